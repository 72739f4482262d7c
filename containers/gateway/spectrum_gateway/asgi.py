"""The completion routes' two ends in plain ASGI: the request's headers and body, the answer
whole or streamed, and the client's disconnect.

The completion routes run on every request and every streamed chunk, so they skip Starlette's
Request and Response objects (their headers, media types and background tasks are not used
here) and watch for a disconnect without a task of their own. Everything else the gateway
serves is FastAPI's.
"""
from __future__ import annotations

import asyncio
import json

from .errors import GatewayError

JSON = b"application/json"
EVENT_STREAM = b"text/event-stream; charset=utf-8"
# Reading a body past its limit stops here: enough to answer 413 on a normal connection.
DRAIN_LIMIT = 64 * 1024 * 1024


def request_headers(scope: dict, wanted: frozenset[bytes]) -> dict[str, str]:
    """The ``wanted`` headers of the request by lower-case name (ASGI servers lower-case
    them); of a repeated header, the first. Only those: an SDK sends a dozen more."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in wanted:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return headers


async def read_body(receive, limit: int) -> bytes:
    """The whole request body; 413 past ``limit`` bytes (read on to ``DRAIN_LIMIT`` so the
    client sees the answer rather than a reset), 499 if the client left before the end."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(499, "the client disconnected before sending the whole body",
                               "client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body", False) or size > DRAIN_LIMIT:
            break
    if size > limit:
        raise GatewayError(413, f"the request body is {size} bytes or more; this gateway "
                                f"accepts at most {limit} (max_body_bytes)", "body_too_large")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def response_start(status: int, headers: dict[str, str], content_type: bytes,
                   length: int | None = None) -> dict:
    """``http.response.start``; without a length the server sends the body chunked."""
    raw = [(b"content-type", content_type)]
    if length is not None:
        raw.append((b"content-length", b"%d" % length))
    raw += [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": raw}


class Answer:
    """A whole answer: its head, then its body."""

    __slots__ = ("status", "body", "headers", "content_type")

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None,
                 content_type: bytes = JSON) -> None:
        self.status, self.body, self.content_type = status, body, content_type
        self.headers = headers or {}

    @classmethod
    def of_json(cls, status: int, body: dict, headers: dict[str, str] | None = None) -> "Answer":
        return cls(status, json.dumps(body, separators=(",", ":")).encode(), headers)

    @classmethod
    def of_error(cls, e: GatewayError) -> "Answer":
        return cls.of_json(e.status, e.body(), e.headers)

    async def __call__(self, receive, send) -> None:
        await send(response_start(self.status, self.headers, self.content_type, len(self.body)))
        await send({"type": "http.response.body", "body": self.body})


class Relay:
    """A relayed stream of server-sent events, stopped when the client hangs up.

    ``source`` pumps the upstream's bytes into a writer (``pump(write)``) and returns the
    stream's last bytes, sent with the end of the body; it is always closed (``aclose()``),
    which aborts the upstream call and meters the request even when the client left while a
    chunk was being written."""

    __slots__ = ("source", "headers")

    def __init__(self, source, headers: dict[str, str]) -> None:
        self.source, self.headers = source, headers

    async def __call__(self, receive, send) -> None:
        try:
            await unless_client_leaves(receive, lambda: self._stream(send))
        finally:
            await self.source.aclose()

    async def _stream(self, send) -> None:
        await send(response_start(200, self.headers, EVENT_STREAM))
        last = await self.source.pump(writer(send))
        await send({"type": "http.response.body", "body": last})


def writer(send):
    """``write(data)``: ``data`` sent to the client now, from whatever callback calls it (the
    upstream connection's, as each chunk is parsed). None once sent; an awaitable when the
    server cannot finish the send at once (its buffer to a slow client is full), to be awaited
    before writing more. It never raises: a failed send raises from that awaitable."""
    def write(data: bytes):
        step = send({"type": "http.response.body", "body": data, "more_body": True})
        try:
            waiting_on = step.send(None)
        except StopIteration:
            return None
        except Exception as e:       # noqa: BLE001 - raised where the writer's caller waits
            return _raise(e)
        return run_rest(step, waiting_on)
    return write


async def run_rest(step, waiting_on):
    """Drive a coroutine already stepped once (``step``, which yielded ``waiting_on``) to its
    end, as a task would: wait on what it waits on, then step it on. Its value is returned."""
    try:
        while True:
            if waiting_on is None:             # a bare yield: one turn of the loop
                await asyncio.sleep(0)
            else:
                waiting_on._asyncio_future_blocking = False
                await asyncio.wait([waiting_on])
            try:
                waiting_on = step.send(None)
            except StopIteration as end:
                return end.value
    finally:
        step.close()


async def to_the_end(step):
    """Await ``step`` (a request's settle) to its end even when this task is cancelled
    meanwhile, then let the cancellation through. A client that hangs up right after the last
    event cancels the task while the stream is being settled; anyio's shield does not stop
    asyncio's own cancel, and a settle cut short would keep the tenant's slot.

    ``step`` is first run here: a settle that never waits (the memory store's) ends before
    anything could cancel it, without the task and shield a settle that waits needs."""
    try:
        waiting_on = step.send(None)
    except StopIteration as end:
        return end.value
    task = asyncio.ensure_future(run_rest(step, waiting_on))
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def _raise(error: Exception) -> None:
    raise error


async def unless_client_leaves(receive, work) -> tuple[bool, object]:
    """``(False, work()'s result)``, or ``(True, None)`` when the client disconnected first:
    then ``work`` is cancelled where it waits, which closes the upstream connection, so an
    abandoned request stops costing upstream time."""
    this = asyncio.current_task()
    watch = DisconnectWatch(receive, this)
    try:
        return False, await work()
    except asyncio.CancelledError:
        if not watch.left:
            raise                      # cancelled from outside: the server is stopping
        this.uncancel()
        return True, None
    finally:
        watch.stop()


class DisconnectWatch:
    """Cancels ``task`` when ``receive`` says ``http.disconnect``, until ``stop``.

    The server's ``receive()`` is stepped the way a task steps a coroutine: on to the future
    it waits on, then again when that future is done. A watcher task per request (created,
    scheduled, cancelled, reaped) was a few percent of a whole answer's CPU."""

    __slots__ = ("receive", "task", "left", "stopped", "_steps")

    def __init__(self, receive, task: asyncio.Task) -> None:
        self.receive, self.task = receive, task
        self.left = self.stopped = False
        self._steps = None
        self._listen()

    def _listen(self) -> None:
        self._steps = self.receive().__await__()
        self._step()

    def _step(self, _done=None) -> None:
        if self.stopped:
            return
        try:
            waiting_on = self._steps.send(None)
        except StopIteration as end:
            if end.value["type"] == "http.disconnect":
                self.left = self.stopped = True
                self.task.cancel()
            else:
                self._listen()           # more of a body nobody reads: listen on
            return
        except Exception:                # the server's receive failed: nothing left to watch
            self.stopped = True
            return
        if waiting_on is None:           # a bare yield: step again on the loop's next turn
            asyncio.get_running_loop().call_soon(self._step)
        else:
            waiting_on._asyncio_future_blocking = False
            waiting_on.add_done_callback(self._step)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self._steps.close()          # the server's receive() lets go of its waiter
