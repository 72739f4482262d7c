"""Settings → vLLM ``AsyncEngineArgs``, through vLLM's own command-line parser.

Going through the parser means every engine flag vLLM knows is accepted with vLLM's own
types, choices and spellings (``1k`` for 1000, ``--no-x`` for false), and an unknown name is
caught here with the variable that set it and the closest real names.
"""
from __future__ import annotations

import argparse
import difflib
import io
from contextlib import redirect_stderr

from .config import FALSY, TRUTHY, ConfigError, ServerSettings

# LMI spells dtypes its own way.
LMI_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


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
            if action.type is not None and value != "":
                action.type(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            problems.append(f"{arg.source}={value!r} is not a valid {arg.name}: {e}")
            continue
        if action.choices is not None and value not in action.choices:
            problems.append(f"{arg.source}={value!r}: {arg.name} must be one of "
                            f"{', '.join(map(str, action.choices))}")
            continue
        argv += [flag, value] if value != "" else [flag]
    if problems:
        raise ConfigError("the engine cannot start with these settings:\n  - "
                          + "\n  - ".join(problems))
    return argv


def build_engine_args(settings: ServerSettings):
    """AsyncEngineArgs for the settings; ConfigError instead of argparse's exit."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser = engine_parser()
    argv = engine_argv(settings, parser)
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            namespace = parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError, ValueError) as e:
        raise ConfigError(f"vLLM rejected the engine flags {argv}: "
                          f"{err.getvalue().strip() or e}") from None
    return AsyncEngineArgs.from_cli_args(namespace)
