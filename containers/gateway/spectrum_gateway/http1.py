"""A lean HTTP/1.1 client for the upstream calls: one asyncio protocol a connection, httptools'
C parser (llhttp), a keep-alive pool per host.

Why not aiohttp: the relay spends its time per request and per streamed chunk, and aiohttp's
general machinery (request objects, URL parsing, tracing, a stream reader and a timer per
read) cost the gateway more CPU than its own checks did. This client does only what a relay
needs: POST a body, read the status and headers, hand on the body's chunks as they arrive,
put the connection back when the answer was read to its end and drop it otherwise.

A stream's chunks are pushed (``pump``): each is handed on from the connection's own callback
as it is parsed, the task woken only at the end, on a failure, or while the reader is full.
Pulling them instead (the reading task woken for each) cost the gateway 5-20 % more CPU per
streamed token, side by side.

Timeouts: ``connect_timeout_s`` for the TCP connect, a proxy's tunnel and the TLS handshake
together, ``read_timeout_s`` for the silence between any two reads, checked by one timer a
connection that is re-armed only when it fires (not one timer per chunk).

What it takes and what it refuses. A refused answer raises ``AnswerRefused`` naming why; it is
not used and its connection is closed (the gateway answers 502). The tests check each rule
over sockets (tests/gateway/test_upstream_http1_proven.py) and the parsing against h11 as the
reference (test_upstream_http1_differential.py):
- Interim answers (100, 102, 103) are skipped, as RFC 9110 §15.2 says: the answer is the
  first final one. 101 Switching Protocols is refused (no request here asks to switch), and
  so are other 1xx, which llhttp would frame as if they had a body.
- Versions: HTTP/1.x (a minor version above 1 read as 1.1, RFC 9112 §2.3); others refused.
- Framing (RFC 9112 §6.3): Content-Length, chunked, or the connection's end. Refused where
  the RFCs let a recipient refuse, some of which h11 takes: a Transfer-Encoding other than
  chunked, one with a Content-Length beside it, a Content-Length repeated, folded header
  lines, lines ended by a bare LF, control bytes in the head, chunk framing off the grammar.
  Empty lines before a status line are skipped (llhttp's way; h11 refuses them).
- Limits (``UpstreamOptions``): the head (status line and headers, with any interim heads
  before it) must end within ``max_header_bytes``; an error answer's body is read up to
  ``max_error_body_bytes`` (``Response.read``); at most ``max_connections`` a host.
- Content-Encoding: the gateway asks for identity; an answer gzip- or deflate-encoded anyway
  is decoded as it arrives, any other coding refused.
- Bytes that come after an answer's end, or while no request is out, close the connection:
  they are never read as the next request's answer (on a shared pool, another tenant's).
- A request is sent once. A pooled connection is checked just before it is written to (closed
  by the upstream, or bytes waiting on it: not reused, the next one or a new one taken);
  once a byte of the request left, a failure is the caller's, as the upstream may have acted
  on the POST.

Proxies: ``$HTTPS_PROXY`` / ``$HTTP_PROXY`` (and their lower-case forms) unless ``$NO_PROXY``
names the host, or an upstream's own ``proxy``; an http:// proxy only. https:// upstreams go
through a CONNECT tunnel, http:// ones as absolute-form requests to the proxy.
"""
from __future__ import annotations

import asyncio
import base64
import re
import select
import ssl
import time
import zlib
from collections import deque
from urllib.parse import unquote, urlsplit
from urllib.request import getproxies_environment, proxy_bypass_environment

import httptools

# An idle pooled connection older than this is dropped instead of reused: servers close idle
# keep-alive connections (uvicorn after 5 s, nginx after 75 s), and a reuse that races their
# close costs a failed request.
IDLE_S = 4.0
# Defaults of the limits (gateway.yaml: upstream_max_*, or per upstream max_*). An LLM
# server's head is a few hundred bytes (h11 stops at 16 KiB, nginx at 4-8 KiB a header
# line); its error bodies are small JSON, though a validation error may echo the request.
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_ERROR_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 512
# Bytes a status line's reason phrase may not hold (RFC 9112 §4: HTAB, SP, VCHAR, obs-text).
CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# The interim answers skipped: llhttp knows these have no body (other 1xx are refused).
INTERIM_STATUSES = (100, 102, 103)


