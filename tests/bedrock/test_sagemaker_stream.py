"""SageMaker response streams through botocore's own parser, however the PayloadParts are cut."""
from __future__ import annotations

import io
import json

import pytest
from aws_event_stream import answer_with_events, event, exception  # tests/bedrock, on sys.path under pytest

from options import contract
from options.contract import Request, StreamEvent, Usage, collect, dialect, invoke_sagemaker, sse_stream

TEXTS = ["Grüße", " 日本", "語 ", "🙂", " fin"]


def _openai_sse(texts, usage=(3, 4)) -> bytes:
    events = [StreamEvent("text", text=t) for t in texts]
    events += [StreamEvent("finish", finish_reason="length"), StreamEvent("usage", usage=Usage(*usage))]
    return b"".join(sse_stream(events, "openai-completions"))


def _runtime_client():
    import boto3
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name="us-east-1").client("sagemaker-runtime")


@pytest.mark.parametrize("part_size", [1, 3, 64])
def test_invoke_sagemaker_buffers_payload_parts(part_size):
    """Real event-stream bytes through botocore's parser; PayloadParts cut every N bytes."""
    data = _openai_sse(TEXTS)
    parts = [data[i:i + part_size] for i in range(0, len(data), part_size)]
    client = _runtime_client()
    sent = answer_with_events(client, "InvokeEndpointWithResponseStream",
                              [event("PayloadPart", p, "application/octet-stream") for p in parts])
    req = Request(prompt="hi", max_tokens=4, stream=True)
    res = collect(invoke_sagemaker(client, "ep", req, "openai-completions"), started=0.0)
    assert res.text == "".join(TEXTS) and res.usage == Usage(3, 4) and res.finish_reason == "length"
    assert sent[0].url.endswith("/endpoints/ep/invocations-response-stream")
    assert json.loads(sent[0].body)["stream"] is True


def test_invoke_sagemaker_reports_a_model_error_mid_stream():
    client = _runtime_client()
    answer_with_events(client, "InvokeEndpointWithResponseStream",
                       [event("PayloadPart", b'data: {"choices": [{"text": "a"}]}\n\n',
                              "application/octet-stream"),
                        exception("ModelStreamError", "CUDA out of memory")])
    with pytest.raises(contract.StreamError, match="CUDA out of memory"):
        collect(invoke_sagemaker(client, "ep", Request(prompt="x", stream=True), "openai-completions"))


def test_invoke_sagemaker_buffered_answer():
    from botocore.stub import Stubber
    client = _runtime_client()
    answer = json.dumps([{"generated_text": "ok", "details": {"finish_reason": "eos_token",
                                                                "generated_tokens": 1}}]).encode()
    with Stubber(client) as stub:
        stub.add_response("invoke_endpoint", {"Body": io.BytesIO(answer), "ContentType": "application/json"},
                          {"EndpointName": "ep", "ContentType": "application/json",
                           "Accept": "application/json",
                           "Body": json.dumps(dialect("tgi").to_wire(Request(prompt="hi"))).encode()})
        res = invoke_sagemaker(client, "ep", Request(prompt="hi"), "tgi")
    assert (res.text, res.finish_reason, res.usage.output_tokens) == ("ok", "stop", 1)
    assert res.timings.e2e_s is not None and res.timings.e2e_s >= 0
