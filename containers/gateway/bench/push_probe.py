"""Probe: what the floor relay (``floor_relay.py``) would cost per streamed token if each
chunk from the upstream were written to the client from the upstream connection's own
callback, instead of waking the request's task once per chunk. Both relays run side by side
in alternating rounds; this file is the pushing one (an ASGI app) and the runner.

The push is a probe, not a relay to ship: it patches ``http1``'s body callbacks in its own
process and gives up on a client that reads slower than the upstream sends (the floor and the
gateway pause the upstream then). It measured the idea before the gateway's relay was rebuilt
on it (``http1.Response.pump``, ``asgi.writer``).

    .venv/bin/python containers/gateway/bench/push_probe.py --rounds 4 --concurrency 8,32
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from floor_relay import start_up_check, whole_body  # noqa: E402
from spectrum_gateway import http1  # noqa: E402

UPSTREAM = os.environ.get("SPECTRUM_FLOOR_UPSTREAM", "")
_queue_body = http1._Connection.on_body
_complete = http1._Connection.on_message_complete


def _on_body(self, body: bytes) -> None:
    push = getattr(self, "push", None)
    if push is None:
        _queue_body(self, body)
    else:
        push(body)


def _on_message_complete(self) -> None:
    _complete(self)
    done = getattr(self, "push_done", None)
    if done is not None and not done.done():
        done.set_result(None)


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        http1._Connection.on_body = _on_body               # this process only
        http1._Connection.on_message_complete = _on_message_complete
        app.pool = http1.Pool(connect_timeout_s=10, read_timeout_s=300)
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        app.pool.close()
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] != "POST":
        return await start_up_check(send)
    body = await whole_body(receive)
    answer = await app.pool.post(UPSTREAM + scope["path"].removeprefix("/v1"), body,
                                 {"content-type": "application/json"})
    connection = answer._connection
    try:
        await send({"type": "http.response.start", "status": answer.status, "headers": [
            (b"content-type", answer.headers.get("content-type", "application/json").encode())]})
        while connection.chunks:             # what came with the headers
            await send({"type": "http.response.body", "body": connection.chunks.popleft(),
                        "more_body": True})
        if not connection.complete:
            connection.push_done = asyncio.get_running_loop().create_future()

            def push(data: bytes) -> None:
                # uvicorn's send of a body finishes at once unless the client is slow.
                step = send({"type": "http.response.body", "body": data, "more_body": True})
                try:
                    step.send(None)
                except StopIteration:
                    return
                step.close()
                connection.close()           # a slow client: the probe gives up on it
                connection.push_done.set_result(None)
            connection.push = push
            await connection.push_done
            connection.push = None
    finally:
        answer.close()
    await send({"type": "http.response.body", "body": b""})


def main() -> None:
    import run as bench
    from options.local_server import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", default="8,32")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="push-probe-"))
    upstream = bench.start_upstream(log_dir, 0.002)
    servers = [upstream]
    try:
        floor = bench.start_floor(upstream, log_dir)
        servers.append(floor)
        port = free_port()
        pushing = bench.start(
            "push", [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), "push_probe:app",
                     "--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http",
                     "httptools", "--log-level", "warning", "--no-access-log"],
            port, "/", log_dir, env={"SPECTRUM_FLOOR_UPSTREAM": f"{upstream.url}/u/fake/v1"})
        servers.append(pushing)
        contenders = [bench.Contender("floor", floor.url + "/v1", None, floor),
                      bench.Contender("push", pushing.url + "/v1", None, pushing)]
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
