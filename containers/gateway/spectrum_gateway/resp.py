"""The store's Redis client: RESP2 over one pipelined connection per process.

Every request makes two round trips to Redis (reserve; settle + ledger + counters), so the
client's own CPU is part of every request's: redis-py spent more packing, pooling and parsing a
command than Redis spent running it. Here a command is encoded as text in one go (the part
that never changes, once per process), replies are parsed in order from one buffer, and
commands from concurrent requests share the connection (Redis runs one at a time anyway, so
a pool of connections buys nothing but CPU).

Nothing hangs and nothing is mismatched: connecting is bounded by ``connect_timeout_s`` and
each round trip by ``command_timeout_s``. A round trip that times out, or a connection that
drops, fails every command waiting on that connection and closes it (a late reply could no
longer be matched to its command); the next command connects again.
"""
from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from urllib.parse import unquote, urlsplit


class Unreachable(Exception):
    """No answer from Redis: it could not be reached, dropped the connection, or was silent.
    ``sent``: the command had been written, so Redis may have run it and only the reply is
    missing."""

    def __init__(self, detail: str, sent: bool = True) -> None:
        super().__init__(detail)
        self.sent = sent


class ReplyError(Exception):
    """Redis's error reply to one command (``-ERR ...``), returned in place of its result."""

    @property
    def no_script(self) -> bool:
        return str(self).startswith("NOSCRIPT")


_INCOMPLETE = object()


class Head:
    """A command's leading arguments that are the same every time it is sent (a script's SHA
    and keys, the ledger stream's name and trimming), encoded once. First in a command's
    tuple, it stands for those arguments: only the rest are encoded per request."""

    __slots__ = ("count", "encoded")

    def __init__(self, *args) -> None:
        self.count = len(args)
        self.encoded = _encode_args(args)


def encode(command: tuple) -> bytes:
    """A command as RESP's array of bulk strings."""
    head = command[0]
    if type(head) is Head:
        args = command[1:]
        return b"*%d\r\n" % (head.count + len(args)) + head.encoded + _encode_args(args)
    return b"*%d\r\n" % len(command) + _encode_args(command)


def _encode_args(args: tuple) -> bytes:
    """Bulk strings, built as text and encoded once when every argument is ASCII text or a
    number (nearly always: the quota's and ledger's commands): half the CPU of a bytes join
    per argument."""
    text = []
    for arg in args:
        kind = type(arg)
        if kind is str:
            if not arg.isascii():
                return _encode_bytes(args)
        elif kind is int or kind is float:
            arg = repr(arg)
        else:
            return _encode_bytes(args)
        text.append(f"${len(arg)}\r\n{arg}\r\n")
    return "".join(text).encode()


def _encode_bytes(args: tuple) -> bytes:
    parts = []
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, float):
            arg = repr(arg).encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def parse(buffer: bytearray, pos: int):
    """``(reply, end)`` of the reply starting at ``pos``, or ``(_INCOMPLETE, pos)``."""
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind, line = buffer[pos], buffer[pos + 1:end]
    if kind == 36:                                        # $ bulk string
        size = int(line)
        if size < 0:
            return None, end + 2
        start = end + 2
        if len(buffer) < start + size + 2:
            return _INCOMPLETE, pos
        return bytes(buffer[start:start + size]), start + size + 2
    if kind == 58:                                        # : integer
        return int(line), end + 2
    if kind == 42:                                        # * array
        size = int(line)
        if size < 0:
            return None, end + 2
        items, at = [], end + 2
        for _ in range(size):
            item, at = parse(buffer, at)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, at
    if kind == 43:                                        # + simple string
        return bytes(line), end + 2
    if kind == 45:                                        # - error
        return ReplyError(line.decode(errors="replace")), end + 2
    raise Unreachable(f"not a RESP2 reply: {bytes(buffer[pos:pos + 40])!r}")


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport = None
        self.buffer = bytearray()
        self.waiting: deque[asyncio.Future] = deque()      # one per command sent, in order
        self.lost: Exception | None = None
        # Commands given in one turn of the loop go out in one write at its end: on loopback a
        # write costs far more than the commands it carries, and concurrent requests' reserves
        # and settles often fall in the same turn.
        self.outgoing: list[bytes] = []
        self.unwritten = 0            # the last this many of ``waiting`` are still in outgoing

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        pos = 0
        try:
            while self.waiting:
                reply, end = parse(self.buffer, pos)
                if reply is _INCOMPLETE:
                    break
                pos = end
                waiter = self.waiting.popleft()
                if not waiter.done():          # its caller may have been cancelled meanwhile
                    waiter.set_result(reply)
        except Unreachable as e:
            self.fail(e)
            return
        if pos:
            del self.buffer[:pos]
        if self.buffer and not self.waiting:
            self.fail(Unreachable(f"Redis sent what nobody asked for: {bytes(self.buffer[:40])!r}"))

    def connection_lost(self, exc) -> None:
        self.fail(Unreachable("Redis closed the connection" + (f" ({exc})" if exc else "")))

    def fail(self, error: Unreachable) -> None:
        if self.lost is None:
            self.lost = error
        if self.transport is not None:
            self.transport.close()
        waiting, self.waiting = self.waiting, deque()
        written = len(waiting) - self.unwritten
        self.outgoing, self.unwritten = [], 0
        for index, waiter in enumerate(waiting):
            if not waiter.done():
                waiter.set_exception(error if index < written or not error.sent
                                     else Unreachable(str(error), sent=False))

    def _check_open(self) -> None:
        # The transport closes before connection_lost arrives: nothing is written on it then
        # (what was written before may have run; what was not, did not).
        if self.lost is None and self.transport.is_closing():
            self.fail(Unreachable("Redis closed the connection"))

    def send(self, loop, payload: bytes, count: int) -> list[asyncio.Future]:
        self._check_open()
        if self.lost is not None:
            raise Unreachable(str(self.lost), sent=False)
        waiters = [loop.create_future() for _ in range(count)]
        self.waiting.extend(waiters)
        if not self.outgoing:
            loop.call_soon(self._write)
        self.outgoing.append(payload)
        self.unwritten += count
        return waiters

    def _write(self) -> None:
        self._check_open()
        if self.outgoing:                # (emptied by fail)
            payload = self.outgoing[0] if len(self.outgoing) == 1 else b"".join(self.outgoing)
            self.outgoing, self.unwritten = [], 0
            self.transport.write(payload)

    def silent(self, waiter: asyncio.Future, timeout_s: float) -> None:
        if not waiter.done():
            self.fail(Unreachable(f"no reply within {timeout_s * 1000:g} ms"))


