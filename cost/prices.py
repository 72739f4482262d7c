"""The dated price table: Bedrock per-token prices, instance-hour prices and specs, EKS fees.

The figures live in ``cost/data/prices-YYYY-MM-DD.json`` (data, not code): every row carries
its own ``as_of`` date and ``source``. ``load_prices()`` reads the newest such file;
``python -m cost prices --refresh`` writes a new one from the AWS Price List API.
Only the standard library is imported here, so every CLI that prices something starts fast.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from options.core import BadInput

DATA_DIR = Path(__file__).resolve().parent / "data"
DATA_FILE_PATTERN = re.compile(r"^prices-(\d{4}-\d{2}-\d{2})\.json$")
SCHEMA = "spectrum.prices/1"
HOURS_PER_MONTH = 730
PLATFORMS = ("sagemaker", "ec2")
TIERS = ("on_demand", "batch", "flex", "priority")
# Cross-region inference profile prefixes Bedrock puts in front of a model id.
PROFILE_PREFIXES = ("global.", "us-gov.", "us.", "eu.", "apac.", "jp.", "au.", "ca.")


class UnknownName(BadInput):
    """A model id or instance type the price table does not know; names the closest known ones."""

    def __init__(self, kind: str, name: str, known: Iterable[str], hint: str = "",
                 match: str | None = None):
        self.kind, self.name = kind, name
        known = sorted(set(known))
        match = match or name  # the normalised spelling, compared with the table's keys
        self.closest = difflib.get_close_matches(match, known, n=4, cutoff=0.4)
        if not self.closest:  # nothing similar: a shared family prefix still helps
            self.closest = [k for k in known if k.startswith(match.split(".")[0])][:4]
        message = f"unknown {kind} {name!r}"
        message += (f": closest known: {', '.join(self.closest)}" if self.closest
                    else f": known {kind}s: {', '.join(known[:12])}{' ...' if len(known) > 12 else ''}")
        if hint:
            message += f" ({hint})"
        super().__init__(message)


@dataclass(frozen=True)
class InstanceType:
    name: str                                   # EC2 spelling: "g5.xlarge"
    ec2_hourly: float | None
    sagemaker_hourly: float | None              # None: not offered, or price not known
    gpus: int                                   # accelerators (GPUs, or Inferentia2 chips)
    gpu_type: str                               # "A10G", "L4", "L40S", "A100", "H100", "Inferentia2"
    gpu_memory_gb_per_gpu: float                # nominal, as AWS sells it
    usable_gpu_memory_gib_per_gpu: float | None  # what a CUDA process can allocate
    vcpus: int
    memory_gib: float
    as_of: str
    source: str
    nvlink: bool = False

    @property
    def sagemaker_name(self) -> str:
        return "ml." + self.name

    @property
    def total_gpu_memory_gb(self) -> float:
        return self.gpus * self.gpu_memory_gb_per_gpu

    def hourly(self, platform: str = "sagemaker") -> float:
        """Hourly price on ``platform``; BadInput when the table has no price for it."""
        check_platform(platform)
        price = self.sagemaker_hourly if platform == "sagemaker" else self.ec2_hourly
        if price is None:
            other = "ec2" if platform == "sagemaker" else "sagemaker"
            raise BadInput(f"no {platform} price for {self.name} in the price table (as of {self.as_of}): "
                           f"use --platform {other}, another instance type, or refresh the table "
                           f"with `python -m cost prices --refresh`")
        return price


@dataclass(frozen=True)
class TokenPrice:
    model_id: str
    name: str
    input_per_million: float
    output_per_million: float
    batch_input_per_million: float | None = None
    batch_output_per_million: float | None = None
    flex_input_per_million: float | None = None
    flex_output_per_million: float | None = None
    priority_input_per_million: float | None = None
    priority_output_per_million: float | None = None
    as_of: str = ""
    source: str = ""

    def per_million(self, tier: str = "on_demand") -> tuple[float, float]:
        """(input, output) USD per 1M tokens on a service tier."""
        if tier not in TIERS:
            raise BadInput(f"unknown Bedrock tier {tier!r}: choose one of {', '.join(TIERS)}")
        if tier == "on_demand":
            return self.input_per_million, self.output_per_million
        pair = getattr(self, f"{tier}_input_per_million"), getattr(self, f"{tier}_output_per_million")
        if pair[0] is None or pair[1] is None:
            offered = [t for t in TIERS if t == "on_demand" or getattr(self, f"{t}_input_per_million") is not None]
            raise BadInput(f"no {tier} price for {self.model_id} in the price table: "
                           f"known tiers for it: {', '.join(offered)}")
        return pair

    def cost(self, input_tokens: int, output_tokens: int, tier: str = "on_demand") -> float:
        p_in, p_out = self.per_million(tier)
        return (input_tokens * p_in + output_tokens * p_out) / 1e6


@dataclass(frozen=True)
class EksFee:
    name: str
    hourly: float
    as_of: str
    source: str


def check_platform(platform: str) -> None:
    if platform not in PLATFORMS:
        raise BadInput(f"unknown platform {platform!r}: choose one of {', '.join(PLATFORMS)}")


def strip_profile_prefix(model_id: str) -> str:
    """'us.anthropic.claude-...' -> 'anthropic.claude-...' (profiles bill as the base model)."""
    for prefix in PROFILE_PREFIXES:
        if model_id.startswith(prefix):
            return model_id[len(prefix):]
    return model_id


def instance_key(name: str) -> str:
    """'ml.g5.xlarge' and 'g5.xlarge' both -> 'g5.xlarge'."""
    name = name.strip().lower()
    return name[3:] if name.startswith("ml.") else name


class PriceTable:
    def __init__(self, doc: dict[str, Any], path: Path | None = None):
        self.path = path
        self.doc = doc
        self.as_of: str = doc.get("as_of", "")
        self.region: str = doc.get("region", "us-east-1")
        self._instances = {r["name"]: _row(InstanceType, r) for r in doc.get("instances", [])}
        self._bedrock = {r["model_id"]: _row(TokenPrice, r) for r in doc.get("bedrock", [])}
        self._eks = {r["name"]: _row(EksFee, r) for r in doc.get("eks", [])}

    def instance(self, name: str) -> InstanceType:
        key = instance_key(name)
        try:
            return self._instances[key]
        except KeyError:
            raise UnknownName("instance type", name, self._instances,
                              "list them with `python -m cost prices --kind instance`", match=key) from None

    def instances(self) -> list[InstanceType]:
        return list(self._instances.values())

    def bedrock(self, model_id: str) -> TokenPrice:
        key = strip_profile_prefix(model_id.strip())
        try:
            return self._bedrock[key]
        except KeyError:
            raise UnknownName("Bedrock model id", model_id, self._bedrock,
                              "list them with `python -m cost prices --kind bedrock`", match=key) from None

    def bedrock_models(self) -> list[TokenPrice]:
        return list(self._bedrock.values())

    @property
    def eks_cluster_hourly(self) -> float:
        return self.eks_fee().hourly

    def eks_fee(self, name: str = "control_plane") -> EksFee:
        try:
            return self._eks[name]
        except KeyError:
            raise UnknownName("EKS fee", name, self._eks) from None

    def eks_fees(self) -> list[EksFee]:
        return list(self._eks.values())


def _row(cls, row: dict[str, Any]):
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in row.items() if k in known})


def data_files(data_dir: Path = DATA_DIR) -> list[Path]:
    """The dated price files, oldest first."""
    return sorted((p for p in data_dir.glob("prices-*.json") if DATA_FILE_PATTERN.match(p.name)),
                  key=lambda p: p.name)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The price table in ``path``, or the newest dated file in cost/data/."""
    if path is None:
        return _default_table()
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"price file {str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"price file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadInput(f"price file {str(path)!r} is not a Spectrum price table "
                       f"(expected \"schema\": \"{SCHEMA}\")")
    return PriceTable(doc, path)


