"""The store's Redis client: RESP2 over one pipelined connection per process (per node of a
Redis Cluster).

Every request makes two round trips to Redis (reserve; settle + ledger + counters), so the
client's own CPU is part of every request's: redis-py spent more packing, pooling and parsing a
command than Redis spent running it (with hiredis's parser too: ``tests/gateway/
redis_client_bench.py``). Here a command is encoded as text in one go (the part that never
changes, once per process), replies are parsed as they arrive by a ``Reader`` that resumes
where it stopped (``test_gateway_resp_reference.py`` holds it to hiredis's), and commands from
concurrent requests share the connection (Redis runs one at a time anyway, so a pool of
connections buys nothing but CPU).

Nothing hangs and nothing is mismatched: connecting is bounded by ``connect_timeout_s`` and
each round trip by ``command_timeout_s``. A connection that drops fails every command waiting
on it; one silent past a round trip's timeout fails that round trip and retires (no new
commands; its late replies still say what ran, ``Unreachable.outcome``); one that meets a
server which cannot take commands now (a replica after a failover, a server loading its data:
``MOVE_ON``) retires too. The next command connects again. In a cluster each command goes to
its slot's primary, and ``MOVED`` / ``ASK`` are followed.
"""
from __future__ import annotations

import asyncio
import binascii
import functools
import hashlib
import os
import socket
import ssl
import time
from collections import deque
from urllib.parse import unquote, urlsplit


class Unreachable(Exception):
    """No answer from Redis: it could not be reached, dropped the connection, or was silent.
    ``sent``: the command had been written, so Redis may have run it and only the reply is
    missing. ``outcome``: when the round trip timed out on a connection that is still open
    (or, in a cluster, only some of its nodes failed), a future that gets the round trip's
    replies as they come, late, with ``UNKNOWN`` in place of those that never will (the
    connection dropped, or stayed silent ``LATE_REPLY_S`` more). Until it is done nobody knows
    whether Redis ran the commands, so sending them again could run them twice."""

    def __init__(self, detail: str, sent: bool = True,
                 outcome: asyncio.Future | None = None) -> None:
        super().__init__(detail)
        self.sent = sent
        self.outcome = outcome


# Error replies that mean the command did not run because this server cannot take it now.
# The store answers 503 for them (with Retry-After) and keeps its settles to retry.
# The first three also mean the connection is on the wrong server: a replica (a failover made
# the old primary one), a server still loading its data set after a restart, a replica cut off
# from its primary. That connection takes no new commands and the next one connects again,
# which through ElastiCache's primary endpoint (a DNS name) reaches the new primary.
MOVE_ON = frozenset({"READONLY", "LOADING", "MASTERDOWN"})
UNAVAILABLE = MOVE_ON | {"TRYAGAIN", "CLUSTERDOWN", "BUSY", "OOM", "NOREPLICAS",
                         "MOVED", "ASK"}     # (those two: still redirected after MAX_REDIRECTS)


class ReplyError(Exception):
    """Redis's error reply to one command (``-ERR ...``), returned in place of its result."""

    @property
    def code(self) -> str:
        """Its first word: ``ERR``, ``WRONGTYPE``, ``NOSCRIPT``, ``READONLY``, ..."""
        return str(self).split(" ", 1)[0]

    @property
    def no_script(self) -> bool:
        return self.code == "NOSCRIPT"

    @property
    def unavailable(self) -> bool:
        """Not run, because this server cannot take commands now (``UNAVAILABLE``)."""
        return self.code in UNAVAILABLE


INCOMPLETE = object()      # Reader.gets: no whole reply yet


class Head:
    """A command's leading arguments that are the same every time it is sent (a script's SHA
    and keys, the ledger stream's name and trimming), encoded once. First in a command's
    tuple, it stands for those arguments: only the rest are encoded per request."""

    __slots__ = ("count", "encoded", "slot")

    def __init__(self, *args) -> None:
        self.count = len(args)
        self.encoded = _encode_args(args)
        self.slot = command_slot(args)      # its key's cluster slot, worked out once


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


class ProtocolError(Unreachable):
    """Bytes that are not a RESP2 reply: whatever sent them is not (or no longer) Redis
    speaking RESP2, so nothing more on that connection can be trusted."""


