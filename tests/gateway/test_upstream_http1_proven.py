"""The upstream client's gaps, closed or refused loudly (http1.py's "What it takes and what it
refuses"), each against a real socket: interim answers, limits, proxies, TLS with a CA made
here, Content-Encoding, bytes after an answer, a POST sent once. Then the same through the
gateway (``serve`` in a process of its own), which answers 502 naming what it refused and
meters it. The differential test against h11 is test_upstream_http1_differential.py."""
from __future__ import annotations

import asyncio
import json
import select
import zlib

import httpx
import pytest

from gateway_harness import Gateway, tcp_server     # (and spectrum_gateway on sys.path)
from spectrum_gateway import http1
from upstream_peers import Certificates, LoopThread, Proxy, chat_answer, gzipped, read_request

URL_PATH = "/v1/chat/completions"
GZIP_BOMB = gzipped(b"\0" * 2_000_000)
# How long a test waits on its peer: a client that waited for an answer that never ends would
# wait for ever, so this only turns that into a failure instead of a hang.
PEER_WAIT_S = 60


def url_of(port: int, scheme: str = "http", host: str = "127.0.0.1") -> str:
    return f"{scheme}://{host}:{port}{URL_PATH}"


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request):
    """The gateway runs on uvloop, the tests' own loops are asyncio's: the parts that touch
    sockets (the check before reuse, TLS through a tunnel) are run on both."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    yield request.param
    asyncio.set_event_loop_policy(None)


async def post(pool: http1.Pool, url: str, body: bytes = b"{}", options=None,
               max_bytes: int | None = None) -> tuple[int, bytes, http1.Headers]:
    """One request read whole: (status, body, headers); the answer closed either way."""
    response = await pool.post(url, body, {"content-type": "application/json"}, options)
    try:
        return response.status, await response.read(max_bytes), response.headers
    finally:
        response.close()


# -------------------------------------------------------------------------- interim answers
@pytest.mark.parametrize("together", [False, True], ids=["written-apart", "one-write"])
def test_interim_answers_are_skipped_and_each_request_on_the_pooled_connection_gets_its_own(
        together, loop_kind):
    """RFC 9110 §15.2: a 1xx is not the answer. Before, the client took a 100 Continue as the
    answer and pooled its connection, so the real 200 became the NEXT request's answer (on a
    shared pool, another tenant's completion)."""
    async def main():
        seen = []

        async def handler(reader, writer, n):
            while True:
                _, body = await read_request(reader)
                seen.append(n)
                parts = [b"HTTP/1.1 100 Continue\r\n\r\n",
                         b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
                         answer(b"answer to " + body, "content-type: text/plain")]
                if together:
                    writer.write(b"".join(parts))
                else:
                    for part in parts:
                        writer.write(part)
                        await writer.drain()
                        await asyncio.sleep(0.03)
        server, port = await tcp_server(handler)
        pool = http1.Pool(5, 5, proxies={})
        first = await post(pool, url_of(port), b"tenant-a")
        second = await post(pool, url_of(port), b"tenant-b")
        pool.close()
        server.close()
        return first, second, seen
    first, second, seen = asyncio.run(main())
    assert first[:2] == (200, b"answer to tenant-a") and second[:2] == (200, b"answer to tenant-b")
    assert "link" not in first[2] and first[2]["content-type"] == "text/plain"
    assert seen == [1, 1]                   # both on the one pooled connection


def test_101_switching_protocols_is_refused_and_its_connection_closed():
    async def main():
        server, port = await tcp_server(lambda r, w, n: _answer_once(
            r, w, b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                  b"connection: upgrade\r\n\r\n\x81\x00"))
        pool = http1.Pool(5, 5, proxies={})
        with pytest.raises(http1.AnswerRefused) as refused:
            await post(pool, url_of(port))
        open_after = pool.open_connections(url_of(port))
        pool.close()
        server.close()
        return refused.value, open_after
    refused, open_after = asyncio.run(main())
    assert "101 Switching Protocols" in str(refused) and open_after == 0


async def _answer_once(reader, writer, raw: bytes, then_wait_s: float = 1.0) -> None:
    await read_request(reader)
    writer.write(raw)
    await writer.drain()
    await asyncio.sleep(then_wait_s)