@lru_cache(maxsize=1)
def _default_table() -> PriceTable:
    files = data_files()
    if not files:
        raise FileNotFoundError(f"no prices-YYYY-MM-DD.json in {DATA_DIR}")
    return load_prices(files[-1])


def dump_prices(doc: dict[str, Any], path: Path) -> Path:
    """Write a price table with one row per line, so a refresh reads as a clean diff."""
    sections = ("bedrock", "instances", "eks")
    head = {k: v for k, v in doc.items() if k not in sections}
    text = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    for key in sections:
        rows = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in doc.get(key, []))
        text += f',\n "{key}": [\n{rows}\n ]'
    text += "\n}\n"
    json.loads(text)  # never write a file load_prices cannot read
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def hourly_cost_line(instance_type: str, count: int = 1, platform: str = "sagemaker",
                     extra_hourly: float = 0.0, table: PriceTable | None = None) -> dict[str, Any]:
    """The cost line a plan carries: hourly and 730-hour monthly USD for ``count`` instances."""
    if not isinstance(count, int) or count < 1:
        raise BadInput(f"instance count {count!r} must be a whole number >= 1")
    table = table or load_prices()
    inst = table.instance(instance_type)
    hourly = inst.hourly(platform) * count + extra_hourly
    return {
        "instance_type": (inst.sagemaker_name if platform == "sagemaker" else inst.name),
        "count": count,
        "platform": platform,
        "hourly_usd": round(hourly, 6),
        "monthly_usd": round(hourly * HOURS_PER_MONTH, 2),
        "price_as_of": inst.as_of,
        "source": inst.source,
    }


def token_cost(model_id: str, input_tokens: int, output_tokens: int,
               table: PriceTable | None = None) -> float:
    """USD for one Bedrock call's usage at on-demand prices."""
    return (table or load_prices()).bedrock(model_id).cost(input_tokens, output_tokens)


def as_dict(row: Any) -> dict[str, Any]:
    return asdict(row)