_INT64 = 1 << 63
_MAX_ELEMENTS = (1 << 32) - 1     # as hiredis: a longer array is a broken stream, not a reply


def _number(line: bytearray, what: str) -> int:
    """A RESP integer, written as Redis writes one: ``0`` or ``-?[1-9][0-9]*`` within 64 bits.
    ``int()`` alone would also take ``+1``, `` 1``, ``1_0`` and ``007``, which no Redis sends:
    taking them would read a corrupted stream as a value."""
    digits = line[1:] if line[:1] == b"-" else line
    if (not digits.isdigit() or len(digits) > 19 or (digits[0] == 48 and len(line) > 1)):
        raise ProtocolError(f"not a RESP2 reply: bad {what} {bytes(line[:40])!r}")
    value = int(line)
    if not -_INT64 <= value < _INT64:
        raise ProtocolError(f"not a RESP2 reply: {what} {bytes(line)!r} is out of range")
    return value


def _line(line: bytearray) -> bytearray:
    if 13 in line or 10 in line:
        raise ProtocolError(f"not a RESP2 reply: a CR or LF inside a status line "
                            f"{bytes(line[:40])!r}")
    return line


class Reader:
    """RESP2 replies out of the bytes a connection receives, whichever way they were cut.

    Parsing resumes where it stopped: an array still arriving keeps the items read so far
    (``_arrays``) and the position of the first item not yet whole, so every byte is looked
    at about once however many pieces a large reply (a page of the ledger) arrives in.
    Parsing a partial reply again from its start on every piece made reading N replies' worth
    of bytes cost O(N²).

    Replies: bytes (simple and bulk strings), int, None (null bulk string or array), list,
    ``ReplyError`` (an error reply, returned, not raised). Anything else, RESP3's types
    included (this client never asks for RESP3), raises ``ProtocolError``.
    """

    __slots__ = ("_buffer", "_pos", "_arrays")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pos = 0                 # where the next unread element starts
        self._arrays: list = []       # arrays being filled, outermost first: [items, still to come]

    def feed(self, data: bytes) -> None:
        if self._pos:                 # (deleting a bytearray's front is cheap in CPython)
            del self._buffer[:self._pos]
            self._pos = 0
        self._buffer += data

    def has_data(self) -> bool:
        """Bytes received that are not part of a whole reply yet."""
        return bool(self._arrays) or self._pos < len(self._buffer)

    def unread(self, limit: int = 40) -> bytes:
        """The first ``limit`` bytes not yet returned as (part of) a reply, for messages."""
        return bytes(self._buffer[self._pos:self._pos + limit])

    def gets(self):
        """The next whole reply, or ``INCOMPLETE`` until more bytes are fed."""
        buffer, pos, arrays = self._buffer, self._pos, self._arrays
        while True:
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                # A type byte that no reply starts with is refused now, not once a line ends.
                if pos < len(buffer) and buffer[pos] not in b"$:*+-":
                    raise ProtocolError(f"not a RESP2 reply: {bytes(buffer[pos:pos + 40])!r}")
                break
            kind = buffer[pos]
            if kind == 36:                                    # $ bulk string
                line = buffer[pos + 1:end]
                # Nearly always a short plain number: checked here without a call.
                if line.isdigit() and end - pos < 20 and (line[0] != 48 or end - pos == 2):
                    size = int(line)
                else:
                    size = _number(line, "bulk string length")
                if size < 0:
                    if size != -1:
                        raise ProtocolError(f"not a RESP2 reply: bulk string length {size}")
                    value, pos = None, end + 2
                else:
                    start = end + 2
                    stop = start + size
                    if len(buffer) < stop + 2:
                        break
                    if buffer[stop] != 13 or buffer[stop + 1] != 10:
                        raise ProtocolError(f"not a RESP2 reply: a bulk string of {size} bytes "
                                            f"not followed by CRLF: {bytes(buffer[stop:stop + 40])!r}")
                    value, pos = bytes(buffer[start:stop]), stop + 2
            elif kind == 58:                                  # : integer
                line = buffer[pos + 1:end]
                if line.isdigit() and end - pos < 20 and (line[0] != 48 or end - pos == 2):
                    value = int(line)
                else:
                    value = _number(line, "integer")
                pos = end + 2
            elif kind == 42:                                  # * array
                line = buffer[pos + 1:end]
                if line.isdigit() and end - pos < 20 and (line[0] != 48 or end - pos == 2):
                    size = int(line)
                else:
                    size = _number(line, "array length")
                pos = end + 2
                if size > 0:
                    if size > _MAX_ELEMENTS:
                        raise ProtocolError(f"not a RESP2 reply: an array of {size} items")
                    arrays.append([[], size])
                    continue
                if size < -1:
                    raise ProtocolError(f"not a RESP2 reply: array length {size}")
                value = [] if size == 0 else None
            elif kind == 43:                                  # + simple string
                value, pos = bytes(_line(buffer[pos + 1:end])), end + 2
            elif kind == 45:                                  # - error
                value = ReplyError(_line(buffer[pos + 1:end]).decode(errors="replace"))
                pos = end + 2
            else:
                raise ProtocolError(f"not a RESP2 reply: {bytes(buffer[pos:pos + 40])!r}")
            while arrays:                # the value completes its array, and maybe its parents
                top = arrays[-1]
                top[0].append(value)
                top[1] -= 1
                if top[1]:
                    break
                value = arrays.pop()[0]
            else:
                self._pos = pos
                return value
        self._pos = pos
        return INCOMPLETE


