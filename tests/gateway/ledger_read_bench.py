"""How long reading a large Redis ledger takes, through the gateway's own store (the path
``admin usage`` and ``python -m cost bill`` read it by).

    .venv/bin/python tests/gateway/ledger_read_bench.py --entries 1000000

starts a redis-server of its own (a free port, a temporary directory; stopped by its pid at
the end), fills ``spectrum:ledger`` with that many entries shaped as the gateway writes them
(XADD in pipelines of 10,000), then times ``RedisStore.ledger()`` (every page, JSON decoded,
duplicates dropped) and ``admin usage --json`` written to /dev/null. ``--url`` uses a Redis
already running instead (its database is flushed of the ledger key first).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
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

LEDGER_KEY = "spectrum:ledger"
FILL_BATCH = 10_000
# Entries' stream ids start here (2026-11-01T00:00:00Z) and advance 1 ms each, two per ms.
FIRST_MS = 1793491200000


def entry(i: int) -> dict:
    """The i-th made-up entry, as ``meter.ledger_entry`` makes them."""
    record = meter.ledger_entry(
        request_id=f"{i:016x}", tenant=f"tenant{i % 50}", key_id=f"{i % 997:012x}",
        model="chat", upstream=("stable", "canary")[i % 10 == 0], fallback_from=[],
        input_tokens=100 + i % 900, output_tokens=1 + i % 512, usage_source="upstream",
        status=200 if i % 40 else 429, latency_s=0.25 + (i % 100) / 100, stream=bool(i % 2),
        cost_usd=(i % 1000) / 1e6, replica=None, routing=None)
    record["ts_ms"] = FIRST_MS + i // 2
    return record


def fill(port: int, entries: int, db: int = 0, first: int = 0) -> None:
    """``entries`` entries XADDed with explicit ids (two a millisecond), 10,000 a pipeline."""
    import redis
    client = redis.Redis(port=port, db=db)
    for start in range(first, first + entries, FILL_BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + FILL_BATCH, first + entries)):
            pipe.xadd(LEDGER_KEY, {"e": meter.ledger_json(entry(i))},
                      id=f"{FIRST_MS + i // 2}-{i % 2}")
        pipe.execute()
    client.close()


def start_redis(directory: Path):
    from options.local_server import free_port
    port = free_port()
    process = subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--dir",
         str(directory), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis
    deadline = time.monotonic() + 15
    while True:
        try:
            redis.Redis(port=port).ping()
            return process, port
        except redis.RedisError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)


def store_for(url: str, directory: Path):
    from spectrum_gateway.config import config_from_dict
    from spectrum_gateway.store import RedisStore
    config = config_from_dict({"store": url, "models": {"m": {"upstreams": [
        {"name": "u", "url": "http://127.0.0.1:9"}]}}}, directory / "gateway.yaml")
    return RedisStore(config)


def read_all(url: str, directory: Path, page_entries: int | None = None) -> tuple[int, float, float]:
    """(entries read, wall s, this process's CPU s) of one whole read through the store."""
    async def go():
        store = store_for(url, directory)
        try:
            kwargs = {"page_entries": page_entries} if page_entries else {}
            count = 0
            async for page in store.ledger_pages(**kwargs):
                count += len(page)
            return count
        finally:
            await store.close()
    wall, cpu = time.perf_counter(), time.process_time()
    count = asyncio.run(go())
    return count, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--url", help="a running Redis (redis://HOST:PORT/DB) instead of one of ours")
    parser.add_argument("--no-admin", action="store_true", help="skip timing admin usage --json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ledger-bench-") as tmp:
        tmp = Path(tmp)
        process = None
        if args.url:
            url = args.url
            import redis
            redis.Redis.from_url(url).delete(LEDGER_KEY)
            port = int(url.split(":")[2].split("/")[0])
            db = int(url.rsplit("/", 1)[1] or 0)
        else:
            process, port = start_redis(tmp)
            url, db = f"redis://127.0.0.1:{port}/0", 0
        try:
            started = time.perf_counter()
            fill(port, args.entries, db)
            filled_s = time.perf_counter() - started
            count, wall, cpu = read_all(url, tmp)
            result = {"entries": args.entries, "fill_s": round(filled_s, 1), "read": count,
                      "store_ledger_wall_s": round(wall, 2), "store_ledger_cpu_s": round(cpu, 2),
                      "us_per_entry": round(wall / max(count, 1) * 1e6, 2)}
            if not args.no_admin:
                (tmp / "gateway.yaml").write_text(
                    f"store: {url}\nmodels: {{m: {{upstreams: [{{name: u, url: 'http://127.0.0.1:9'}}]}}}}\n")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                with open("/dev/null", "wb") as sink:
                    subprocess.run([sys.executable, str(REPO / "containers/gateway/admin"), "--config",
                                    str(tmp / "gateway.yaml"), "usage", "--json"], stdout=sink, check=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                result["admin_usage_json_wall_s"] = round(time.perf_counter() - started, 2)
                result["admin_usage_json_cpu_s"] = round(
                    after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)
                result["admin_max_rss_mb"] = round(after.ru_maxrss / 1024)
            print(json.dumps(result))
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)


if __name__ == "__main__":
    main()
