"""The gateway's `serve` command, as a function: the image's script (containers/gateway/serve)
and ``spectrum gateway serve`` run this one parser.

Checks the config first and stops with exit 2 and a message naming every bad line and key,
else serves until SIGTERM (one uvicorn process; with --workers N > 1, gunicorn with N uvicorn
workers, which needs `store: redis://...`).
"""
import argparse
import os
import sys

from spectrum_gateway.config import ConfigError
from spectrum_gateway.errors import GatewayError


def build_parser(prog: str = "serve") -> argparse.ArgumentParser:
    """The gateway's flags (docs/gen_cli.py renders them into the CLI reference)."""
    parser = argparse.ArgumentParser(prog=prog, description="Spectrum's API gateway")
    parser.add_argument("serve", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--config", default=os.environ.get("SPECTRUM_GATEWAY_CONFIG", "gateway.yaml"),
                        help="the gateway config (default: $SPECTRUM_GATEWAY_CONFIG or gateway.yaml)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    return parser


def main(argv: list, prog: str = "serve") -> int:
    """``argv`` without the program name; the image is run as ``IMAGE serve --config ...``."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.serve not in (None, "serve"):
        parser.error(f"unexpected argument {args.serve!r}")
    from spectrum_gateway.server import run
    try:
        run(args.config, args.host, args.port, args.workers, args.log_level)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except GatewayError as e:      # the secret file unreadable
        print(f"{prog}: {e.message}", file=sys.stderr)
        return 2
    return 0
