"""The server's configuration, read from the environment the way SageMaker users write it.

Three conventions meet here, so a configuration written for another rung runs unchanged:
- the model: ``SM_VLLM_MODEL``, then ``/opt/ml/model`` (SageMaker's unpacked ``ModelDataUrl``),
  then ``HF_MODEL_ID`` (AWS's vLLM image order); LMI's ``OPTION_MODEL_ID`` too;
- vLLM's ``SM_VLLM_*``: prefix stripped, lowercased, ``_`` → ``-`` gives the engine flag
  (an empty value is a bare flag);
- LMI's ``OPTION_*`` (rung 3): renamed where LMI's name differs from vLLM's
  (``OPTION_MAX_ROLLING_BATCH_SIZE`` → ``max_num_seqs`` ...), passed through otherwise;
  options that only steer LMI itself are accepted and ignored, with the reason logged.
``SM_NUM_GPUS`` is the GPUs the instance has: the default tensor-parallel size, and a ceiling.

Everything here is plain Python (no vLLM import), so ``serve`` checks the environment
before it binds the port. Names of engine flags are checked against vLLM's own parser later,
in the worker (``engine_args.py``), because importing vLLM takes seconds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

# The image carries this package and the project's core (options.core), nothing else.
from options.core import MASK, is_secret_name

SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
DEFAULT_PORT = 8080
# SageMaker's real-time payload limit.
MAX_BODY_BYTES = 6 * 1024 * 1024
# gunicorn halts the whole server when its worker exits with this code.
WORKER_BOOT_ERROR = 3


class ConfigError(ValueError):
    """Settings the user must fix; the message names every offending variable."""


# LMI option → vLLM engine argument, where the names differ.
LMI_RENAMED = {
    "tensor_parallel_degree": "tensor_parallel_size",
    "max_rolling_batch_size": "max_num_seqs",
    "max_rolling_batch_prefill_tokens": "max_num_batched_tokens",
    "pipeline_parallel_degree": "pipeline_parallel_size",
    "quantize": "quantization",
}
# LMI options that steer LMI's own machinery; this server has one engine and one way to run
# it, so they are accepted and ignored (value → why), unless the value asks for something
# this server cannot do.
LMI_IGNORED = {
    "rolling_batch": ({"auto", "vllm", "lmi-dist", "disable"},
                      "this server always batches continuously with vLLM"),
    "serving_loader": ({"vllm"}, "the engine is always vLLM"),
    "async_mode": (None, "the engine adapter is always asynchronous"),
    "engine": ({"python", "mpi"}, "one engine process per server"),
    "entrypoint": (None, "selects the model.py backend (see backend selection)"),
    "output_formatter": (None, "the answer's format follows the request's dialect"),
    "model_loading_timeout": (None, "start-up waits on /ping instead"),
    "task": (None, "text generation only"),
    "mpi_mode": (None, "one engine process per server"),
}
# Shortcuts LMI reads without the OPTION_ prefix.
LMI_SHORTCUTS = {"TENSOR_PARALLEL_DEGREE": "tensor_parallel_degree",
                 "MAX_BATCH_SIZE": "max_rolling_batch_size"}
TRUTHY = {"", "1", "true", "yes", "on"}
FALSY = {"0", "false", "no", "off"}
# Settings of the server itself (not the engine).
SERVER_PREFIX = "SPECTRUM_SERVER_"


@dataclass
class EngineArg:
    """One engine argument, with the variable(s) it came from, for messages."""
    name: str           # vLLM's flag name with underscores: "max_num_seqs"
    value: str          # as written in the environment ("" means a bare flag)
    source: str         # "OPTION_MAX_ROLLING_BATCH_SIZE"


@dataclass
class ServerSettings:
    model: str
    model_source: str
    port: int
    host: str = "0.0.0.0"
    engine_args: dict[str, EngineArg] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)      # "OPTION_X=y (why)"
    threads: int = 64                                      # blocking work: model.py calls
    graceful_timeout_s: int = 25                           # SageMaker kills 30 s after SIGTERM
    # A client must send its request's headers, and each part of its body, within this time
    # (nginx's client_header_timeout / client_body_timeout): a stalled client is dropped.
    read_timeout_s: int = 30
    served_model_name: str = ""
    # Level 4: serve through the user's model.py instead of vLLM (interface 6).
    handler_entrypoint: Path | None = None
    lmi_properties: dict[str, str] = field(default_factory=dict)
    # LoRA adapters: roots a load may read from beyond the model folder and /opt/ml/models
    # (absolute folders, s3:// prefixes), and whether base-model requests carry an all-zero
    # adapter ("auto": where vLLM's LoRA kernels need it, i.e. its CPU torch ops).
    adapter_sources: tuple[str, ...] = ()
    base_zero_adapter: str = "auto"
    # A folder of adapters (<name>/ each) registered at start-up instead of the model folder's
    # adapters/: where a pod's init container puts them when the model comes from the hub.
    adapters_dir: str | None = None

    def describe(self) -> dict:
        """The effective configuration, for the one start-up log line (secrets masked)."""
        return {
            "model": self.model, "model_source": self.model_source,
            "served_model_name": self.served_model_name,
            "bind": f"{self.host}:{self.port}", "threads": self.threads,
            "graceful_timeout_s": self.graceful_timeout_s, "read_timeout_s": self.read_timeout_s,
            "backend": "lmi_handler" if self.handler_entrypoint else "vllm",
            "handler_entrypoint": str(self.handler_entrypoint) if self.handler_entrypoint else None,
            "engine_args": {a.name: MASK if is_secret_name(a.name) else a.value
                            for a in self.engine_args.values()},
            "engine_arg_sources": {a.name: a.source for a in self.engine_args.values()},
            "ignored": self.ignored,
            "adapter_sources": list(self.adapter_sources),
            "base_zero_adapter": self.base_zero_adapter,
            "prefix_caching": self.prefix_caching_said(),
            "adapters_dir": self.adapters_dir,
        }


    def prefix_caching_said(self) -> str:
        """Where prefix caching's setting comes from. Unset, vLLM 0.32 turns it on for every
        model that supports it (generative decoders; pooling models with last-token pooling)
        and off for the rest, where forcing it on gives wrong vectors: so the server leaves it
        to vLLM, and SM_VLLM_ENABLE_PREFIX_CACHING=false turns it off."""
        arg = self.engine_args.get("enable_prefix_caching")
        if arg is not None:
            return f"{arg.value or 'true'}, as set by {arg.source}"
        return "vLLM's default: on wherever the model supports it"


def settings_from_env(env: Mapping[str, str] | None = None) -> ServerSettings:
    """Read and check the environment; raises ConfigError naming every problem found."""
    env = dict(os.environ if env is None else env)
    problems: list[str] = []
    args: dict[str, EngineArg] = {}
    ignored: list[str] = []

    def put(name: str, value: str, source: str) -> None:
        if name in args and _normal(args[name].value) != _normal(value):
            problems.append(f"{args[name].source}={args[name].value!r} and {source}={value!r} "
                            f"both set engine argument {name!r} to different values: keep one")
            return
        args.setdefault(name, EngineArg(name, value, source))

    # vLLM's own convention first: it is the most specific.
    for key in sorted(env):
        if key.startswith("SM_VLLM_") and key != "SM_VLLM_MODEL":
            name = key[len("SM_VLLM_"):].lower()
            if not name:
                problems.append(f"{key} names no engine argument")
                continue
            put(name, env[key].strip(), key)

    lmi = {f"OPTION_{k.upper()}": v for k, v in _lmi_options(env).items()}
    for key in sorted(lmi):
        option = key[len("OPTION_"):].lower()
        value = lmi[key].strip()
        if option == "model_id":
            continue                                     # the model, read below
        if option in LMI_IGNORED:
            allowed, why = LMI_IGNORED[option]
            if allowed is not None and value.lower() not in allowed:
                problems.append(f"{key}={value!r} is not supported here ({why}); "
                                f"use one of {sorted(allowed)} or remove it")
            else:
                ignored.append(f"{key}={value} ({why})")
            continue
        name = LMI_RENAMED.get(option, option)
        put(name, value, key)

    _resolve_tensor_parallel(env, args, problems)
    model, model_source = _resolve_model(env, problems)
    port = _int_setting(env, "SAGEMAKER_BIND_TO_PORT", DEFAULT_PORT, problems, 1, 65535)
    threads = _int_setting(env, SERVER_PREFIX + "THREADS", 64, problems, 1, 4096)
    graceful = _int_setting(env, SERVER_PREFIX + "GRACEFUL_TIMEOUT", 25, problems, 1, 3600)
    read_timeout = _int_setting(env, SERVER_PREFIX + "READ_TIMEOUT", 30, problems, 1, 3600)
    entrypoint = _handler_entrypoint(env, model, problems)
    adapter_sources = _adapter_sources(env, problems)
    adapters_dir = env.get(SERVER_PREFIX + "ADAPTERS_DIR", "").strip() or None
    if adapters_dir and (not adapters_dir.startswith("/") or ".." in Path(adapters_dir).parts):
        problems.append(f"{SERVER_PREFIX}ADAPTERS_DIR={adapters_dir!r} must be an absolute "
                        "folder without '..'")
    zero = env.get(SERVER_PREFIX + "BASE_ZERO_ADAPTER", "auto").strip().lower() or "auto"
    if zero not in ("auto", "true", "false"):
        problems.append(f"{SERVER_PREFIX}BASE_ZERO_ADAPTER={zero!r} must be auto, true or false")
    if problems:
        raise ConfigError("the server cannot start with these settings:\n  - "
                          + "\n  - ".join(problems))
    served = args["served_model_name"].value if "served_model_name" in args else model
    return ServerSettings(
        model=model, model_source=model_source, port=port,
        host=env.get(SERVER_PREFIX + "HOST", "0.0.0.0"), engine_args=args, ignored=ignored,
        threads=threads, graceful_timeout_s=graceful, read_timeout_s=read_timeout,
        served_model_name=served,
        handler_entrypoint=entrypoint,
        adapter_sources=adapter_sources, base_zero_adapter=zero, adapters_dir=adapters_dir,
        lmi_properties={k[len("OPTION_"):].lower(): v for k, v in lmi.items()} | {
            "model_id": model},
    )


def _lmi_options(env: Mapping[str, str]) -> dict[str, str]:
    """OPTION_* plus LMI's unprefixed shortcuts (the prefixed form wins, as in LMI)."""
    out = {k[len("OPTION_"):]: v for k, v in env.items() if k.startswith("OPTION_") and len(k) > 7}
    for short, option in LMI_SHORTCUTS.items():
        if short in env and option.upper() not in out:
            out[option.upper()] = env[short]
    return out


