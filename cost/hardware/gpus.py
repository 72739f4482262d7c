"""The GPU and instance table that capacity from specs starts from.

The figures live in ``cost/hardware/data/gpus-YYYY-MM-DD.json`` (data, not code; the newest file
wins): per GPU its memory (nominal, and the total CUDA reports, which is what vLLM budgets from),
bandwidth, dense tensor TF/s by dtype and the link between GPUs of one instance, each row with its
source and date; per EC2 family the GPU and the GPU count of each size. Standard library only.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from cost.prices import UnknownName, instance_key
from options.core import BadInput

DATA_DIR = Path(__file__).resolve().parent / "data"
DATA_FILE_PATTERN = re.compile(r"^gpus-(\d{4}-\d{2}-\d{2})\.json$")
SCHEMA = "spectrum.gpus/1"
DTYPES = ("bf16", "fp16", "fp8", "fp4", "int8")
FAMILIES = ("ampere", "ada", "hopper", "blackwell")
LINKS = ("nvlink", "pcie")
# The spellings engines and configs use for the same matmul dtypes.
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8",
                 "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float4": "fp4", "nvfp4": "fp4",
                 "mxfp4": "fp4"}
# EC2 families of these classes carry no accelerator: general purpose (a, m, t, mac), compute (c),
# memory (r, u, x, z), storage (d, h, i, im, is) and HPC. inf*, trn*, dl* and g*/p* do not match.
CPU_ONLY_FAMILY = re.compile(r"^(?:(?:a|c|d|h|i|im|is|m|r|t|u|x|z)\d|u-|hpc\d|mac\d)")


@dataclass(frozen=True)
class GpuSpec:
    name: str                                   # key: a10g, l4, l40s, a100-40gb, ..., b200
    label: str                                  # "NVIDIA H100 SXM 80GB"
    family: str                                 # ampere | ada | hopper | blackwell
    memory_gb: float                            # nominal
    memory_gib: float                           # CUDA's total: what vLLM multiplies by utilization
    bandwidth_gb_s: float                       # HBM/GDDR peak
    tflops: dict[str, float | None] = field(hash=False)  # dense; None: no tensor path
    link: str                                   # nvlink | pcie
    link_gb_s: float                            # per GPU, one way, as an all-reduce sees it
    source: str
    as_of: str

    def native_dtypes(self) -> list[str]:
        return [d for d in DTYPES if self.tflops.get(d) is not None]

    def native(self, dtype: str) -> bool:
        """Whether the tensor cores multiply this dtype (fp8 on Ampere: no, it is upcast)."""
        return self.tflops.get(matmul_dtype(dtype)) is not None

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for matmuls in ``dtype``; BadInput where the GPU has no such path,
        since a roofline with a made-up peak would look exact and be wrong."""
        key = matmul_dtype(dtype)
        tf = self.tflops.get(key)
        if tf is None:
            raise BadInput(f"{self.label} ({self.name}) has no native {key} tensor math: its native "
                           f"dtypes are {', '.join(self.native_dtypes())}; choose one of those or "
                           f"a GPU that runs {key} (e.g. {_example_gpu_for(key)})")
        return tf * 1e12

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "family": self.family,
                "memory_gb": self.memory_gb, "memory_gib": self.memory_gib,
                "bandwidth_gb_s": self.bandwidth_gb_s, "tflops": dict(self.tflops),
                "link": self.link, "link_gb_s": self.link_gb_s, "source": self.source,
                "as_of": self.as_of}


@dataclass(frozen=True)
class InstanceSpec:
    name: str                                   # EC2 spelling: "p5.48xlarge"
    gpu: GpuSpec
    gpus: int
    link: str                                   # nvlink | pcie
    link_gb_s: float
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "gpu": self.gpu.to_json(), "gpus": self.gpus, "link": self.link,
                "link_gb_s": self.link_gb_s, "source": self.source}


