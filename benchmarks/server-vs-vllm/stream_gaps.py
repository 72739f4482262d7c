"""Probe: the gaps a client sees between a long stream's events, with the server started
two ways, side by side in one run:

- ``group``: in a process group of its own within the caller's session, as
  ``options.local_server.LocalServer`` starts it (and so the tests, the benchmarks and
  ``--target local``);
- ``session``: in a session of its own (``setsid``), as it was started before.

On Linux a session is a scheduling autogroup. The question is whether the engine's busy
processes, in a group of their own, keep the client's group off the CPU.

Both servers are loaded at once (an idle engine stops polling after a second); each round
streams once from each, in an order that alternates from round to round. A gap is the time
between two consecutive events as the client reads them.

    flock /tmp/spectrum-engine.lock .venv/bin/python benchmarks/server-vs-vllm/stream_gaps.py \\
        --rounds 6 --tokens 1800
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from options.local_server import LocalServer  # noqa: E402
from options.tiny_model import tiny_model_dir  # noqa: E402


class OwnSessionServer(LocalServer):
    """The server in a session (so an autogroup) of its own."""

    def spawn_options(self) -> dict:
        return {"start_new_session": True}


# Room for a stream long enough (seconds on CPU) to show a stall.
MAX_MODEL_LEN = 2048
PLACEMENTS = {"group": LocalServer, "session": OwnSessionServer}


def stream_gaps(url: str, tokens: int) -> dict:
    """One stream of ``tokens`` tokens; the largest gap, the gaps over 0.1 s, the duration."""
    started = time.monotonic()
    seen = []
    with requests.post(url + "/v1/completions", stream=True, timeout=300, json={
            "prompt": "The deployment spectrum", "max_tokens": tokens, "ignore_eos": True,
            "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                seen.append(time.monotonic())
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    return {"events": len(seen), "max_gap_s": round(max(gaps), 3),
            "gaps_over_100ms": sum(g > 0.1 for g in gaps),
            "first_event_s": round(seen[0] - started, 3),
            "duration_s": round(seen[-1] - started, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=1800)
    parser.add_argument("--json", type=Path, help="write every try's figures here")
    args = parser.parse_args()
    if args.tokens >= MAX_MODEL_LEN - 8:
        parser.error(f"--tokens {args.tokens} does not fit the engine's {MAX_MODEL_LEN}-token "
                     "context with the prompt: use fewer")
    model = str(tiny_model_dir())
    logs = Path(tempfile.mkdtemp(prefix="stream-gaps-"))
    env = {"HF_MODEL_ID": model, "SM_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
           "SM_VLLM_ENFORCE_EAGER": "", "VLLM_CPU_KVCACHE_SPACE": "1"}
    servers = {}
    try:
        for name, kind in PLACEMENTS.items():
            servers[name] = kind(env, log_path=logs / f"{name}.log").start()
        for server in servers.values():
            server.wait_ready()
        rows = []
        order = list(servers)
        for round_no in range(args.rounds):
            for name in order:
                row = {"round": round_no, "placement": name,
                       **stream_gaps(servers[name].url, args.tokens)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            order.reverse()
    finally:
        for server in servers.values():
            server.stop()
    print(f"\n{args.tokens}-token streams, {args.rounds} rounds; median [min, max]:")
    print("| placement | largest gap s | gaps over 0.1 s | duration s | tries with a gap over 0.5 s |")
    print("|---|---:|---:|---:|---:|")
    for name in servers:
        mine = [r for r in rows if r["placement"] == name]

        def spread(key: str) -> str:
            values = [r[key] for r in mine]
            return f"{statistics.median(values):g} [{min(values):g}, {max(values):g}]"
        stalled = sum(r["max_gap_s"] > 0.5 for r in mine)
        print(f"| {name} | {spread('max_gap_s')} | {spread('gaps_over_100ms')} | "
              f"{spread('duration_s')} | {stalled} of {len(mine)} |")
    if args.json:
        args.json.write_text(json.dumps({"tokens": args.tokens, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