# ----------------------------------------------------------------------------------- limits
def head_of(size: int, interim: bytes = b"") -> bytes:
    """An answer whose head (with ``interim`` before it) is exactly ``size`` bytes."""
    fixed = interim + b"HTTP/1.1 200 OK\r\nx-pad: \r\ncontent-length: 2\r\n\r\n"
    return interim + (b"HTTP/1.1 200 OK\r\nx-pad: " + b"a" * (size - len(fixed))
                      + b"\r\ncontent-length: 2\r\n\r\n")


@pytest.mark.parametrize("interim", [b"", b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"])
def test_the_head_must_end_within_max_header_bytes_interim_heads_counted(interim):
    limit = 4096

    async def main():
        outcomes = []
        for size in (limit, limit + 1):
            raw = head_of(size, interim) + b"ok"
            assert raw.index(b"\r\n\r\n", len(interim)) + 4 == size
            server, port = await tcp_server(lambda r, w, n, raw=raw: _answer_once(r, w, raw))
            pool = http1.Pool(5, 5, proxies={})
            options = http1.UpstreamOptions(max_header_bytes=limit)
            try:
                status, body, _ = await post(pool, url_of(port), options=options)
                outcomes.append((status, body))
            except http1.AnswerRefused as e:
                outcomes.append((e.limit, str(e)))
            outcomes.append(pool.open_connections(url_of(port), options))
            pool.close()
            server.close()
        return outcomes
    at_limit, open_at, over, open_over = asyncio.run(main())
    assert at_limit == (200, b"ok") and open_at == 1          # pooled
    assert over[0] == "max_header_bytes" and "over 4096 bytes (max_header_bytes)" in over[1]
    assert open_over == 0                                      # closed


def test_a_head_that_never_ends_is_refused_at_the_limit_not_buffered():
    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
            while True:                 # until the client hangs up: one that buffers never returns
                writer.write(b"a" * 4096)
                await writer.drain()
                await asyncio.sleep(0.001)
        server, port = await tcp_server(handler)
        pool = http1.Pool(5, 5, proxies={})
        with pytest.raises(http1.AnswerRefused) as refused:
            await asyncio.wait_for(post(pool, url_of(port)), PEER_WAIT_S)
        pool.close()
        server.close()
        return refused.value
    refused = asyncio.run(main())
    assert refused.limit == "max_header_bytes" and f"{64 * 1024} bytes" in str(refused)


@pytest.mark.parametrize("framing", ["content-length", "chunked", "gzip"])
def test_an_error_body_over_its_limit_is_refused_as_it_arrives(framing):
    """An error answer is read to show its message; one over ``max_error_body_bytes`` is
    refused as soon as that is known (a declared length at once), never held whole. The peer
    never ends its answer: a client waiting for the rest would never return."""
    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            if framing == "content-length":      # declares 10 MB, sends 1 KB, then waits
                writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10000000\r\n\r\n"
                             + b"x" * 1024)
            elif framing == "chunked":           # an error body that never ends
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                while True:
                    writer.write(b"400\r\n" + b"e" * 1024 + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.002)
            else:                                # 2 KB on the wire, 2 MB decoded
                writer.write(answer(GZIP_BOMB, "content-encoding: gzip",
                                    status="400 Bad Request"))
            await writer.drain()
            await asyncio.sleep(3600)            # and never closes
        server, port = await tcp_server(handler)
        pool = http1.Pool(5, 5, proxies={})
        options = http1.UpstreamOptions(max_error_body_bytes=64 * 1024)
        response = await asyncio.wait_for(pool.post(url_of(port), b"{}", {}, options), PEER_WAIT_S)
        with pytest.raises(http1.AnswerRefused) as refused:
            await asyncio.wait_for(response.read(response.max_error_body_bytes), PEER_WAIT_S)
        response.close()
        open_after = pool.open_connections(url_of(port), options)
        pool.close()
        server.close()
        return refused.value, open_after
    refused, open_after = asyncio.run(main())
    assert refused.limit == "max_error_body_bytes"
    assert "over 65536 bytes" in str(refused) and "(max_error_body_bytes)" in str(refused)
    assert open_after == 0


def test_max_connections_refuses_one_more_and_counts_closed_ones_out(loop_kind):
    async def main():
        release = asyncio.Event()

        async def handler(reader, writer, n):
            while True:
                await read_request(reader)
                await release.wait()
                writer.write(answer(b"%d" % n))
                await writer.drain()
        server, port = await tcp_server(handler)
        pool = http1.Pool(5, 5, proxies={})
        options = http1.UpstreamOptions(max_connections=2)
        url = url_of(port)
        held = [asyncio.ensure_future(post(pool, url, options=options)) for _ in range(2)]
        await asyncio.sleep(0.2)
        with pytest.raises(http1.ConnectFailed) as busy:
            await post(pool, url, options=options)
        open_while_held = pool.open_connections(url, options)
        release.set()
        bodies = sorted(body for _, body, _ in await asyncio.gather(*held))
        again = await post(pool, url, options=options)       # a pooled one, no third
        open_idle = pool.open_connections(url, options)
        pool.close()
        open_closed = pool.open_connections(url, options)
        server.close()
        return busy.value, open_while_held, bodies, again[1], open_idle, open_closed
    busy, open_while_held, bodies, again, open_idle, open_closed = asyncio.run(main())
    assert busy.busy and "already has 2 connections open" in str(busy)
    assert "max_connections" in str(busy)
    assert open_while_held == 2 and bodies == [b"1", b"2"] and again in (b"1", b"2")
    assert open_idle == 2 and open_closed == 0


# -------------------------------------------------------------------------- content coding
@pytest.mark.parametrize("coding, encode", [
    ("gzip", gzipped),
    ("x-gzip", gzipped),
    ("gzip", lambda b: gzipped(b[:100]) + gzipped(b[100:])),     # two members
    ("deflate", zlib.compress),
    ("identity", lambda b: b),
])
@pytest.mark.parametrize("how", ["read", "pump"])
def test_an_answer_encoded_anyway_is_decoded(coding, encode, how):
    text = json.dumps({"choices": [{"text": "word " * 2000}]}).encode()
    wire = encode(text)

    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-encoding: {coding}\r\n"
                         f"transfer-encoding: chunked\r\n\r\n".encode())
            for i in range(0, len(wire), 97):          # chunks cut across the coding's blocks
                piece = wire[i:i + 97]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await asyncio.sleep(1)
        server, port = await tcp_server(handler)
        pool = http1.Pool(5, 5, proxies={})
        response = await pool.post(url_of(port), b"{}", {})
        if how == "read":
            body = await response.read()
        else:
            got = []
            await response.pump(got.append)
            body = b"".join(got)
        response.close()
        pool.close()
        server.close()
        return body
    assert asyncio.run(main()) == text


