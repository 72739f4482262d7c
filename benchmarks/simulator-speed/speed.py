"""How long ``python -m cost simulate`` takes against the number of requests: the README's table.

    python benchmarks/simulator-speed/speed.py [--rounds 3] [--requests 10000,100000,1000000]

The shipped Azure conversation trace is scaled (``--scale``) to each request count and run
through ``python -m cost simulate ... --json`` in a subprocess, all six rungs with the default
policy search: the wall time a user waits, interpreter start-up and reading the trace included. Each size runs ``--rounds`` times, the sizes alternating within a round; the median
and the range are printed, since this machine's speed moves between runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # run as a script from anywhere: cost is the checkout's

BASE_ROWS = 19_366           # requests in the shipped trace


def one_run(requests: int, capacity_tok_s: float) -> tuple[float, int]:
    from cost.traces import AZURE_CONV_TRACE

    command = [sys.executable, "-m", "cost", "simulate", "--trace", str(AZURE_CONV_TRACE),
               "--scale", f"{requests / BASE_ROWS:.6f}", "--model", "meta.llama3-1-8b-instruct-v1:0",
               "--instance", "g5.xlarge", "--capacity", f"{capacity_tok_s:g}", "--slo-ttft-ms", "2000",
               "--slo-e2e-ms", "60000", "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)   # this checkout's cost
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"simulate exited {done.returncode}: {done.stderr.strip()}")
    return seconds, json.loads(done.stdout)["trace"]["requests"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/simulator-speed/speed.py", description=__doc__.split("\n")[0])
    p.add_argument("--requests", default="10000,100000,1000000")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--capacity", type=float, default=1500.0, help="output tok/s of one replica (default 1500)")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.requests.split(",")]
    times: dict[int, list[float]] = {n: [] for n in sizes}
    counts: dict[int, int] = {}
    for _ in range(args.rounds):
        for n in sizes:
            seconds, counts[n] = one_run(n, args.capacity)
            times[n].append(seconds)
    print("| requests | seconds, median [min, max] | µs per request |")
    print("|---:|---:|---:|")
    for n in sizes:
        med = statistics.median(times[n])
        print(f"| {counts[n]:,} | {med:.2f} [{min(times[n]):.2f}, {max(times[n]):.2f}] | {med / counts[n] * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
