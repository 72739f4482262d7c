"""LMI (DJL Serving) configuration: ``OPTION_*`` env ⇄ serving.properties, image URI, sizing.

``LmiConfig`` holds the options in properties form (``tensor_parallel_degree``) and renders
both the container environment (``OPTION_TENSOR_PARALLEL_DEGREE``) and an equivalent
``serving.properties``. ``check_fit`` validates a config against an instance type from the
price table's catalogue before anything is sent: tensor parallelism must divide the GPUs and
the attention heads, and the weights plus the KV cache of one full-length sequence must fit
the usable GPU memory (what vLLM checks when it starts).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from options.core import BadInput

# The djl-lmi version Spectrum plans with; --lmi-version overrides it. The tag comes from the
# SageMaker SDK's bundled image table, so it changes only with that table.
DEFAULT_LMI_VERSION = "0.38.0"
ARCHITECTURES_FILE = Path(__file__).with_name("architectures.json")
GIB = 1024 ** 3

# Env names LMI reads directly (not as OPTION_*): passed through unchanged.
PLAIN_ENV = {"HF_MODEL_ID", "HF_TOKEN", "HF_REVISION", "TENSOR_PARALLEL_DEGREE", "MAX_BATCH_SIZE",
             "MAX_CONCURRENT_REQUESTS", "SERVING_FAIL_FAST", "SERVING_LOAD_MODELS",
             "SERVING_OPTS", "SM_NUM_GPUS"}
DTYPE_BYTES = {"fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp32": 4, "float32": 4,
               "auto": 2, "fp8": 1}
QUANTIZED_WEIGHT_BYTES = {"awq": 0.56, "gptq": 0.56, "fp8": 1.0, "bitsandbytes": 0.56,
                          "bitsandbytes4": 0.56, "bitsandbytes8": 1.0}
DEFAULT_MAX_ROLLING_BATCH = 256         # LMI's default option.max_rolling_batch_size
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9    # vLLM's default
# Options Spectrum sets unless the user sets them. Prefix caching keeps an agent's growing
# prompt (shared system prompt, then each step's context) in the KV cache between calls;
# vLLM turns it on by default for generative models, written out here so the plan says so
# and an LMI release with another default still gets it. OPTION_ENABLE_PREFIX_CACHING=false
# turns it off.
DEFAULT_OPTIONS = {"enable_prefix_caching": "true"}


def add_lmi_version_argument(group) -> None:
    group.add_argument("--lmi-version", default=DEFAULT_LMI_VERSION, metavar="VERSION",
                       help=f"LMI (djl-lmi) image version from the SageMaker SDK's table "
                            f"(default {DEFAULT_LMI_VERSION}), e.g. --lmi-version 0.36.0")


def option_key(key: str) -> str:
    """OPTION_TENSOR_PARALLEL_DEGREE / option.tensor_parallel_degree / tensor_parallel_degree → tensor_parallel_degree."""
    key = key.strip()
    if key.upper().startswith("OPTION_"):
        return key[len("OPTION_"):].lower()
    if key.lower().startswith("option."):
        return key[len("option."):]
    return key.lower()


def parse_options(pairs: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``--option`` values → (LMI options in properties form, plain env such as HF_TOKEN)."""
    options: dict[str, str] = {}
    plain: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--option {pair!r} is not KEY=VALUE: write it as "
                           f"OPTION_TENSOR_PARALLEL_DEGREE=4 or tensor_parallel_degree=4")
        if key.strip() in PLAIN_ENV:
            plain[key.strip()] = value.strip()
        else:
            options[option_key(key)] = value.strip()
    return options, plain