@pytest.mark.parametrize("coding, wire, why", [
    ("br", b"\x1b\x03\x00\xf8\xa5\x90\x00", "Content-Encoding 'br'"),
    ("gzip, deflate", zlib.compress(gzipped(b"{}")), "Content-Encoding 'gzip, deflate'"),
    ("gzip", b"\x1f\x8b not gzip at all", "gzip-encoded body does not decode"),
    ("gzip", gzipped(b'{"a": 1}' * 100)[:-12], "gzip-encoded body ends before its end"),
    ("deflate", zlib.compress(b"{}") + b"junk", "deflate-encoded body goes on after its end"),
])
def test_an_encoding_it_cannot_decode_is_refused_naming_it(coding, wire, why):
    async def main():
        raw = answer(wire, f"content-encoding: {coding}")
        server, port = await tcp_server(lambda r, w, n: _answer_once(r, w, raw))
        pool = http1.Pool(5, 5, proxies={})
        with pytest.raises(http1.AnswerRefused) as refused:
            await post(pool, url_of(port))
        pool.close()
        server.close()
        return str(refused.value)
    assert why in asyncio.run(main())


# ------------------------------------------------------------- the connection's framing
@pytest.mark.parametrize("when", ["with-the-answer", "while-idle"])
def test_bytes_after_an_answer_are_never_the_next_requests_answer(when):
    stale = answer(b"stale")

    async def main():
        async def handler(reader, writer, n):
            await read_request(reader)
            if n == 1:
                if when == "with-the-answer":
                    writer.write(answer(b"first") + stale)
                else:
                    writer.write(answer(b"first"))
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    writer.write(stale)           # while the connection waits in the pool
                await writer.drain()
                await asyncio.sleep(2)
            else:
                writer.write(answer(b"second"))
                await writer.drain()
                await asyncio.sleep(1)
        server, port = await tcp_server(handler)
        pool = http1.Pool(5, 5, proxies={})
        first = await post(pool, url_of(port))
        await asyncio.sleep(0.2)
        second = await post(pool, url_of(port))
        pool.close()
        server.close()
        return first[1], second[1]
    assert asyncio.run(main()) == (b"first", b"second")


