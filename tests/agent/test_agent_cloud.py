"""The agent end to end on the cloud rungs, with no account: the CLI against a SageMaker rung
deployed on the emulator (moto's sagemaker-runtime answering queued LMI bodies), and against
Bedrock with every ConverseStream answered at botocore's level by real event-stream bytes; and the
streaming SageMaker path (InvokeEndpointWithResponseStream, which moto lacks) the same way.

Each test checks the trace: every call's endpoint and role, its tokens as the upstream usage
said, its cost from the prices in cost/data/prices-2026-11-29.json worked out by hand here, and
totals that are the sums of the calls."""
from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from options.agent.retrieval import Index, read_passages
from options.agent.run import Model, run_agent

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What does level 3 configure in the LMI container?"
G5_XLARGE_SAGEMAKER_HOURLY = 1.408                  # ml.g5.xlarge on SageMaker, $/hour
NOVA_MICRO_IN, NOVA_MICRO_OUT = 0.035, 0.14        # amazon.nova-micro-v1:0, $ per 1M tokens


def _aws_event_stream():
    spec = importlib.util.spec_from_file_location("aws_event_stream", REPO / "tests" / "bedrock" / "aws_event_stream.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_totals_are_sums(doc):
    t = doc["totals"]
    assert t["calls"] == len(doc["calls"])
    for key in ("input_tokens", "output_tokens", "e2e_ms", "cost_usd"):
        assert t[key] == pytest.approx(sum(c[key] for c in doc["calls"])), key


# --- a SageMaker rung on the emulator ---------------------------------------------------------------

@pytest.fixture(scope="module")
def emulator_url():
    from options.aws import emulator
    with emulator() as url:
        yield url


@pytest.fixture
def lmi_endpoint(emulator_url):
    """Rung 3 deployed on the emulator by the rung's own plan and apply: the endpoint's name."""
    from options.aws import Target
    from options.deploy import parse_args
    from options.spectrum import rung_module

    urllib.request.urlopen(urllib.request.Request(emulator_url + "/moto-api/reset", method="POST")).read()
    module = rung_module(3)
    deployment = module.apply(module.plan(module.spec_from_args(parse_args(["--level", "3", "--target", "emulator"]))),
                              Target("emulator", "us-east-1", emulator_url))
    assert deployment.dialect == "tgi"
    return deployment.endpoint_name


def _bodies_moto_received() -> list[dict]:
    """What each InvokeEndpoint carried, in order: moto keys its answers by the request."""
    from moto.sagemakerruntime.models import sagemakerruntime_backends

    backend = sagemakerruntime_backends["123456789012"]["us-east-1"]
    keys = [key for answers in backend.results.values() for key in answers]
    return [json.loads(json.loads(base64.b64decode(key))["Body"]) for key in keys]


def test_the_agent_on_a_sagemaker_rung_on_the_emulator(emulator_url, lmi_endpoint, docs, tmp_path):
    from options.aws import queue_emulator_result

    # LMI's answers, in the order the agent calls: the plan, then summarise, then analyse.
    answers = [("retrieve, summarise, analyse", 41, 6), ("Level 3 sets OPTION variables.", 233, 9),
               ("The rolling batch size and the tensor parallel degree.", 57, 12)]
    for text, tokens_in, tokens_out in answers:
        queue_emulator_result(emulator_url, "us-east-1", json.dumps(
            {"generated_text": text, "details": {"finish_reason": "eos_token", "generated_tokens": tokens_out,
                                                 "input_tokens": tokens_in}}))
    trace_path = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "options.agent", "--level", "3", "--target", "emulator",
                           "--endpoint-url", emulator_url, "--endpoint", lmi_endpoint, "--instance", "ml.g5.xlarge",
                           "--docs", str(docs), "--question", QUESTION, "--trace", str(trace_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the emulator cannot stream" in done.stdout
    doc = json.loads(trace_path.read_text())
    assert [c["role"] for c in doc["calls"]] == ["plan", "summarise", "analyse"]
    for call, (text, tokens_in, tokens_out) in zip(doc["calls"], answers):
        assert call["endpoint"] == f"sagemaker:{lmi_endpoint} (tgi)"
        assert (call["text"], call["input_tokens"], call["output_tokens"]) == (text, tokens_in, tokens_out)
        assert call["ttft_ms"] is None and call["e2e_ms"] > 0          # one InvokeEndpoint: no first token
        assert call["cost_usd"] == pytest.approx(G5_XLARGE_SAGEMAKER_HOURLY * call["e2e_ms"] / 1000 / 3600)
    _assert_totals_are_sums(doc)
    assert doc["totals"]["input_tokens"] == 41 + 233 + 57 and doc["totals"]["output_tokens"] == 6 + 9 + 12
    assert doc["answer"] == answers[2][0] and "error" not in doc
    assert doc["retrieval"]["fallback"] == "level 3's endpoint (Bring your own model on LMI) serves no embeddings on /invocations"
    # The requests were LMI's: the system prompt leads "inputs"; summarise got the passage, analyse
    # got summarise's answer.
    bodies = _bodies_moto_received()
    assert len(bodies) == 3 and all(b["inputs"].startswith("You are a knowledge agent") for b in bodies)
    assert bodies[0]["parameters"]["max_new_tokens"] == 24 and "stream" not in bodies[0]
    assert "[lmi.md#0]" in bodies[1]["inputs"] and answers[1][0] in bodies[2]["inputs"]


def test_the_emulator_with_no_answer_queued_says_how_to_queue_one(emulator_url, lmi_endpoint, docs, tmp_path):
    trace_path = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "options.agent", "--level", "3", "--target", "emulator",
                           "--endpoint-url", emulator_url, "--endpoint", lmi_endpoint, "--docs", str(docs),
                           "--question", QUESTION, "--trace", str(trace_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    out = " ".join(done.stdout.split())
    assert done.returncode == 1 and "The emulator runs no model" in out and "queue_emulator_result" in out, out
    doc = json.loads(trace_path.read_text())
    assert doc["error"]["type"] == "AgentFailed" and doc["calls"] == []
    assert doc["endpoint"] == f"sagemaker:{lmi_endpoint} (tgi)"


# --- Bedrock through botocore ----------------------------------------------------------------------

@pytest.fixture
def default_session(monkeypatch, botocore_events):
    """boto3's default session with test credentials; ``register(event, handler)`` hooks every
    client it makes, until the test ends."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)   # clients read these when they are made
    return botocore_events


def _event_stream_response(request, messages: list[bytes]):
    from botocore.awsrequest import AWSResponse

    return AWSResponse(request.url, 200, {"content-type": "application/vnd.amazon.eventstream"},
                       _aws_event_stream()._Raw(b"".join(messages), 7))


@pytest.fixture
def bedrock_answers(default_session):
    """Every ConverseStream is answered, in turn, by ``answers`` (text, input tokens, output
    tokens) as real event-stream bytes; yields the list and the requests sent."""
    es = _aws_event_stream()
    answers: list[tuple[str, int, int]] = []
    sent: list = []

    def before_send(request, **_):
        text, tokens_in, tokens_out = answers[len(sent)]
        sent.append(request)
        return _event_stream_response(request, [es.event("messageStart", {"role": "assistant"})]
                                      + [es.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": w + " "}})
                                         for w in text.split()]
                                      + [es.event("messageStop", {"stopReason": "end_turn"}),
                                         es.event("metadata", {"usage": {"inputTokens": tokens_in, "outputTokens": tokens_out,
                                                                         "totalTokens": tokens_in + tokens_out},
                                                               "metrics": {"latencyMs": 40}})])

    default_session("before-send.bedrock-runtime.ConverseStream", before_send)
    yield answers, sent


def test_the_agent_on_bedrock_end_to_end(bedrock_answers, docs, tmp_path, capsys):
    from options.agent.__main__ import main

    answers, sent = bedrock_answers
    answers += [("retrieve, summarise, analyse", 120, 7), ("Level 3 sets OPTION variables.", 410, 9),
                ("The rolling batch size.", 95, 6)]
    trace_path = tmp_path / "trace.json"
    code = main(["--level", "1", "--target", "aws", "--docs", str(docs), "--question", QUESTION,
                 "--trace", str(trace_path), "--json"])
    assert code == 0, capsys.readouterr()
    doc = json.loads(trace_path.read_text())
    assert json.loads(capsys.readouterr().out) == doc
    assert [c["role"] for c in doc["calls"]] == ["plan", "summarise", "analyse"]
    for call, (text, tokens_in, tokens_out) in zip(doc["calls"], answers):
        assert call["endpoint"] == "bedrock-runtime us-east-1 amazon.nova-micro-v1:0"
        assert (call["input_tokens"], call["output_tokens"]) == (tokens_in, tokens_out)
        assert call["text"].strip() == text and 0 < call["ttft_ms"] <= call["e2e_ms"]
    assert [c["cost_usd"] for c in doc["calls"]] == [
        pytest.approx((tokens_in * NOVA_MICRO_IN + tokens_out * NOVA_MICRO_OUT) / 1e6) for _, tokens_in, tokens_out in answers]
    _assert_totals_are_sums(doc)
    assert doc["retrieval"]["fallback"].startswith("Bedrock's Converse API serves no embeddings")
    # The requests botocore built and signed: the model in the path, the system prompt, the chain.
    assert len(sent) == 3 and all(r.url.endswith("/model/amazon.nova-micro-v1%3A0/converse-stream") for r in sent)
    bodies = [json.loads(r.body) for r in sent]
    assert all(b["system"][0]["text"].startswith("You are a knowledge agent") for b in bodies)
    assert bodies[0]["inferenceConfig"]["maxTokens"] == 24
    assert "[lmi.md#0]" in bodies[1]["messages"][0]["content"][0]["text"]
    assert answers[1][0] in bodies[2]["messages"][0]["content"][0]["text"]


def test_a_failed_bedrock_task_keeps_its_calls_in_the_trace(bedrock_answers, docs, tmp_path, capsys):
    from options.agent.__main__ import main

    answers, sent = bedrock_answers
    answers += [("retrieve, analyse", 120, 7), ("", 300, 0)]          # analyse answers nothing
    trace_path = tmp_path / "trace.json"
    code = main(["--level", "1", "--target", "aws", "--docs", str(docs), "--question", QUESTION,
                 "--trace", str(trace_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1 and "failed: the model's last call (analyse) returned no text" in out
    doc = json.loads(trace_path.read_text())
    assert doc["error"]["kind"] == "failure" and "returned no text" in doc["error"]["message"]
    assert [(c["role"], c["input_tokens"], c["output_tokens"]) for c in doc["calls"]] == \
        [("plan", 120, 7), ("analyse", 300, 0)]
    _assert_totals_are_sums(doc)


# --- the streaming SageMaker path (--target aws) -------------------------------------------------------

def test_the_agent_on_a_sagemaker_endpoint_streams_in_the_rungs_dialect(docs):
    import boto3

    from options.contract import StreamEvent, Usage, invoke_sagemaker, sse_stream

    es = _aws_event_stream()
    client = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                   region_name="us-east-1").client("sagemaker-runtime")
    events = [StreamEvent("text", text="retrieve, "), StreamEvent("text", text="analyse"),
              StreamEvent("finish", finish_reason="stop"), StreamEvent("usage", usage=Usage(150, 3))]
    data = b"".join(sse_stream(events, "tgi"))
    sent = es.answer_with_events(client, "InvokeEndpointWithResponseStream",
                                 [es.event("PayloadPart", data[i:i + 9], "application/octet-stream")
                                  for i in range(0, len(data), 9)])
    model = Model(lambda req: invoke_sagemaker(client, "agent-ep", req, "tgi"), "sagemaker:agent-ep",
                  hourly_usd=G5_XLARGE_SAGEMAKER_HOURLY)
    trace = run_agent(QUESTION, Index.build(read_passages(docs)), model)
    assert [c.role for c in trace.calls] == ["plan", "analyse"]
    assert [(c.input_tokens, c.output_tokens) for c in trace.calls] == [(150, 3), (150, 3)]
    assert all(0 < c.ttft_ms <= c.e2e_ms for c in trace.calls)
    bodies = [json.loads(r.body) for r in sent]
    # LMI's dialect: the system prompt leads the text of "inputs".
    assert bodies[1]["inputs"].startswith("You are a knowledge agent") and "[lmi.md#0]" in bodies[1]["inputs"]
    assert all(b["stream"] is True for b in bodies)
    assert all(r.url.endswith("/endpoints/agent-ep/invocations-response-stream") for r in sent)
    _assert_totals_are_sums(trace.to_json())
    assert trace.totals()["cost_usd"] == pytest.approx(G5_XLARGE_SAGEMAKER_HOURLY * trace.totals()["e2e_ms"] / 1000 / 3600)


# --- the bring-your-own image's endpoint (level 5): its /invocations embeds ----------------------------

def _byo_endpoint(default_session, embeddings: str):
    """Level 5's endpoint at botocore's level: InvokeEndpoint with an OpenAI embeddings body is
    answered with vectors (``embeddings == "served"``) or, as SageMaker passes on the server's 400
    for a model that does not pool, a ModelError; generation streams the plan, then an answer."""
    from botocore.awsrequest import AWSResponse
    from standin_http import keyword_vector

    from options.contract import StreamEvent, Usage, sse_stream

    es = _aws_event_stream()
    embedded, generated = [], []

    def invoke(request, **_):
        texts = json.loads(request.body)["input"]
        embedded.append(texts)
        if embeddings == "served":
            doc = {"object": "list", "model": "byo", "usage": {"prompt_tokens": 11 * len(texts), "total_tokens": 11 * len(texts)},
                   "data": [{"object": "embedding", "index": i, "embedding": keyword_vector(t)} for i, t in enumerate(texts)]}
            return AWSResponse(request.url, 200, {"content-type": "application/json"}, _aws_event_stream()._Raw(json.dumps(doc).encode(), 64))
        said = json.dumps({"error": {"message": "this server's engine runs runner 'generate' and serves no embeddings: "
                                                "start it with SM_VLLM_RUNNER=pooling"}})
        body = {"ErrorCode": "CLIENT_ERROR_FROM_MODEL", "OriginalStatusCode": 400, "OriginalMessage": said,
                "Message": f"Received client error (400) from primary with message \"{said}\".",
                "LogStreamArn": "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/byo-ep"}
        return AWSResponse(request.url, 424, {"content-type": "application/json",
                                              "x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/com.amazon.sagemaker/"},
                           _aws_event_stream()._Raw(json.dumps(body).encode(), 64))

    def stream(request, **_):
        generated.append(json.loads(request.body))
        text = "retrieve, analyse" if len(generated) == 1 else "The rolling batch size."
        data = b"".join(sse_stream([StreamEvent("text", text=text), StreamEvent("usage", usage=Usage(90, 5))],
                                   "openai-completions"))          # level 5's dialect
        return _event_stream_response(request, [es.event("PayloadPart", data[i:i + 9], "application/octet-stream")
                                                for i in range(0, len(data), 9)])

    default_session("before-send.sagemaker-runtime.InvokeEndpoint", invoke)
    default_session("before-send.sagemaker-runtime.InvokeEndpointWithResponseStream", stream)
    return embedded, generated


def test_the_byo_endpoint_embeds_the_passages_and_the_question(default_session, docs, tmp_path, capsys):
    from options.agent.__main__ import main

    embedded, generated = _byo_endpoint(default_session, "served")
    code = main(["--level", "5", "--target", "aws", "--endpoint", "byo-ep", "--instance", "ml.g5.xlarge",
                 "--docs", str(docs), "--question", QUESTION, "--json"])
    assert code == 0, capsys.readouterr()
    doc = json.loads(capsys.readouterr().out)
    assert [c["role"] for c in doc["calls"]] == ["plan", "embed", "analyse"]
    embed = doc["calls"][1]
    assert embed["endpoint"] == "sagemaker:byo-ep (openai-embeddings)" and (embed["input_tokens"], embed["output_tokens"]) == (11, 0)
    assert embed["cost_usd"] == pytest.approx(G5_XLARGE_SAGEMAKER_HOURLY * embed["e2e_ms"] / 1000 / 3600)
    _assert_totals_are_sums(doc)
    assert len(embedded) == 2 and embedded[1] == [QUESTION] and len(embedded[0]) == doc["retrieval"]["passages"]
    assert doc["retrieval"]["fallback"] is None and doc["retrieval"]["indexing"]["input_tokens"] == 11 * len(embedded[0])
    assert doc["retrieval"]["hits"][0]["passage"] == "lmi.md#0" and "[lmi.md#0]" in generated[1]["prompt"]


def test_a_byo_endpoint_that_does_not_pool_falls_back_and_says_why(default_session, docs, capsys):
    from options.agent.__main__ import main

    embedded, _ = _byo_endpoint(default_session, "400")
    code = main(["--level", "5", "--target", "aws", "--endpoint", "byo-ep", "--docs", str(docs),
                 "--question", QUESTION, "--json"])
    assert code == 0, capsys.readouterr()
    doc = json.loads(capsys.readouterr().out)
    assert len(embedded) == 1 and [c["role"] for c in doc["calls"]] == ["plan", "analyse"]
    assert doc["retrieval"]["method"].startswith("local hashed bag-of-words")
    assert doc["retrieval"]["fallback"].startswith("sagemaker:byo-ep (openai-embeddings) answered 400: ")
    assert "SM_VLLM_RUNNER=pooling" in doc["retrieval"]["fallback"]