# A round trip that timed out leaves its connection open this long for the late replies that
# tell whether Redis ran its commands (a server that was only slow: a long script, a fork, a
# DEBUG SLEEP); then the connection is closed and what it carried counts as never answered.
LATE_REPLY_S = 10.0


class _Late:
    """The replies of a round trip whose caller stopped waiting (``Unreachable.outcome``)."""

    __slots__ = ("outcome", "replies", "left")

    def __init__(self, outcome: asyncio.Future, count: int) -> None:
        self.outcome, self.replies, self.left = outcome, [UNKNOWN] * count, count

    def add(self, index: int, reply) -> None:
        self.replies[index] = reply
        self.left -= 1
        if not self.left and not self.outcome.done():
            self.outcome.set_result(self.replies)

    def never(self) -> None:
        """The rest will not come: UNKNOWN stays in their places."""
        if not self.outcome.done():
            self.outcome.set_result(self.replies)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport = None
        self.reader = Reader()
        self.waiting: deque[asyncio.Future] = deque()      # one per command sent, in order
        self.lost: Exception | None = None
        # Commands given in one turn of the loop go out in one write at its end: on loopback a
        # write costs far more than the commands it carries, and concurrent requests' reserves
        # and settles often fall in the same turn.
        self.outgoing: list[bytes] = []
        self.unwritten = 0            # the last this many of ``waiting`` are still in outgoing
        # Retiring: it takes no new commands (the next goes on a new connection) and closes
        # once the replies it still waits for are in: it met a server that cannot take
        # commands (MOVE_ON) or one silent past a round trip's timeout.
        self.retiring = False
        self.late: dict = {}          # waiter whose caller gave up → (its _Late, index)
        self._give_up = None          # the timer that ends the wait for late replies
        self.heard = 0.0              # loop time of the last bytes received (or connecting)
        self.password = None          # what it authenticated with

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.heard = asyncio.get_running_loop().time()

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        try:
            while self.waiting:
                reply = reader.gets()
                if reply is INCOMPLETE:
                    break
                waiter = self.waiting.popleft()
                if not waiter.done():          # its caller may have been cancelled meanwhile
                    waiter.set_result(reply)
                elif self.late:
                    late = self.late.pop(waiter, None)
                    if late is not None:
                        late[0].add(late[1], reply)
                if type(reply) is ReplyError and reply.code in MOVE_ON:
                    self.retiring = True
        except ProtocolError as e:
            self.fail(e)
            return
        if not self.waiting:
            if reader.has_data():
                self.fail(ProtocolError(f"Redis sent what nobody asked for: {reader.unread()!r}"))
            elif self.retiring:
                self.fail(Unreachable("the connection was retired"))
        self.heard = asyncio.get_running_loop().time()

    def connection_lost(self, exc) -> None:
        self.fail(Unreachable("Redis closed the connection" + (f" ({exc})" if exc else "")))

    def fail(self, error: Unreachable) -> None:
        if self.lost is None:
            self.lost = error
        if self.transport is not None:
            self.transport.close()
        if self._give_up is not None:
            self._give_up.cancel()
            self._give_up = None
        waiting, self.waiting = self.waiting, deque()
        written = len(waiting) - self.unwritten
        self.outgoing, self.unwritten = [], 0
        for index, waiter in enumerate(waiting):
            if not waiter.done():
                waiter.set_exception(error if index < written or not error.sent
                                     else Unreachable(str(error), sent=False))
        late, self.late = self.late, {}
        for collector, _ in late.values():
            collector.never()

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

    def silent(self, waiters: list[asyncio.Future], timeout_s: float) -> None:
        """The round trip of ``waiters`` got no whole answer within ``timeout_s``: its caller
        stops waiting (``Unreachable`` with an ``outcome``) and the connection retires. It is
        not closed yet: closing it would leave unknown whether Redis ran the commands (a
        server that was only slow runs what it had read, and would run a retry as well)."""
        if waiters[-1].done() or self.lost is not None:
            return
        loop = waiters[-1].get_loop()
        collector = _Late(loop.create_future(), len(waiters))
        error = Unreachable(f"no reply within {timeout_s * 1000:g} ms", outcome=collector.outcome)
        for index, waiter in enumerate(waiters):
            if not waiter.done():
                self.late[waiter] = (collector, index)
                waiter.set_exception(error)
            elif not waiter.cancelled() and waiter.exception() is None:
                collector.add(index, waiter.result())
        self.retiring = True
        if self._give_up is None:
            self._give_up = loop.call_later(LATE_REPLY_S, self._silent_too_long)

    def retire(self) -> None:
        """Take no new commands; close once the replies still awaited are in."""
        self.retiring = True
        if not self.waiting and self.lost is None:
            self.fail(Unreachable("the connection was retired"))

    def _silent_too_long(self) -> None:
        self._give_up = None
        self.fail(Unreachable(f"no reply within {LATE_REPLY_S:g} s after a round trip timed "
                              "out; the connection was closed"))