@dataclass
class LmiConfig:
    model_id: str                                  # HF_MODEL_ID: hub id, s3:// prefix or /opt/ml/model
    options: dict[str, str] = field(default_factory=dict)   # properties form, without "option."
    plain_env: dict[str, str] = field(default_factory=dict)

    def effective_options(self) -> dict[str, str]:
        """The user's options over Spectrum's defaults (``DEFAULT_OPTIONS``)."""
        return {**DEFAULT_OPTIONS, **self.options}

    def env(self) -> dict[str, str]:
        env = {"HF_MODEL_ID": self.model_id}
        env.update({f"OPTION_{k.upper()}": v for k, v in sorted(self.effective_options().items())})
        env.update(self.plain_env)
        return env

    def serving_properties(self) -> str:
        lines = ["engine=Python", f"option.model_id={self.model_id}"]
        lines += [f"option.{k}={v}" for k, v in sorted(self.effective_options().items())]
        return "\n".join(lines) + "\n"

    # Values the sizing needs, with LMI's defaults.
    def tensor_parallel(self, gpus: int) -> int:
        raw = self.options.get("tensor_parallel_degree", self.plain_env.get("TENSOR_PARALLEL_DEGREE", "max"))
        if str(raw).lower() == "max":
            return gpus
        return _positive_int("tensor_parallel_degree", raw)

    def max_batch(self) -> int:
        raw = self.options.get("max_rolling_batch_size", self.plain_env.get("MAX_BATCH_SIZE"))
        return _positive_int("max_rolling_batch_size", raw) if raw else DEFAULT_MAX_ROLLING_BATCH

    def max_model_len(self) -> int | None:
        raw = self.options.get("max_model_len")
        return _positive_int("max_model_len", raw) if raw else None

    def dtype_bytes(self) -> float:
        dtype = self.options.get("dtype", "fp16").lower()
        if dtype not in DTYPE_BYTES:
            raise BadInput(f"option dtype={dtype!r} is not known: use one of {', '.join(DTYPE_BYTES)}")
        return DTYPE_BYTES[dtype]

    def gpu_memory_utilization(self) -> float:
        raw = self.options.get("gpu_memory_utilization")
        if raw is None:
            return DEFAULT_GPU_MEMORY_UTILIZATION
        try:
            value = float(raw)
        except ValueError:
            value = -1
        if not 0 < value <= 1:
            raise BadInput(f"option gpu_memory_utilization={raw!r} must be a fraction in (0, 1], e.g. 0.9")
        return value


def _positive_int(name: str, raw: Any) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        value = 0
    if value < 1:
        raise BadInput(f"option {name}={raw!r} must be a whole number ≥ 1")
    return value


# ----------------------------------------------------------------------------------- model shape

