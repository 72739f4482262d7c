"""Probe: the floor relay (``floor_relay.py``) pulling each chunk from the upstream (the
request's task woken for each, ``pull_app``) against the same relay pushing it (written from
the upstream connection's callback, ``http1.Response.pump`` into ``asgi.writer``, as the
gateway relays: ``app``, the bench's floor), side by side in alternating rounds: what pushing
saves per streamed token on the bare stack.

    .venv/bin/python containers/gateway/bench/push_probe.py --rounds 4 --concurrency 8,32
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    import run as bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", default="8,32")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="push-probe-"))
    upstream = bench.start_upstream(log_dir, 0.002)
    servers = [upstream]
    try:
        for relay, name in (("pull_app", "pull"), ("app", "push")):
            servers.append(bench.start_floor(upstream, log_dir, relay, name))
        contenders = [bench.Contender(server.name, server.url + "/v1", None, server)
                      for server in servers[1:]]
        per_token: dict[tuple, list[float]] = {}
        for round_no in range(args.rounds):
            for c in contenders if round_no % 2 == 0 else contenders[::-1]:
                for concurrency in map(int, args.concurrency.split(",")):
                    row = asyncio.run(bench.run_level(c, upstream, concurrency,
                                                      max(48, 4 * concurrency), False, 128))
                    if row["lost"]:
                        raise SystemExit(f"{c.name} lost {row['lost']} streams: {row['errors']}")
                    per_token.setdefault((concurrency, c.name), []).append(
                        row["proxy_cpu_ms_per_token"])
                    print(f"round {round_no + 1} {c.name} c={concurrency}: "
                          f"{row['proxy_cpu_ms_per_token']} ms/token", flush=True)
    finally:
        for server in reversed(servers):
            server.stop()
    print("\n| conc | relay | proxy CPU ms/token, median [min, max] |\n|---:|---|---:|")
    for (concurrency, name), values in sorted(per_token.items()):
        print(f"| {concurrency} | {name} | {statistics.median(values):.4f} "
              f"[{min(values):.4f}, {max(values):.4f}] |")


if __name__ == "__main__":
    main()
