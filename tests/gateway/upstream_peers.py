"""Peers for the upstream client's tests, all on 127.0.0.1 and written here: a certificate
authority with server and client certificates made with ``cryptography``, an HTTP proxy
(CONNECT tunnels and absolute-form forwarding, optionally asking for credentials), and raw
servers on an event loop in a thread of their own, so a gateway in another process, or a
client whose own loop is held, can reach them."""
from __future__ import annotations

import asyncio
import base64
import datetime
import gzip
import ipaddress
import ssl
import threading
from pathlib import Path
from urllib.parse import urlsplit

from gateway_harness import tcp_server


class LoopThread:
    """An asyncio event loop running in a daemon thread; ``run`` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout_s: float = 10):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def stop(self) -> None:
        """Its servers' connections cancelled and ended, then the loop stopped and closed."""
        try:
            self.run(_cancel_all())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head (up to its blank line) and its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)




class Certificates:
    """A CA made for the test, a server certificate it signed for 127.0.0.1 and localhost,
    and a client certificate it signed; each written as PEM into ``directory``."""

    def __init__(self, directory: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
        self.dir = directory
        now = datetime.datetime.now(datetime.timezone.utc)

        def name(common: str):
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

        def write(file: str, data: bytes) -> str:
            path = directory / file
            path.write_bytes(data)
            return str(path)

        def key_pem(key) -> bytes:
            return key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())

        def issue(common: str, key, issuer_key, issuer_name, *, ca=False, sans=(), usage=None):
            builder = (x509.CertificateBuilder().subject_name(name(common))
                       .issuer_name(issuer_name).public_key(key.public_key())
                       .serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))
                       .not_valid_after(now + datetime.timedelta(days=1))
                       .add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                                      critical=True))
            if ca:
                builder = builder.add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
                builder = builder.add_extension(
                    x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            else:
                builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    issuer_key.public_key()), critical=False)
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)),
                                                critical=False)
            if usage:
                builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            return builder.sign(issuer_key, hashes.SHA256())

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = issue("spectrum test CA", ca_key, ca_key, name("spectrum test CA"), ca=True)
        server_key = ec.generate_private_key(ec.SECP256R1())
        server = issue("127.0.0.1", server_key, ca_key, ca.subject,
                       sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                             x509.DNSName("localhost")], usage=ExtendedKeyUsageOID.SERVER_AUTH)
        client_key = ec.generate_private_key(ec.SECP256R1())
        client = issue("gateway", client_key, ca_key, ca.subject,
                       usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        pem = serialization.Encoding.PEM
        self.ca_file = write("ca.pem", ca.public_bytes(pem))
        self.server_cert = write("server.pem", server.public_bytes(pem))
        self.server_key = write("server.key", key_pem(server_key))
        self.client_cert = write("client.pem", client.public_bytes(pem))
        self.client_key = write("client.key", key_pem(client_key))
        # A second CA nobody trusts: a server certificate from it must fail verification.
        other_key = ec.generate_private_key(ec.SECP256R1())
        other = issue("another CA", other_key, other_key, name("another CA"), ca=True)
        self.other_ca_file = write("other-ca.pem", other.public_bytes(pem))

    def server_context(self, require_client_cert: bool = True) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca_file)
        return context


class Proxy:
    """An HTTP proxy: ``CONNECT host:port`` opens a tunnel; an absolute-form request
    (``POST http://host:port/path``) is forwarded to its host, each request on the connection
    rewritten to origin-form. Every request line it is sent is kept in ``seen``. With
    ``credentials`` ("user:password"), a request without them in Proxy-Authorization gets 407."""

    def __init__(self, credentials: str | None = None) -> None:
        self.credentials = credentials
        self.seen: list[str] = []
        self.server = None
        self.port = 0

    @property
    def url(self) -> str:
        auth = f"{self.credentials}@" if self.credentials else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    async def start(self) -> "Proxy":
        self.server, self.port = await tcp_server(self._client)
        return self

    def _authorized(self, head: bytes) -> bool:
        if self.credentials is None:
            return True
        wanted = b"basic " + base64.b64encode(self.credentials.encode()).lower()
        return any(line.lower().startswith(b"proxy-authorization:")
                   and line.split(b":", 1)[1].strip().lower() == wanted
                   for line in head.split(b"\r\n"))

    async def _client(self, reader, writer, n) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        self.seen.append(line)
        if not self._authorized(head):
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                         b"proxy-authenticate: Basic\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            return
        method, target, _ = line.split(" ", 2)
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await _both_ways(_pipe(reader, up_writer), _pipe(up_reader, writer))
            return
        parts = urlsplit(target)
        up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port or 80)

        async def requests(head: bytes) -> None:     # client → upstream, request by request
            while True:
                length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                               if h.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                first, rest = head.split(b"\r\n", 1)
                verb, absolute, version = first.split(b" ", 2)
                origin = urlsplit(absolute.decode("latin-1"))
                path = (origin.path or "/") + (f"?{origin.query}" if origin.query else "")
                rest = b"\r\n".join(h for h in rest.split(b"\r\n")
                                    if not h.lower().startswith(b"proxy-authorization:"))
                up_writer.write(b"%s %s %s\r\n%s%s" % (verb, path.encode(), version, rest, body))
                await up_writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                self.seen.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
        await _both_ways(requests(head), _pipe(up_reader, writer))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _both_ways(*directions) -> None:
    """Relay until either direction ends, then stop the other."""
    tasks = [asyncio.ensure_future(d) for d in directions]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def gzipped(data: bytes) -> bytes:
    """gzip without a timestamp: bytes made at collection name parametrized tests, and every
    pytest-xdist worker must collect the same names."""
    return gzip.compress(data, mtime=0)


def chat_answer(text: str) -> bytes:
    """An OpenAI chat completion's JSON whose message is ``text``."""
    import json
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                 "total_tokens": 2}}).encode()