@dataclass
class ModelShape:
    """What sizing needs to know about a model; any field may be unknown (None)."""
    source: str                       # where the numbers came from
    parameters: float | None = None
    weight_bytes: float | None = None  # on-disk size of the weights when known exactly
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    weight_bytes_per_parameter: float | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> "ModelShape":
        text = config.get("text_config", config)  # multimodal configs nest the language model
        hidden = text.get("hidden_size")
        heads = text.get("num_attention_heads")
        kv = text.get("num_key_value_heads", heads)
        head_dim = text.get("head_dim") or (hidden // heads if hidden and heads else None)
        return cls(source=source, parameters=estimate_parameters(text),
                   num_layers=text.get("num_hidden_layers"), num_attention_heads=heads,
                   num_kv_heads=kv, head_dim=head_dim,
                   max_position_embeddings=text.get("max_position_embeddings"))

    def kv_bytes_per_token(self, dtype_bytes: float) -> float | None:
        if None in (self.num_layers, self.num_kv_heads, self.head_dim):
            return None
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * dtype_bytes

    def weights(self, dtype_bytes: float, quantize: str | None) -> float | None:
        if quantize and self.parameters:
            return self.parameters * QUANTIZED_WEIGHT_BYTES.get(quantize.lower(), dtype_bytes)
        if self.weight_bytes:
            return self.weight_bytes
        if self.parameters:
            return self.parameters * (self.weight_bytes_per_parameter or dtype_bytes)
        return None


def estimate_parameters(c: dict[str, Any]) -> float | None:
    """Parameters of a decoder-only transformer from its config.json (embeddings + layers)."""
    try:
        hidden, layers = c["hidden_size"], c["num_hidden_layers"]
        heads = c["num_attention_heads"]
        kv = c.get("num_key_value_heads", heads)
        head_dim = c.get("head_dim") or hidden // heads
        inter = c.get("intermediate_size", 4 * hidden)
        vocab = c["vocab_size"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    experts = c.get("num_local_experts") or c.get("num_experts") or 1
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    mlp = 3 * hidden * inter * experts
    embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return float(embeddings + layers * (attention + mlp + 2 * hidden))


def load_catalogue() -> dict[str, dict[str, Any]]:
    doc = json.loads(ARCHITECTURES_FILE.read_text())
    return {m["id"].lower(): m for m in doc["models"]}


def _hf_cache_config(hub_id: str) -> Path | None:
    """config.json of a hub model already in the local Hugging Face cache, if any."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub")
    snapshots = home / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


def model_shape(model: str, local_path: Path | None, overrides: dict[str, Any]) -> ModelShape:
    """config.json (local folder or HF cache) → built-in catalogue → flags → unknown."""
    shape: ModelShape | None = None
    config_path = (local_path / "config.json") if local_path else _hf_cache_config(model)
    if config_path and config_path.is_file():
        shape = ModelShape.from_config(json.loads(config_path.read_text()), f"{config_path}")
        if local_path:
            weights = sum(p.stat().st_size for p in local_path.glob("*.safetensors")) or \
                sum(p.stat().st_size for p in local_path.glob("*.bin"))
            shape.weight_bytes = float(weights) or None
    else:
        row = load_catalogue().get(model.lower())
        if row:
            shape = ModelShape(source=f"built-in catalogue ({row['source']}, as of {row['as_of']})",
                               parameters=row["parameters"], num_layers=row["num_layers"],
                               num_attention_heads=row["num_attention_heads"],
                               num_kv_heads=row["num_kv_heads"], head_dim=row["head_dim"],
                               max_position_embeddings=row["max_position_embeddings"],
                               weight_bytes_per_parameter=row.get("weight_bytes_per_parameter"))
    shape = shape or ModelShape(source="flags" if any(v is not None for v in overrides.values())
                                else "unknown")
    for key, value in overrides.items():
        if value is not None:
            setattr(shape, key, value)
            if shape.source not in ("flags",) and "flags" not in shape.source:
                shape.source += " + flags"
    return shape


# ----------------------------------------------------------------------------------- sizing

@dataclass
class FitReport:
    instance: str
    gpus: int
    tensor_parallel: int
    usable_gib: float                 # across the GPUs the model is split over, after utilisation
    weights_gib: float | None
    kv_gib_per_sequence: float | None
    max_model_len: int | None
    sequences_that_fit: int | None    # full-length sequences the KV cache holds
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.sequences_that_fit is None or self.sequences_that_fit >= 1


def fit(config: LmiConfig, shape: ModelShape, instance) -> FitReport:
    """How the model fits on ``instance`` (a cost.prices.InstanceType); raises on TP errors."""
    gpus = instance.gpus
    tp = config.tensor_parallel(gpus)
    name = instance.sagemaker_name
    if gpus < 1 or instance.gpu_type.lower().startswith(("inferentia", "trainium")):
        raise BadInput(f"{name} has no NVIDIA GPU ({gpus} × {instance.gpu_type}); the LMI vLLM "
                       f"image needs one: choose a g5, g6, g6e, p4d or p5 instance")
    if tp > gpus or gpus % tp:
        divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
        raise BadInput(f"tensor parallel degree {tp} does not divide the {gpus} GPUs of {name}: "
                       f"use one of {', '.join(map(str, divisors))} "
                       f"(OPTION_TENSOR_PARALLEL_DEGREE={divisors[-1]} uses them all)")
    heads = shape.num_attention_heads
    if heads and heads % tp:
        divisors = [d for d in range(1, gpus + 1) if gpus % d == 0 and heads % d == 0]
        implied = "" if "tensor_parallel_degree" in config.options else \
            f" (LMI's default tensor_parallel_degree=max uses all {gpus} GPUs of {name})"
        raise BadInput(f"tensor parallel degree {tp}{implied} does not divide the model's {heads} "
                       f"attention heads ({shape.source}): set OPTION_TENSOR_PARALLEL_DEGREE to one "
                       f"of {', '.join(map(str, divisors))}")
    skipped = []
    if not heads:
        skipped.append("attention heads unknown: tensor parallel checked against the GPUs only")
    usable_per_gpu = instance.usable_gpu_memory_gib_per_gpu or instance.gpu_memory_gb_per_gpu * 0.93
    usable = usable_per_gpu * tp * config.gpu_memory_utilization()
    dtype_bytes = config.dtype_bytes()
    weights = shape.weights(dtype_bytes, config.options.get("quantize"))
    kv_token = shape.kv_bytes_per_token(dtype_bytes)
    max_len = config.max_model_len() or shape.max_position_embeddings
    report = FitReport(name, gpus, tp, usable, weights / GIB if weights else None,
                       kv_token * max_len / GIB if kv_token and max_len else None, max_len, None,
                       skipped)
    if weights is None:
        skipped.append("parameter count unknown: memory not checked (give --model a local folder, "
                       "or --param-count)")
        return report
    free = usable - report.weights_gib
    if report.kv_gib_per_sequence is None:
        skipped.append("layers / KV heads / head_dim or max_model_len unknown: KV cache not checked")
        report.sequences_that_fit = 1 if free > 0 else 0
        return report
    report.sequences_that_fit = max(0, math.floor(free / report.kv_gib_per_sequence)) if free > 0 else 0
    batch = config.max_batch()
    if report.fits and report.sequences_that_fit < batch:
        report.notes.append(
            f"the KV cache holds {report.sequences_that_fit} full-length ({max_len}-token) sequences "
            f"at once; max_rolling_batch_size is {batch}, so a batch of long sequences queues "
            f"(shorter ones share the paged cache)")
    return report


def describe_fit(r: FitReport) -> str:
    need = (r.weights_gib or 0) + (r.kv_gib_per_sequence or 0)
    return (f"weights {r.weights_gib:.1f} GiB + KV cache for one {r.max_model_len}-token sequence "
            f"{r.kv_gib_per_sequence or 0:.1f} GiB = {need:.1f} GiB, but {r.instance} gives "
            f"{r.usable_gib:.1f} GiB usable ({r.tensor_parallel} GPU(s) × usable memory × "
            f"gpu_memory_utilization)")


def check_fit(config: LmiConfig, shape: ModelShape, instance, prices) -> FitReport:
    """``fit`` that raises BadInput naming the numbers and the cheapest instance that fits."""
    report = fit(config, shape, instance)
    if report.fits:
        return report
    raise BadInput(f"the model does not fit: {describe_fit(report)}. {smallest_fitting(config, shape, prices)}"
                   f"{shorter_context_hint(report)}")


def shorter_context_hint(r: FitReport) -> str:
    """When the weights fit and only the KV cache does not, a shorter context keeps the instance."""
    if not (r.weights_gib and r.kv_gib_per_sequence and r.max_model_len) or r.usable_gib <= r.weights_gib:
        return ""
    kv_gib_per_token = r.kv_gib_per_sequence / r.max_model_len
    tokens = int((r.usable_gib - r.weights_gib) / kv_gib_per_token) // 1024 * 1024
    if tokens < 1024:
        return ""
    return f"; or keep {r.instance} with a shorter context: OPTION_MAX_MODEL_LEN={tokens} fits"


def smallest_fitting(config: LmiConfig, shape: ModelShape, prices) -> str:
    candidates = []
    for inst in prices.instances():
        if inst.sagemaker_hourly is None or inst.gpus < 1 or \
                inst.gpu_type.lower().startswith(("inferentia", "trainium")):
            continue
        trial = LmiConfig(config.model_id, {**config.options, "tensor_parallel_degree": "max"},
                          config.plain_env)
        try:
            report = fit(trial, shape, inst)
        except BadInput:
            continue
        if report.fits:
            candidates.append((inst.sagemaker_hourly, inst.sagemaker_name, inst.gpus))
    if not candidates:
        return ("No instance in the catalogue fits it: set a shorter OPTION_MAX_MODEL_LEN or "
                "quantize (OPTION_QUANTIZE=awq)")
    price, name, gpus = min(candidates)
    return (f"The cheapest instance that fits is {name} (${price:g}/h, {gpus} GPU(s), with "
            f"OPTION_TENSOR_PARALLEL_DEGREE={gpus})")


def startup_timeout_s(weights_gib: float | None) -> int:
    """ContainerStartupHealthCheckTimeoutInSeconds sized from the model.

    Downloading and loading run at very roughly 0.25–0.5 GiB/s on SageMaker GPU hosts; allow
    10 minutes of fixed start-up (image pull, CUDA graphs, warm-up) plus 8 s per GiB of weights,
    within SageMaker's bounds (60–3600 s).
    """
    if weights_gib is None:
        return 1800
    return int(min(3600, max(600, 600 + 8 * weights_gib)))


# ----------------------------------------------------------------------------------- image URI

def image_uri(region: str, version: str = DEFAULT_LMI_VERSION) -> str:
    """The djl-lmi image for ``region`` from the SageMaker SDK's bundled table (read, not imported)."""
    spec = importlib.util.find_spec("sagemaker")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput("the LMI image table comes with the SageMaker SDK: pip install 'spectrum[sdk]'")
    table_path = Path(list(spec.submodule_search_locations)[0]) / "image_uri_config" / "djl-lmi.json"
    table = json.loads(table_path.read_text())
    version = table.get("version_aliases", {}).get(version, version)
    versions = table["versions"]
    if version not in versions:
        raise BadInput(f"--lmi-version {version!r} is not in the SageMaker SDK's djl-lmi table: "
                       f"choose one of {', '.join(sorted(versions, key=_version_key, reverse=True))}")
    row = versions[version]
    account = row["registries"].get(region)
    if account is None:
        raise BadInput(f"LMI {version} is not published in region {region!r}: choose one of "
                       f"{', '.join(sorted(row['registries']))}")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{domain}/{row['repository']}:{row['tag_prefix']}"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())
