"""Many models on one engine: LoRA adapters over the base model, and SageMaker's multi-model
container contract (``/models``) over them.

- The registry knows every adapter by name: those found at start-up in the model folder's
  ``adapters/<name>/`` (registered, not loaded) and those loaded through ``POST /models``.
- An adapter is loaded into the engine on its first request (or at once by ``POST /models``);
  concurrent first requests share one load (single-flight). The engine's CPU cache of adapters
  (``max_cpu_loras``) is kept by an LRU here, so vLLM never evicts on its own: an adapter with
  requests in flight or pinned is never evicted; when every resident adapter is pinned there
  is no room (507). The GPU slots (``max_loras``) are vLLM's own LRU over the adapters it
  runs; the registry mirrors it for ``/metrics``.
- Loading reads a path or URL its caller names, so it is guarded: sources only under the
  allowed roots, no ``..`` or symlink out of them, and the files are checked before the engine
  sees them (peft config, rank, target modules and tensor shapes against the base model,
  safetensors only: a pickle is refused and never opened). A copy of the checked files is
  what the engine loads, so files changed at the source later never reach it.
- Base-model requests carry an all-zero adapter where vLLM's LoRA kernels apply the last
  adapter to rows without one (its CPU torch ops index slot -1): mixed batches stay exact.

Everything runs on the server's event loop; file and S3 work goes to ``asyncio.to_thread``.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from . import metrics
from .dialects import BadRequest

log = logging.getLogger("byo_vllm.adapters")

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Weight files that are Python pickles: opening one runs code, so they are refused.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
SAFE_DTYPES = {"F16", "BF16", "F32"}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Where SageMaker's multi-model endpoints unpack the models they load.
SAGEMAKER_MODELS_DIR = Path("/opt/ml/models")
# Peft's key prefix in adapter_model.safetensors.
PEFT_PREFIX = "base_model.model."
LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
# A safetensors header larger than this is not an adapter's.
MAX_HEADER_BYTES = 64 * 1024 * 1024
# How long a load waits for a resident adapter's requests to finish so it can be evicted.
SLOT_WAIT_S = 60.0
DEFAULT_PAGE = 100
BASE_ZERO_NAME = "spectrum-base-zero"


# -- where adapters may come from ------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    url: str
    local: Path | None = None          # a folder (resolved) for local sources
    bucket: str = ""                   # s3://bucket/prefix
    prefix: str = ""


@dataclass(frozen=True)
class AllowedSources:
    """The roots a load may read from: local folders (resolved) and s3:// prefixes."""
    local_roots: tuple[Path, ...]
    s3_prefixes: tuple[str, ...] = ()

    @classmethod
    def build(cls, model_dir: Path | None, extra: Iterable[str] = ()) -> "AllowedSources":
        roots = [SAGEMAKER_MODELS_DIR]
        if model_dir is not None:
            roots.insert(0, model_dir)
        s3 = []
        for item in extra:
            if item.startswith("s3://"):
                s3.append(item.rstrip("/") + "/")
            else:
                roots.append(Path(item))
        return cls(tuple(dict.fromkeys(Path(os.path.realpath(r)) for r in roots)), tuple(s3))

    def describe(self) -> str:
        return ", ".join([str(r) for r in self.local_roots] + list(self.s3_prefixes))

    def check(self, url: Any) -> Source:
        """The source ``url`` names, if it is under an allowed root. BadRequest 400 for a
        value that is no source at all, 403 for one outside the roots."""
        if not isinstance(url, str) or not url.strip():
            raise BadRequest(f"url={url!r}: give the adapter's folder (an absolute path) or an "
                             "s3://bucket/prefix", "url")
        url = url.strip()
        if url.startswith("s3://"):
            return self._check_s3(url)
        if "://" in url:
            raise BadRequest(f"url={url!r}: only local folders and s3:// prefixes can be "
                             f"loaded (allowed roots: {self.describe()})", "url")
        path = PurePosixPath(url)
        if not path.is_absolute():
            raise BadRequest(f"url={url!r} is a relative path: give an absolute folder under "
                             f"one of {self.describe()}", "url")
        if ".." in path.parts:
            raise BadRequest(f"url={url!r} contains '..': name the folder directly, under one "
                             f"of {self.describe()}", "url", 403)
        real = Path(os.path.realpath(url))
        root = self._root_of(real)
        if root is None:
            named = Path(os.path.normpath(url))
            why = ("resolves through a symlink to " + str(real)
                   if self._root_of(named) is not None else "is")
            raise BadRequest(f"url={url!r} {why} outside the folders adapters may be loaded "
                             f"from: {self.describe()}", "url", 403)
        return Source(url=url, local=real)

    def _root_of(self, path: Path) -> Path | None:
        for root in self.local_roots:
            if path == root or root in path.parents:
                return root
        return None

    def check_file(self, path: Path) -> Path:
        """``path`` resolved, if it stays under an allowed root (a symlinked file can point
        anywhere)."""
        real = Path(os.path.realpath(path))
        if self._root_of(real) is None:
            raise BadRequest(f"{path} resolves through a symlink to {real}, outside the "
                             f"folders adapters may be loaded from: {self.describe()}",
                             "url", 403)
        return real

    def _check_s3(self, url: str) -> Source:
        rest = url[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket or ".." in prefix.split("/"):
            raise BadRequest(f"url={url!r}: an S3 source is s3://bucket/prefix without '..'",
                             "url", 400 if not bucket else 403)
        normal = f"s3://{bucket}/{prefix.strip('/')}/"
        if not any(normal.startswith(p) for p in self.s3_prefixes):
            allowed = ", ".join(self.s3_prefixes) or "none are configured"
            raise BadRequest(f"url={url!r} is not under an allowed s3:// prefix ({allowed}); "
                             "add it to SPECTRUM_SERVER_ADAPTER_SOURCES to allow it",
                             "url", 403)
        return Source(url=url, bucket=bucket, prefix=prefix.strip("/"))


# -- the files ----------------------------------------------------------------------------------
def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors a safetensors file declares ({name: {dtype, shape, data_offsets}}), read
    from its JSON header only. BadRequest 400 for a file that is not one."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise BadRequest(f"{path.name} is {size} bytes: not a safetensors file", "url")
        length = struct.unpack("<Q", raw)[0]
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise BadRequest(f"{path.name} declares a {length}-byte header in a {size}-byte "
                             "file: not a safetensors file, or truncated", "url")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadRequest(f"{path.name}: the safetensors header is not JSON ({e})",
                             "url") from None
    if not isinstance(header, dict):
        raise BadRequest(f"{path.name}: the safetensors header is not a table of tensors", "url")
    header.pop("__metadata__", None)
    data = size - 8 - length
    for name, info in header.items():
        ok = (isinstance(info, dict) and isinstance(info.get("shape"), list)
              and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2
              and 0 <= info["data_offsets"][0] <= info["data_offsets"][1] <= data)
        if not ok:
            raise BadRequest(f"{path.name}: tensor {name!r} has a malformed entry or lies past "
                             "the end of the file (truncated?)", "url")
    return header


def base_model_modules(model_dir: Path | None) -> dict[str, tuple[int, int]] | None:
    """The base model's linear modules ({"model.layers.0.self_attn.q_proj": (out, in)}) from
    its safetensors headers; None when the folder has none (the module check is skipped)."""
    if model_dir is None or not model_dir.is_dir():
        return None
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    modules: dict[str, tuple[int, int]] = {}
    for file in files:
        for name, info in read_safetensors_header(file).items():
            if name.endswith(".weight") and len(info["shape"]) == 2:
                out, inp = info["shape"]
                modules[name[:-len(".weight")]] = (int(out), int(inp))
    return modules


@dataclass
class AdapterSpec:
    """What the checks learned of an adapter's files."""
    rank: int
    modules: list[str]
    target_modules: Any


def check_adapter_folder(folder: Path, base: dict[str, tuple[int, int]] | None,
                         max_rank: int) -> AdapterSpec:
    """Checks a peft adapter before the engine sees it. BadRequest 400 naming the problem."""
    config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file():
        raise BadRequest(f"{folder} has no {CONFIG_FILE}: an adapter is a peft folder with "
                         f"{CONFIG_FILE} and {WEIGHTS_FILE}", "url")
    if not weights.is_file():
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise BadRequest(f"{folder} holds {', '.join(pickles)} (a pickle, which can run "
                             f"code when opened; not opened) and no {WEIGHTS_FILE}: save the "
                             "adapter as safetensors (peft: save_pretrained(..., "
                             "safe_serialization=True))", "url")
        raise BadRequest(f"{folder} has no {WEIGHTS_FILE}", "url")
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"{config_path} is not JSON: {e}", "url") from None
    if not isinstance(config, dict):
        raise BadRequest(f"{config_path} must be a JSON object", "url")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise BadRequest(f"{CONFIG_FILE}: r={rank!r} must be a positive whole number (the "
                         "LoRA rank)", "url")
    ranks = {"r": rank} | {f"rank_pattern[{k!r}]": v
                           for k, v in (config.get("rank_pattern") or {}).items()}
    for where, r in ranks.items():
        if isinstance(r, int) and r > max_rank:
            raise BadRequest(f"{CONFIG_FILE}: {where}={r} is above this server's max_lora_rank "
                             f"{max_rank}: use an adapter of rank ≤ {max_rank}, or start the "
                             f"server with SM_VLLM_MAX_LORA_RANK ≥ {r}", "url")
    targets = config.get("target_modules")
    leaves = {m.rsplit(".", 1)[-1] for m in base} if base else None
    if isinstance(targets, list) and leaves is not None:
        unknown = [t for t in targets if not isinstance(t, str)
                   or (t not in leaves and t not in base)]
        if unknown:
            raise BadRequest(f"{CONFIG_FILE}: target_modules {unknown} are not modules of the "
                             f"base model (it has {', '.join(sorted(leaves))})", "url")
    elif isinstance(targets, str) and base is not None:
        if not any(re.fullmatch(targets, m) or m.endswith("." + targets) for m in base):
            raise BadRequest(f"{CONFIG_FILE}: target_modules {targets!r} matches no module "
                             "of the base model", "url")
    elif targets is not None and not isinstance(targets, (list, str)):
        raise BadRequest(f"{CONFIG_FILE}: target_modules={targets!r} must be a list of module "
                         "names", "url")
    modules = _check_weights(weights, base, max_rank)
    return AdapterSpec(rank=rank, modules=modules, target_modules=targets)