class Redis:
    """``redis://[[user]:password@]host[:port][/db]`` (``rediss://`` for TLS)."""

    def __init__(self, url: str, connect_timeout_s: float, command_timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"{url!r} is not a redis:// or rediss:// URL")
        self.host, self.port = parts.hostname, parts.port or 6379
        self.tls = parts.scheme == "rediss"
        self.db = int(parts.path.strip("/") or 0)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password is not None else None
        self.connect_timeout_s, self.command_timeout_s = connect_timeout_s, command_timeout_s
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future | None = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(loop.create_connection(
                _Connection, self.host, self.port,
                ssl=ssl.create_default_context() if self.tls else None), self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise Unreachable(f"connecting timed out after {self.connect_timeout_s * 1000:g} ms",
                              sent=False) from None
        except OSError as e:
            raise Unreachable(f"cannot connect to {self.host}:{self.port} "
                              f"({e.strerror or e})", sent=False) from None
        setup = []
        if self.password is not None:
            setup.append(("AUTH", self.username, self.password) if self.username
                         else ("AUTH", self.password))
        if self.db:
            setup.append(("SELECT", self.db))
        if setup:
            for reply in await self._round_trip(connection, setup):
                if isinstance(reply, ReplyError):
                    connection.fail(Unreachable(f"Redis refused {reply}", sent=False))
                    raise connection.lost
        return connection

    async def _ready(self) -> _Connection:
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    def _connected(self, attempt: asyncio.Future) -> None:
        self._connecting = None
        if not attempt.cancelled() and attempt.exception() is None:
            self._connection = attempt.result()

    async def _round_trip(self, connection: _Connection, commands: list[tuple]) -> list:
        loop = asyncio.get_running_loop()
        waiters = connection.send(loop, b"".join(map(encode, commands)), len(commands))
        last = waiters[-1]
        timer = loop.call_later(self.command_timeout_s, connection.silent, last,
                                self.command_timeout_s)
        try:
            await last            # replies come in order: the last one done, all are
        finally:
            timer.cancel()
        return [waiter.result() for waiter in waiters]

    async def pipeline(self, commands: list[tuple]) -> list:
        """The commands in one write and one round trip; their replies in order, an error
        reply as a ``ReplyError`` in its place (not raised). ``Unreachable`` if none came."""
        connection = self._connection
        if connection is None or connection.lost is not None:
            connection = await self._ready()
        return await self._round_trip(connection, commands)

    async def command(self, *command):
        """One command's reply; its error reply raised."""
        (reply,) = await self.pipeline([command])
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    async def connect(self) -> None:
        """Connect now rather than on the first command."""
        if self._connection is None or self._connection.lost is not None:
            await self._ready()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.fail(Unreachable("the client was closed"))
            self._connection = None


class Script:
    """A Lua script, run by its SHA; re-sent whole when Redis does not know it (a restarted
    or flushed Redis forgets loaded scripts)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._heads: dict[tuple, Head] = {}     # keys → "EVALSHA sha n keys…", encoded

    def by_sha(self, keys: list, args: list) -> tuple:
        keys = tuple(keys)
        head = self._heads.get(keys)
        if head is None:
            if len(self._heads) >= 4096:          # a tenant's keys change once a month
                self._heads.clear()
            head = self._heads[keys] = Head("EVALSHA", self.sha, len(keys), *keys)
        return (head, *args)

    def whole(self, keys: list, args: list) -> tuple:
        return ("EVAL", self.source, len(keys), *keys, *args)

    async def run(self, redis: Redis, keys: list, args: list):
        (reply,) = await redis.pipeline([self.by_sha(keys, args)])
        if isinstance(reply, ReplyError) and reply.no_script:
            (reply,) = await redis.pipeline([self.whole(keys, args)])
        if isinstance(reply, ReplyError):
            raise reply
        return reply
