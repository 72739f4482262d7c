"""spectrum: one console script for every Spectrum command, so a newcomer learns one name.

Each subcommand hands the rest of the command line to the same ``main`` as its ``python -m``
module (one parser, two doors), passing ``prog`` so that its help says ``spectrum <command>``.
A command's module is imported only when that command runs: ``spectrum --help`` stays fast and
needs none of the heavy dependencies (boto3, vLLM, torch).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

# name → (module whose main(argv, prog) runs it, one line for the help)
COMMANDS = {
    "deploy": ("options.deploy", "deploy an LLM at one rung: local (default), emulator or aws"),
    "cost": ("cost.__main__", "prices, break-evens, monthly cost per rung, recommend, simulate"),
    "bench": ("options.bench.__main__", "measure TTFT / ITL / E2E / tok/s of any rung; replay traces"),
    "agent": ("options.agent.__main__", "the knowledge agent on any rung, traced and priced"),
    "gateway": (None, "the public API gateway: `spectrum gateway serve ...` or `... admin ...`"),
    "serve": ("byo_vllm.entrypoint", "the bring-your-own image's server, configured from the environment"),
    "check": ("options.check", "what a level needs (credentials, role, quota, tools) and whether it is there"),
}
GATEWAY_COMMANDS = {"serve": "spectrum_gateway.serve", "admin": "spectrum_gateway.admin"}
# In a checkout the images' packages sit beside their Dockerfiles (the images' scripts put
# them on sys.path the same way); an install carries both (byo_vllm, spectrum_gateway).
CHECKOUT = Path(__file__).resolve().parents[1]
IMAGE_DIRS = {"byo_vllm": CHECKOUT / "containers" / "byo-vllm",
              "spectrum_gateway": CHECKOUT / "containers" / "gateway"}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return ("usage: spectrum COMMAND [ARGS ...]\n\nDeploy and serve LLMs at every rung of the AWS "
            "spectrum, and find the cheapest rung for your traffic.\n\ncommands:\n"
            + "\n".join(lines) + "\n\n`spectrum COMMAND --help` shows a command's flags, the same as "
            "its `python -m` module's (or image script's).\n")


def _import(module: str):
    """Import a command's module; an image's package is looked for in the checkout too."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        folder = IMAGE_DIRS.get(top)
        if exc.name != top or folder is None or not (folder / top).is_dir():
            raise
        sys.path.insert(0, str(folder))
        return importlib.import_module(module)


def _gateway(argv: list[str]) -> int:
    if not argv or argv[0] not in GATEWAY_COMMANDS:
        got = f"unknown gateway command {argv[0]!r}" if argv and not argv[0].startswith("-") else "usage"
        print(f"spectrum gateway: {got}: spectrum gateway {{serve,admin}} [ARGS ...]\n"
              "  serve  run the gateway (--config gateway.yaml)\n"
              "  admin  API keys and usage (--config gateway.yaml keys|usage ...)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        module = _import(GATEWAY_COMMANDS[argv[0]])
    except ImportError as exc:
        print(f"spectrum gateway: the gateway cannot be imported here ({exc}). It needs its "
              "extra: pip install 'spectrum[gateway]' (pip install -e '.[gateway]' in a checkout), "
              "or run its image (containers/gateway/build).", file=sys.stderr)
        return 1
    return module.main(argv[1:], prog=f"spectrum gateway {argv[0]}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"spectrum: unknown command {name!r}: choose one of {', '.join(COMMANDS)}\n\n{usage()}",
              end="", file=sys.stderr)
        return 2
    if name == "gateway":
        return _gateway(rest)
    return _import(COMMANDS[name][0]).main(rest, prog=f"spectrum {name}")


if __name__ == "__main__":
    sys.exit(main())
