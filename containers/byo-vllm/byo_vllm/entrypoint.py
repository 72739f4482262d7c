"""The image's entrypoint, as a function: SageMaker runs `docker run IMAGE serve` (the script
``containers/byo-vllm/serve``), and ``spectrum serve`` runs the same ``main`` from an install.

Reads the configuration from the environment (see byo_vllm/config.py), stops with exit 2
and a message naming every bad setting, else starts the server on SAGEMAKER_BIND_TO_PORT
(default 8080) and serves until SIGTERM.
"""
import sys

from byo_vllm.config import ConfigError, settings_from_env


def main(argv: list, prog: str = "serve") -> int:
    """``argv`` without the program name; SageMaker passes the one word ``serve``."""
    if argv not in ([], ["serve"]):
        print(f"unexpected arguments {argv}\nusage: {prog} [serve]   (configuration comes from the "
              "environment)", file=sys.stderr)
        return 2
    try:
        settings = settings_from_env()
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    from byo_vllm.server import run
    run(settings)
    return 0