class ConnectFailed(Exception):
    """No connection: refused, unreachable, the connect timed out (``timed_out``), a proxy did
    not open its tunnel, or the host already has ``max_connections`` open (``busy``)."""

    def __init__(self, detail: str, timed_out: bool = False, busy: bool = False) -> None:
        super().__init__(detail)
        self.timed_out, self.busy = timed_out, busy


class ReadFailed(Exception):
    """The connection broke, or was silent for the read timeout (``timed_out``), before the
    answer was read to its end. ``answered``: whether any byte of the answer had come."""

    def __init__(self, detail: str, timed_out: bool = False, answered: bool = True) -> None:
        super().__init__(detail)
        self.timed_out, self.answered = timed_out, answered


class AnswerRefused(ReadFailed):
    """The upstream answered, but not in a way this client takes: over a limit (``limit``
    names it), a framing or coding it refuses, a protocol switch. The answer is not used and
    its connection is closed."""

    def __init__(self, detail: str, limit: str | None = None) -> None:
        super().__init__(detail, answered=True)
        self.limit = limit


class Headers(dict):
    """The answer's headers, names in lower case, values without the whitespace around them;
    a name repeated has its values joined by ", " (RFC 9110 §5.3)."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


def tls_context(ca_file: str | None = None, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the server: against ``ca_file`` alone when given
    (else the system's CAs), presenting ``cert_file`` (and ``key_file``, unless the key is in
    the same file) when given. ValueError naming the file that would not load."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"ca_file {ca_file!r} is not a readable PEM file of CA certificates "
                         f"({e})") from None
    if cert_file:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            key = f" with key_file {key_file!r}" if key_file else ""
            raise ValueError(f"cert_file {cert_file!r}{key} is not a PEM certificate and its "
                             f"private key ({e})") from None
    elif key_file:
        raise ValueError(f"key_file {key_file!r} needs cert_file, the certificate it is the "
                         f"key of")
    return context


def masked(url: str) -> str:
    """``url`` with its password, if any, replaced by ***: proxy URLs carry credentials."""
    password = urlsplit(url if "://" in url else f"http://{url}").password
    return url if password is None else url.replace(f":{password}@", ":***@", 1)


def parse_proxy(url: str, source: str) -> tuple[str, int, bytes | None]:
    """(host, port, Proxy-Authorization value or None) of an http:// proxy URL (a bare
    ``host:port`` taken as one). ValueError naming ``source`` and what would be right."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or 80
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"{source} {masked(url)!r} is not an http:// proxy URL; use "
                         f"http://HOST:PORT (user:password@ allowed). A TLS connection to the "
                         f"proxy itself is not supported; https:// upstreams are tunnelled "
                         f"through an http:// proxy with CONNECT")
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = b"Basic " + base64.b64encode(credentials.encode())
    return parts.hostname, port, authorization


