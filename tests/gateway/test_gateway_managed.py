"""Managed rungs as upstreams: Bedrock Converse and a SageMaker endpoint, through the
contract's dialects and boto3, against a fake AWS runtime that speaks the real wire format
(JSON, and AWS event-stream bytes for streams)."""
from __future__ import annotations


import openai
import pytest

HI = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two"}]


def test_bedrock_as_the_fallback_of_a_self_hosted_upstream(gateway, acme_key, upstreams):
    client = gateway.client(acme_key["key"])
    raw = client.chat.completions.with_raw_response.create(model="managed", messages=HI, max_tokens=3)
    answer = raw.parse()
    assert raw.headers["x-spectrum-upstream"] == "bedrock"
    assert raw.headers["x-spectrum-fallback"] == "selfhosted refused"
    assert answer.choices[0].message.content == "fake.model-v1:0 fake.model-v1:1 fake.model-v1:2 "
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 3)
    sent = upstreams.stats("fake.model-v1")["last_body"]
    assert sent["system"] == [{"text": "be brief"}] and sent["inferenceConfig"]["maxTokens"] == 3

    chunks = list(client.chat.completions.create(model="managed", messages=HI, max_tokens=4,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"fake.model-v1:{i} " for i in range(4))
    assert chunks[-1].usage.completion_tokens == 4


def test_bedrock_throttling_is_a_fallback_reason_not_a_failure(gateway, acme_key, upstreams):
    upstreams.set("fake.model-v1", mode="fail429")
    try:
        with pytest.raises(openai.APIStatusError) as info:
            gateway.client(acme_key["key"]).chat.completions.create(model="managed", messages=HI,
                                                                    max_tokens=2)
        # Both failed: the self-hosted one refused, then Bedrock throttled; not all were 429s.
        assert info.value.status_code == 502
        assert "bedrock answered 429 (ThrottlingException)" in info.value.message
        assert info.value.response.headers["x-spectrum-fallback"] == "selfhosted refused; bedrock status 429"
    finally:
        upstreams.set("fake.model-v1", mode="ok")


def test_sagemaker_endpoint_whole_and_streamed(gateway, acme_key):
    client = gateway.client(acme_key["key"])
    answer = client.chat.completions.create(model="endpoint", messages=HI, max_tokens=2)
    assert answer.choices[0].message.content == "byo-ep:0 byo-ep:1 "
    assert answer.usage.completion_tokens == 2
    chunks = list(client.chat.completions.create(model="endpoint", messages=HI, max_tokens=5, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "".join(f"byo-ep:{i} " for i in range(5))
    mine = gateway.ledger(lambda e: e["upstream"] == "sagemaker" and e["stream"], tenant="acme")
    assert mine[-1]["output_tokens"] == 5 and mine[-1]["usage_source"] == "upstream"