def test_a_pooled_connection_found_closed_before_writing_is_replaced_and_the_post_sent_once(
        loop_kind):
    """The upstream closed the idle connection and the event loop has not seen it yet (its
    loop is held here, as a busy gateway's is): the check before writing finds the close
    waiting on the socket, so the request goes once, on a new connection."""
    peers = LoopThread()
    seen = []

    async def handler(reader, writer, n):
        await read_request(reader)
        seen.append(n)
        writer.write(answer(b"%d" % n))
        await writer.drain()            # one answer, then the upstream closes it

    async def main(port):
        pool = http1.Pool(5, 5, proxies={})
        first = await post(pool, url_of(port))
        (idle,) = pool._idle[pool._target(url_of(port), pool.options).key]
        # The loop held until the peer's close waits on the socket (select, not the loop, sees it).
        select.select([idle.transport.get_extra_info("socket")], [], [], PEER_WAIT_S)
        unseen_close = not idle.closed
        second = await post(pool, url_of(port))
        pool.close()
        return first[1], unseen_close, second[1]
    try:
        server, port = peers.run(tcp_server(handler))
        first, unseen_close, second = asyncio.run(main(port))
        peers.run(_close(server))
    finally:
        peers.stop()
    assert (first, second) == (b"1", b"2") and unseen_close
    assert seen == [1, 2]


async def _close(server) -> None:
    server.close()


# ---------------------------------------------------------------------------- proxies, TLS
@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return Certificates(tmp_path_factory.mktemp("tls"))


async def _echo_path(reader, writer, n) -> None:
    """An upstream that answers each request with its request line, keeping the connection."""
    while True:
        head, _ = await read_request(reader)
        writer.write(answer(head.split(b"\r\n", 1)[0]))
        await writer.drain()


def test_https_through_a_connect_tunnel_with_the_tests_ca_and_a_client_certificate(
        certificates, monkeypatch, loop_kind):
    """$HTTPS_PROXY: a CONNECT tunnel through the proxy, TLS end to end inside it against the
    CA made here, the client certificate the upstream asks for; $NO_PROXY's hosts go direct."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")      # replaced below
    monkeypatch.setenv("NO_PROXY", "localhost")

    async def main():
        proxy = await Proxy().start()
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        server, port = await tcp_server(_echo_path, certificates.server_context())
        options = http1.UpstreamOptions(ca_file=certificates.ca_file,
                                        cert_file=certificates.client_cert,
                                        key_file=certificates.client_key)
        pool = http1.Pool(5, 5)                  # the environment, read now
        tunnelled = [await post(pool, url_of(port, "https"), options=options) for _ in range(2)]
        direct = await post(pool, url_of(port, "https", "localhost"), options=options)
        pool.close()
        server.close()
        proxy.close()
        return tunnelled, direct, proxy.seen, port
    tunnelled, direct, seen, port = asyncio.run(main())
    assert [body for _, body, _ in tunnelled] == [f"POST {URL_PATH} HTTP/1.1".encode()] * 2
    assert direct[:2] == (200, f"POST {URL_PATH} HTTP/1.1".encode())
    assert seen == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]       # one tunnel, reused


def test_http_through_a_forwarding_proxy_with_credentials(monkeypatch, loop_kind):
    """An http:// upstream through its own ``proxy`` (user:password in the URL): requests in
    absolute form, Proxy-Authorization sent; $HTTP_PROXY is what the upstream's own replaces."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")     # never used: the upstream's wins

    async def main():
        proxy = await Proxy(credentials="gw:s3cret").start()
        server, port = await tcp_server(_echo_path)
        options = http1.UpstreamOptions(proxy=proxy.url)
        pool = http1.Pool(5, 5)
        answers = [await post(pool, url_of(port) + f"?n={i}", options=options) for i in range(2)]
        pool.close()
        server.close()
        proxy.close()
        return answers, proxy.seen, port
    answers, seen, port = asyncio.run(main())
    assert [body for _, body, _ in answers] == [
        f"POST {URL_PATH}?n={i} HTTP/1.1".encode() for i in range(2)]
    assert seen == [f"POST http://127.0.0.1:{port}{URL_PATH}?n={i} HTTP/1.1" for i in range(2)]