def _normal(value: str) -> str:
    v = value.strip().lower()
    return "true" if v in TRUTHY else "false" if v in FALSY else v


def _resolve_tensor_parallel(env: Mapping[str, str], args: dict[str, EngineArg],
                             problems: list[str]) -> None:
    gpus = None
    if "SM_NUM_GPUS" in env:
        gpus = _int_setting(env, "SM_NUM_GPUS", 0, problems, 0, 64)
    tp = args.get("tensor_parallel_size")
    if tp is not None and tp.value.lower() == "max":          # LMI's default spelling
        if not gpus:
            problems.append(f"{tp.source}=max needs SM_NUM_GPUS (the GPUs on the instance)")
            return
        args["tensor_parallel_size"] = EngineArg("tensor_parallel_size", str(gpus), tp.source)
        tp = args["tensor_parallel_size"]
    if tp is not None:
        try:
            size = int(tp.value)
        except ValueError:
            problems.append(f"{tp.source}={tp.value!r} is not a whole number of GPUs")
            return
        if size < 1:
            problems.append(f"{tp.source}={size} must be at least 1")
        elif gpus and size > gpus:
            problems.append(f"{tp.source}={size} needs {size} GPUs but SM_NUM_GPUS={gpus}: "
                            f"use at most {gpus}, or an instance with more GPUs")
    elif gpus and gpus > 1:
        args["tensor_parallel_size"] = EngineArg("tensor_parallel_size", str(gpus), "SM_NUM_GPUS")


