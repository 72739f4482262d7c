"""Streaming invocations: moto has no InvokeEndpointWithResponseStream, so a before-send hook
answers with real AWS event-stream bytes (PayloadPart messages cut at awkward places) and
botocore's own event-stream parser reads them."""
from __future__ import annotations

import binascii
import struct

import pytest
from botocore.awsrequest import AWSResponse

from options import contract
from options.core import rung
from options.deploy import main
from options.sagemaker.apply import apply_plan

WORDS = ["GPUs ", "multiply ", "matrices ", "in ", "parallel ", "— fast."]


def _header(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return struct.pack(">B", len(n)) + n + b"\x07" + struct.pack(">H", len(v)) + v


def event_message(payload: bytes) -> bytes:
    """One AWS event-stream message carrying a PayloadPart."""
    headers = (_header(":event-type", "PayloadPart") + _header(":message-type", "event")
               + _header(":content-type", "application/octet-stream"))
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    head = prelude + struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF) + headers + payload
    return head + struct.pack(">I", binascii.crc32(head) & 0xFFFFFFFF)


class _Raw:
    def __init__(self, data: bytes, chunk: int):
        self.data, self.chunk = data, chunk

    def stream(self, *_, **__):
        for i in range(0, len(self.data), self.chunk):
            yield self.data[i:i + self.chunk]


def _answer_stream(dialect: str) -> bytes:
    """The container's SSE bytes, cut into PayloadParts that split lines and UTF-8 characters."""
    events = [contract.StreamEvent("text", text=w) for w in WORDS] + \
        [contract.StreamEvent("finish", finish_reason="stop")]
    body = b"".join(contract.sse_stream(events, dialect))
    parts = [body[i:i + 7] for i in range(0, len(body), 7)]
    return b"".join(event_message(p) for p in parts)


@pytest.fixture
def streamed_answers(botocore_events):
    def install(dialect: str):
        def answer(request, **_):
            if "invocations-response-stream" not in request.url:
                return None
            return AWSResponse(request.url, 200, {"Content-Type": "application/vnd.amazon.eventstream"},
                               _Raw(_answer_stream(dialect), chunk=13))
        botocore_events("before-send.sagemaker-runtime.InvokeEndpointWithResponseStream", answer)
    return install


@pytest.mark.parametrize("level", [3, 5])
def test_stream_through_sagemaker_runtime(level, target, build, streamed_answers):
    module, _, plan = build("--level", str(level), "--target", "emulator")
    streamed_answers(rung(level).can.dialect)
    deployment = apply_plan(plan, target, lambda _: None)
    events = list(module.invoke(deployment, contract.Request(prompt="Why GPUs?", stream=True)))
    result = contract.collect(events)
    assert result.text == "".join(WORDS) and result.finish_reason == "stop"
    assert len([e for e in events if e.kind == "text"]) == len(WORDS)


def test_cli_stream_on_the_aws_path(emulator_url, target, streamed_answers, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    streamed_answers("lmi")
    code = main(["--level", "3", "--target", "aws", "--endpoint-url", emulator_url,
                 "--invoke", "Why GPUs?", "--stream"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"answer (spectrum-l3-mistral-7b-instruct-v0-3): {''.join(WORDS)!r}" in out
    assert "TTFT " in out and "n/a" not in out.split("TTFT ")[1].split("·")[0]
