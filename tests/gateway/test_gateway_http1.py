"""The gateway's upstream client (spectrum_gateway.http1) against real sockets: servers written
here byte by byte, so each test can make the upstream do the odd thing it is about (close a
pooled connection, end a body by closing, go silent, answer garbage, outrun its reader)."""
from __future__ import annotations

import asyncio

import pytest

from gateway_harness import tcp_server     # (and spectrum_gateway on sys.path)
from spectrum_gateway import http1

OK = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


async def serve(handler):
    """``tcp_server`` and the completion URL on it."""
    server, port = await tcp_server(handler)
    return server, f"http://127.0.0.1:{port}/v1/chat/completions"


def answering(raw: bytes, then_wait_s: float = 0.0):
    """A handler that answers one request with ``raw``, then holds the connection open."""
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        await asyncio.sleep(then_wait_s)
    return handler


def test_keep_alive_reuses_the_connection_and_sends_the_body_whole():
    async def main():
        seen = []

        async def handler(reader, writer, n):
            while True:
                seen.append((n, await read_request(reader)))
                writer.write(OK)
        server, url = await serve(handler)
        pool = http1.Pool(5, 5)
        for body in (b'{"a": 1}', b'{"b": 2}'):
            answer = await pool.post(url, body, {"content-type": "application/json"})
            assert (answer.status, await answer.read()) == (200, b"{}")
            assert answer.headers.get("Content-Type") == "application/json"
            answer.close()
        pool.close()
        server.close()
        return seen
    seen = asyncio.run(main())
    assert [n for n, _ in seen] == [1, 1]              # one connection for both
    first = seen[0][1]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-length: 8\r\n" in first and first.endswith(b'\r\n\r\n{"a": 1}')


def test_a_pooled_connection_closed_after_the_request_went_out_is_not_sent_again():
    """The race aiohttp calls ServerDisconnected: the upstream reads the next request on a
    kept-alive connection and closes it unanswered. It may have acted on that POST, so the
    client does not send it again: the caller gets the failure (the gateway's 502), and the
    next request goes on a new connection."""
    async def main():
        seen = []

        async def handler(reader, writer, n):
            await read_request(reader)
            seen.append(n)
            writer.write(OK)
            if n == 1:
                await read_request(reader)       # the second request, never answered
                seen.append(n)
                return
            while True:
                await read_request(reader)
                seen.append(n)
                writer.write(OK)
        server, url = await serve(handler)
        pool = http1.Pool(5, 5)
        outcomes = []
        for _ in range(3):
            try:
                answer = await pool.post(url, b"{}", {})
                outcomes.append((answer.status, await answer.read()))
                answer.close()
            except http1.ReadFailed as e:
                outcomes.append(("failed", e.answered, "closed" in str(e)))
        pool.close()
        server.close()
        return outcomes, seen
    outcomes, seen = asyncio.run(main())
    assert outcomes == [(200, b"{}"), ("failed", False, True), (200, b"{}")]
    assert seen == [1, 1, 2]          # the second request reached the upstream once, not twice


def test_a_pooled_connection_that_closed_while_idle_is_not_reused():
    async def main():
        async def handler(reader, writer, n):
            while True:          # each answer's body: the number of the connection it came on
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n%d" % n)
                await writer.drain()
                if n == 1:
                    return       # the first connection: one answer, then closed while idle
        server, url = await serve(handler)
        pool = http1.Pool(5, 5)
        bodies = []
        for _ in range(3):
            answer = await pool.post(url, b"{}", {})
            bodies.append(await answer.read())
            answer.close()
            await asyncio.sleep(0.1)             # the close reaches the idle connection
        pool.close()
        server.close()
        return bodies
    assert asyncio.run(main()) == [b"1", b"2", b"2"]