class UpstreamOptions:
    """How to reach one upstream and how much to take from it; made once per configured
    upstream (its TLS context is built here, once, and a bad file fails here).

    ``proxy``: an http:// proxy URL for this upstream; None: the environment's
    (``$HTTPS_PROXY`` / ``$HTTP_PROXY`` unless ``$NO_PROXY`` names the host)."""

    __slots__ = ("proxy", "tls", "tls_files", "max_header_bytes", "max_error_body_bytes",
                 "max_connections")

    def __init__(self, *, proxy: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None,
                 max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 max_error_body_bytes: int = DEFAULT_MAX_ERROR_BODY_BYTES,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if proxy is not None:
            parse_proxy(proxy, "proxy")
        self.proxy = proxy
        self.tls_files = (ca_file, cert_file, key_file)
        self.tls = tls_context(ca_file, cert_file, key_file) if any(self.tls_files) else None
        self.max_header_bytes = max_header_bytes
        self.max_error_body_bytes = max_error_body_bytes
        self.max_connections = max_connections


class _Target:
    """Where a URL's requests go and how, worked out once per (URL, options): the pool key
    (connections are shared only by requests that would make the same connection), the
    request line and Host header, the address to connect to, TLS, and the proxy's part."""

    __slots__ = ("key", "head", "host", "port", "tls", "server_hostname", "tunnel", "name")

    def __init__(self, key, head, host, port, tls, server_hostname, tunnel, name) -> None:
        self.key, self.head, self.host, self.port = key, head, host, port
        self.tls, self.server_hostname, self.tunnel, self.name = tls, server_hostname, tunnel, name


class _Decoder:
    """A body's Content-Encoding undone as it arrives: gzip (members one after another, zero
    bytes after one skipped, as ``gzip -d`` and Python's ``gzip.decompress`` take them) or
    deflate (the zlib format, RFC 9110 §8.4.1.2)."""

    __slots__ = ("coding", "gzip", "z", "fed")

    def __init__(self, coding: str) -> None:
        self.coding, self.gzip = coding, coding in ("gzip", "x-gzip")
        self.z = zlib.decompressobj(31 if self.gzip else 15)
        self.fed = False

    def decode(self, data: bytes) -> bytes:
        self.fed = True
        out = []
        while data:
            if self.z.eof:
                if not self.gzip:
                    raise AnswerRefused("the upstream's deflate-encoded body goes on after "
                                        "its end")
                data = data.lstrip(b"\0")                 # padding after a member
                if not data:
                    break
                self.z = zlib.decompressobj(31)           # the next gzip member
            try:
                out.append(self.z.decompress(data))
            except zlib.error as e:
                raise AnswerRefused(f"the upstream's {self.coding}-encoded body does not "
                                    f"decode ({e})") from None
            data = self.z.unused_data if self.z.eof else b""
        return b"".join(out)

    def finish(self) -> None:
        if self.fed and not self.z.eof:
            raise AnswerRefused(f"the upstream's {self.coding}-encoded body ends before its "
                                f"end")


def _decoder_for(encoding: str) -> _Decoder | None:
    """The decoder a Content-Encoding value needs (None: identity); AnswerRefused naming a
    coding this client does not decode."""
    codings = [c.strip().lower() for c in encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return _Decoder(codings[0])
    raise AnswerRefused(f"the upstream answered with Content-Encoding {encoding!r}, which the "
                        f"gateway does not decode (it asks for identity, and decodes one of "
                        f"gzip or deflate)")


class _Connection(asyncio.Protocol):
    """One TCP connection; at most one answer being read on it at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float | None,
                 on_gone=None) -> None:
        self.loop, self.pool_read_timeout_s = loop, read_timeout_s
        self.on_gone = on_gone        # called once when it closes (the host's count of open ones)
        self.transport = None
        self.closed = False
        self.idle_since = 0.0
        self._timer = None
        self._readable = None         # a poll of its socket: is anything waiting to be read?
        self.max_head_bytes = DEFAULT_MAX_HEADER_BYTES
        self._reset()
        self.complete = True          # no answer is due until a request goes out

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        # llhttp knows 0.9, 1.0, 1.1 and 2.0 alone; RFC 9112 §2.3: a higher 1.x minor version
        # is to be read as 1.1 (others are refused in on_headers_complete). And llhttp stops at
        # bytes after a message with "Connection: close", an interim one's too, where the final
        # answer follows; bytes after the final answer are refused here (on_message_begin),
        # and its should_keep_alive still says close.
        self.parser.set_dangerous_leniencies(lenient_version=True, lenient_keep_alive=True)
        self.read_timeout_s = self.pool_read_timeout_s     # ``expect_end`` shortens it
        self.status = 0
        self.headers = Headers()
        self.headers_done = False
        self.interim = False          # the head being parsed is a 1xx: skipped
        self.head_bytes = 0           # bytes fed while no final head had ended
        self.until_close = False      # the body ends when the connection does
        self.decoder: _Decoder | None = None
        self.body_limit: int | None = None      # ``Response.read(max_bytes)``
        self.body_checked = False     # a decoder or a limit: each chunk through _take_checked
        self.body_bytes = 0
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
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._readable = select.poll()
            self._readable.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        if self.complete:     # nothing is due: never to be read as the next request's answer
            self._poison()
            return
        self.answered = True
        self.last_read = time.monotonic()
        if not self.headers_done:
            room = self.max_head_bytes - self.head_bytes
            if len(data) > room:
                data = self._head_within_limit(data, room)
                if not data:
                    return
            else:
                self.head_bytes += len(data)
        try:        # (the streaming path: _feed's work inline, one call less a chunk)
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self._not_http(e)
            return
        if self.sink is None or self.held is not None or self.complete:
            self._wake()

    def _head_within_limit(self, data: bytes, room: int) -> bytes:
        """``data``, longer than the ``room`` left for the head (with any interim heads): its
        first ``room`` bytes fed, then what is left of it to feed if the final head ended
        within them, else b"" (refused for going past ``max_head_bytes``, or not HTTP)."""
        if room > 0 and not self._feed(data[:room]):
            return b""
        if not self.headers_done:
            self._fail(AnswerRefused(
                f"the upstream's answer head (status line and headers, with any interim 1xx "
                f"heads) is over {self.max_head_bytes} bytes (max_header_bytes)",
                limit="max_header_bytes"))
            return b""
        return data[room:]

    def _feed(self, data: bytes) -> bool:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self._not_http(e)
            return False
        return True

    def _not_http(self, e: Exception) -> None:
        # A refusal raised in a callback is already ``self.error``.
        cause = f": {e.__context__!r}" if e.__context__ is not None else ""
        self._fail(self.error or ReadFailed(
            f"the upstream's answer is not valid HTTP/1.1 ({e}{cause})"))

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._gone()
        if self._timer is not None:
            self._timer.cancel()
        if self.headers_done and not self.complete and self.until_close and self.error is None:
            try:
                self.on_message_complete()     # a body that ends when the connection does
            except ReadFailed as e:
                self._fail(e)
            self._wake()
        if not self.complete:
            self._fail(ReadFailed(f"the upstream closed the connection"
                                  f"{f' ({exc})' if exc else ''}", answered=self.answered))

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:     # a second answer to one request
            self._refuse(AnswerRefused("the upstream sent more after its answer's end"))

    def on_status(self, reason: bytes) -> None:
        # llhttp takes a NUL there; RFC 9112 §4 does not ("OK" needs no search).
        if not reason.isalpha() and CONTROL_BYTES.search(reason):
            self._refuse(AnswerRefused(f"the upstream's status line has a control byte in its "
                                       f"reason phrase ({reason[:60]!r})"))

    def on_header(self, name: bytes, value: bytes) -> None:      # called once per header
        if self.headers_done:         # a chunked body's trailer: not the answer's headers
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").rstrip(" \t")    # llhttp drops the leading OWS
        headers = self.headers
        if key in headers:
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        version = self.parser.get_http_version()
        if version[:2] != "1.":
            self._refuse(AnswerRefused(f"the upstream answered in HTTP/{version}; the gateway "
                                       f"speaks HTTP/1.x"))
        # Names are lower case already: dict.get, not Headers.get (a per-request cost).
        transfer_encoding = dict.get(self.headers, "transfer-encoding")   # on every head
        if transfer_encoding is not None and transfer_encoding.lower() != "chunked":
            self._refuse(AnswerRefused(f"the upstream answered with Transfer-Encoding "
                                       f"{transfer_encoding!r}; the gateway takes chunked "
                                       f"alone"))
        if status < 200:
            if status == 101:
                self._refuse(AnswerRefused("the upstream answered 101 Switching Protocols; no "
                                           "request from the gateway asks to switch"))
            if status < 100:
                self._refuse(AnswerRefused(f"the upstream answered status {status:03d}, not "
                                           f"an HTTP status (100-999)"))
            if status not in INTERIM_STATUSES:
                # llhttp frames other 1xx as if they had a body, where RFC 9110 §15.2 says
                # none has: what follows could be read as this interim answer's body.
                self._refuse(AnswerRefused(f"the upstream answered interim status {status}, "
                                           f"which the gateway does not know (it skips "
                                           f"100, 102 and 103)"))
            if version == "1.0":      # 1xx are HTTP/1.1's; llhttp would end the connection here
                self._refuse(AnswerRefused(f"the upstream answered an interim {status} in "
                                           f"HTTP/1.0, which has none"))
            self.interim = True       # 100 Continue, 102, 103 Early Hints: not the answer
            self.headers = Headers()
            return
        headers = self.headers
        encoding = dict.get(headers, "content-encoding")
        if encoding is not None:
            try:
                self.decoder = _decoder_for(encoding)
            except AnswerRefused as e:
                self._refuse(e)
            self.body_checked = self.decoder is not None
        self.status = status
        self.until_close = transfer_encoding is None and "content-length" not in headers
        # HTTP/1.0's keep-alive is an extension not every server gets right (h11 ignores it).
        self.keep_alive = self.parser.should_keep_alive() and version != "1.0"
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.body_checked:
            self._take_checked(body)
            return
        if self.sink is not None and self.held is None:
            held = self.sink(body)
            if held is not None:          # the reader is full: stop reading until it is not
                self.held = held
                self.paused = True
                self.transport.pause_reading()
            return
        self.chunks.append(body)          # for ``read``, or pushed once ``held`` is done

    def _take_checked(self, body: bytes) -> None:
        """``on_body`` with the answer's coding undone and its size limit kept."""
        if self.decoder is not None:
            try:
                body = self.decoder.decode(body)
            except AnswerRefused as e:
                self._refuse(e)
            if not body:
                return
        if self.body_limit is not None:
            self.body_bytes += len(body)
            if self.body_bytes > self.body_limit:
                self._refuse(self._over_body_limit())
        if self.sink is not None and self.held is None:
            held = self.sink(body)
            if held is not None:
                self.held = held
                self.paused = True
                self.transport.pause_reading()
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.decoder is not None:
            try:
                self.decoder.finish()
            except AnswerRefused as e:
                self._refuse(e)
        self.complete = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- refusing and failing
    def _refuse(self, error: AnswerRefused):
        """Stop parsing: ``error`` is why (raised out of httptools' callback); the answer's
        failure unless it had come whole (``_fail``)."""
        if self.error is None and not self.complete:
            self.error = error
        raise error

    def _over_body_limit(self) -> AnswerRefused:
        return AnswerRefused(f"the upstream's {self.status} answer has a body over "
                             f"{self.body_limit} bytes, the most the gateway reads of an "
                             f"error answer (max_error_body_bytes)", limit="max_error_body_bytes")

    def limit_body(self, max_bytes: int) -> None:
        """Refuse the rest of the body past ``max_bytes`` (decoded), counting what came."""
        held = sum(map(len, self.chunks))
        declared = self.headers.get("content-length")
        if held > max_bytes or (self.decoder is None and declared is not None
                                and declared.isdigit() and int(declared) > max_bytes):
            self.body_limit = max_bytes
            error = self._over_body_limit()
            self._fail(error)
            raise error
        self.body_limit, self.body_bytes, self.body_checked = max_bytes, held, True

    def _poison(self) -> None:
        """Bytes came while no answer was due: the connection's framing can no longer be
        trusted, so it is closed and never reused."""
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()

    # -- waiting
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: ReadFailed) -> None:
        if self.complete:         # the answer came whole: only the connection is not to be trusted
            self.keep_alive = False
        elif self.error is None:
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

    def still_open(self) -> bool:
        """Whether a request may go out on this idle connection: not closed, and nothing
        waiting to be read on its socket (the upstream's close, or stray bytes) that the
        event loop has not handled yet."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        return not (self._readable is not None and self._readable.poll(0))

    def send(self, head: bytes, body: bytes, max_head_bytes: int) -> None:
        self._reset()
        self.max_head_bytes = max_head_bytes
        self.transport.writelines((head, body))

    def _gone(self) -> None:
        on_gone, self.on_gone = self.on_gone, None
        if on_gone is not None:
            on_gone()

    def close(self) -> None:
        self.closed = True
        self._gone()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class _TunnelOpener(asyncio.Protocol):
    """Asks an HTTP proxy for a tunnel (``CONNECT host:port``) and waits for its 2xx; TLS to
    the upstream then runs through the tunnel (``Pool._open_transport``)."""

    def __init__(self, request: bytes, proxy: str, upstream: str, max_head_bytes: int) -> None:
        self.request, self.proxy, self.upstream = request, proxy, upstream
        self.max_head_bytes = max_head_bytes
        self.established = asyncio.get_running_loop().create_future()
        self.transport = None
        self.buffer = b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.established.done():
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > self.max_head_bytes:
                self._fail(f"answered CONNECT with a head over {self.max_head_bytes} bytes "
                           f"(max_header_bytes)")
            return
        status_line = self.buffer.split(b"\r\n", 1)[0]
        words = status_line.split(b" ", 2)
        shown = status_line[:120].decode("latin-1")
        if (len(words) < 2 or not words[0].startswith(b"HTTP/1.") or len(words[1]) != 3
                or not words[1].isdigit()):
            self._fail(f"answered CONNECT with {shown!r}, not an HTTP/1.1 status line")
        elif not words[1].startswith(b"2"):
            hint = (" (give the proxy's user:password in its URL)"
                    if words[1] == b"407" else "")
            self._fail(f"refused the tunnel: {shown}{hint}")
        elif self.buffer[end + 4:]:
            self._fail("sent bytes after its answer to CONNECT, before the TLS handshake")
        else:
            self.established.set_result(None)

    def connection_lost(self, exc) -> None:
        if not self.established.done():
            self.established.set_exception(ConnectFailed(
                f"the proxy {self.proxy} closed the connection before opening a tunnel to "
                f"{self.upstream}{f' ({exc})' if exc else ''}"))

    def _fail(self, why: str) -> None:
        self.established.set_exception(ConnectFailed(
            f"the proxy {self.proxy}, asked for a tunnel to {self.upstream}, {why}"))
        self.transport.close()


class Response:
    """An answer with its status and headers read and its body not yet: ``read`` it or
    ``pump`` it, then ``close`` (the connection goes back to the pool only when the
    body was read to its end)."""

    def __init__(self, pool: "Pool", key: tuple, connection: _Connection,
                 max_error_body_bytes: int = DEFAULT_MAX_ERROR_BODY_BYTES) -> None:
        self._pool, self._key, self._connection = pool, key, connection
        self.status = connection.status
        self.headers = connection.headers
        self.max_error_body_bytes = max_error_body_bytes

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

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The whole body (decoded). With ``max_bytes`` (an error answer's limit) a longer
        body is refused as it arrives, never held whole: ``AnswerRefused``."""
        c = self._connection
        if max_bytes is not None:
            c.limit_body(max_bytes)
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
    """Keep-alive connections per (scheme, host, port, proxy, TLS files), at most an upstream's
    ``max_connections`` of them open at once.

    ``proxies``: scheme → proxy URL and ``no`` → the hosts that go direct, as
    ``urllib.request.getproxies_environment`` reads them from the environment (the default,
    read once here)."""

    def __init__(self, connect_timeout_s: float | None, read_timeout_s: float | None,
                 proxies: dict[str, str] | None = None) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.proxies = getproxies_environment() if proxies is None else dict(proxies)
        self.options = UpstreamOptions()          # for ``post`` calls that name none
        self._idle: dict[tuple, list[_Connection]] = {}
        self._open: dict[tuple, int] = {}         # connections open (idle or in use) per key
        self._ssl: ssl.SSLContext | None = None
        self._targets: dict[tuple, _Target] = {}

    def _proxy_for(self, scheme: str, host: str, port: int,
                   options: UpstreamOptions) -> tuple[str, str] | None:
        """(proxy URL, where it was set) for a request to ``host:port``, or None: direct."""
        if options.proxy is not None:
            return options.proxy, "the upstream's proxy"
        url = self.proxies.get(scheme)
        if not url or proxy_bypass_environment(f"{host}:{port}", self.proxies):
            return None
        return url, f"${scheme.upper()}_PROXY"

    def _target(self, url: str, options: UpstreamOptions) -> _Target:
        """How requests to ``url`` go, worked out once per (URL, options)."""
        known = self._targets.get((url, options))
        if known is not None:
            return known
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectFailed(f"{url!r} is not an http:// or https:// URL")
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6
        authority = f"{name}:{port}"
        host_header = name if port == (443 if https else 80) else authority
        tls = (options.tls or self._default_tls()) if https else None
        proxy = self._proxy_for(parts.scheme, parts.hostname, port, options)
        if proxy is None:
            head = f"POST {path} HTTP/1.1\r\nhost: {host_header}\r\n".encode("latin-1")
            target = _Target((parts.scheme, parts.hostname, port, None, options.tls_files),
                             head, parts.hostname, port, tls, parts.hostname, None, authority)
        else:
            proxy_url, source = proxy
            try:
                proxy_host, proxy_port, authorization = parse_proxy(proxy_url, source)
            except ValueError as e:
                raise ConnectFailed(str(e)) from None
            key = (parts.scheme, parts.hostname, port, proxy_url, options.tls_files)
            via = f"{authority} through the proxy {masked(proxy_url)}"
            auth = (b"proxy-authorization: " + authorization + b"\r\n") if authorization else b""
            if https:     # a tunnel: the proxy sees only where to, TLS runs end to end
                connect = (f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n"
                           .encode("latin-1") + auth + b"\r\n")
                head = f"POST {path} HTTP/1.1\r\nhost: {host_header}\r\n".encode("latin-1")
                target = _Target(key, head, proxy_host, proxy_port, tls, parts.hostname,
                                 (connect, masked(proxy_url)), via)
            else:         # absolute-form, for the proxy to forward (RFC 9112 §3.2.2)
                head = (f"POST http://{host_header}{path} HTTP/1.1\r\nhost: {host_header}\r\n"
                        .encode("latin-1") + auth)
                target = _Target(key, head, proxy_host, proxy_port, None, None, None, via)
        if len(self._targets) < 1024:
            self._targets[(url, options)] = target
        return target

    def _default_tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _connect(self, target: _Target, options: UpstreamOptions) -> _Connection:
        key = target.key
        open_now = self._open.get(key, 0)
        if open_now >= options.max_connections:
            raise ConnectFailed(f"{target.name} already has {open_now} connection"
                                f"{'' if open_now == 1 else 's'} open, the most "
                                f"max_connections allows; none opened", busy=True)
        self._open[key] = open_now + 1
        loop = asyncio.get_running_loop()
        connection = _Connection(loop, self.read_timeout_s, lambda: self._gone(key))
        try:
            await asyncio.wait_for(self._open_transport(target, connection, options),
                                   self.connect_timeout_s)
        except asyncio.TimeoutError:
            connection.close()
            raise ConnectFailed(f"connecting to {target.name} timed out after "
                                f"{self.connect_timeout_s:g} s", timed_out=True) from None
        except OSError as e:
            connection.close()
            raise ConnectFailed(f"cannot connect to {target.name} ({e.strerror or e})") from None
        except BaseException:
            connection.close()
            raise
        return connection

    async def _open_transport(self, target: _Target, connection: _Connection,
                              options: UpstreamOptions) -> None:
        loop = asyncio.get_running_loop()
        if target.tunnel is None:
            await loop.create_connection(
                lambda: connection, target.host, target.port, ssl=target.tls,
                server_hostname=target.server_hostname if target.tls else None)
            return
        request, proxy = target.tunnel
        opener = _TunnelOpener(request, proxy, target.name, options.max_header_bytes)
        transport, _ = await loop.create_connection(lambda: opener, target.host, target.port)
        try:
            await opener.established
            tls_transport = await loop.start_tls(transport, connection, target.tls,
                                                 server_hostname=target.server_hostname)
        except BaseException:
            transport.close()
            raise
        connection.connection_made(tls_transport)

    def _gone(self, key: tuple) -> None:
        left = self._open.get(key, 1) - 1
        if left > 0:
            self._open[key] = left
        else:
            self._open.pop(key, None)

    def _reuse(self, key: tuple) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < IDLE_S and connection.still_open():
                return connection
            connection.close()     # found closed before a byte was written: the next one
        return None

    def release(self, key: tuple, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(connection)

    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   options: UpstreamOptions | None = None) -> Response:
        """Send ``body`` and wait for the answer's status and headers. Sent once: a failure
        after the request began to go out raises (``ReadFailed``), never sends it again."""
        options = options or self.options
        target = self._target(url, options)
        head = target.head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        head += b"content-length: %d\r\n\r\n" % len(body)
        connection = self._reuse(target.key) or await self._connect(target, options)
        return await self._exchange(target.key, connection, head, body, options)

    async def _exchange(self, key: tuple, connection: _Connection, head: bytes, body: bytes,
                        options: UpstreamOptions) -> Response:
        if connection.closed:     # a new connection the upstream closed at once
            connection.close()
            raise ReadFailed("the upstream closed the connection before the request was sent",
                             answered=False)
        try:
            connection.send(head, body, options.max_header_bytes)
            while not connection.headers_done:
                await connection.wait()
        except BaseException:
            connection.close()
            raise
        return Response(self, key, connection, options.max_error_body_bytes)

    def open_connections(self, url: str, options: UpstreamOptions | None = None) -> int:
        """How many connections to ``url``'s host are open now (idle or in use)."""
        return self._open.get(self._target(url, options or self.options).key, 0)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