@pytest.mark.parametrize("case", ["proxy-wants-credentials", "unknown-ca", "no-client-cert",
                                  "https-proxy-url"])
def test_tls_and_proxy_failures_are_named_connect_failures(certificates, case, loop_kind):
    async def main():
        proxy = await Proxy(credentials="gw:s3cret").start()
        server, port = await tcp_server(_echo_path, certificates.server_context())
        files = dict(ca_file=certificates.ca_file, cert_file=certificates.client_cert,
                     key_file=certificates.client_key)
        proxies = {}
        if case == "proxy-wants-credentials":
            proxies = {"https": f"http://127.0.0.1:{proxy.port}"}
        elif case == "unknown-ca":
            files["ca_file"] = certificates.other_ca_file
        elif case == "no-client-cert":
            files = dict(ca_file=certificates.ca_file)
        elif case == "https-proxy-url":
            proxies = {"https": f"https://gw:s3cret@127.0.0.1:{proxy.port}"}
        pool = http1.Pool(5, 5, proxies=proxies)
        try:
            await post(pool, url_of(port, "https"), options=http1.UpstreamOptions(**files))
            failure = None
        except (http1.ConnectFailed, http1.ReadFailed) as e:
            failure = e
        pool.close()
        server.close()
        proxy.close()
        return failure
    failure = asyncio.run(main())
    assert failure is not None
    message = str(failure)
    assert "s3cret" not in message
    if case == "proxy-wants-credentials":
        assert isinstance(failure, http1.ConnectFailed)
        assert "refused the tunnel: HTTP/1.1 407" in message and "user:password" in message
    elif case == "unknown-ca":
        assert isinstance(failure, http1.ConnectFailed) and "certificate verify failed" in message
    elif case == "https-proxy-url":
        assert "$HTTPS_PROXY 'https://gw:***@127.0.0.1:" in message
        assert "is not an http:// proxy URL" in message
    # no-client-cert: the upstream ends the handshake (TLS 1.3: at the first read) either way


def test_tls_files_that_will_not_load_name_the_file(certificates, tmp_path):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ValueError, match=r"ca_file '.*not.pem' is not a readable PEM file"):
        http1.UpstreamOptions(ca_file=str(not_pem))
    with pytest.raises(ValueError, match=r"cert_file '.*client.pem' with key_file '.*server.key'"):
        http1.UpstreamOptions(cert_file=certificates.client_cert, key_file=certificates.server_key)
    with pytest.raises(ValueError, match="key_file '.*' needs cert_file"):
        http1.UpstreamOptions(key_file=certificates.client_key)
    with pytest.raises(ValueError, match=r"proxy 'socks5://127.0.0.1:1080' is not an http://"):
        http1.UpstreamOptions(proxy="socks5://127.0.0.1:1080")


# ------------------------------------------------------------------ through the gateway
def _echo_chat(prefix: str = "echo"):
    """An upstream answering each chat request with "<prefix>: <its first message>"."""
    async def handler(reader, writer, n):
        while True:
            _, body = await read_request(reader)
            writer.write(answer(chat_answer(f"{prefix}: {_first_message(body)}"),
                                "content-type: application/json"))
            await writer.drain()
    return handler


def _first_message(body: bytes) -> str:
    return json.loads(body)["messages"][0]["content"]


