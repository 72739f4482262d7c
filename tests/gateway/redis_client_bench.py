"""The store's Redis traffic through each client, CPU per request: the gateway's own client
(``spectrum_gateway.resp`` through ``RedisStore``, one pipelined connection) against redis-py's
asyncio client with hiredis's parser and with its pure-Python one (a connection pool, a
pipeline for the settle), on one redis-server; and, with ``--cluster``, redis-py's cluster
client against the store's own on a Redis Cluster.

    .venv/bin/python tests/gateway/redis_client_bench.py [--requests 4000] [--concurrency 32]
        [--rounds 5] [--cluster HOST:PORT]

A request is what the gateway sends per whole answer: the reservation (EVALSHA of the quota's
script), then one pipeline of the settle script, the ledger's XADD and the counters' script.
CPU is this process's (user + sys), so Redis's own work is not counted; contenders alternate
round by round; the table gives each one's median and range over the rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "containers" / "gateway"))
sys.path.insert(0, str(REPO))

from spectrum_gateway import meter  # noqa: E402
from spectrum_gateway.config import TenantLimits, config_from_dict  # noqa: E402
from spectrum_gateway.quota import RESERVE_LUA, SETTLE_LUA, month_now, _quota_keys  # noqa: E402
from spectrum_gateway.store import COUNT_LUA, RedisStore, _flat  # noqa: E402

LIMITS = TenantLimits("bench", rpm=10**9, tpm=10**12, max_concurrency=10**6)


def entry(i: int) -> dict:
    return meter.ledger_entry(request_id=f"b{i:012x}", tenant="bench", key_id="k", model="chat",
                              upstream="stable", fallback_from=[], input_tokens=12,
                              output_tokens=1, usage_source="upstream", status=200,
                              latency_s=0.002, stream=False, cost_usd=0.0)


async def run_store(url: str, requests: int, concurrency: int) -> float:
    """The gateway's store (its own client): CPU seconds for ``requests``."""
    store = RedisStore(config_from_dict({"store": url, "ledger_max_entries": 10_000, "models": {
        "m": {"upstreams": [{"name": "u", "url": "http://127.0.0.1:9"}]}}}, Path("/tmp/bench.yaml")))
    await store.warm()
    store._upkeep_task.cancel()
    queue = iter(range(requests))

    async def worker():
        for i in queue:
            rid = f"s{i:012x}"
            await store.reserve(LIMITS, rid, 13, 0.0)
            e = entry(i)
            await store.finish(LIMITS, rid, -12, 0.0, e, meter.increments(e))
    await asyncio.gather(*(worker() for _ in range(2)))      # scripts loaded, connection warm
    queue = iter(range(requests))
    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu = time.process_time() - started
    await store.close()
    return cpu


async def run_redis_py(url: str, requests: int, concurrency: int, hiredis: bool,
                       cluster: bool = False) -> float:
    """The same commands through redis-py's asyncio client (or its cluster client)."""
    import redis.asyncio as aredis
    from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
    parser = _AsyncHiredisParser if hiredis else _AsyncRESP2Parser
    if cluster:
        from redis.asyncio.cluster import RedisCluster
        host, port = url.split("//")[1].split("/")[0].split(":")
        # (Its nodes' connections take no parser_class: hiredis's whenever it is installed.)
        client = RedisCluster(host=host, port=int(port))
        await client.initialize()
    else:
        client = aredis.Redis.from_url(url, parser_class=parser, max_connections=concurrency + 4)
    reserve_sha = await client.script_load(RESERVE_LUA)
    settle_sha = await client.script_load(SETTLE_LUA)
    count_sha = await client.script_load(COUNT_LUA)
    queue = iter(range(requests))

    async def worker():
        for i in queue:
            rid = f"p{i:012x}"
            month, left = month_now()
            keys = _quota_keys("spectrum", "bench", month)
            await client.evalsha(reserve_sha, len(keys), *keys, rid, LIMITS.rpm, LIMITS.tpm, 13,
                                 LIMITS.max_concurrency, 30000, -1, 0, left)
            e = entry(i)
            if cluster:
                # redis-py's cluster pipeline refuses EVALSHA ("blocked when running redis in
                # cluster mode"): the three go as concurrent commands instead.
                await asyncio.gather(
                    client.evalsha(settle_sha, 4, *keys[2:6], rid, -12, 0),
                    client.xadd("spectrum:ledger", {"e": meter.ledger_json(e)}, maxlen=10_000,
                                approximate=True),
                    client.evalsha(count_sha, 1, "spectrum:metrics", *_flat(meter.increments(e))))
                continue
            pipe = client.pipeline(transaction=False)
            pipe.evalsha(settle_sha, 4, *keys[2:6], rid, -12, 0)
            pipe.xadd("spectrum:ledger", {"e": meter.ledger_json(e)}, maxlen=10_000, approximate=True)
            pipe.evalsha(count_sha, 1, "spectrum:metrics", *_flat(meter.increments(e)))
            await pipe.execute()
    await asyncio.gather(*(worker() for _ in range(2)))
    queue = iter(range(requests))
    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu = time.process_time() - started
    await client.aclose()
    return cpu


def start_redis(directory: Path):
    from options.local_server import free_port
    import redis
    port = free_port()
    process = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                                "--dir", str(directory), "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            redis.Redis(port=port).ping()
            return process, port
        except redis.RedisError:
            if time.monotonic() > deadline:
                process.kill()
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cluster", metavar="HOST:PORT", help="a Redis Cluster node: compare "
                        "the cluster clients there instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="redis-bench-") as tmp:
        process = None
        if args.cluster:
            url = f"redis://{args.cluster}/0"
        else:
            process, port = start_redis(Path(tmp))
            url = f"redis://127.0.0.1:{port}/0"
        try:
            contenders = {
                "spectrum resp.py": lambda: run_store(url, args.requests, args.concurrency),
                "redis-py + hiredis": lambda: run_redis_py(url, args.requests, args.concurrency,
                                                           True, bool(args.cluster)),
            }
            if not args.cluster:
                contenders["redis-py (Python parser)"] = lambda: run_redis_py(
                    url, args.requests, args.concurrency, False)
            results: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(args.rounds):
                for name, run in contenders.items():
                    results[name].append(asyncio.run(run()) / args.requests * 1e6)
            rows = {name: {"median_us": round(statistics.median(v), 1),
                           "min_us": round(min(v), 1), "max_us": round(max(v), 1)}
                    for name, v in results.items()}
            print(json.dumps({"url": url, "requests": args.requests, "concurrency": args.concurrency,
                              "rounds": args.rounds, "cpu_us_per_request": rows}, indent=1))
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)


if __name__ == "__main__":
    main()
