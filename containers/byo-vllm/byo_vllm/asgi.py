"""The HTTP plumbing under the routes, as ASGI: reading a body within a size and a time limit,
answering JSON, and streaming. The only module that speaks ASGI's messages; the routes
speak requests and answers.

Both limits protect the server from its clients. A body over the limit is answered 413 from
its declared length, after the rest of it has been read and dropped (up to a bound), so a
client that writes its whole body before reading sees the 413, not a reset connection. A
client that stops sending mid-body gets 408 instead of holding its request open forever.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from .dialects import BadRequest, dumps_compact

JSON = b"application/json"
# A body over the limit is still read (and dropped) up to this many times the limit before
# the 413 goes out; past that the connection closes with the answer.
DROP_AT_MOST = 4


class Request:
    """One HTTP request as the routes see it."""

    __slots__ = ("scope", "receive", "method", "path", "headers")

    def __init__(self, scope: dict, receive: Callable[[], Awaitable[dict]]) -> None:
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[bytes, bytes] = dict(scope["headers"])   # names are lower-case

    def header(self, name: str) -> str | None:
        value = self.headers.get(name.lower().encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    @property
    def http_version(self) -> str:
        return self.scope.get("http_version", "1.1")

    async def body(self, limit: int, timeout_s: float) -> bytes:
        """The whole body. BadRequest 413 over ``limit`` bytes (at once when the declared
        length says so), 408 when the client sends nothing for ``timeout_s``."""
        declared = self.header("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if self.header("expect") != "100-continue":   # else the body never comes
                await self._drop_rest(DROP_AT_MOST * limit, timeout_s)
            raise _too_large(limit)
        parts, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(self.receive(), timeout_s)
            except asyncio.TimeoutError:
                raise BadRequest(f"the client sent no part of the body for {timeout_s:g} s: "
                                 "send the whole body promptly", "body", 408) from None
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                if message.get("more_body", False):
                    await self._drop_rest(DROP_AT_MOST * limit, timeout_s)
                raise _too_large(limit)
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _drop_rest(self, at_most: int, timeout_s: float) -> None:
        """Reads and drops what is left of the body (up to ``at_most`` bytes), so that a
        client that writes its whole body before reading sees the answer, not a reset
        connection (nginx's lingering close does the same)."""
        dropped = 0
        while dropped <= at_most:
            try:
                message = await asyncio.wait_for(self.receive(), timeout_s)
            except asyncio.TimeoutError:
                return
            if message["type"] == "http.disconnect":
                raise ClientGone()
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def disconnected(self) -> None:
        """Returns once the client has gone away (call it after the body is read)."""
        while (await self.receive())["type"] != "http.disconnect":
            pass


class ClientGone(Exception):
    """The client closed the connection before its request was read."""


def _too_large(limit: int) -> BadRequest:
    return BadRequest(f"the body is larger than {limit} bytes (SageMaker's 6 MB limit for "
                      "real-time endpoints): send less", "body", 413)


Send = Callable[[dict], Awaitable[None]]


async def respond(send: Send, status: int, body: bytes, content_type: bytes = JSON,
                  headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", b"%d" % len(body)), *headers]})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, payload: Any, status: int = 200,
                       headers: list[tuple[bytes, bytes]] = ()) -> None:
    await respond(send, status, dumps_compact(payload).encode(), JSON, headers)


async def respond_error(send: Send, error: BadRequest,
                        headers: list[tuple[bytes, bytes]] = ()) -> None:
    await respond_json(send, error.to_json(), error.status, headers)


SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


async def stream(request: Request, send: Send, chunks: AsyncIterator[bytes],
                 headers: list[tuple[bytes, bytes]] = ()) -> bool:
    """Sends ``chunks`` as they come (HTTP/1.1 chunked framing). An HTTP/1.0 client cannot
    take chunks: it gets the whole answer with its length once it is complete.

    Returns False when the client went away first; the iterator is then closed, which
    aborts the request in the engine."""
    if request.http_version == "1.0":
        body = b"".join([chunk async for chunk in chunks])
        await respond(send, 200, body, SSE_HEADERS[0][1], [*SSE_HEADERS[1:], *headers])
        return True
    gone = asyncio.ensure_future(request.disconnected())
    try:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*SSE_HEADERS, *headers]})
        async for chunk in chunks:
            if gone.done():
                return False
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return not gone.done()
    finally:
        gone.cancel()
        await chunks.aclose()