def _resolve_model(env: Mapping[str, str], problems: list[str]) -> tuple[str, str]:
    named = [(k, env[k].strip()) for k in ("SM_VLLM_MODEL", "OPTION_MODEL_ID", "HF_MODEL_ID")
             if env.get(k, "").strip()]
    distinct = {v for _, v in named}
    if len(distinct) > 1:
        problems.append("the model is named differently by " + ", ".join(
            f"{k}={v!r}" for k, v in named) + ": set only one")
    if named:
        return named[0][1], named[0][0]
    model_dir = Path(env.get(SERVER_PREFIX + "MODEL_DIR", str(SAGEMAKER_MODEL_DIR)))
    if model_dir.is_dir() and any(model_dir.iterdir()):
        return str(model_dir), str(model_dir)
    problems.append(f"no model: set HF_MODEL_ID (a hub id or a folder) or SM_VLLM_MODEL, "
                    f"or put the model in {model_dir}")
    return "", ""


def _handler_entrypoint(env: Mapping[str, str], model: str, problems: list[str]) -> Path | None:
    """Level 4: OPTION_ENTRYPOINT naming a .py file, or a model.py in the model folder."""
    model_dir = Path(model) if model and Path(model).is_dir() else None
    entry = env.get("OPTION_ENTRYPOINT", "").strip()
    source = "OPTION_ENTRYPOINT"
    if not entry and model_dir is not None:             # LMI reads it from the folder too
        entry = _serving_property(model_dir / "serving.properties", "option.entryPoint")
        source = "option.entryPoint in serving.properties"
    if entry:
        if not entry.endswith(".py"):
            return None            # a module name LMI ships ("djl_python.vllm"): plain vLLM
        path = Path(entry)
        if not path.is_absolute() and model_dir is not None:
            path = model_dir / path
        if not path.is_file():
            problems.append(f"{source}={entry!r}: no such file (looked at {path})")
            return None
        return path
    if model_dir is not None and (model_dir / "model.py").is_file():
        return model_dir / "model.py"
    return None


