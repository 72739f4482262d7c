"""python -m options.bedrock models [--region R] [--offline] [--json]: the text models and their prices."""
from __future__ import annotations

import argparse
import json
import sys

from options.core import BadInput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m options.bedrock",
                                     description="Bedrock (level 1) helpers.")
    sub = parser.add_subparsers(dest="command", required=True)
    models = sub.add_parser("models", help="text models a region offers, with prices per 1M tokens")
    models.add_argument("--region", default="us-east-1")
    models.add_argument("--endpoint-url", help="send the lookup to this endpoint (an emulator)")
    models.add_argument("--offline", action="store_true", help="list the price table; call nothing")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    try:
        return _models(args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _models(args: argparse.Namespace) -> int:
    from options.aws import Target
    from options.bedrock.catalogue import list_models

    client = None
    if not args.offline:
        client = Target("aws", region=args.region, endpoint_url=args.endpoint_url).client("bedrock")
    entries, offline_reason = list_models(client)
    if args.json:
        print(json.dumps({"region": args.region, "offline_reason": offline_reason,
                          "models": [e.to_json() for e in entries]}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if offline_reason:
        console.print(f"[yellow]{offline_reason}[/yellow]")
    table = Table(title=f"Bedrock text models ({args.region})")
    for col in ("model id", "name", "stream", "inference", "$ / 1M in", "$ / 1M out", "price as of"):
        table.add_column(col)
    money = lambda x: "-" if x is None else f"{x:g}"  # noqa: E731
    for e in sorted(entries, key=lambda e: e.model_id):
        table.add_row(e.model_id, e.name, {True: "yes", False: "no", None: "?"}[e.streaming],
                      ",".join(e.inference_types) or "?", money(e.input_per_million),
                      money(e.output_per_million), e.price_as_of or "-")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
