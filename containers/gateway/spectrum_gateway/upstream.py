"""Calling an upstream: OpenAI-compatible servers over async HTTP (rung 5/6 servers, vLLM,
anything that speaks ``/v1/chat/completions``).

``open`` returns the upstream's response with its headers read and its body not yet, so a
stream is passed on as it arrives; a failure the next upstream could fix (refused, timed out,
5xx, 429) raises ``UpstreamFailure`` before anything reached the client, which is what lets
the gateway fall back without the client noticing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import orjson

from . import http1
from .config import GatewayConfig, Upstream


@dataclass
class UpstreamFailure(Exception):
    upstream: str
    kind: str            # "refused", "timeout", "status", "busy" (at its max_connections)
    detail: str
    status: int | None = None

    def __str__(self) -> str:
        return f"{self.upstream} {self.detail}"

    @property
    def gateway_status(self) -> int:
        return 504 if self.kind == "timeout" else 502


class StreamBroken(Exception):
    """An answer that had started broke off (a dropped connection, a managed stream's error)."""


class StreamTimeout(StreamBroken):
    """The upstream sent nothing for ``upstream_timeout_s`` in the middle of its answer."""


class StreamRefused(StreamBroken):
    """The upstream's answer broke a rule the gateway keeps (``http1.AnswerRefused``: over a
    limit, a coding it does not decode), so it was not read on."""


class HttpResponse:
    """An upstream's HTTP answer, headers read and body not yet: ``aread`` or ``pump`` it,
    then ``aclose`` (which drops the connection if the body was not read to its end, so
    an abandoned request stops the upstream's work)."""

    waits_to_close = False     # back to the pool, or closed, at once

    def __init__(self, response: http1.Response) -> None:
        self._response = response
        self.status_code = response.status
        self.headers = response.headers
        self.on_close = None         # called once when closed (a replica's in-flight count)

    @staticmethod
    def _broken(e: http1.ReadFailed) -> StreamBroken:
        if isinstance(e, http1.AnswerRefused):
            return StreamRefused(str(e))
        return StreamTimeout(str(e)) if e.timed_out else StreamBroken(str(e))

    async def aread(self) -> bytes:
        """The whole body; an error answer's only up to the upstream's
        ``max_error_body_bytes`` (``StreamRefused`` past it)."""
        limit = self._response.max_error_body_bytes if self.status_code >= 400 else None
        try:
            return await self._response.read(limit)
        except http1.ReadFailed as e:
            raise self._broken(e) from None

    async def pump(self, sink) -> None:
        """The body's bytes handed to ``sink`` as they arrive (``http1.Response.pump``)."""
        try:
            await self._response.pump(sink)
        except http1.ReadFailed as e:
            raise self._broken(e) from None

    def expect_end(self, within_s: float) -> None:
        self._response.expect_end(within_s)

    async def aclose(self) -> None:
        self._response.close()     # back to the pool only if read to its end
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()


async def pump_from(chunks, sink) -> None:
    """``pump`` over an answer's chunks as an async iterator, for answers that do not come
    through ``http1`` (Bedrock's and SageMaker's streams)."""
    async for chunk in chunks:
        held = sink(chunk)
        if held is not None:
            await held


class OpenAIUpstreams:
    """One keep-alive pool for every OpenAI-compatible upstream (``http1``: a relay on it spent
    less than half the CPU per request it spent on aiohttp)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.pool = http1.Pool(config.connect_timeout_s, config.upstream_timeout_s)
        # Each upstream's proxy, TLS files and limits, made at start-up (a bad file fails
        # then), found by the upstream's identity: the config is fixed for the process's life,
        # and hashing the dataclass's twenty fields on every request would cost more.
        self._options: dict[int, tuple[Upstream, http1.UpstreamOptions]] = {}
        for model in config.models.values():
            for upstream in model.upstreams:
                if upstream.kind == "openai":
                    self.options(upstream)

    def options(self, upstream: Upstream) -> http1.UpstreamOptions:
        """How the client reaches ``upstream`` and what it takes from it (made once)."""
        known = self._options.get(id(upstream))
        if known is None or known[0] is not upstream:
            known = self._options[id(upstream)] = (upstream, http1.UpstreamOptions(
                proxy=upstream.proxy, ca_file=upstream.ca_file, cert_file=upstream.cert_file,
                key_file=upstream.key_file, max_header_bytes=upstream.max_header_bytes,
                max_error_body_bytes=upstream.max_error_body_bytes,
                max_connections=upstream.max_connections))
        return known[1]

    @staticmethod
    def url(base: str, path: str) -> str:
        base = base.rstrip("/")
        return base + (path if base.endswith("/v1") else "/v1" + path)

    async def open(self, upstream: Upstream, path: str, body: dict | bytes,
                   replica: str | None = None, replica_url: str | None = None) -> HttpResponse:
        """POST ``body`` (a dict, or JSON bytes sent as they are) to ``upstream`` (to
        ``replica_url``, one of its replicas, when given);
        the response with its body unread (caller closes it). Failures name the replica."""
        who = replica or upstream.name
        url = self.url(replica_url or upstream.url, path)
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if upstream.api_key_env and os.environ.get(upstream.api_key_env):
            headers["authorization"] = f"Bearer {os.environ[upstream.api_key_env]}"
        try:
            raw = await self.pool.post(
                url, body if isinstance(body, bytes) else orjson.dumps(body), headers,
                self.options(upstream))
        except http1.ConnectFailed as e:
            if e.busy:
                raise UpstreamFailure(who, "busy", f"not called ({e})")
            raise UpstreamFailure(who, "timeout" if e.timed_out else "refused",
                                  f"timed out ({e})" if e.timed_out else f"unreachable ({e})")
        except http1.ReadFailed as e:
            raise UpstreamFailure(who, "timeout" if e.timed_out else "refused",
                                  f"timed out ({e})" if e.timed_out else f"failed ({e})")
        response = HttpResponse(raw)
        if response.status_code >= 500 or response.status_code == 429:
            try:
                text = (await response.aread())[:300].decode(errors="replace")
            except StreamBroken as e:
                text = f"[its body unread: {e}]"
            finally:
                await response.aclose()
            what = "is over its own quota" if response.status_code == 429 else "failed"
            raise UpstreamFailure(who, "status",
                                  f"answered {response.status_code} ({what}): {text}",
                                  response.status_code)
        return response

    async def close(self) -> None:
        self.pool.close()


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete server-sent events (each with its blank-line end) and the unfinished rest."""
    events = []
    while True:
        ends = [(i, n) for i, n in ((buffer.find(b"\n\n"), 2), (buffer.find(b"\r\n\r\n"), 4))
                if i >= 0]
        if not ends:
            return events, buffer
        end, sep = min(ends)
        events.append(buffer[:end + sep])
        buffer = buffer[end + sep:]


def carries_usage(data: bytes) -> bool:
    """Whether ``data`` has a ``"usage"`` key whose value is an object, told without parsing
    it. OpenAI's API, and servers that follow it, put ``"usage": null`` in every chunk of a
    stream that asked for usage, as the gateway always asks: parsing each chunk to find that
    out took a token's relay from 0.6 to 3.5 µs. (Inside a string a quote is escaped, so
    ``"usage"`` followed by a colon is a key.)"""
    at = data.find(b'"usage"')
    while at >= 0:
        at += 7
        rest = data[at:at + 32].lstrip(b" \t\r\n")
        if rest[:1] == b":" and rest[1:].lstrip(b" \t\r\n")[:1] == b"{":
            return True
        at = data.find(b'"usage"', at)
    return False


def event_json(event: bytes) -> dict | None:
    """The JSON payload of one ``data:`` event, or None (``[DONE]``, comments, other fields)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                try:
                    return orjson.loads(data)
                except ValueError:
                    return None
    return None