def _check_weights(weights: Path, base: dict[str, tuple[int, int]] | None,
                   max_rank: int) -> list[str]:
    header = read_safetensors_header(weights)
    if not header:
        raise BadRequest(f"{WEIGHTS_FILE} holds no tensors", "url")
    parts: dict[str, dict[str, list[int]]] = {}
    for key, info in header.items():
        if info.get("dtype") not in SAFE_DTYPES:
            raise BadRequest(f"{WEIGHTS_FILE}: {key} is {info.get('dtype')}; adapter weights "
                             f"must be one of {', '.join(sorted(SAFE_DTYPES))}", "url")
        match = LORA_KEY.match(key)
        if match is None or len(info["shape"]) != 2:
            raise BadRequest(f"{WEIGHTS_FILE}: {key!r} is not a LoRA weight (expected "
                             f"{PEFT_PREFIX}<module>.lora_A.weight / .lora_B.weight, 2-D)",
                             "url")
        module = match["module"].removeprefix(PEFT_PREFIX)
        parts.setdefault(module, {})[match["part"]] = info["shape"]
    for module, shapes in parts.items():
        if set(shapes) != {"A", "B"}:
            raise BadRequest(f"{WEIGHTS_FILE}: {module} has lora_{''.join(shapes)} but not "
                             f"lora_{'B' if 'A' in shapes else 'A'}", "url")
        (r, a_in), (b_out, r_b) = shapes["A"], shapes["B"]
        if r != r_b or r > max_rank:
            raise BadRequest(f"{WEIGHTS_FILE}: {module} has rank {r} in lora_A and {r_b} in "
                             f"lora_B; both must match and be ≤ max_lora_rank {max_rank}", "url")
        if base is None:
            continue
        if module not in base:
            raise BadRequest(f"{WEIGHTS_FILE}: {module} is not a module of the base model",
                             "url")
        out, inp = base[module]
        if (a_in, b_out) != (inp, out):
            raise BadRequest(f"{WEIGHTS_FILE}: {module} maps {a_in} → {b_out} features but "
                             f"the base model's maps {inp} → {out}: this adapter was trained "
                             "for another model", "url")
    return sorted(parts)


