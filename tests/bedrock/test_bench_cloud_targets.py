"""The bench measures Bedrock and SageMaker endpoints through botocore, as it measures servers."""
from __future__ import annotations

import json

import boto3
from aws_event_stream import answer_with_events, event  # tests/bedrock, on sys.path under pytest

from options.bench import runner
from options.bench.metrics import summarize
from options.bench.profile import Profile, parse_lengths
from options.bedrock.client import retry_config
from options.contract import Request, StreamEvent, Usage, sse_stream


def _client(service):
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name="us-east-1").client(service, config=retry_config())


def _profile(n):
    return Profile(requests=n, prompt_tokens=parse_lengths("8", "p", ()),
                   output_tokens=parse_lengths("4", "o", ()), concurrency=2, seed=1)


def test_bench_against_bedrock_counts_server_usage():
    client = _client("bedrock-runtime")
    stream = ([event("messageStart", {"role": "assistant"})]
              + [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": t}})
                 for t in ["a", "b", "c"]]
              + [event("messageStop", {"stopReason": "max_tokens"}),
                 event("metadata", {"usage": {"inputTokens": 11, "outputTokens": 4, "totalTokens": 15},
                                    "metrics": {"latencyMs": 5}})])
    sent = answer_with_events(client, "ConverseStream", stream)
    run = runner.run(_profile(6), runner.bedrock_target(client),
                     Request(prompt="-", model="us.amazon.nova-micro-v1:0", stream=True))
    s = summarize(run.records, run.duration_s)
    # Four output tokens each from usage, though only three text chunks arrived.
    assert (s.completed, s.output_tokens, s.input_tokens, s.errors) == (6, 24, 66, {})
    assert all(r.tpot_s is not None for r in run.records)
    assert {json.loads(r.body)["inferenceConfig"]["maxTokens"] for r in sent} == {4}


def test_bench_against_a_sagemaker_endpoint_and_its_errors():
    client = _client("sagemaker-runtime")
    events = [StreamEvent("text", text="héllo"), StreamEvent("text", text=" wörld"),
              StreamEvent("finish", finish_reason="length"), StreamEvent("usage", usage=Usage(9, 4))]
    data = b"".join(sse_stream(events, "openai-chat"))
    answer_with_events(client, "InvokeEndpointWithResponseStream",
                       [event("PayloadPart", data[i:i + 5], "application/octet-stream")
                        for i in range(0, len(data), 5)])
    run = runner.run(_profile(4), runner.sagemaker_target(client, "ep", "openai-chat"),
                     Request(prompt="-", stream=True))
    s = summarize(run.records, run.duration_s)
    assert (s.completed, s.output_tokens, s.errors) == (4, 16, {})

    failing = _client("sagemaker-runtime")
    from botocore.awsrequest import AWSResponse

    class Raw:
        def stream(self, **_):
            yield b'{"ErrorCode": "ModelError", "Message": "boom"}'

        def read(self, *a, **k):
            return b'{"ErrorCode": "ModelError", "Message": "boom"}'

    failing.meta.events.register(
        "before-send.sagemaker-runtime.InvokeEndpointWithResponseStream",
        lambda request, **_: AWSResponse(request.url, 424, {"x-amzn-errortype": "ModelError"}, Raw()))
    run = runner.run(_profile(3), runner.sagemaker_target(failing, "ep", "openai-chat"),
                     Request(prompt="-", stream=True))
    assert summarize(run.records, run.duration_s).errors == {"ModelError": 3}
