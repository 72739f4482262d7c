"""Settings → vLLM's ``vllm serve`` arguments, through vLLM's own command-line parser.

Going through the parser means every engine flag vLLM knows is accepted with vLLM's own
types, choices and spellings (``1k`` for 1000, ``--no-x`` for false), and an unknown name is
caught here with the variable that set it and the closest real names.

Beside the engine's flags, the settings may carry the flags of vLLM's OpenAI serving layer
that this server runs (``SERVING_FLAGS``: the tool-call parser, auto tool choice, the chat
template ...), as SageMaker's vLLM image passes ``SM_VLLM_TOOL_CALL_PARSER`` on to
``vllm serve``. The rest of ``vllm serve``'s own flags (host, port, API keys, TLS) belong to
its HTTP server, which this one replaces: they are refused by name, never ignored.
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


# The flags of vLLM's OpenAI serving layer (openai_layer.py) that the settings may set.
SERVING_FLAGS = frozenset({
    "tool_call_parser", "enable_auto_tool_choice", "tool_parser_plugin", "tool_strict_level",
    "exclude_tools_when_tool_choice_none", "chat_template", "chat_template_content_format",
    "default_chat_template_kwargs", "trust_request_chat_template", "response_role",
    "return_tokens_as_token_ids", "enable_prompt_tokens_details", "enable_force_include_usage",
})


def engine_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s parser: the engine's flags and its serving layer's."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="serve", exit_on_error=False))


def _engine_flag_names() -> frozenset[str]:
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))


def engine_argv(settings: ServerSettings, parser: argparse.ArgumentParser) -> list[str]:
    """The flags vLLM would be started with; ConfigError names every bad variable."""
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    usable = _engine_flag_names() | SERVING_FLAGS
    argv = ["--model", settings.model]
    problems = []
    for arg in settings.engine_args.values():
        flag = "--" + arg.name.replace("_", "-")
        action = actions.get(flag)
        if action is not None and arg.name not in usable:
            problems.append(f"{arg.source}: {arg.name!r} is a flag of vllm serve's own HTTP "
                            "server, which this server replaces (it listens on 8080, as "
                            "SageMaker expects): leave it out")
            continue
        if action is None or arg.name == "model":
            known = sorted(usable)
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


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX), as vLLM's CPU
    platform asks torch."""
    import torch
    return any(getattr(torch.cpu, name, lambda: False)()
               for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def cpu_dtype(settings: ServerSettings, on_cpu: bool, native_bf16: bool) -> tuple[list[str], str | None]:
    """The model's dtype on a CPU without bfloat16 instructions: extra engine flags and the
    start-up log line (None where nothing changes).

    On CPU, vLLM runs a model in bfloat16 unless told otherwise. Without AVX512-BF16 or AMX
    that is emulated: oneDNN refuses the matmul and torch's fallback is slow (a tiny Llama on
    an AVX2 host: 1,130-1,330 output tok/s in bfloat16 against 2,400-2,540 in float32, and
    its prefill twice as slow). So where the settings choose no dtype, such a host runs
    float32; a dtype the settings choose is kept.
    """
    if not on_cpu or native_bf16:
        return [], None
    if "dtype" in settings.engine_args:
        return [], (f"dtype: as set by {settings.engine_args['dtype'].source}; this CPU has no "
                    "bfloat16 instructions (AVX512-BF16 or AMX), so bfloat16 runs emulated")
    return ["--dtype", "float32"], ("dtype: float32 (--dtype float32): this CPU has no bfloat16 "
                                    "instructions (AVX512-BF16 or AMX), where bfloat16 runs emulated "
                                    "and about half as fast; set SM_VLLM_DTYPE to choose another")


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
    return AsyncEngineArgs.from_cli_args(parse_serve_args(settings))


def parse_serve_args(settings: ServerSettings) -> argparse.Namespace:
    """``vllm serve``'s parsed arguments for the settings (the engine's and the serving
    layer's), checked as ``vllm serve`` checks them; ConfigError instead of argparse's exit."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.platforms import current_platform

    parser = engine_parser()
    argv = engine_argv(settings, parser)
    on_cpu = current_platform.is_cpu()
    extra, engine_env, said = compile_mode(settings, on_cpu, cpp_compiler(), os.environ)
    log.info("%s", said)
    os.environ.update(engine_env)          # read by the engine's processes, spawned later
    argv += extra
    dtype_flags, said = cpu_dtype(settings, on_cpu, on_cpu and cpu_has_native_bf16())
    if said:
        log.info("%s", said)
    argv += dtype_flags
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            namespace = parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError, ValueError) as e:
        raise ConfigError(f"vLLM rejected the engine flags {argv}: "
                          f"{err.getvalue().strip() or e}") from None
    namespace.served_model_name = [settings.served_model_name]
    try:
        validate_parsed_serve_args(namespace)
    except (TypeError, ValueError) as e:     # e.g. auto tool choice without a parser
        raise ConfigError(f"vLLM rejected the serving flags {argv}: {e}; the settings' "
                          "names are the flags' in upper case after SM_VLLM_ (or OPTION_), "
                          "e.g. SM_VLLM_TOOL_CALL_PARSER=pythonic") from None
    return namespace