def copy_local(source: Source, sources: AllowedSources, dest: Path) -> None:
    """Copies the adapter's config and safetensors (never a pickle) into ``dest``."""
    folder = source.local
    if folder is None or not folder.is_dir():
        raise BadRequest(f"url={source.url!r}: no such folder", "url")
    dest.mkdir(parents=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        path = folder / name
        if path.exists():
            shutil.copyfile(sources.check_file(path), dest / name)
    _note_pickles(folder.iterdir(), dest)


def fetch_s3(source: Source, dest: Path) -> None:
    """Downloads the adapter's config and safetensors from S3 (boto3's usual credential
    chain) into ``dest``; pickles are listed, never downloaded."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as e:
        raise BadRequest(f"url={source.url!r}: this image has no boto3 to fetch from S3 ({e})",
                         "url", 500) from None
    s3 = boto3.client("s3")
    prefix = source.prefix + "/" if source.prefix else ""
    dest.mkdir(parents=True)
    try:
        listing = s3.list_objects_v2(Bucket=source.bucket, Prefix=prefix, Delimiter="/")
        keys = [o["Key"] for o in listing.get("Contents", [])]
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if prefix + name in keys:
                s3.download_file(source.bucket, prefix + name, str(dest / name))
    except (BotoCoreError, ClientError) as e:
        raise BadRequest(f"url={source.url!r}: S3 refused the download: {e}", "url") from None
    if not keys:
        raise BadRequest(f"url={source.url!r}: no objects under that prefix", "url")
    _note_pickles((PurePosixPath(k) for k in keys), dest)


def _note_pickles(paths: Iterable, dest: Path) -> None:
    """Leaves an empty marker per pickle seen at the source, so the check can name it."""
    for p in paths:
        if p.suffix in PICKLE_SUFFIXES and not (dest / WEIGHTS_FILE).exists():
            (dest / p.name).touch()


def write_zero_adapter(dest: Path, base: dict[str, tuple[int, int]], rank: int = 1) -> None:
    """An adapter whose every delta is zero (lora_B = 0), on each layer's first attention
    projection: base-model requests carry it so no row of a batch runs without an adapter."""
    import numpy as np
    from safetensors.numpy import save_file

    for leaf in ("q_proj", "qkv_proj", "query_key_value", "c_attn", "o_proj"):
        chosen = sorted(m for m in base if m.rsplit(".", 1)[-1] == leaf)
        if chosen:
            break
    else:
        raise RuntimeError("the base model has no attention projection (q_proj, qkv_proj, "
                           "...) to carry the all-zero adapter")
    tensors = {}
    for module in chosen:
        out, inp = base[module]
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = np.zeros((rank, inp), np.float32)
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = np.zeros((out, rank), np.float32)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / WEIGHTS_FILE))
    (dest / CONFIG_FILE).write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": rank, "bias": "none",
        "target_modules": [leaf], "task_type": "CAUSAL_LM"}))


# -- the registry --------------------------------------------------------------------------
@dataclass(eq=False)
class Adapter:
    name: str
    url: str
    origin: str                           # "folder" (found at start-up) | "api" (POST /models)
    pinned: bool = False
    lora: Any = None                      # the LoRARequest while resident in the engine
    files: Path | None = None             # the checked copy the engine loaded
    inflight: int = 0
    loading: asyncio.Future | None = None
    removed: bool = False

    def describe(self) -> dict[str, str]:
        return {"modelName": self.name, "modelUrl": self.url}


@dataclass
class Lease:
    """One request's hold on an adapter (None: the base model): it cannot be evicted or
    unloaded until released."""
    registry: "AdapterRegistry"
    adapter: Adapter | None
    lora_request: Any
    released: bool = False

    @property
    def name(self) -> str | None:
        return self.adapter.name if self.adapter is not None else None

    def release(self) -> None:
        if not self.released and self.adapter is not None:
            self.released = True
            self.adapter.inflight -= 1
            self.registry._released.set()


@dataclass
class LoraLimits:
    """The engine's LoRA capacity as users see it (the all-zero adapter's slot excluded)."""
    gpu_slots: int
    cpu_slots: int
    max_rank: int


class AdapterRegistry:
    """Every adapter by name, their residency in the engine, and the /models contract."""

    def __init__(self, engine, limits: LoraLimits, sources: AllowedSources, store: Path,
                 base_names: Iterable[str], base_modules: dict[str, tuple[int, int]] | None,
                 zero_adapter: bool) -> None:
        self.engine = engine                      # vLLM's AsyncLLM (add_lora, remove_lora…)
        self.limits = limits
        self.sources = sources
        self.store = store
        self.base_names = {n for n in base_names if n}
        self.base_modules = base_modules
        self.zero_adapter = zero_adapter
        self._adapters: dict[str, Adapter] = {}
        self._resident: OrderedDict[str, Adapter] = OrderedDict()   # LRU, oldest first
        self._active: OrderedDict[str, None] = OrderedDict()        # mirror of the GPU slots
        self._slots = asyncio.Lock()              # one load or eviction at a time
        self._released = asyncio.Event()
        self._next_id = 1
        self._base_request = None

    # -- start-up ----------------------------------------------------------------------------
    async def start(self, model_dir: Path | None, adapters_dir: Path | None = None) -> None:
        """Loads the all-zero adapter (when used) and registers the adapters found in
        ``adapters_dir`` (default: the model folder's ``adapters/``)."""
        from vllm.lora.request import LoRARequest

        if self.zero_adapter:
            if self.base_modules is None:
                raise RuntimeError("LoRA needs the base model's safetensors to build the "
                                   "all-zero adapter for base-model requests; none were found")
            dest = self.store / BASE_ZERO_NAME
            await asyncio.to_thread(write_zero_adapter, dest, self.base_modules)
            request = LoRARequest(BASE_ZERO_NAME, self._new_id(), str(dest))
            await self.engine.add_lora(request)
            await self.engine.pin_lora(request.lora_int_id)
            self._base_request = request
        folder = adapters_dir or (model_dir / "adapters" if model_dir is not None else None)
        if folder is not None and folder.is_dir():
            for path in sorted(folder.iterdir()):
                if not path.is_dir():
                    continue
                if not NAME_PATTERN.match(path.name) or path.name in self.base_names:
                    log.warning("adapter folder %s skipped: its name is not a usable adapter "
                                "name (letters, digits, '.', '_', '-'; not the base model's)",
                                path)
                    continue
                self._adapters[path.name] = Adapter(path.name, str(path), "folder")
                self._show(self._adapters[path.name])
        log.info("LoRA on: %d GPU slots, %d in the CPU cache, rank ≤ %d, %d adapters "
                 "registered from %s%s", self.limits.gpu_slots, self.limits.cpu_slots,
                 self.limits.max_rank, len(self._adapters), folder,
                 "; base-model requests carry an all-zero adapter" if self.zero_adapter else "")

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # -- requests ----------------------------------------------------------------------------
    def is_base(self, name: str | None) -> bool:
        return name is None or name in self.base_names

    async def acquire(self, name: str | None) -> Lease:
        """The adapter a request names, loaded (base names and None: the base model).
        BadRequest 404 for an unknown name."""
        if self.is_base(name):
            return Lease(self, None, self._base_request)
        adapter = self.get(name)
        if adapter.lora is not None:
            metrics.ADAPTER_HITS.labels(name).inc()
        while adapter.lora is None:               # another load may evict it before we run
            await self._ensure_loaded(adapter)
            if adapter.removed:
                raise self._unknown(name)
        adapter.inflight += 1
        self._touch(adapter)
        return Lease(self, adapter, adapter.lora)

    def get(self, name: str) -> Adapter:
        adapter = self._adapters.get(name)
        if adapter is None:
            raise self._unknown(name)
        return adapter

    def _unknown(self, name: str) -> BadRequest:
        loaded = sorted(a.name for a in self._resident.values())
        known = sorted(self._adapters)
        return BadRequest(
            f"no adapter {name!r} on this server: the base model is "
            f"{' or '.join(repr(n) for n in sorted(self.base_names))}; adapters: "
            f"{', '.join(known) or 'none'} (loaded now: {', '.join(loaded) or 'none'}); "
            "load one with POST /models {\"model_name\", \"url\"}", "model", 404)

    def where(self, adapter: Adapter) -> str:
        if adapter.lora is None:
            return "registered"
        return "gpu" if adapter.name in self._active else "cpu"

    def _touch(self, adapter: Adapter) -> None:
        self._resident.move_to_end(adapter.name)
        if adapter.name in self._active:
            self._active.move_to_end(adapter.name)
            return
        # vLLM activates the adapters it runs into its GPU slots, least recently used out.
        self._active[adapter.name] = None
        changed = [adapter]
        while len(self._active) > self.limits.gpu_slots:
            out = self._adapters.get(self._active.popitem(last=False)[0])
            if out is not None:
                changed.append(out)
        for a in changed:
            self._show(a)

    def _show(self, adapter: Adapter) -> None:
        where = self.where(adapter) if not adapter.removed else None
        for place in ("gpu", "cpu", "registered"):
            metrics.ADAPTER_RESIDENT.labels(adapter.name, place).set(1 if place == where else 0)

    # -- loading -----------------------------------------------------------------------------
    async def _ensure_loaded(self, adapter: Adapter) -> None:
        """Single-flight: every caller for a cold adapter awaits the same load."""
        if adapter.loading is None:
            adapter.loading = asyncio.ensure_future(self._load(adapter))
        await asyncio.shield(adapter.loading)

    async def _load(self, adapter: Adapter) -> None:
        from vllm.lora.request import LoRARequest

        started = time.monotonic()
        lora_id = self._new_id()
        dest = self.store / f"{adapter.name}-{lora_id}"
        try:
            spec = await asyncio.to_thread(self._prepare, adapter, dest)
            async with self._slots:
                if adapter.removed:
                    raise self._unknown(adapter.name)
                self._check_room(adapter)
                request = LoRARequest(f"{adapter.name}-{lora_id}", lora_id, str(dest))
                try:
                    # The engine's cache has one spare slot: the new adapter goes in before
                    # anything is evicted, so one that vLLM refuses costs no other adapter.
                    await self.engine.add_lora(request)
                except Exception as e:        # noqa: BLE001 - vLLM's own check failed
                    raise BadRequest(f"the engine refused adapter {adapter.name!r}: "
                                     f"{type(e).__name__}: {e}", "url") from None
                adapter.lora, adapter.files = request, dest
                self._resident[adapter.name] = adapter
                self._touch(adapter)
                await self._make_room(adapter)
            seconds = time.monotonic() - started
            metrics.ADAPTER_LOADS.labels(adapter.name).inc()
            metrics.ADAPTER_LOAD_SECONDS.labels(adapter.name).observe(seconds)
            log.info("adapter %s loaded in %.3f s (rank %d, %d modules, from %s)",
                     adapter.name, seconds, spec.rank, len(spec.modules), adapter.url)
        except BaseException as e:
            metrics.ADAPTER_LOAD_FAILURES.labels(adapter.name).inc()
            if adapter.lora is None:
                await asyncio.to_thread(shutil.rmtree, dest, True)
            if isinstance(e, BadRequest):
                log.warning("adapter %s not loaded: %s", adapter.name, e)
            raise
        finally:
            adapter.loading = None

    def _prepare(self, adapter: Adapter, dest: Path) -> AdapterSpec:
        """(thread) The source checked again (a folder can change), its files copied into
        this server's store and checked there: what the engine loads is what was checked."""
        source = self.sources.check(adapter.url)
        if source.local is not None:
            copy_local(source, self.sources, dest)
        else:
            fetch_s3(source, dest)
        return check_adapter_folder(dest, self.base_modules, self.limits.max_rank)

    def _check_room(self, incoming: Adapter) -> None:
        """507 when the cache is full of pinned adapters (SageMaker then unloads some)."""
        resident = list(self._resident.values())
        if len(resident) >= self.limits.cpu_slots and all(a.pinned for a in resident):
            raise BadRequest(
                f"no room for adapter {incoming.name!r}: all {self.limits.cpu_slots} adapter "
                f"slots hold pinned adapters ({', '.join(self._resident)}); DELETE "
                "/models/<name> one of them, or start the server with a larger "
                "SM_VLLM_MAX_CPU_LORAS", "model_name", 507)

    async def _make_room(self, incoming: Adapter) -> None:
        """(under the slots lock) Evicts least recently used adapters, never a pinned one or
        one with requests running, until the cache is within its size again."""
        deadline = time.monotonic() + SLOT_WAIT_S
        while len(self._resident) > self.limits.cpu_slots:
            victim = next((a for a in self._resident.values()
                           if a is not incoming and not a.pinned and a.inflight == 0), None)
            if victim is not None:
                await self._evict(victim)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                await self._evict(incoming, count=False)
                raise BadRequest(f"no room for adapter {incoming.name!r}: every resident "
                                 f"adapter had requests running for {SLOT_WAIT_S:g} s; retry",
                                 "model_name", 503)
            self._released.clear()
            try:
                await asyncio.wait_for(self._released.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def _evict(self, adapter: Adapter, count: bool = True) -> None:
        request, files = adapter.lora, adapter.files
        adapter.lora = adapter.files = None
        self._resident.pop(adapter.name, None)
        self._active.pop(adapter.name, None)
        try:
            await self.engine.remove_lora(request.lora_int_id)
        finally:
            if files is not None:
                await asyncio.to_thread(shutil.rmtree, files, True)
            if count:
                metrics.ADAPTER_EVICTIONS.labels(adapter.name).inc()
            self._show(adapter)

    # -- the multi-model contract ------------------------------------------------------------
    async def load(self, name: Any, url: Any, pinned: Any = False) -> Adapter:
        """POST /models: 409 for a name already known, 403/400 for the source, 507 when every
        slot is pinned."""
        if name in self.base_names:
            raise BadRequest(f"model_name={name!r} is the base model's name: choose another",
                             "model_name", 409)
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise BadRequest(f"model_name={name!r}: 1-128 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit", "model_name")
        if not isinstance(pinned, bool):
            raise BadRequest(f"pinned={pinned!r} must be true or false", "pinned")
        if name in self._adapters:
            raise BadRequest(f"model {name!r} is already loaded (from "
                             f"{self._adapters[name].url}): DELETE /models/{name} first to "
                             "load other files under that name", "model_name", 409)
        self.sources.check(url)               # 400/403 before anything is touched
        adapter = Adapter(name, url.strip(), "api", pinned=pinned)
        self._adapters[name] = adapter
        try:
            await self._ensure_loaded(adapter)
        except BaseException:
            if self._adapters.get(name) is adapter:
                del self._adapters[name]
            raise
        self._show(adapter)
        return adapter

    async def unload(self, name: str) -> None:
        """DELETE /models/<name>: later requests get 404; frees the engine's slot once the
        requests already running on it end."""
        adapter = self.get(name)
        del self._adapters[name]
        adapter.removed = True
        if adapter.loading is not None:
            try:
                await asyncio.shield(adapter.loading)
            except BaseException:             # noqa: BLE001 - it is going anyway
                pass
        while adapter.inflight:
            self._released.clear()
            await self._released.wait()
        async with self._slots:
            if adapter.lora is not None:
                await self._evict(adapter, count=False)
        for place in ("gpu", "cpu", "registered"):
            try:
                metrics.ADAPTER_RESIDENT.remove(name, place)
            except KeyError:
                pass
        log.info("adapter %s unloaded", name)

    async def evict(self, name: str) -> bool:
        """Takes a loaded adapter out of the engine once the requests running on it end,
        counted as an eviction; it stays registered, and its next request loads it again (a
        host's own cache, Ray Serve's multiplexing, evicts through this). Idempotent: False
        when ``name`` is unknown or not loaded."""
        adapter = self._adapters.get(name)
        if adapter is None:
            return False
        if adapter.loading is not None:
            try:
                await asyncio.shield(adapter.loading)
            except Exception:                 # noqa: BLE001 - a failed load left nothing
                pass
        while True:
            while adapter.inflight:
                self._released.clear()
                await self._released.wait()
            async with self._slots:
                if adapter.inflight:          # a request took it while we waited for the lock
                    continue
                if adapter.lora is None or adapter.removed:
                    return False
                await self._evict(adapter)
                log.info("adapter %s evicted", name)
                return True

    def page(self, token: str | None, max_results: int) -> tuple[list[Adapter], str | None]:
        """GET /models: adapters in name order from ``token`` (the name to start at, opaque)."""
        start = ""
        if token:
            try:
                padded = token.encode("ascii") + b"=" * (-len(token) % 4)
                start = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
            except (ValueError, UnicodeError):
                start = ""
            if not NAME_PATTERN.match(start):
                raise BadRequest(f"next_page_token={token!r} is not a token this server "
                                 "gave: start again without it", "next_page_token")
        names = sorted(n for n in self._adapters if n >= start)
        chosen = names[:max_results]
        following = names[max_results] if len(names) > max_results else None
        token = (base64.urlsafe_b64encode(following.encode()).decode().rstrip("=")
                 if following else None)
        return [self._adapters[n] for n in chosen], token

    def status(self, adapter: Adapter) -> dict[str, Any]:
        return adapter.describe() | {"residency": self.where(adapter), "pinned": adapter.pinned,
                                     "origin": adapter.origin,
                                     "requestsRunning": adapter.inflight}

    def all(self) -> list[Adapter]:
        return [self._adapters[n] for n in sorted(self._adapters)]
