"""Real AWS event-stream bytes for botocore to parse (moto and Stubber cannot stream).

A message: prelude (total length, headers length, CRC32 of those 8 bytes), headers (name
length, name, type 7 = string, value length, value), payload, CRC32 of everything before.
``answer_with_events`` returns such bytes from a ``before-send`` hook, so the request is
built, signed and sent through botocore's own stack and the answer goes through botocore's
own event-stream parser, exactly as with AWS.
"""
from __future__ import annotations

import binascii
import json
import struct
from typing import Any

from botocore.awsrequest import AWSResponse


def _crc(data: bytes) -> int:
    return binascii.crc32(data) & 0xFFFFFFFF


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    encoded = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        encoded += struct.pack(">B", len(n)) + n + struct.pack(">BH", 7, len(v)) + v
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", _crc(prelude))
    body = prelude + encoded + payload
    return body + struct.pack(">I", _crc(body))


def event(event_type: str, payload: Any, content_type: str = "application/json") -> bytes:
    """One ``:message-type: event`` message; dicts become JSON, bytes are sent as they are."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return encode_message({":message-type": "event", ":event-type": event_type,
                           ":content-type": content_type}, data)


def exception(exception_type: str, message: str) -> bytes:
    return encode_message({":message-type": "exception", ":exception-type": exception_type,
                           ":content-type": "application/json"},
                          json.dumps({"message": message, "Message": message}).encode())


class _Raw:
    """What botocore reads an event stream from: ``stream()`` yields the bytes in chunks."""

    def __init__(self, data: bytes, chunk: int):
        self._data, self._chunk = data, chunk

    def stream(self, *a: Any, **kw: Any):
        for i in range(0, len(self._data), self._chunk):
            yield self._data[i:i + self._chunk]

    def read(self, *a: Any, **kw: Any) -> bytes:
        return self._data

    def close(self) -> None:
        pass


def answer_with_events(client: Any, operation: str, messages: list[bytes], *, chunk: int = 7,
                       headers: dict[str, str] | None = None) -> list[Any]:
    """Make ``client``'s next ``operation`` calls answer ``messages``; returns the sent requests."""
    sent: list[Any] = []
    data = b"".join(messages)

    def before_send(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)
        return AWSResponse(request.url, 200, {"content-type": "application/vnd.amazon.eventstream",
                                              **(headers or {})}, _Raw(data, chunk))

    service = client.meta.service_model.service_id.hyphenize()
    client.meta.events.register(f"before-send.{service}.{operation}", before_send)
    return sent
