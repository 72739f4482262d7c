"""The bench's floor: the least a relay on the gateway's own stack can do (uvicorn with uvloop
and httptools, the gateway's upstream client ``spectrum_gateway.http1``, raw ASGI). No key, no
quota, no routing, no meter, no JSON parsing: the body is passed on and the answer's bytes come
back as they arrive, each chunk written from the upstream connection's callback as the gateway
does. What it costs per token and per request is what any gateway on this stack costs at
least.

    SPECTRUM_FLOOR_UPSTREAM=http://127.0.0.1:PORT/u/fake/v1 \\
        python -m uvicorn --app-dir benchmarks/gateway floor_relay:app --port 8001
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "containers" / "gateway"))

from spectrum_gateway.asgi import writer  # noqa: E402
from spectrum_gateway.http1 import Pool  # noqa: E402

UPSTREAM = os.environ.get("SPECTRUM_FLOOR_UPSTREAM", "")
pool = Pool(connect_timeout_s=10, read_timeout_s=300)


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def start_up_check(send) -> None:
    """What the bench's start-up check (a GET) gets."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def whole_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    if scope["method"] != "POST":
        return await start_up_check(send)
    body = await whole_body(receive)
    path = scope["path"].removeprefix("/v1")
    answer = await pool.post(UPSTREAM + path, body, {"content-type": "application/json"})
    try:
        await send({"type": "http.response.start", "status": answer.status, "headers": [
            (b"content-type", answer.headers.get("content-type", "application/json").encode())]})
        await answer.pump(writer(send))     # each chunk from the connection's callback
    finally:
        answer.close()
    await send({"type": "http.response.body", "body": b""})
