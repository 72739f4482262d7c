"""Calling an upstream: OpenAI-compatible servers over async HTTP (rung 5/6 servers, vLLM,
anything that speaks ``/v1/chat/completions``).

``open`` returns the upstream's response with its headers read and its body not yet, so a
stream is passed on as it arrives; a failure the next upstream could fix (refused, timed out,
5xx, 429) raises ``UpstreamFailure`` before anything reached the client, which is what lets
the gateway fall back without the client noticing.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .config import GatewayConfig, Upstream


@dataclass
class UpstreamFailure(Exception):
    upstream: str
    kind: str            # "refused", "timeout", "status"
    detail: str
    status: int | None = None

    def __str__(self) -> str:
        return f"{self.upstream} {self.detail}"

    @property
    def gateway_status(self) -> int:
        return 504 if self.kind == "timeout" else 502


class StreamBroken(Exception):
    """A stream that had started broke off (a managed upstream's error event, a dropped stream)."""


class OpenAIUpstreams:
    """One pooled async HTTP client for every OpenAI-compatible upstream."""

    def __init__(self, config: GatewayConfig) -> None:
        import httpx
        self.httpx = httpx
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.upstream_timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            headers={"accept-encoding": "identity"})

    @staticmethod
    def url(upstream: Upstream, path: str) -> str:
        base = upstream.url.rstrip("/")
        return base + (path if base.endswith("/v1") else "/v1" + path)

    async def open(self, upstream: Upstream, path: str, body: dict):
        """POST ``body`` to ``upstream``; the response with its body unread (caller closes it)."""
        httpx = self.httpx
        headers = {"content-type": "application/json"}
        if upstream.api_key_env and os.environ.get(upstream.api_key_env):
            headers["authorization"] = f"Bearer {os.environ[upstream.api_key_env]}"
        request = self.client.build_request("POST", self.url(upstream, path), headers=headers,
                                            content=json.dumps(body).encode())
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TimeoutException as e:
            raise UpstreamFailure(upstream.name, "timeout", f"timed out ({type(e).__name__})")
        except httpx.TransportError as e:
            raise UpstreamFailure(upstream.name, "refused",
                                  f"unreachable ({type(e).__name__}: {e or 'connection failed'})")
        if response.status_code >= 500 or response.status_code == 429:
            try:
                text = (await response.aread())[:300].decode(errors="replace")
            except httpx.HTTPError:
                text = ""
            finally:
                await response.aclose()
            what = "is over its own quota" if response.status_code == 429 else "failed"
            raise UpstreamFailure(upstream.name, "status",
                                  f"answered {response.status_code} ({what}): {text}",
                                  response.status_code)
        return response

    async def close(self) -> None:
        await self.client.aclose()


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


def event_json(event: bytes) -> dict | None:
    """The JSON payload of one ``data:`` event, or None (``[DONE]``, comments, other fields)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                try:
                    return json.loads(data)
                except ValueError:
                    return None
    return None
