"""A lean HTTP/1.1 client for the upstream calls: one asyncio protocol a connection, httptools'
C parser, a keep-alive pool per host.

Why not aiohttp: the relay spends its time per request and per streamed chunk, and aiohttp's
general machinery (request objects, URL parsing, tracing, a stream reader and a timer per
read) cost the gateway more CPU than its own checks did. This client does only what a relay
needs: POST a body, read the status and headers, hand on the body's chunks as they arrive,
put the connection back when the answer was read to its end and drop it otherwise.

A stream's chunks are pushed (``pump``): each is handed on from the connection's own callback
as it is parsed, the task woken only at the end, on a failure, or while the reader is full.
Pulling them instead (the reading task woken for each) cost the gateway 5-20 % more CPU per
streamed token, side by side.

Timeouts: ``connect_timeout_s`` for the TCP (and TLS) connect, ``read_timeout_s`` for the
silence between any two reads, checked by one timer a connection that is re-armed only when
it fires (not one timer per chunk).
"""
from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

# An idle pooled connection older than this is dropped instead of reused: servers close idle
# keep-alive connections (uvicorn after 5 s, nginx after 75 s), and a reuse that races their
# close costs a retry.
IDLE_S = 4.0


class ConnectFailed(Exception):
    """No connection: refused, unreachable, or the connect timed out (``timed_out``)."""

    def __init__(self, detail: str, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.timed_out = timed_out


class ReadFailed(Exception):
    """The connection broke, or was silent for the read timeout (``timed_out``), before the
    answer was read to its end. ``answered``: whether any byte of the answer had come."""

    def __init__(self, detail: str, timed_out: bool = False, answered: bool = True) -> None:
        super().__init__(detail)
        self.timed_out, self.answered = timed_out, answered


class Headers(dict):
    """The answer's headers, names in lower case (the last of repeated names wins)."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


class _Connection(asyncio.Protocol):
    """One TCP connection; at most one answer being read on it at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float | None) -> None:
        self.loop, self.pool_read_timeout_s = loop, read_timeout_s
        self.transport = None
        self.closed = False
        self.idle_since = 0.0
        self._timer = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.read_timeout_s = self.pool_read_timeout_s     # ``expect_end`` shortens it
        self.status = 0
        self.headers = Headers()
        self.headers_done = False
        self.complete = False
        self.keep_alive = True
        self.chunks: deque[bytes] = deque()
        self.paused = False
        self.error: ReadFailed | None = None
        self.answered = False
        self.last_read = time.monotonic()
        self._waiter: asyncio.Future | None = None
        self.sink = None              # while ``pump`` runs: where each chunk goes
        self.held = None              # what the sink asked to wait on, reading paused meanwhile

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.answered = True
        self.last_read = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ReadFailed("the upstream switched protocols"))
        except httptools.HttpParserError as e:
            self._fail(ReadFailed(f"the upstream's answer is not valid HTTP/1.1 ({e})"))
        else:
            if self.sink is None or self.held is not None or self.complete:
                self._wake()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if (self.headers_done and not self.complete and "content-length" not in self.headers
                and "chunked" not in self.headers.get("transfer-encoding", "")):
            self.on_message_complete()     # a body that ends when the connection does
            self._wake()
        if not self.complete:
            self._fail(ReadFailed(f"the upstream closed the connection"
                                  f"{f' ({exc})' if exc else ''}", answered=self.answered))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:      # called once per header
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.sink is not None and self.held is None:
            held = self.sink(body)
            if held is not None:          # the reader is full: stop reading until it is not
                self.held = held
                self.paused = True
                self.transport.pause_reading()
            return
        self.chunks.append(body)          # for ``read``, or pushed once ``held`` is done

    def on_message_complete(self) -> None:
        self.complete = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- waiting
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: ReadFailed) -> None:
        if self.error is None:
            self.error = error
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _check_silence(self) -> None:
        self._timer = None
        if self.complete or self.closed:
            return
        if self.paused:            # waiting on the client, not on the upstream
            self.last_read = time.monotonic()
        silent = time.monotonic() - self.last_read
        if silent >= self.read_timeout_s:
            self._fail(ReadFailed(f"the upstream sent nothing for {self.read_timeout_s:g} s",
                                  timed_out=True, answered=self.answered))
        else:
            self._timer = self.loop.call_later(self.read_timeout_s - silent, self._check_silence)

    def expect_end(self, within_s: float) -> None:
        """The rest of this answer is due within ``within_s`` of its last bytes (what it
        carries has all come): the read timeout is that, until the next request."""
        if self.complete or (self.read_timeout_s and self.read_timeout_s <= within_s):
            return
        self.read_timeout_s = within_s
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(within_s, self._check_silence)

    async def wait(self) -> None:
        """Until the next bytes, the end, or a failure."""
        if self.error is not None:
            raise self.error
        if self.read_timeout_s and self._timer is None:
            self._timer = self.loop.call_later(self.read_timeout_s, self._check_silence)
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def send(self, head: bytes, body: bytes) -> None:
        self._reset()
        self.transport.writelines((head, body))

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class Response:
    """An answer with its status and headers read and its body not yet: ``read`` it or
    ``pump`` it, then ``close`` (the connection goes back to the pool only when the
    body was read to its end)."""

    def __init__(self, pool: "Pool", key: tuple, connection: _Connection) -> None:
        self._pool, self._key, self._connection = pool, key, connection
        self.status = connection.status
        self.headers = connection.headers

    async def pump(self, sink) -> None:
        """Hand the body's chunks to ``sink`` as they arrive, called from the connection's
        callback, so no task wakes per chunk. ``sink`` returns None, or an awaitable while its
        reader is full: reading from the upstream stops until that is done. Returns at the end
        of the body; raises ``ReadFailed`` as ``chunks`` does. ``sink`` must not raise."""
        c = self._connection
        while True:
            while c.chunks:          # came with the headers, or while reading was held
                held = sink(c.chunks.popleft())
                if held is not None:
                    await held
            if c.complete:
                return
            if c.paused:
                c.paused = False
                c.last_read = time.monotonic()     # held time is not the upstream's silence
                c.transport.resume_reading()
            c.sink = sink
            try:
                await c.wait()       # woken at the end, on a failure, or when held
            except BaseException:
                _drop(c.held)
                c.held = None
                raise
            finally:
                c.sink = None
            if c.held is not None:
                held, c.held = c.held, None
                await held

    def expect_end(self, within_s: float) -> None:
        """The rest of the body is due within ``within_s``, or reading fails as timed out
        (``_Connection.expect_end``)."""
        if self._connection is not None:
            self._connection.expect_end(within_s)

    async def read(self) -> bytes:
        c = self._connection
        while not c.complete:
            await c.wait()
        data = b"".join(c.chunks)
        c.chunks.clear()
        return data

    def close(self) -> None:
        c, self._connection = self._connection, None
        if c is None:
            return
        if c.complete and c.keep_alive and not c.closed and c.error is None:
            self._pool.release(self._key, c)
        else:
            c.close()