# TCP keepalive on every connection: the kernel probes a connection that has been quiet this
# long, and drops it when that many probes this far apart go unanswered (Linux's defaults
# wait two hours), so a peer that vanished without a reset cannot hold it for ever.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3


def _keepalive(transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                          ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, option):       # (Linux; macOS names the first TCP_KEEPALIVE)
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class Misconfigured(Unreachable):
    """Redis refused how the client was told to use it (a database other than 0 where there is
    only database 0): no retry will help; the configuration must change."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, sent=False)


class PasswordFile:
    """A password or auth token kept in a file (an ElastiCache IAM token written by a
    sidecar, a mounted Kubernetes secret): read again whenever the file changes, so a rotated
    token is used by the next connection and re-sent on the open one (``reauthenticate``)
    before the old one expires."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple | None = None     # (mtime_ns, size) of what was read
        self._value: str | None = None

    def __call__(self) -> str:
        try:
            stat = os.stat(self.path)
            if (stat.st_mtime_ns, stat.st_size) != self._seen:
                with open(self.path, encoding="utf-8") as f:
                    self._value = f.read().strip()
                self._seen = stat.st_mtime_ns, stat.st_size
        except OSError as e:
            if self._value is None:           # never read: nothing to fall back on
                raise Unreachable(f"cannot read the store's password file {self.path!r} "
                                  f"({e.strerror or e})", sent=False) from None
        return self._value


