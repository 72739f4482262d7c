"""Probe: how /ping fares while many clients hold half-sent requests open, for this server
and the servers it is compared with (same names as run.py: byo, byo@git:REV, vllm).

For each server, one at a time: start it, open N connections that stop mid-request (half
with their headers cut short, half with complete headers and half a body), time /ping from a
process of its own (as SageMaker's health checker) while they are open, close them, and
check that the server still answers a request.

    flock /tmp/spectrum-engine.lock .venv/bin/python benchmarks/server-vs-vllm/slow_clients.py \\
        --servers byo,vllm --connections 1000
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import start_server, stop_server  # noqa: E402  (the benchmark's own server starts)

from options.tiny_model import tiny_model_dir  # noqa: E402

PINGS = """
import json, sys, time, urllib.request
times = []
for _ in range(int(sys.argv[2])):
    started = time.monotonic()
    try:
        with urllib.request.urlopen(sys.argv[1] + sys.argv[3], timeout=10) as r:
            r.read()
        times.append(time.monotonic() - started)
    except Exception:
        times.append(None)             # no answer within 10 s
    time.sleep(0.2)
print(json.dumps(times))
"""


def half_sent(port: int, n: int) -> list[socket.socket]:
    body = json.dumps({"prompt": "never finished", "max_tokens": 4}).encode()
    stalled = []
    for i in range(n):
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        if i % 2:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        else:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body[:len(body) // 2]))
        stalled.append(client)
    return stalled


def pings(url: str, path: str, count: int) -> list[float | None]:
    out = subprocess.run([sys.executable, "-c", PINGS, url, str(count), path],
                         capture_output=True, text=True, timeout=60 * count)
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="byo,vllm")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--pings", type=int, default=5)
    parser.add_argument("--kv-cache-gib", default="2")
    parser.add_argument("--log-dir", default="/tmp/byo-bench-logs")
    args = parser.parse_args()
    model = str(tiny_model_dir())
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.servers.split(","):
        server = start_server(name, model, args.kv_cache_gib, log_dir)
        path = "/health" if name == "vllm" else "/ping"
        try:
            idle = pings(server.url, path, args.pings)
            stalled = half_sent(server.port, args.connections)
            loaded = pings(server.url, path, args.pings)
            for client in stalled:
                client.close()
            time.sleep(1)
            after = pings(server.url, path, args.pings)
        finally:
            stop_server(server)

        def worst(times):
            return ("no answer in 10 s" if None in times
                    else f"{1000 * max(times):.1f} ms")
        rows.append((server.label, worst(idle), worst(loaded), worst(after)))
        print(f"{name}: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"| server | health check idle (worst of {args.pings}) | with {args.connections} "
          "half-sent requests open | after they closed |")
    print("|---|---:|---:|---:|")
    for label, idle, loaded, after in rows:
        print(f"| {label} | {idle} | {loaded} | {after} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