class GatewayPeers:
    """The upstreams each gateway-level test is about, the proxies, and what they saw."""

    def __init__(self, certificates: Certificates) -> None:
        self.loop = LoopThread()
        self.release_busy = self.loop.run(_event())
        self.heads: list[bytes] = []               # every request head the raw upstreams read
        self.connections: dict[str, list[int]] = {}   # upstream → the connection of each request
        self.servers = []
        self.ports = {name: self._start(name, handler) for name, handler in {
            "interim": self._interim, "once": self._once, "gzip": self._encoded("gzip"),
            "brotli": self._encoded("br"), "bighead": self._big_head,
            "bigerror": self._big_error, "busy": self._slow, "switch": self._switch}.items()}
        self.ports["echo"] = self._start("echo", _echo_chat("forwarded"))
        self.ports["tls"] = self._start("tls", _echo_chat("over tls"),
                                        certificates.server_context())
        self.proxy = self.loop.run(Proxy().start())
        self.forwarding_proxy = self.loop.run(Proxy(credentials="gw:s3cret").start())

    def _start(self, name: str, handler, tls=None) -> int:
        async def counted(reader, writer, n):
            self.connections.setdefault(name, [])
            await handler(_Recording(reader, self.heads, self.connections[name], n), writer, n)
        server, port = self.loop.run(tcp_server(counted, tls))
        self.servers.append(server)
        return port

    @staticmethod
    async def _interim(reader, writer, n):
        while True:
            _, body = await read_request(reader)
            for part in (b"HTTP/1.1 100 Continue\r\n\r\n",
                         b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"):
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.write(answer(chat_answer(f"echo: {_first_message(body)}"),
                                "content-type: application/json"))
            await writer.drain()

    @staticmethod
    async def _once(reader, writer, n):
        """Answers a connection's first request; reads its second and closes, unanswered."""
        _, body = await read_request(reader)
        writer.write(answer(chat_answer(f"echo: {_first_message(body)}")))
        await writer.drain()
        await read_request(reader)

    @staticmethod
    def _encoded(coding: str):
        async def handler(reader, writer, n):
            while True:
                _, body = await read_request(reader)
                text = chat_answer(f"echo: {_first_message(body)}")
                wire = gzipped(text) if coding == "gzip" else b"\x1b\x03\x00\xf8"
                writer.write(answer(wire, "content-type: application/json",
                                    f"content-encoding: {coding}"))
                await writer.drain()
        return handler

    @staticmethod
    async def _big_head(reader, writer, n):
        await read_request(reader)
        writer.write(answer(chat_answer("never read"), "x-big: " + "b" * 10_000))
        await writer.drain()
        await asyncio.sleep(1)

    @staticmethod
    async def _switch(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                     b"connection: upgrade\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    @staticmethod
    async def _big_error(reader, writer, n):
        await read_request(reader)
        writer.write(answer(json.dumps({"error": {"message": "e" * 10_000}}).encode(),
                            "content-type: application/json", status="400 Bad Request"))
        await writer.drain()
        await asyncio.sleep(1)

    async def _slow(self, reader, writer, n):
        """Holds each answer until the test lets it go (``release_busy``)."""
        while True:
            _, body = await read_request(reader)
            await asyncio.wait_for(self.release_busy.wait(), 20)
            writer.write(answer(chat_answer(f"echo: {_first_message(body)}")))
            await writer.drain()

    def close(self) -> None:
        for server in self.servers + [self.proxy, self.forwarding_proxy]:
            self.loop.loop.call_soon_threadsafe(server.close)
        self.loop.stop()


async def _event() -> asyncio.Event:
    return asyncio.Event()      # made on the peers' loop, which waits on it


class _Recording:
    """A stream reader that notes each request head read through ``read_request``, and on
    which connection it came."""

    def __init__(self, reader, heads: list, connections: list, n: int) -> None:
        self.reader, self.heads, self.connections, self.n = reader, heads, connections, n

    async def readuntil(self, separator):
        head = await self.reader.readuntil(separator)
        self.heads.append(head)
        self.connections.append(self.n)
        return head

    def __getattr__(self, name):
        return getattr(self.reader, name)


@pytest.fixture(scope="module")
def peers(certificates):
    peers = GatewayPeers(certificates)
    yield peers
    peers.close()


@pytest.fixture(scope="module")
def http1_gateway(tmp_path_factory, peers, certificates):
    """One gateway (store: memory, one process) whose models each reach one of ``peers``;
    $HTTPS_PROXY is the test's proxy and $NO_PROXY names localhost."""
    port = peers.ports
    tls = {"ca_file": certificates.ca_file, "cert_file": certificates.client_cert,
           "key_file": certificates.client_key}

    def model(name: str, url: str | None = None, **settings) -> dict:
        url = url or f"http://127.0.0.1:{port[name]}/v1"
        return {"upstreams": [{"name": name, "url": url, **settings}]}
    config = {
        "store": "memory", "upstream_timeout_s": 5, "connect_timeout_s": 2,
        "tenants": {"a": {"models": ["*"]}, "b": {"models": ["*"]}},
        "models": {
            "interim": model("interim"), "once": model("once"), "gzip": model("gzip"),
            "brotli": model("brotli"), "bighead": model("bighead", max_header_bytes=4096),
            "bigerror": model("bigerror", max_error_body_bytes=1024),
            "busy": model("busy", max_connections=1), "switch": model("switch"),
            "tls-proxied": model("tls", f"https://127.0.0.1:{port['tls']}/v1", **tls),
            "tls-direct": model("tls", f"https://localhost:{port['tls']}/v1", **tls),
            "forwarded": model("echo", proxy=peers.forwarding_proxy.url),
        },
    }
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HTTPS_PROXY", peers.proxy.url)
        env.setenv("NO_PROXY", "localhost")
        env.delenv("HTTP_PROXY", raising=False)
        env.delenv("http_proxy", raising=False)
        env.delenv("https_proxy", raising=False)
        env.delenv("no_proxy", raising=False)
        gateway = Gateway(tmp_path_factory.mktemp("http1-gateway"), config).start()
    gateway.keys = {tenant: gateway.create_key(tenant) for tenant in ("a", "b")}
    yield gateway
    gateway.stop()


def ask(gateway, model: str, text: str = "hi", tenant: str = "a") -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {gateway.keys[tenant]['key']}"},
                      json={"model": model, "max_tokens": 4,
                            "messages": [{"role": "user", "content": text}]})


def content(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_gateway_two_tenants_behind_interim_answers_each_get_their_own(http1_gateway, peers):
    first = ask(http1_gateway, "interim", "tenant a's prompt", tenant="a")
    second = ask(http1_gateway, "interim", "tenant b's prompt", tenant="b")
    assert content(first) == "echo: tenant a's prompt"
    assert content(second) == "echo: tenant b's prompt"
    assert peers.connections["interim"] == [1, 1]        # on the one pooled connection


def test_gateway_a_post_the_upstream_may_have_received_is_not_resent_502_and_metered(
        http1_gateway, peers):
    assert content(ask(http1_gateway, "once", "first")) == "echo: first"
    failed = ask(http1_gateway, "once", "second")
    assert failed.status_code == 502, failed.text
    message = failed.json()["error"]["message"]
    assert "every upstream of model 'once' failed" in message and "closed the connection" in message
    assert content(ask(http1_gateway, "once", "third")) == "echo: third"
    # The second POST reached the upstream once (connection 1), never sent again.
    assert peers.connections["once"] == [1, 1, 2]
    [entry] = http1_gateway.ledger(lambda e: e["model"] == "once" and e["status"] == 502,
                                   tenant="a")
    assert entry["upstream"] is None and entry["fallback_from"] == ["once"]


def test_gateway_asks_for_identity_decodes_gzip_and_refuses_br_naming_it(http1_gateway, peers):
    assert content(ask(http1_gateway, "gzip", "zipped")) == "echo: zipped"
    refused = ask(http1_gateway, "brotli", "brotli")
    assert refused.status_code == 502
    assert "Content-Encoding 'br'" in refused.json()["error"]["message"]
    assert all(b"\r\naccept-encoding: identity\r\n" in head for head in peers.heads)
    http1_gateway.ledger(lambda e: e["model"] == "brotli" and e["status"] == 502, tenant="a")


@pytest.mark.parametrize("model, named", [
    ("bighead", "over 4096 bytes (max_header_bytes)"),
    ("bigerror", "over 1024 bytes, the most the gateway reads of an error answer "
                 "(max_error_body_bytes)"),
    ("switch", "answered 101 Switching Protocols; no request from the gateway asks to switch"),
])
def test_gateway_answers_it_refuses_are_502_naming_why(http1_gateway, model, named):
    refused = ask(http1_gateway, model)
    assert refused.status_code == 502, refused.text
    assert named in refused.json()["error"]["message"]
    http1_gateway.ledger(lambda e: e["model"] == model and e["status"] == 502, tenant="a")


def test_gateway_one_request_past_max_connections_is_502_naming_it(http1_gateway, peers):
    from concurrent.futures import ThreadPoolExecutor

    from gateway_harness import wait_for
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(ask, http1_gateway, "busy", "one")
        # The first holds the one connection allowed until the upstream lets it go.
        wait_for(lambda: peers.connections.get("busy"), 20, "the first request to arrive")
        second = ask(http1_gateway, "busy", "two")
        peers.loop.loop.call_soon_threadsafe(peers.release_busy.set)
        assert content(first.result()) == "echo: one"
    assert second.status_code == 502, second.text
    message = second.json()["error"]["message"]
    assert "already has 1 connection open, the most max_connections allows" in message
    assert peers.connections["busy"] == [1]          # the second never reached it


def test_gateway_reaches_a_tls_upstream_through_the_environments_proxy_or_direct(
        http1_gateway, peers):
    assert content(ask(http1_gateway, "tls-proxied", "via proxy")) == "over tls: via proxy"
    assert content(ask(http1_gateway, "tls-direct", "direct")) == "over tls: direct"
    assert content(ask(http1_gateway, "forwarded", "forwarded")) == "forwarded: forwarded"
    assert peers.proxy.seen == [f"CONNECT 127.0.0.1:{peers.ports['tls']} HTTP/1.1"]
    assert peers.forwarding_proxy.seen == [
        f"POST http://127.0.0.1:{peers.ports['echo']}/v1/chat/completions HTTP/1.1"]


# ------------------------------------------------------------------------------- config
def test_limits_proxy_and_tls_settings_load_with_defaults_and_overrides(tmp_path, certificates):
    from spectrum_gateway.config import load_config
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
upstream_max_header_bytes: 8192
upstream_max_connections: 64
models:
  chat:
    upstreams:
      - {{name: plain, url: "http://127.0.0.1:8080"}}
      - name: secure
        url: "https://up.example/v1"
        proxy: "http://user:pw@proxy.example:3128"
        ca_file: {certificates.ca_file}
        cert_file: {certificates.client_cert}
        key_file: {certificates.client_key}
        max_header_bytes: 2048
        max_error_body_bytes: 4096
        max_connections: 8
""")
    config = load_config(path)
    plain, secure = config.models["chat"].upstreams
    assert (plain.max_header_bytes, plain.max_error_body_bytes, plain.max_connections) == (
        8192, http1.DEFAULT_MAX_ERROR_BODY_BYTES, 64)
    assert (plain.proxy, plain.ca_file) == (None, None)
    assert (secure.max_header_bytes, secure.max_error_body_bytes, secure.max_connections) == (
        2048, 4096, 8)
    assert (secure.proxy, secure.ca_file, secure.key_file) == (
        "http://user:pw@proxy.example:3128", certificates.ca_file, certificates.client_key)


@pytest.mark.parametrize("setting, message", [
    ("proxy: socks5://proxy:1080", "line 8: models.chat.upstreams[0].proxy: proxy "
                                   "'socks5://proxy:1080' is not an http:// proxy URL"),
    ("proxy: https://u:secret@proxy:443", "models.chat.upstreams[0].proxy: proxy "
                                          "'https://u:***@proxy:443' is not an http:// proxy"),
    ("ca_file: missing.pem", "line 8: models.chat.upstreams[0].ca_file: '"),
    ("max_header_bytes: 100", "line 8: models.chat.upstreams[0].max_header_bytes: must be a "
                              "whole number >= 1024, got 100"),
    ("max_connections: 0", "models.chat.upstreams[0].max_connections: must be a whole number "
                           ">= 1, got 0"),
    ("max_connection: 4", "unknown key; did you mean 'max_connections'?"),
])
def test_bad_http_client_settings_name_their_line(tmp_path, setting, message):
    from spectrum_gateway.config import ConfigError, load_config
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
models:
  chat:
    upstreams:
      - name: secure
        url: "https://up.example/v1"
        weight: 1
        {setting}
""")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert message in str(error.value)
    assert "secret" not in str(error.value)


def test_tls_settings_on_plain_http_or_a_managed_upstream_are_refused(tmp_path, certificates):
    from spectrum_gateway.config import ConfigError, load_config
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
upstream_max_error_body_bytes: 0
models:
  chat:
    upstreams:
      - {{name: plain, url: "http://127.0.0.1:8080", ca_file: {certificates.ca_file}}}
      - {{name: managed, bedrock: {{model_id: m}}, weight: 0, max_connections: 4}}
""")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    text = str(error.value)
    assert "line 2: upstream_max_error_body_bytes: must be a whole number >= 1, got 0" in text
    assert ("line 6: models.chat.upstreams[0].ca_file: applies to https:// URLs; this "
            "upstream's are http://") in text
    assert ("line 7: models.chat.upstreams[1].max_connections: applies to an "
            "OpenAI-compatible upstream") in text