class _Node:
    """One server: its connection (made on demand: TLS, AUTH, SELECT), pipelined round trips
    on it, and the connections it retired while their replies were still awaited."""

    def __init__(self, client: "Redis", host: str, port: int) -> None:
        self.client, self.host, self.port = client, host, port
        self.connection: _Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._retired: list[_Connection] = []    # retiring connections still open

    def __repr__(self) -> str:
        return f"{self.host}:{self.port}"

    async def _connect(self) -> _Connection:
        client = self.client
        loop = asyncio.get_running_loop()
        password = client._password() if client._password is not None else None
        try:
            _, connection = await asyncio.wait_for(loop.create_connection(
                _Connection, self.host, self.port, ssl=client._tls()), client.connect_timeout_s)
        except asyncio.TimeoutError:
            raise Unreachable(f"connecting to {self} timed out after "
                              f"{client.connect_timeout_s * 1000:g} ms", sent=False) from None
        except ssl.SSLCertVerificationError as e:
            raise Unreachable(
                f"the TLS certificate of {self} is not trusted ({e.verify_message}); "
                + ("is store.ca_file the CA that signed it?" if client.ca_file else
                   "give store.ca_file: the CA certificate that signed it"), sent=False) from None
        except ssl.SSLError as e:
            raise Unreachable(f"TLS with {self} failed ({e.reason or e}); does it speak TLS "
                              "(rediss://) on that port?", sent=False) from None
        except OSError as e:
            raise Unreachable(f"cannot connect to {self} ({e.strerror or e})", sent=False) from None
        _keepalive(connection.transport)
        connection.password = password
        setup = []
        if password is not None:
            setup.append(client._auth(password))
        if client.db:
            setup.append(("SELECT", client.db))
        if setup:
            try:
                replies = await self._round_trip(connection, setup)
            except BaseException:
                connection.fail(Unreachable("connecting was given up", sent=False))
                raise
            for command, reply in zip(setup, replies):
                if not isinstance(reply, ReplyError):
                    continue
                if command[0] == "SELECT" and not reply.unavailable:
                    error = Misconfigured(
                        f"{self} refused SELECT {client.db} ({reply}): it has only database 0, "
                        "as ElastiCache Serverless and Redis Cluster do; end the store URL with /0")
                else:
                    error = Unreachable(f"Redis refused {command[0]}: {reply}", sent=False)
                connection.fail(error)
                raise error
        return connection

    def usable(self) -> _Connection | None:
        connection = self.connection
        if connection is None or connection.lost is not None or connection.retiring:
            return None
        return connection

    async def ready(self) -> _Connection:
        connection = self.usable()
        if connection is not None:
            return connection
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    def _connected(self, attempt: asyncio.Future) -> None:
        self._connecting = None
        if not attempt.cancelled() and attempt.exception() is None:
            old, self.connection = self.connection, attempt.result()
            self._retired = [c for c in self._retired if c.lost is None]
            if old is not None and old.lost is None:
                self._retired.append(old)      # still waiting for replies: closed by close()

    def _start(self, connection: _Connection, commands: list, timeout_s: float | None) -> tuple:
        """The commands sent (at the end of this turn of the loop) and timed: the round trip
        to await with ``_end``. Apart, so that a cluster's pipeline starts its round trips to
        every node before it awaits any of them, without a task for each."""
        loop = asyncio.get_running_loop()
        waiters = connection.send(loop, b"".join(map(encode, commands)), len(commands))
        timeout_s = timeout_s or self.client.command_timeout_s
        return waiters, loop.call_later(timeout_s, connection.silent, waiters, timeout_s)

    @staticmethod
    async def _end(started: tuple) -> list:
        waiters, timer = started
        try:
            await waiters[-1]      # replies come in order: the last one done, all are
        except BaseException:
            for waiter in waiters:     # (retrieved: asyncio would log each one otherwise)
                if waiter.done() and not waiter.cancelled():
                    waiter.exception()
            raise
        finally:
            timer.cancel()
        return [waiter.result() for waiter in waiters]

    async def _round_trip(self, connection: _Connection, commands: list,
                          timeout_s: float | None = None) -> list:
        return await self._end(self._start(connection, commands, timeout_s))

    async def round_trip(self, commands: list, timeout_s: float | None = None) -> list:
        connection = self.usable() or await self.ready()
        return await self._round_trip(connection, commands, timeout_s)

    async def reauthenticate(self) -> None:
        client, connection = self.client, self.usable()
        if client._password is None or connection is None:
            return
        password = client._password()
        if password == connection.password:
            return
        (reply,) = await self._round_trip(connection, [client._auth(password)])
        if isinstance(reply, ReplyError):
            connection.retire()               # the next command connects again, and says why
            raise Unreachable(f"Redis refused the new password: {reply}", sent=False)
        connection.password = password

    async def ping_if_idle(self, idle_s: float) -> None:
        connection = self.usable()
        if connection is None:
            await self.ready()
        elif not connection.waiting and asyncio.get_running_loop().time() - connection.heard >= idle_s:
            (reply,) = await self._round_trip(connection, [("PING",)])
            if isinstance(reply, ReplyError):
                raise reply

    def close(self) -> None:
        for connection in [self.connection, *self._retired]:
            if connection is not None:
                connection.fail(Unreachable("the client was closed"))
        self.connection, self._retired = None, []