def _drop(held) -> None:
    """An awaitable nobody will wait on now: closed, if it is a coroutine, so it is not left
    half-run."""
    close = getattr(held, "close", None)
    if close is not None:
        close()


class Pool:
    """Keep-alive connections per (scheme, host, port), no limit on their number."""

    def __init__(self, connect_timeout_s: float | None, read_timeout_s: float | None) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self._idle: dict[tuple, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._targets: dict[str, tuple] = {}

    def _target(self, url: str) -> tuple[tuple, bytes]:
        """(pool key, request-target and Host header lines) of a URL, parsed once per URL."""
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConnectFailed(f"{url!r} is not an http:// or https:// URL")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6
            default_port = port == (443 if parts.scheme == "https" else 80)
            host = name if default_port else f"{name}:{port}"
            known = ((parts.scheme, parts.hostname, port),
                     f"POST {target} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1"))
            if len(self._targets) < 1024:
                self._targets[url] = known
        return known

    async def _connect(self, key: tuple) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self.read_timeout_s), host, port,
                                       ssl=self._ssl if scheme == "https" else None),
                self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectFailed(f"connecting to {host}:{port} timed out after "
                                f"{self.connect_timeout_s:g} s", timed_out=True) from None
        except OSError as e:
            raise ConnectFailed(f"cannot connect to {host}:{port} ({e.strerror or e})") from None
        return connection

    def _reuse(self, key: tuple) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_S:
                return connection
            connection.close()
        return None

    def release(self, key: tuple, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(connection)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Response:
        """Send ``body`` and wait for the answer's status and headers."""
        key, head = self._target(url)
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        head += b"content-length: %d\r\n\r\n" % len(body)
        connection = self._reuse(key)
        if connection is not None:
            try:
                return await self._exchange(key, connection, head, body)
            except ReadFailed as e:
                if e.answered or e.timed_out:
                    raise
                # A pooled connection the upstream closed as it was reused: nothing was
                # answered on it, so once more, on a new one.
        return await self._exchange(key, await self._connect(key), head, body)

    async def _exchange(self, key: tuple, connection: _Connection, head: bytes,
                        body: bytes) -> Response:
        try:
            connection.send(head, body)
            while not connection.headers_done:
                await connection.wait()
        except BaseException:
            connection.close()
            raise
        return Response(self, key, connection)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
