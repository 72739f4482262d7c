"""Level 1 through botocore's own stack: Stubber for Converse, real event-stream bytes for streams."""
from __future__ import annotations

import argparse
import json
import time

import boto3
import pytest
from aws_event_stream import answer_with_events, event, exception  # tests/bedrock, on sys.path
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber

import options.bedrock as level1
from cost import token_cost
from options.aws import Target
from options.bedrock.catalogue import list_models
from options.bedrock.client import BedrockBadRequest, BedrockClient, BedrockError, retry_config
from options.contract import Request, Usage, collect
from options.core import BadInput

MODEL = "amazon.nova-micro-v1:0"


def _session(region="us-east-1"):
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name=region)


def _runtime(region="us-east-1"):
    return _session(region).client("bedrock-runtime", config=retry_config())


def _answer(text="Hello there", stop="end_turn", inp=12, out=3):
    return {"output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": stop, "usage": {"inputTokens": inp, "outputTokens": out, "totalTokens": inp + out},
            "metrics": {"latencyMs": 321}}


def test_converse_sends_the_request_and_prices_the_usage():
    runtime = _runtime()
    req = Request(prompt="Hi", system="Be brief", max_tokens=50, temperature=0.2, top_p=0.9,
                  stop=["END"], model=MODEL)
    expected = {"modelId": MODEL, "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
                "system": [{"text": "Be brief"}],
                "inferenceConfig": {"maxTokens": 50, "temperature": 0.2, "topP": 0.9,
                                    "stopSequences": ["END"]}}
    with Stubber(runtime) as stub:
        stub.add_response("converse", _answer(inp=1200, out=300), expected)
        res = BedrockClient(runtime).converse(req)
        stub.assert_no_pending_responses()
    assert (res.text, res.finish_reason) == ("Hello there", "stop")
    assert (res.usage.input_tokens, res.usage.output_tokens) == (1200, 300)
    # Nova Micro: $0.035 in, $0.14 out per 1M tokens (the dated table).
    assert res.usage.cost_usd == pytest.approx(token_cost(MODEL, 1200, 300))
    assert res.usage.cost_usd == pytest.approx((1200 * 0.035 + 300 * 0.14) / 1e6)
    assert res.timings.server_latency_s == pytest.approx(0.321)


def _json_response(request, status, body, headers=None):
    return AWSResponse(request.url, status, {"content-type": "application/json", **(headers or {})},
                       _RawBody(json.dumps(body).encode()))


class _RawBody:
    def __init__(self, data):
        self.data = data

    def stream(self, **kw):
        yield self.data

    def read(self, *a, **kw):
        return self.data


@pytest.mark.parametrize("code", ["ThrottlingException", "ModelNotReadyException"])
def test_throttling_then_success_retries_with_backoff(code):
    """botocore's standard retry mode does the retry; the server's retry-after sets the wait."""
    runtime = _runtime()
    sends = []

    def before_send(request, **_):
        sends.append(time.perf_counter())
        if len(sends) == 1:
            return _json_response(request, 429, {"message": "slow down"},
                                  {"x-amzn-errortype": f"{code}:http://internal.amazon.com/",
                                   "x-amz-retry-after": "300"})
        return _json_response(request, 200, _answer())

    runtime.meta.events.register("before-send.bedrock-runtime.Converse", before_send)
    res = BedrockClient(runtime).converse(Request(prompt="Hi", model=MODEL))
    assert res.text == "Hello there"
    assert len(sends) == 2
    assert sends[1] - sends[0] >= 0.3          # it waited before retrying
    assert res.raw["usage"]["outputTokens"] == 3


def test_throttling_that_never_ends_says_what_to_do():
    runtime = _session().client("bedrock-runtime", config=retry_config(max_attempts=2))
    runtime.meta.events.register(
        "before-send.bedrock-runtime.Converse",
        lambda request, **_: _json_response(request, 429, {"message": "Too many requests"},
                                            {"x-amzn-errortype": "ThrottlingException",
                                             "x-amz-retry-after": "10"}))
    with pytest.raises(BedrockError, match=r"still throttling .* after 2 attempts.*quota"):
        BedrockClient(runtime).converse(Request(prompt="Hi", model=MODEL))