# --- Redis Cluster --------------------------------------------------------------------------------

SLOTS = 16384
# Commands that name no key: sent to any node (the others' first key is their first argument;
# EVAL and EVALSHA's is their fourth, after the script and the number of keys).
KEYLESS = frozenset({"PING", "ECHO", "AUTH", "HELLO", "SELECT", "CLUSTER", "ACL", "INFO", "CLIENT",
                     "CONFIG", "DEBUG", "SCRIPT", "FUNCTION", "TIME", "DBSIZE", "FLUSHDB",
                     "FLUSHALL", "ROLE", "READONLY", "READWRITE", "ASKING", "WAIT", "SAVE"})
REDIRECTS = frozenset({"MOVED", "ASK"})
MAX_REDIRECTS = 5            # a command moved more often than this meets a cluster in upheaval
REFRESH_EVERY_S = 1.0        # the slot map is asked for again at most this often


@functools.lru_cache(maxsize=65536)
def key_slot(key) -> int:
    """The cluster slot of a key: CRC16 (XMODEM, which ``binascii.crc_hqx`` computes) of the
    key, or of its hash tag (the text between its first ``{`` and the next ``}``, when not
    empty), modulo 16,384. Keys that share a tag share a slot, hence a node: a tenant's quota
    keys, all named ``...{tenant}...``, can go to one Lua script."""
    data = key.encode() if isinstance(key, str) else bytes(key)
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    return binascii.crc_hqx(data, 0) % SLOTS


def command_slot(command: tuple) -> int | None:
    """The slot of a command's key (None: it has none)."""
    head = command[0]
    if type(head) is Head:
        return head.slot
    name = head.upper() if isinstance(head, str) else bytes(head).decode().upper()
    if name in ("EVAL", "EVALSHA"):
        return key_slot(command[3]) if len(command) > 3 and int(command[2]) > 0 else None
    if name in KEYLESS or len(command) < 2:
        return None
    return key_slot(command[1])


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


# In an ``Unreachable.outcome``'s replies: a command whose reply never came (it may have run).
UNKNOWN = _Unknown()