def _adapter_sources(env: Mapping[str, str], problems: list[str]) -> tuple[str, ...]:
    """SPECTRUM_SERVER_ADAPTER_SOURCES: comma-separated absolute folders and s3:// prefixes
    that POST /models may load adapters from (besides the model folder and /opt/ml/models)."""
    key = SERVER_PREFIX + "ADAPTER_SOURCES"
    out = []
    for item in (i.strip() for i in env.get(key, "").split(",")):
        if not item:
            continue
        if item.startswith("s3://"):
            if not item[len("s3://"):].split("/")[0]:
                problems.append(f"{key}: {item!r} names no bucket (s3://bucket/prefix)")
                continue
        elif not item.startswith("/") or ".." in Path(item).parts:
            problems.append(f"{key}: {item!r} must be an absolute folder without '..' or an "
                            "s3://bucket/prefix")
            continue
        out.append(item)
    return tuple(out)


def _serving_property(path: Path, key: str) -> str:
    if not path.is_file():
        return ""
    for line in path.read_text(errors="replace").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower():
            return value.strip()
    return ""


def _int_setting(env: Mapping[str, str], key: str, default: int, problems: list[str],
                 low: int, high: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        problems.append(f"{key}={raw!r} is not a whole number (expected {low}..{high})")
        return default
    if not low <= value <= high:
        problems.append(f"{key}={value} is out of range: expected {low}..{high}")
        return default
    return value
