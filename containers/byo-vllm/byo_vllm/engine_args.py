"""Settings → vLLM ``AsyncEngineArgs``, through vLLM's own command-line parser.

Going through the parser means every engine flag vLLM knows is accepted with vLLM's own
types, choices and spellings (``1k`` for 1000, ``--no-x`` for false), and an unknown name is
caught here with the variable that set it and the closest real names.
"""
from __future__ import annotations

import argparse
import difflib
import io
import logging
import os
import shutil
from contextlib import redirect_stderr
from typing import Mapping

from .config import FALSY, TRUTHY, ConfigError, ServerSettings

log = logging.getLogger("byo_vllm.engine_args")

# LMI spells dtypes its own way.
LMI_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
# Engine arguments through which the user chooses how the model runs (compiled or eager).
COMPILE_CHOICES = ("enforce_eager", "compilation_config", "optimization_level")


def engine_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="serve", exit_on_error=False)
    return AsyncEngineArgs.add_cli_args(parser)


def engine_argv(settings: ServerSettings, parser: argparse.ArgumentParser) -> list[str]:
    """The flags vLLM would be started with; ConfigError names every bad variable."""
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    argv = ["--model", settings.model]
    problems = []
    for arg in settings.engine_args.values():
        flag = "--" + arg.name.replace("_", "-")
        action = actions.get(flag)
        if action is None or arg.name == "model":
            known = [o[2:].replace("-", "_") for o in actions if o.startswith("--")]
            close = difflib.get_close_matches(arg.name, known, n=3)
            problems.append(f"{arg.source}: {arg.name!r} is not a vLLM engine argument"
                            + (f" (did you mean {', '.join(close)}?)" if close else ""))
            continue
        value = arg.value
        if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
            lowered = value.lower()
            if lowered in TRUTHY:
                argv.append(flag)
            elif lowered in FALSY and isinstance(action, argparse.BooleanOptionalAction):
                argv.append("--no-" + flag[2:])
            else:
                problems.append(f"{arg.source}={value!r}: {arg.name} is on or off "
                                f"(true/false, or empty for on)")
            continue
        if arg.name == "dtype":
            value = LMI_DTYPES.get(value.lower(), value)
        if value == "" and action.nargs not in ("?", "*"):
            problems.append(f"{arg.source} is empty but {arg.name} needs a value")
            continue
        try:
            # Typed as the flag is (choices of max_lora_rank are ints: "8" must match 8).
            typed = action.type(value) if action.type is not None and value != "" else value
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            problems.append(f"{arg.source}={value!r} is not a valid {arg.name}: {e}")
            continue
        if action.choices is not None and typed not in action.choices:
            problems.append(f"{arg.source}={value!r}: {arg.name} must be one of "
                            f"{', '.join(map(str, action.choices))}")
            continue
        argv += [flag, value] if value != "" else [flag]
    if problems:
        raise ConfigError("the engine cannot start with these settings:\n  - "
                          + "\n  - ".join(problems))
    return argv


def cpp_compiler() -> str | None:
    """The C++ compiler torch inductor would use (``$CXX``, else ``g++``), or None."""
    return shutil.which(os.environ.get("CXX") or "g++")


def compile_mode(settings: ServerSettings, on_cpu: bool, compiler: str | None,
                 env: Mapping[str, str]) -> tuple[list[str], dict[str, str], str]:
    """How the model runs: extra engine flags, environment for the engine's processes, and
    the start-up log line that says which.

    On CPU, vLLM compiles the model with torch inductor by default, and its sampler compiles
    a logprobs kernel whatever the mode; inductor builds C++ at run time, so without a
    compiler the engine dies at its first step. A CPU host without one therefore runs
    everything eager: ``--enforce-eager`` (unless the settings choose a mode) and
    ``TORCH_COMPILE_DISABLE=1`` (unless the environment sets it).
    """
    chosen = [settings.engine_args[n].source for n in COMPILE_CHOICES if n in settings.engine_args]
    if not on_cpu or compiler:
        where = f"C++ compiler {compiler}" if on_cpu else "this platform's default"
        said = f"as set by {', '.join(chosen)}" if chosen else "vLLM's default"
        return [], {}, f"compile mode: {said} ({where})"
    flags = [] if chosen else ["--enforce-eager"]
    extra_env = {} if "TORCH_COMPILE_DISABLE" in env else {"TORCH_COMPILE_DISABLE": "1"}
    said = f"as set by {', '.join(chosen)}" if chosen else "eager (--enforce-eager)"
    return flags, extra_env, (
        f"compile mode: {said}; no C++ compiler found ($CXX or g++), which torch inductor "
        f"needs, so torch.compile is off"
        + (" (TORCH_COMPILE_DISABLE=1)" if extra_env else "")
        + ": install g++ and python3-dev to compile the model")


def build_engine_args(settings: ServerSettings):
    """AsyncEngineArgs for the settings; ConfigError instead of argparse's exit."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    parser = engine_parser()
    argv = engine_argv(settings, parser)
    extra, engine_env, said = compile_mode(settings, current_platform.is_cpu(), cpp_compiler(),
                                           os.environ)
    log.info("%s", said)
    os.environ.update(engine_env)          # read by the engine's processes, spawned later
    argv += extra
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            namespace = parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError, ValueError) as e:
        raise ConfigError(f"vLLM rejected the engine flags {argv}: "
                          f"{err.getvalue().strip() or e}") from None
    return AsyncEngineArgs.from_cli_args(namespace)
