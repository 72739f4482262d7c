"""Reading a request's body within the server's limits (byo_vllm.asgi), through the ASGI
interface the HTTP protocol drives it with: no engine, no sockets."""
from __future__ import annotations

import asyncio

import pytest

from byo_vllm.asgi import DROP_AT_MOST, ClientGone, Request
from byo_vllm.dialects import BadRequest

LIMIT = 1000


def _request(parts: list[bytes], headers: dict[str, str] | None = None, stall: bool = False):
    """A request whose body arrives in ``parts``; ``stall``: the client then sends nothing."""
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1 or stall}
                for i, p in enumerate(parts)]
    received = []

    async def receive() -> dict:
        if messages:
            received.append(messages[0])
            return messages.pop(0)
        await asyncio.sleep(3600)          # a stalled client

    scope = {"method": "POST", "path": "/v1/completions", "http_version": "1.1",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    return Request(scope, receive), received


def _body(request: Request, timeout_s: float = 5.0) -> bytes:
    return asyncio.run(request.body(LIMIT, timeout_s))


def test_a_body_in_parts_is_joined():
    request, _ = _request([b'{"prompt":', b' "hi"}'])
    assert _body(request) == b'{"prompt": "hi"}'


def test_a_declared_length_over_the_limit_is_413_after_the_rest_is_dropped():
    parts = [b"x" * 600] * 4
    request, received = _request(parts, {"Content-Length": str(2400)})
    with pytest.raises(BadRequest) as e:
        _body(request)
    assert e.value.status == 413 and f"larger than {LIMIT} bytes" in str(e.value)
    assert len(received) == 4, "the rest of the body was not read before the answer"


def test_dropping_stops_at_its_bound():
    parts = [b"x" * LIMIT] * (DROP_AT_MOST + 5)
    request, received = _request(parts, {"Content-Length": str(len(parts) * LIMIT)})
    with pytest.raises(BadRequest):
        _body(request)
    assert len(received) == DROP_AT_MOST + 1


def test_a_client_that_waits_for_100_continue_is_answered_without_reading():
    request, received = _request([b"x" * 600] * 4, {"Content-Length": "2400",
                                                   "Expect": "100-continue"})
    with pytest.raises(BadRequest) as e:
        _body(request)
    assert e.value.status == 413 and received == []


def test_a_chunked_body_that_grows_past_the_limit_is_413():
    request, _ = _request([b"x" * 600, b"x" * 600, b"x"])
    with pytest.raises(BadRequest) as e:
        _body(request)
    assert e.value.status == 413


def test_a_client_that_stops_mid_body_gets_408():
    request, _ = _request([b'{"prompt": "ha'], stall=True)
    with pytest.raises(BadRequest) as e:
        _body(request, timeout_s=0.2)
    assert e.value.status == 408 and "no part of the body for 0.2 s" in str(e.value)


def test_a_client_gone_mid_body_is_not_answered():
    messages = [{"type": "http.request", "body": b"{", "more_body": True},
                {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    request = Request({"method": "POST", "path": "/", "headers": []}, receive)
    with pytest.raises(ClientGone):
        _body(request)
