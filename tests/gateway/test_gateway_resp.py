"""The store's Redis client (``spectrum_gateway.resp``): against the real redis-server, and
against servers written here byte by byte for what Redis will not do on request (silence, a
connection cut mid-pipeline)."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gateway_harness import tcp_server     # (and spectrum_gateway on sys.path)
from spectrum_gateway.resp import (INCOMPLETE, Head, Reader, Redis, ReplyError, Script,
                                   Unreachable, _Connection, encode)


def test_encode_and_parse_every_reply_kind_at_every_split():
    assert encode(("SET", "k", b"\x00v", 3, 1.5)) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00v\r\n$1\r\n3\r\n$3\r\n1.5\r\n")
    # A head encoded once stands for its arguments: the same bytes, whatever follows it.
    for head, rest in [(("EVALSHA", "f" * 40, 2, "k1", "k2"), ("id", -5, 0.25)),
                       (("XADD", "ledger", "*", "e"), ('{"tenant":"étranger"}',)),
                       (("SET", "clé"), (b"\x00v",)), (("PING",), ())]:
        assert encode((Head(*head), *rest)) == encode((*head, *rest))
    wire = (b"+OK\r\n-ERR wrong\r\n:42\r\n$5\r\nhe\r\no\r\n$-1\r\n$0\r\n\r\n"
            b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n*0\r\n*-1\r\n")
    expected = [b"OK", "ERR wrong", 42, b"he\r\no", None, b"", [1, [b"a", None], []], None]
    reader, replies = Reader(), []
    reader.feed(wire)
    while (reply := reader.gets()) is not INCOMPLETE:
        replies.append(str(reply) if isinstance(reply, ReplyError) else reply)
    assert replies == expected and not reader.has_data()
    # Every cut short of a reply's end is incomplete, never a wrong value; the rest, fed
    # after, completes it (test_gateway_resp_reference.py checks this against hiredis).
    for cut in range(len(wire)):
        reader, got = Reader(), []
        for piece in (wire[:cut], wire[cut:]):
            reader.feed(piece)
            while (reply := reader.gets()) is not INCOMPLETE:
                got.append(str(reply) if isinstance(reply, ReplyError) else reply)
            if piece:
                assert got == expected[:len(got)]
        assert got == expected


def run(coro):
    return asyncio.run(coro)


def test_commands_pipelines_errors_and_scripts(redis_server):
    async def main():
        redis = Redis(redis_server.url, 1.0, 5.0)
        key = f"test-resp-{uuid.uuid4().hex[:8]}"
        try:
            assert await redis.command("PING") == b"PONG"
            replies = await redis.pipeline([("HSET", key, "a", "1", "b", "2"), ("HGETALL", key),
                                            ("INCR", key), ("HGET", key, "nope")])
            assert replies[:2] == [2, [b"a", b"1", b"b", b"2"]] and replies[3] is None
            assert isinstance(replies[2], ReplyError) and "WRONGTYPE" in str(replies[2])
            with pytest.raises(ReplyError, match="WRONGTYPE"):
                await redis.command("INCR", key)
            # Concurrent callers share the connection; each gets its own reply.
            counts = await asyncio.gather(*(redis.command("INCR", key + ":n") for _ in range(50)))
            assert sorted(counts) == list(range(1, 51))
            # A script Redis has forgotten is sent again whole.
            script = Script("return {KEYS[1], ARGV[1] + 1}")
            assert await script.run(redis, [key], [41]) == [key.encode(), 42]
            await redis.command("SCRIPT", "FLUSH")
            (by_sha,) = await redis.pipeline([script.by_sha([key], [1])])
            assert isinstance(by_sha, ReplyError) and by_sha.no_script
            assert await script.run(redis, [key], [1]) == [key.encode(), 2]
        finally:
            await redis.command("DEL", key, key + ":n")
            redis.close()
    run(main())


def test_user_password_and_database_from_the_url(redis_server):
    async def main():
        admin = Redis(redis_server.url, 1.0, 5.0)
        user = f"gw{uuid.uuid4().hex[:6]}"
        await admin.command("ACL", "SETUSER", user, "on", ">s3cr:et", "~*", "+@all")
        try:
            redis = Redis(f"redis://{user}:s3cr%3Aet@127.0.0.1:{redis_server.port}/3", 1.0, 5.0)
            await redis.command("SET", "resp-db-check", "three")
            assert await redis.command("GET", "resp-db-check") == b"three"
            assert await admin.command("GET", "resp-db-check") is None     # db 0: not there
            await redis.command("DEL", "resp-db-check")
            redis.close()
            wrong = Redis(f"redis://{user}:nope@127.0.0.1:{redis_server.port}/0", 1.0, 5.0)
            with pytest.raises(Unreachable, match="WRONGPASS"):
                await wrong.command("PING")
        finally:
            await admin.command("ACL", "DELUSER", user)
            admin.close()
    run(main())


def test_silence_fails_every_waiting_command_within_the_timeout_then_it_reconnects():
    async def main():
        async def handle(reader, writer, n):
            await reader.read(1024)
            if n == 1:
                await asyncio.sleep(10)          # the first connection: never a reply
            else:
                writer.write(b"+PONG\r\n")
                await writer.drain()
                await reader.read(1024)
        server, port = await tcp_server(handle)
        redis = Redis(f"redis://127.0.0.1:{port}/0", 1.0, 0.2)
        started = time.monotonic()
        results = await asyncio.gather(redis.command("PING"), redis.command("PING"),
                                       return_exceptions=True)
        waited = time.monotonic() - started
        # The peer never replies: only the 200 ms command timeout ends the wait, and not before.
        assert all(isinstance(r, Unreachable) and "no reply within 200 ms" in str(r)
                   for r in results), results
        assert waited > 0.15
        assert await redis.command("PING") == b"PONG"      # a new connection
        redis.close()
        server.close()
    run(main())


def test_a_connection_cut_mid_pipeline_fails_its_commands_and_the_next_one_reconnects():
    async def main():
        async def handle(reader, writer, n):
            await reader.read(1024)
            if n == 1:
                writer.write(b":1\r\n:2")        # one reply and part of the next, then gone
                await writer.drain()
                return
            writer.write(b"+PONG\r\n")
            await writer.drain()
            await reader.read(1024)
        server, port = await tcp_server(handle)
        redis = Redis(f"redis://127.0.0.1:{port}/0", 1.0, 5.0)
        with pytest.raises(Unreachable, match="closed the connection"):
            await redis.pipeline([("INCR", "a"), ("INCR", "a"), ("INCR", "a")])
        assert await redis.command("PING") == b"PONG"
        redis.close()
        server.close()
    run(main())


def test_nothing_listening_and_garbage_are_unreachable_at_once():
    CONNECT_TIMEOUT_S = 30
    async def main():
        server, port = await tcp_server(lambda reader, writer, n: asyncio.sleep(0))
        server.close()
        await server.wait_closed()
        started = time.monotonic()
        with pytest.raises(Unreachable, match=f"cannot connect to 127.0.0.1:{port}"):
            await Redis(f"redis://127.0.0.1:{port}/0", CONNECT_TIMEOUT_S, 1.0).command("PING")
        # Refused, not timed out: the client did not wait out its connect timeout.
        assert time.monotonic() - started < CONNECT_TIMEOUT_S

        async def garbage(reader, writer, n):
            await reader.read(1024)
            writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(1)
        server, port = await tcp_server(garbage)
        with pytest.raises(Unreachable, match="not a RESP2 reply"):
            await Redis(f"redis://127.0.0.1:{port}/0", 1.0, 1.0).command("PING")
        server.close()
    run(main())


class RecordingTransport(asyncio.Transport):
    """The socket's end of a connection: what was written, call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def test_commands_given_in_one_turn_go_out_in_one_write_and_an_unwritten_one_is_not_sent():
    async def main():
        loop = asyncio.get_running_loop()
        connection, transport = _Connection(), RecordingTransport()
        connection.connection_made(transport)
        first = connection.send(loop, encode(("INCR", "a")), 1)
        both = connection.send(loop, encode(("GET", "a")) + encode(("GET", "b")), 2)
        assert transport.writes == []                   # not yet: at the end of this turn
        await asyncio.sleep(0)
        assert transport.writes == [encode(("INCR", "a")) + encode(("GET", "a"))
                                    + encode(("GET", "b"))]
        connection.data_received(b":1\r\n$1\r\n1\r\n")
        connection.data_received(b"$-1\r\n")
        assert [w.result() for w in first + both] == [1, b"1", None]

        # Redis drops the connection with one command written and one still to be: only the
        # written one may have run (so only its reservation is given back later).
        written = connection.send(loop, encode(("INCR", "a")), 1)
        await asyncio.sleep(0)
        unwritten = connection.send(loop, encode(("INCR", "a")), 1)
        connection.connection_lost(None)
        await asyncio.sleep(0)
        assert len(transport.writes) == 2                # the second was never written
        assert written[0].exception().sent is True
        assert unwritten[0].exception().sent is False
        with pytest.raises(Unreachable) as refused:
            connection.send(loop, encode(("PING",)), 1)
        assert refused.value.sent is False
    run(main())


def test_a_url_that_is_not_redis_is_refused():
    with pytest.raises(ValueError, match="not a redis:// or rediss:// URL"):
        Redis("http://127.0.0.1:6379/0", 1.0, 1.0)