class Redis:
    """``redis://[[user]:password@]host[:port][/db]`` (``rediss://`` for TLS): one server, or
    any node of a Redis Cluster.

    ``ca_file``: the CA certificates a ``rediss://`` server's certificate must chain to (the
    system's when not given). ``password``: where the password (or IAM auth token) comes from
    when the URL has none: a string, or a callable asked on every connect (``PasswordFile``).

    Whether the server is a cluster node is asked when ``connect`` is called (``CLUSTER
    SLOTS``; a server without cluster support refuses it), and found out anyway from the first
    ``MOVED`` a command gets (then its slot map is asked for). In a cluster each command goes to the primary serving its
    key's slot, one pipelined connection per node; the commands of one pipeline that belong to
    different nodes go out together, one round trip each. ``MOVED`` (the slot has moved: a
    failover, a resharding) is followed and the slot map asked for again; ``ASK`` (the slot is
    being migrated) is followed for that command alone.
    """

    def __init__(self, url: str, connect_timeout_s: float, command_timeout_s: float, *,
                 ca_file: str | None = None, password=None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"{url!r} is not a redis:// or rediss:// URL")
        self.tls = parts.scheme == "rediss"
        self.ca_file = ca_file
        self.db = int(parts.path.strip("/") or 0)
        self.username = unquote(parts.username) if parts.username else None
        if parts.password is not None:
            password = unquote(parts.password)
        self._password = password if callable(password) or password is None else (lambda: password)
        self.connect_timeout_s, self.command_timeout_s = connect_timeout_s, command_timeout_s
        self._tls_context: ssl.SSLContext | None = None
        self._seed = _Node(self, parts.hostname, parts.port or 6379)   # the node in the URL
        self.host, self.port = self._seed.host, self._seed.port
        self._nodes: dict[tuple, _Node] = {(self.host, self.port): self._seed}
        self._slots: list | None = None          # a cluster: the node serving each slot
        self._checked = False                    # whether the seed was asked if it is one
        self._checking: asyncio.Future | None = None
        self._refreshing: asyncio.Future | None = None
        self._refreshed = 0.0

    @property
    def cluster(self) -> bool:
        return self._slots is not None

    @property
    def _connection(self) -> _Connection | None:
        """The seed node's connection (one server: the only one)."""
        return self._seed.connection

    def _auth(self, password: str) -> tuple:
        return ("AUTH", self.username, password) if self.username else ("AUTH", password)

    def _tls(self) -> ssl.SSLContext | None:
        if self.tls and self._tls_context is None:
            self._tls_context = ssl.create_default_context(cafile=self.ca_file)
        return self._tls_context

    def _node(self, host: str, port: int) -> _Node:
        node = self._nodes.get((host, port))
        if node is None:
            node = self._nodes[(host, port)] = _Node(self, host, port)
        return node

    # --- is it a cluster, and where is each slot

    async def _check(self) -> None:
        if self._checking is None:
            self._checking = asyncio.ensure_future(self._ask_slots(self._seed, first=True))
            self._checking.add_done_callback(lambda _: setattr(self, "_checking", None))
        await asyncio.shield(self._checking)

    async def _ask_slots(self, node: _Node, first: bool = False) -> bool:
        """``CLUSTER SLOTS`` of ``node`` applied; False when it says it is no cluster node."""
        (reply,) = await node.round_trip([("CLUSTER", "SLOTS")])
        self._checked = True
        if not isinstance(reply, list):
            # No cluster support ("ERR This instance has cluster support disabled"), or not
            # allowed to ask: a MOVED would tell, and is followed then.
            return False
        slots = [None] * SLOTS
        for start, end, primary, *_ in reply:
            host = primary[0].decode() if primary[0] else node.host
            for extra in primary[3:]:      # Redis 7: {hostname: ...}, when nodes announce one
                if isinstance(extra, list) and b"hostname" in extra[::2]:
                    named = extra[extra.index(b"hostname") + 1]
                    host = named.decode() if named else host
            slots[start:end + 1] = [self._node(host, int(primary[1]))] * (end - start + 1)
        self._slots = slots
        self._refreshed = time.monotonic()
        return True

    def _refresh_soon(self) -> None:
        """Ask for the slot map again (in the background, at most every REFRESH_EVERY_S)."""
        if self._refreshing is None and time.monotonic() - self._refreshed >= REFRESH_EVERY_S:
            self._refreshed = time.monotonic()
            self._refreshing = asyncio.ensure_future(self._refresh())
            self._refreshing.add_done_callback(lambda _: setattr(self, "_refreshing", None))

    async def _refresh(self) -> None:
        """The map from the first node that answers: the seed, then those the map names."""
        for node in [self._seed, *dict.fromkeys(n for n in self._slots or () if n is not None)]:
            try:
                if await self._ask_slots(node):
                    return
            except Exception:          # (in the background: the next MOVED asks again)
                continue

    def _node_for(self, command: tuple) -> _Node:
        slot = command_slot(command)
        node = self._slots[slot] if slot is not None else None
        return node or self._seed

    # --- commands

    async def pipeline(self, commands: list[tuple], timeout_s: float | None = None) -> list:
        """The commands in one write and one round trip (in a cluster, one per node they go
        to); their replies in order, an error reply as a ``ReplyError`` in its place (not
        raised). ``Unreachable`` if none came within ``timeout_s`` (``command_timeout_s``
        unless given: a large reply may take longer)."""
        if self._slots is None:
            replies = await self._seed.round_trip(commands, timeout_s)
            for reply in replies:
                if type(reply) is ReplyError and reply.code in REDIRECTS:
                    break
            else:
                return replies
            try:                                 # a cluster that did not say so
                if not await self._ask_slots(self._seed):
                    return replies
            except Unreachable:   # the MOVED replies stand (a 503): the rest has run
                return replies
            return await self._across_nodes(commands, timeout_s, replies)
        return await self._across_nodes(commands, timeout_s)

    async def _across_nodes(self, commands: list[tuple], timeout_s, replies=None) -> list:
        """A cluster's pipeline: the commands grouped by node, the groups sent together, the
        redirected ones sent again where they are told to go."""
        asking: dict[int, _Node] = {}            # command → the node an ASK named
        if replies is None:
            replies, todo = [UNKNOWN] * len(commands), range(len(commands))
        else:
            todo = self._redirected(replies, range(len(commands)), asking)
        for _ in range(MAX_REDIRECTS + 1):
            if not todo:
                return replies
            groups: dict[_Node, list[int]] = {}
            for index in todo:
                groups.setdefault(asking.get(index) or self._node_for(commands[index]), []).append(index)
            failures, started = [], []
            for node, indexes in groups.items():
                # An ASK's command goes right after ASKING; ``at``: where each reply will be.
                wire, at = [], []
                for index in indexes:
                    if index in asking:
                        wire.append(("ASKING",))
                    at.append(len(wire))
                    wire.append(commands[index])
                try:
                    connection = node.usable() or await node.ready()
                    started.append((indexes, at, node._start(connection, wire, timeout_s)))
                except Unreachable as e:
                    failures.append((indexes, at, e))
            for indexes, at, round_trip in started:
                try:
                    result = await _Node._end(round_trip)
                except Unreachable as e:
                    failures.append((indexes, at, e))
                    continue
                for index, position in zip(indexes, at):
                    replies[index] = result[position]
            if failures:
                self._refresh_soon()           # a node gone may mean a failover: ask again
                raise _combined(replies, failures)
            todo = self._redirected(replies, [i for ix in groups.values() for i in ix], asking)
        return replies       # still redirected: the MOVED errors stand (UNAVAILABLE: a 503)

    def _redirected(self, replies: list, indexes, asking: dict) -> list[int]:
        """The commands told to go elsewhere; the slot map updated for each MOVED."""
        again = []
        for index in indexes:
            reply = replies[index]
            if type(reply) is not ReplyError or reply.code not in REDIRECTS:
                asking.pop(index, None)
                continue
            _, slot, address = str(reply).split(" ", 2)
            host, _, port = address.rpartition(":")
            node = self._node(host or self._seed.host, int(port))
            if reply.code == "MOVED":
                asking.pop(index, None)
                if self._slots is not None:
                    self._slots[int(slot)] = node
                self._refresh_soon()
            else:
                asking[index] = node
            again.append(index)
        return again

    async def command(self, *command, timeout_s: float | None = None):
        """One command's reply; its error reply raised."""
        (reply,) = await self.pipeline([command], timeout_s)
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    def _all_nodes(self) -> list[_Node]:
        nodes = [self._seed]
        if self._slots is not None:
            nodes += dict.fromkeys(n for n in self._slots if n is not None and n is not self._seed)
        return nodes

    async def connect(self) -> None:
        """Connect now rather than on the first command (and learn whether it is a cluster)."""
        await self._seed.ready()
        if not self._checked:
            await self._check()

    async def ping_if_idle(self, idle_s: float) -> None:
        """PING each node nothing was heard from for ``idle_s``: a connection that went silent
        (a failover that left no one to reset it, a network path gone) is found and replaced
        while idle, not by the next request's timeout. TCP keepalive does the same for the
        kernel, more slowly."""
        for node in self._all_nodes():
            await node.ping_if_idle(idle_s)

    async def reauthenticate(self) -> None:
        """AUTH again on each open connection when the password source now gives another
        value (a rotated token): ElastiCache ends an IAM-authenticated connection 12 hours
        after its last AUTH, and a connection opened later would use the new value anyway."""
        for node in self._all_nodes():
            await node.reauthenticate()

    def close(self) -> None:
        for node in self._nodes.values():
            node.close()


def _combined(replies: list, failures: list) -> Unreachable:
    """One ``Unreachable`` for a cluster pipeline some of whose nodes did not answer: its
    ``outcome`` gets every command's reply, those that never came as UNKNOWN."""
    sent = any(e.sent for _, _, e in failures) or any(r is not UNKNOWN for r in replies)
    detail = "; ".join(str(e) for _, _, e in failures)
    late = [(indexes, at, e.outcome) for indexes, at, e in failures if e.outcome is not None]
    if not sent:
        return Unreachable(detail, sent=False)
    loop = asyncio.get_running_loop()
    outcome = loop.create_future()

    def complete(_=None) -> None:
        if outcome.done() or any(not future.done() for _, _, future in late):
            return
        for indexes, at, future in late:      # (``at``: past the ASKING replies)
            late_replies = future.result()
            for index, position in zip(indexes, at):
                replies[index] = late_replies[position]
        outcome.set_result(list(replies))
    for _, _, future in late:
        future.add_done_callback(complete)
    complete()
    return Unreachable(detail, outcome=outcome)



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