def test_a_body_ended_by_closing_the_connection_is_whole():
    async def main():
        server, url = await serve(answering(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it"))
        pool = http1.Pool(5, 5)
        answer = await pool.post(url, b"{}", {})
        body = await answer.read()
        answer.close()
        pool.close()
        server.close()
        return body
    assert asyncio.run(main()) == b"all of it"


def test_chunks_arrive_as_sent_and_a_cut_stream_is_a_read_failure():
    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for word in (b"one", b"two"):
                writer.write(b"%x\r\n%s\r\n" % (len(word), word))
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.transport.abort()        # cut before the last chunk
        server, url = await serve(handler)
        pool = http1.Pool(5, 5)
        answer = await pool.post(url, b"{}", {})
        got = []
        with pytest.raises(http1.ReadFailed) as failed:
            await answer.pump(got.append)
        answer.close()
        pool.close()
        server.close()
        return got, failed.value
    got, failure = asyncio.run(main())
    assert got == [b"one", b"two"]
    assert failure.answered and not failure.timed_out and "closed" in str(failure)


def test_silence_past_the_read_timeout_fails_and_names_it():
    async def main():
        server, url = await serve(answering(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n", 10))
        pool = http1.Pool(5, 0.3)
        answer = await pool.post(url, b"{}", {})
        loop = asyncio.get_running_loop()
        got, started = [], []

        def sink(chunk):
            got.append(chunk)
            started.append(loop.time())
        with pytest.raises(http1.ReadFailed) as failed:
            await answer.pump(sink)
        assert got == [b"one"]
        waited = loop.time() - started[0]
        answer.close()
        pool.close()
        server.close()
        return failed.value, waited
    failure, waited = asyncio.run(main())
    assert failure.timed_out and "0.3 s" in str(failure)
    assert 0.25 <= waited < 5


def test_refused_and_garbage_answers_are_named_failures():
    async def main():
        garbage = answering(b"this is not HTTP\r\n\r\n", 1)
        server, url = await serve(garbage)
        closed, closed_url = await serve(garbage)
        closed.close()
        await closed.wait_closed()
        pool = http1.Pool(5, 5)
        with pytest.raises(http1.ReadFailed) as bad:
            await pool.post(url, b"{}", {})
        with pytest.raises(http1.ConnectFailed) as refused:
            await pool.post(closed_url, b"{}", {})
        with pytest.raises(http1.ConnectFailed) as not_http:
            await pool.post("ftp://127.0.0.1/x", b"{}", {})
        pool.close()
        server.close()
        return bad.value, refused.value, not_http.value
    bad, refused, not_http = asyncio.run(main())
    assert "not valid HTTP/1.1" in str(bad)
    assert "cannot connect to 127.0.0.1:" in str(refused) and not refused.timed_out
    assert "'ftp://127.0.0.1/x' is not an http:// or https:// URL" in str(not_http)


def test_pump_hands_each_chunk_on_from_the_connections_callback_in_order():
    """Pushed chunks reach the sink outside any task (from the protocol's callback), in order,
    the ones that came with the headers first; a cut answer still raises ReadFailed."""
    words = [b"w%d" % i for i in range(20)]

    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"%x\r\n%s\r\n" % (len(words[0]), words[0]))
            for word in words[1:]:
                await asyncio.sleep(0.005)
                writer.write(b"%x\r\n%s\r\n" % (len(word), word))
                await writer.drain()
            if n == 1:
                writer.write(b"0\r\n\r\n")
            else:
                await asyncio.sleep(0.05)       # read before the cut
                writer.transport.abort()
        server, url = await serve(handler)
        pool = http1.Pool(5, 5)
        got, from_a_task = [], []

        def sink(chunk):
            got.append(chunk)
            from_a_task.append(asyncio.current_task() is not None)
        answer = await pool.post(url, b"{}", {})
        await answer.pump(sink)
        answer.close()
        pool.close()
        whole, pushed_from_tasks = list(got), from_a_task.count(True)
        got.clear()
        pool = http1.Pool(5, 5)             # a new connection: the server cuts this one
        answer = await pool.post(url, b"{}", {})
        with pytest.raises(http1.ReadFailed) as failed:
            await answer.pump(sink)
        answer.close()
        pool.close()
        server.close()
        return whole, pushed_from_tasks, got, failed.value
    whole, pushed_from_tasks, cut, failure = asyncio.run(main())
    assert b"".join(whole) == b"".join(words)
    # Only what came before the pump started (the first word, with the headers) is handed on
    # from the pumping task; the other 19 come from the connection's callback.
    assert pushed_from_tasks <= 1 and len(whole) >= 19
    assert b"".join(cut) == b"".join(words) and failure.answered and "closed" in str(failure)


def test_pump_holds_the_upstream_while_the_sink_is_full_and_loses_nothing():
    """A sink that asks to wait (its reader is full) pauses reading from the upstream; chunks
    parsed meanwhile wait their turn, and all 8 MB arrive in order once it drains."""
    total = 8 * 1024 * 1024

    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
            for i in range(total // 65536):
                writer.write(bytes([i % 251]) * 65536)
            await writer.drain()
            await asyncio.sleep(5)
        server, url = await serve(handler)
        pool = http1.Pool(5, 5)
        answer = await pool.post(url, b"{}", {})
        connection = answer._connection
        got, holds, paused_while_held = [], [], []
        loop = asyncio.get_running_loop()

        def sink(chunk):
            got.append(chunk)
            if len(holds) < 3 and sum(map(len, got)) > (len(holds) + 1) * 1024 * 1024:
                hold = loop.create_future()
                holds.append(hold)

                def release():
                    paused_while_held.append(not connection.transport.is_reading())
                    hold.set_result(None)
                loop.call_later(0.2, release)
                return hold
            return None
        await answer.pump(sink)
        answer.close()
        pool.close()
        server.close()
        return b"".join(got), len(holds), paused_while_held
    body, held, paused = asyncio.run(main())
    expected = b"".join(bytes([i % 251]) * 65536 for i in range(total // 65536))
    assert len(body) == total and body == expected
    assert held == 3 and paused == [True, True, True]


def test_expect_end_shortens_the_read_timeout_for_this_answer_only():
    """Once an answer's content has all come (a stream's [DONE]) the rest of its body is due at
    once: ``expect_end`` makes the read timeout that short, and the next request on the same
    pooled connection has the pool's own again."""
    async def main():
        connections = []

        async def handler(reader, writer, n):
            for i in range(3):
                await read_request(reader)
                connections.append(n)
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                             b"e\r\ndata: [DONE]\n\n\r\n")
                await writer.drain()
                if i == 0:                   # the body's end comes soon
                    await asyncio.sleep(0.05)
                elif i == 1:                 # slower than 0.3 s, well inside the pool's 30 s
                    await asyncio.sleep(0.6)
                else:                        # never
                    await asyncio.sleep(60)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        server, url = await serve(handler)
        pool = http1.Pool(5, 30)
        outcomes = []
        for shorten in (True, False, True):
            answer = await pool.post(url, b"{}", {})

            def sink(chunk, answer=answer, shorten=shorten):
                if shorten:
                    answer.expect_end(0.3)
            started = asyncio.get_running_loop().time()
            try:
                await answer.pump(sink)
                outcomes.append("whole")
            except http1.ReadFailed as e:
                waited = asyncio.get_running_loop().time() - started
                outcomes.append("timed out within 5 s" if e.timed_out and waited < 5 else
                                f"{e} after {waited:.1f} s")
            answer.close()
        pool.close()
        server.close()
        return outcomes, connections
    # The first answer ends inside its 0.3 s; the second, on the same connection, takes 0.6 s
    # and still ends whole; the third never ends and fails after 0.3 s, not the pool's 30.
    outcomes, connections = asyncio.run(main())
    assert outcomes == ["whole", "whole", "timed out within 5 s"]
    assert connections == [1, 1, 1]              # all three on the one pooled connection


def test_the_request_line_and_host_header_follow_the_url():
    pool = http1.Pool(5, 5, proxies={})
    target = pool._target("http://[::1]/v1/chat/completions", pool.options)
    assert (target.key[:3], target.head) == (
        ("http", "::1", 80), b"POST /v1/chat/completions HTTP/1.1\r\nhost: [::1]\r\n")
    assert pool._target("http://[::1]:8080/v1/x", pool.options).head.endswith(
        b"host: [::1]:8080\r\n")
    target = pool._target("https://up.example/v1/x?a=1", pool.options)
    assert (target.key[:3], target.head) == (
        ("https", "up.example", 443), b"POST /v1/x?a=1 HTTP/1.1\r\nhost: up.example\r\n")