def test_access_denied_says_to_request_model_access():
    runtime = _runtime("eu-west-1")
    with Stubber(runtime) as stub:
        stub.add_client_error("converse", "AccessDeniedException", "You don't have access to the model "
                              "with the specified model ID.", 403)
        with pytest.raises(BedrockError) as info:
            BedrockClient(runtime).converse(Request(prompt="Hi", model="eu.amazon.nova-micro-v1:0"))
    msg = str(info.value)
    assert "Request access to this model" in msg and "eu-west-1" in msg
    assert "'eu.amazon.nova-micro-v1:0'" in msg and info.value.code == "AccessDeniedException"


@pytest.mark.parametrize("message, expected", [
    ("1 validation error detected: Value '9000' at 'inferenceConfig.maxTokens' failed to satisfy "
     "constraint: Member must have value less than or equal to 8192",
     r"inferenceConfig.maxTokens \(--max-tokens\) = '9000': Member must have value less than or equal to 8192"),
    ("The maximum tokens you requested exceeds the model limit of 5000. Try again with a maximum "
     "tokens value that is lower than 5000.", r"maxTokens \(--max-tokens\) is over this model's limit of 5000"),
    ("Invocation of model ID amazon.nova-micro-v1:0 with on-demand throughput isn't supported. Retry "
     "your request with the ID or ARN of an inference profile that contains this model.",
     r"--model us.amazon.nova-micro-v1:0"),
])
def test_validation_errors_name_the_field_and_limit(message, expected):
    runtime = _runtime()
    with Stubber(runtime) as stub:
        stub.add_client_error("converse", "ValidationException", message, 400)
        with pytest.raises(BedrockBadRequest, match=expected):
            BedrockClient(runtime).converse(Request(prompt="Hi", model=MODEL, max_tokens=9000))