def matmul_dtype(dtype: str) -> str:
    """'bfloat16' -> 'bf16'; BadInput for a dtype the table has no column for."""
    key = dtype.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise BadInput(f"unknown matmul dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return key


class GpuTable:
    """One dated GPU file, read and checked."""

    def __init__(self, doc: dict[str, Any], path: Path | None = None):
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
        self.path, self.as_of = path, doc["as_of"]
        self._gpus = {row["name"]: _gpu_row(row) for row in doc["gpus"]}
        self._instances: dict[str, InstanceSpec] = {}
        for fam in doc["instance_families"]:
            spec = self._gpus[fam["gpu"]]
            _check_link(fam["link"], fam["family"])
            for size, count in fam["sizes"].items():
                name = f"{fam['family']}.{size}"
                self._instances[name] = InstanceSpec(name, spec, int(count), fam["link"],
                                                     float(fam["link_gb_s"]), fam["source"])
        self._not_modelled = {f: row for row in doc.get("not_modelled", []) for f in row["families"]}

    def gpu(self, name: str) -> GpuSpec:
        try:
            return self._gpus[name.strip().lower()]
        except KeyError:
            raise BadInput(f"unknown GPU {name!r}: known GPUs: {', '.join(self._gpus)}") from None

    def gpus(self) -> list[GpuSpec]:
        return list(self._gpus.values())

    def instance(self, name: str) -> InstanceSpec:
        key = instance_key(name)
        if key in self._instances:
            return self._instances[key]
        family = key.split(".")[0]
        if family in self._not_modelled:
            row = self._not_modelled[family]
            alt = self._instances[row["alternative"]]
            raise BadInput(f"{name} carries {row['accelerator']} chips, which are not modelled here: "
                           f"the Neuron compiler builds the model for them ahead of time, so no GPU "
                           f"roofline applies; for an estimate from specs use a GPU instance such as "
                           f"{alt.name} ({alt.gpus} x {alt.gpu.label})")
        if CPU_ONLY_FAMILY.match(family):
            raise BadInput(f"{name} has no GPU: capacity from specs needs a GPU instance "
                           f"(g5, g6, g6e, p4d, p5, ...), e.g. g6.xlarge or g5.xlarge")
        raise UnknownName("GPU instance type", name, self._instances,
                          f"the GPU table {self.path.name if self.path else ''} lists those modelled",
                          match=key)

    def instances(self) -> list[InstanceSpec]:
        return list(self._instances.values())


def _gpu_row(row: dict[str, Any]) -> GpuSpec:
    tflops = row["tflops"]
    if set(tflops) != set(DTYPES):
        raise ValueError(f"GPU {row['name']}: tflops must give each of {DTYPES}, got {sorted(tflops)}")
    if row["family"] not in FAMILIES:
        raise ValueError(f"GPU {row['name']}: family {row['family']!r} is not one of {FAMILIES}")
    _check_link(row["link"], row["name"])
    return GpuSpec(row["name"], row["label"], row["family"], float(row["memory_gb"]),
                   float(row["memory_gib"]), float(row["bandwidth_gb_s"]),
                   {d: (None if tflops[d] is None else float(tflops[d])) for d in DTYPES},
                   row["link"], float(row["link_gb_s"]), row["source"], row["as_of"])


def _check_link(link: str, where: str) -> None:
    if link not in LINKS:
        raise ValueError(f"{where}: link {link!r} is not one of {LINKS}")


def _example_gpu_for(dtype: str) -> str:
    return ", ".join(g.name for g in load_gpu_table().gpus() if g.native(dtype)) or "none known"


def data_files(data_dir: Path = DATA_DIR) -> list[Path]:
    """The dated GPU files, oldest first."""
    return sorted(p for p in data_dir.glob("gpus-*.json") if DATA_FILE_PATTERN.match(p.name))


@lru_cache(maxsize=None)
def load_gpu_table(path: Path | None = None) -> GpuTable:
    """The table in ``path``, or in the newest dated file."""
    path = path or data_files()[-1]
    return GpuTable(json.loads(Path(path).read_text()), Path(path))


def gpu(name: str) -> GpuSpec:
    """A GPU by key, any case: 'H100' -> the H100 SXM row."""
    return load_gpu_table().gpu(name)


def instance(name: str) -> InstanceSpec:
    """An instance by EC2 or SageMaker name ('ml.g5.12xlarge' works)."""
    return load_gpu_table().instance(name)


def gpus() -> list[GpuSpec]:
    return load_gpu_table().gpus()


def instances() -> list[InstanceSpec]:
    return load_gpu_table().instances()