def _stream_messages(deltas, stop="max_tokens", usage=(7, 5)):
    return ([event("messageStart", {"role": "assistant"})]
            + [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": d}}) for d in deltas]
            + [event("contentBlockStop", {"contentBlockIndex": 0}),
               event("messageStop", {"stopReason": stop}),
               event("metadata", {"usage": {"inputTokens": usage[0], "outputTokens": usage[1],
                                            "totalTokens": sum(usage)}, "metrics": {"latencyMs": 42}})])


def test_converse_stream_through_botocores_event_stream_parser():
    runtime = _runtime()
    deltas = ["Über", " 日本", "語", " 🙂", "!"]
    sent = answer_with_events(runtime, "ConverseStream", _stream_messages(deltas), chunk=5)
    req = Request(prompt="Hi", max_tokens=5, stream=True, model="us.amazon.nova-micro-v1:0")
    events = list(BedrockClient(runtime).converse_stream(req))
    assert [e.text for e in events if e.kind == "text"] == deltas      # one event per delta
    assert [e.kind for e in events][-2:] == ["finish", "usage"]
    res = collect(events, started=events[0].t - 0.001)
    assert res.text == "".join(deltas) and res.finish_reason == "length"
    assert (res.usage.input_tokens, res.usage.output_tokens) == (7, 5)
    assert res.usage.cost_usd == pytest.approx(token_cost(MODEL, 7, 5))   # profile billed as base
    assert res.timings.e2e_s == pytest.approx(res.timings.ttft_s + sum(res.timings.itl_s))
    body = json.loads(sent[0].body)
    assert body["inferenceConfig"] == {"maxTokens": 5}
    assert sent[0].url.endswith("/model/us.amazon.nova-micro-v1%3A0/converse-stream")


def test_error_inside_the_stream_is_reported():
    runtime = _runtime()
    answer_with_events(runtime, "ConverseStream",
                       _stream_messages(["a"])[:2] + [exception("throttlingException", "Too many tokens")])
    stream = BedrockClient(runtime).converse_stream(Request(prompt="Hi", stream=True, model=MODEL))
    with pytest.raises(BedrockError, match="still throttling.*Too many tokens"):
        list(stream)


def test_profile_from_the_wrong_geography_is_bad_input():
    with pytest.raises(BadInput, match=r"'eu.amazon.nova-micro-v1:0'.*'us-east-1'.*use 'us.amazon.nova-micro-v1:0'"):
        BedrockClient(_runtime("us-east-1")).converse(Request(prompt="x", model="eu.amazon.nova-micro-v1:0"))
    # global. works from anywhere, apac. from ap-*:
    from options.bedrock.client import check_model_region
    check_model_region("global.anthropic.claude-haiku-4-5-20251001-v1:0", "sa-east-1")
    check_model_region("apac.amazon.nova-micro-v1:0", "ap-southeast-1")


def test_catalogue_live_then_offline_fallback():
    bedrock = _session().client("bedrock")
    summaries = [{"modelArn": "arn:aws:bedrock:us-east-1::foundation-model/" + MODEL, "modelId": MODEL,
                  "modelName": "Nova Micro", "providerName": "Amazon", "inputModalities": ["TEXT"],
                  "outputModalities": ["TEXT"], "responseStreamingSupported": True,
                  "inferenceTypesSupported": ["ON_DEMAND"], "modelLifecycle": {"status": "ACTIVE"}},
                 {"modelArn": "arn:aws:bedrock:us-east-1::foundation-model/x.new-v1:0", "modelId": "x.new-v1:0",
                  "modelName": "New", "providerName": "X", "responseStreamingSupported": False,
                  "inferenceTypesSupported": ["INFERENCE_PROFILE"], "modelLifecycle": {"status": "ACTIVE"}},
                 {"modelArn": "arn:aws:bedrock:us-east-1::foundation-model/x.old-v1:0", "modelId": "x.old-v1:0",
                  "modelName": "Old", "providerName": "X", "modelLifecycle": {"status": "LEGACY"}}]
    with Stubber(bedrock) as stub:
        stub.add_response("list_foundation_models", {"modelSummaries": summaries}, {"byOutputModality": "TEXT"})
        entries, offline = list_models(bedrock)
    assert offline is None
    assert [(e.model_id, e.input_per_million, e.streaming) for e in entries] == \
        [(MODEL, 0.035, True), ("x.new-v1:0", None, False)]
    with Stubber(bedrock) as stub:
        stub.add_client_error("list_foundation_models", "AccessDeniedException", "no", 403)
        entries, offline = list_models(bedrock)
    assert "AccessDeniedException" in offline and MODEL in {e.model_id for e in entries}
    assert all(e.source.startswith("offline price table") for e in entries)


# --- the RungModule ---------------------------------------------------------------------------

def _args(**kw):
    parser = argparse.ArgumentParser()
    level1.add_arguments(parser.add_argument_group("level 1"))
    ns = parser.parse_args(kw.pop("argv", []))
    for k, v in {"model": None, "region": "us-east-1", "invoke": None, "max_tokens": 100,
                 "temperature": None, "stream": False, "json": False, **kw}.items():
        setattr(ns, k, v)
    return ns


def test_plan_is_the_converse_request_and_its_cost(capsys):
    spec = level1.spec_from_args(_args(argv=["--system", "Be terse", "--top-p", "0.5", "--stop", "###",
                                             "--stop", "END"], invoke="x" * 400, model="us.amazon.nova-micro-v1:0"))
    p = level1.plan(spec).to_json()
    assert p["level"] == 1 and p["steps"][0]["operation"] == "Converse"
    params = p["steps"][0]["params"]                 # as --plan --json prints it (maxTokens unmasked)
    assert params["inferenceConfig"] == {"maxTokens": 100, "topP": 0.5, "stopSequences": ["###", "END"]}
    assert params["system"] == [{"text": "Be terse"}] and params["modelId"] == "us.amazon.nova-micro-v1:0"
    cost = p["cost"]
    assert (cost["input_per_million_usd"], cost["output_per_million_usd"]) == (0.035, 0.14)
    assert cost["estimated_input_tokens"] == 100 + 2           # 400 + 8 characters / 4
    assert cost["per_call_max_usd"] == pytest.approx((102 * 0.035 + 100 * 0.14) / 1e6)
    assert level1.run_local(spec, _args(json=True)) == 0
    assert json.loads(capsys.readouterr().out)["needs_cloud"] is True
    assert level1.run_local(spec, _args()) == 0
    assert "needs the cloud" in capsys.readouterr().out
    assert level1.down(spec, Target("local")) == []


@pytest.mark.parametrize("argv, kw, match", [
    (["--top-p", "1.5"], {}, r"top_p=1.5 must be in \(0, 1\]"),
    ([], {"model": "eu.amazon.nova-micro-v1:0"}, r"use 'us.amazon.nova-micro-v1:0'"),
    ([], {"max_tokens": 0}, "max_tokens=0"),
])
def test_bad_flags_are_bad_input(argv, kw, match):
    with pytest.raises(BadInput, match=match):
        level1.spec_from_args(_args(argv=argv, **kw))


def test_unknown_model_plans_with_a_price_note():
    spec = level1.spec_from_args(_args(model="amazon.nova-micro-v9:0"))
    assert "closest known: amazon.nova-micro-v1:0" in level1.plan(spec).cost["note"]


def test_apply_and_invoke_through_a_target(monkeypatch):
    """The deployment fills the model, system prompt and stops; the request goes out via boto3."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    spec = level1.spec_from_args(_args(argv=["--system", "S", "--stop", "Z"], model=MODEL))
    dep = level1.apply(level1.plan(spec), Target("aws", region="us-east-1"))
    assert (dep.endpoint_name, dep.dialect, dep.created) == (MODEL, "bedrock", [])
    seen = []

    def before_send(request, **_):
        seen.append(json.loads(request.body))
        return _json_response(request, 200, _answer(inp=4, out=2))

    boto3.setup_default_session()
    boto3.DEFAULT_SESSION._session.register("before-send.bedrock-runtime.Converse", before_send)
    try:
        res = level1.invoke(dep, Request(prompt="Hi", max_tokens=9))
    finally:
        boto3.DEFAULT_SESSION = None
    assert seen[0]["system"] == [{"text": "S"}]
    assert seen[0]["inferenceConfig"] == {"maxTokens": 9, "stopSequences": ["Z"]}
    assert res.text == "Hello there" and res.usage == Usage(4, 2, token_cost(MODEL, 4, 2))
    assert level1.status(spec, Target("local"))["resources"] == []


@pytest.fixture
def default_session_answers(monkeypatch):
    """Answers for clients made from boto3's default session (as Target.client makes them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    boto3.setup_default_session()
    sent = []

    def answer(event_name, body):
        def before_send(request, **_):
            sent.append((event_name, request))
            return _json_response(request, 200, body)
        boto3.DEFAULT_SESSION._session.register(f"before-send.{event_name}", before_send)

    yield answer, sent
    boto3.DEFAULT_SESSION = None


def test_status_looks_the_model_up(default_session_answers):
    answer, sent = default_session_answers
    answer("bedrock.GetFoundationModel", {"modelDetails": {
        "modelArn": "arn:aws:bedrock:us-east-1::foundation-model/" + MODEL, "modelId": MODEL,
        "responseStreamingSupported": True, "inferenceTypesSupported": ["ON_DEMAND"],
        "modelLifecycle": {"status": "ACTIVE"}}})
    st = level1.status(level1.spec_from_args(_args(model=MODEL)), Target("aws"))
    assert st["status"] == "ACTIVE" and st["streaming"] is True and st["resources"] == []
    assert sent[0][1].url.endswith("/foundation-models/amazon.nova-micro-v1%3A0")
    with pytest.raises(BadInput, match="no emulator"):
        level1.apply(level1.plan(level1.spec_from_args(_args())), Target("emulator", endpoint_url="http://x"))


def test_deploy_cli_invokes_level_1_through_this_rung(default_session_answers, capsys):
    """`python -m options.deploy --level 1 --target aws --invoke ...` end to end, in process."""
    from options import deploy

    answer, sent = default_session_answers
    answer("bedrock-runtime.Converse", _answer(text="Bedrock is AWS's model service.", inp=9, out=7))
    answer("bedrock.GetFoundationModel", {"modelDetails": {
        "modelArn": "arn:aws:bedrock:us-east-1::foundation-model/" + MODEL, "modelId": MODEL,
        "modelLifecycle": {"status": "ACTIVE"}}})
    code = deploy.main(["--level", "1", "--target", "aws", "--invoke", "What is Bedrock?", "--system", "Be brief",
                        "--max-tokens", "40", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["answer"]["text"] == "Bedrock is AWS's model service."
    assert summary["answer"]["usage"]["cost_usd"] == pytest.approx(token_cost(MODEL, 9, 7))
    converse = json.loads(next(r for name, r in sent if name == "bedrock-runtime.Converse").body)
    assert converse["system"] == [{"text": "Be brief"}] and converse["inferenceConfig"]["maxTokens"] == 40
    # Bedrock bills per call: the next steps must not tell the user to remove an endpoint.
    assert "billing:  per token" in out.err and "--down" not in out.err
    assert deploy.main(["--level", "1", "--plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"][0]["operation"] == "Converse"
