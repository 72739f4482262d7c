"""The bring-your-own server through real HTTP, started by its own ``serve`` script, with the
real vLLM engine on CPU and the tiny model. One server for the whole module; the last test
stops it with SIGTERM while requests are in flight."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from byo_servers import (GRACEFUL_TIMEOUT_S, MAX_MODEL_LEN, READ_TIMEOUT_S, SAGEMAKER_PING_TIMEOUT_S,
                         sse_events, wait_for)
from stream_hang_up import assert_hang_up_is_aborted

pytestmark = pytest.mark.engine

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


def test_ping_503_while_loading_then_200(byo_server):
    states = [s for _, s in byo_server.states]
    # Its first answer came while the engine loaded (vLLM's own server answers nothing then).
    answered = [s for s in states if s != "down"]
    assert answered[0] == "loading", f"never saw 503 while loading: {states[:5]}"
    assert states[-1] == "ready"
    for method in ("get", "post"):
        r = getattr(requests, method)(byo_server.url + "/ping", timeout=2)
        assert r.status_code == 200 and r.content == b""


def test_the_heap_loading_left_is_frozen_before_ready(byo_server):
    """vLLM and torch leave hundreds of thousands of objects a full collection would walk
    with the loop stopped; the server freezes them once, as it becomes ready."""
    log = byo_server.log.read_text()
    frozen = re.search(r"start-up heap frozen: (\d+) objects", log)
    assert frozen, log[-3000:]
    assert int(frozen.group(1)) > 100_000


# (route, body builder, expected dialect of the answer)
def _completion(**kw):
    return {"prompt": "The deployment spectrum", "max_tokens": 12, "ignore_eos": True, **kw}


def _chat(**kw):
    return {"messages": CHAT, "max_tokens": 12, "ignore_eos": True, **kw}


def _tgi(stream=False):
    return {"inputs": "The deployment spectrum", "stream": stream,
            "parameters": {"max_new_tokens": 12, "ignore_eos": True, "details": True}}


CASES = [
    ("/v1/completions", _completion, "completion"),
    ("/v1/chat/completions", _chat, "chat"),
    ("/invocations", _completion, "completion"),
    ("/invocations", _chat, "chat"),
    ("/invocations", lambda **kw: _tgi(**kw), "tgi"),
]


@pytest.mark.parametrize("route,body,dialect", CASES,
                         ids=[f"{r}-{d}" for r, _, d in CASES])
def test_route_and_dialect_not_streaming(byo_server, route, body, dialect):
    r = byo_server.post(route, body(), headers={
        "X-Amzn-SageMaker-Custom-Attributes": "trace=abc"})
    assert r.status_code == 200, r.text
    assert r.headers["X-Amzn-SageMaker-Custom-Attributes"] == "trace=abc"
    data = r.json()
    if dialect == "tgi":
        assert set(data) == {"generated_text", "details"}
        details = data["details"]
        assert details["generated_tokens"] == 12 and details["finish_reason"] == "length"
        assert len(details["tokens"]) == 12
        assert all(isinstance(t["id"], int) and t["logprob"] <= 0 for t in details["tokens"])
        assert isinstance(data["generated_text"], str) and data["generated_text"]
        return
    assert data["object"] == ("chat.completion" if dialect == "chat" else "text_completion")
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length"
    text = choice["message"]["content"] if dialect == "chat" else choice["text"]
    assert isinstance(text, str) and text
    if dialect == "chat":
        assert choice["message"]["role"] == "assistant"
    usage = data["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12


@pytest.mark.parametrize("route,body,dialect", CASES,
                         ids=[f"{r}-{d}" for r, _, d in CASES])
def test_route_and_dialect_streaming(byo_server, route, body, dialect):
    extra = {} if dialect == "tgi" else {"stream_options": {"include_usage": True}}
    r = byo_server.post(route, body(stream=True, **extra), stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers.get("Transfer-Encoding") == "chunked"
    events = sse_events(r)
    if dialect == "tgi":
        tokens = [e for e in events if e["token"] is not None]
        assert len(tokens) == 12 == len(events)
        last = events[-1]
        assert last["details"]["generated_tokens"] == 12
        assert last["details"]["finish_reason"] == "length"
        assert "".join(e["token"]["text"] for e in events) == last["generated_text"]
        assert all(e["generated_text"] is None for e in events[:-1])
        return
    assert events[-1] == "[DONE]"
    usage_event = events[-2]
    assert usage_event["choices"] == [] and usage_event["usage"]["completion_tokens"] == 12
    chunks = events[:-2]
    expected_object = "chat.completion.chunk" if dialect == "chat" else "text_completion"
    assert all(c["object"] == expected_object for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    if dialect == "chat":
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text


def test_streamed_text_matches_the_same_request_not_streamed(byo_server):
    body = {"prompt": "Time to first token", "max_tokens": 20, "temperature": 0,
            "ignore_eos": True}
    whole = byo_server.post("/v1/completions", body).json()["choices"][0]["text"]
    events = sse_events(byo_server.post("/v1/completions", dict(body, stream=True), stream=True))
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole


def test_models_and_metrics(byo_server):
    models = requests.get(byo_server.url + "/v1/models", timeout=5).json()
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    samples = byo_server.metrics()
    assert any(k.startswith('byo_requests_total{route="/v1/completions",status="200"}')
               for k in samples)
    for name in ("byo_time_to_first_token_seconds_count", "byo_e2e_request_latency_seconds_count",
                 "byo_output_tokens_total", "byo_prompt_tokens_total", "byo_requests_running",
                 "byo_requests_waiting", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert any(k.startswith(name) for k in samples), name
    assert byo_server.metric("byo_output_tokens_total") >= 12


def _tgi_stream(url: str, i: int, max_tokens: int) -> tuple[int, list[dict]]:
    body = {"inputs": f"Request number {i}: the cheapest way to serve", "stream": True,
            "parameters": {"max_new_tokens": max_tokens, "ignore_eos": True, "details": True}}
    r = requests.post(url + "/invocations", json=body, stream=True, timeout=120)
    return r.status_code, sse_events(r)


# Pings /ping from a process of its own, as SageMaker's health checker does (a pinger thread in
# this process would time its wait for the GIL behind the 64 client threads parsing events),
# until a stop file appears: "ready" once its first ping is answered, then, at the end, each
# ping's start (the machine's monotonic clock, shared by every process) and how long it took.
PINGER = """
import json, os, sys, time, urllib.request
url, stop_file = sys.argv[1], sys.argv[2]
pings = []
while not os.path.exists(stop_file):
    started = time.monotonic()
    with urllib.request.urlopen(url + "/ping", timeout=5) as r:
        assert r.status == 200, r.status
    pings.append((started, time.monotonic() - started))
    if len(pings) == 1:
        print("ready", flush=True)
    time.sleep(0.05)
print(json.dumps(pings))
"""


def test_64_concurrent_streams_exact_and_unmixed_while_ping_stays_fast(byo_server, tmp_path):
    n, max_tokens = 64, 48
    stop_file = tmp_path / "stop"
    pinger = subprocess.Popen([sys.executable, "-c", PINGER, byo_server.url, str(stop_file)],
                              stdout=subprocess.PIPE, text=True)
    try:
        # The streams start once the pinger is pinging, so its pings meet them however fast
        # either side runs on this machine.
        assert pinger.stdout.readline().strip() == "ready", "the first /ping failed"
        streams_start = time.monotonic()
        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(lambda i: _tgi_stream(byo_server.url, i, max_tokens),
                                    range(n)))
        streams_end = time.monotonic()
    finally:
        stop_file.touch()
        out, _ = pinger.communicate(timeout=30)
    assert pinger.returncode == 0, "a /ping failed or timed out under load"
    pings = json.loads(out)
    streamed_texts = []
    for status, events in results:
        assert status == 200
        tokens = [e["token"] for e in events]
        assert len(tokens) == max_tokens, "a stream lost or gained tokens"
        assert [e["index"] for e in events] == list(range(max_tokens))
        last = events[-1]
        assert last["details"]["generated_tokens"] == max_tokens
        assert "".join(t["text"] for t in tokens) == last["generated_text"]
        streamed_texts.append(last["generated_text"])
    during = [took for started, took in pings if streams_start <= started <= streams_end]
    assert during, "no /ping was answered while the streams were in flight"
    assert max(took for _, took in pings) < SAGEMAKER_PING_TIMEOUT_S, pings

    # Greedy decoding: each stream must match its own prompt's answer, asked again. Batch
    # composition can shift a near-tie now and then, but mixed-up streams would match ~never.
    def again(i):
        body = {"inputs": f"Request number {i}: the cheapest way to serve",
                "parameters": {"max_new_tokens": max_tokens, "ignore_eos": True}}
        return byo_server.post("/invocations", body).json()["generated_text"]

    with ThreadPoolExecutor(n) as pool:
        reference = list(pool.map(again, range(n)))
    same = sum(a == b for a, b in zip(streamed_texts, reference))
    assert same >= 0.9 * n, f"only {same}/{n} streams match their own prompt's answer"
    assert len(set(streamed_texts)) > n // 2


def test_disconnected_stream_is_aborted_in_the_engine(byo_server):
    assert_hang_up_is_aborted(byo_server.url, byo_server.metric, MAX_MODEL_LEN - 16, wait_for)


def test_stream_to_an_http_1_0_client_is_written_whole_then_closed(byo_server):
    """HTTP/1.0 has no chunked framing: the client gets the whole stream's events with their
    length once the answer is complete, then the connection closes."""
    body = json.dumps({"prompt": "Hello", "max_tokens": 20, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    host, port = byo_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while chunk := client.recv(65536):
            received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")) and b"chunked" not in head.lower()
    assert f"content-length: {len(payload)}".encode() in head.lower()
    events = [line[6:] for line in payload.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 20
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-2])


def test_streams_one_after_another_on_one_kept_alive_connection(byo_server):
    """A finished stream leaves its connection ready for the next request."""
    with requests.Session() as session:
        texts = []
        for _ in range(3):
            r = session.post(byo_server.url + "/v1/completions", stream=True, timeout=60,
                             json={"prompt": "Same prompt", "max_tokens": 30, "temperature": 0,
                                   "ignore_eos": True, "stream": True})
            assert r.status_code == 200
            events = sse_events(r)
            assert events[-1] == "[DONE]"
            texts.append("".join(e["choices"][0]["text"] for e in events[:-1]))
        r = session.post(byo_server.url + "/v1/completions", timeout=60,
                         json={"prompt": "Same prompt", "max_tokens": 30, "temperature": 0,
                               "ignore_eos": True})
        assert r.status_code == 200
    assert len(texts[0]) > 0 and texts == [texts[0]] * 3 == [r.json()["choices"][0]["text"]] * 3


BAD_INPUTS = [
    # (route, raw body, status, words the message must contain)
    ("/invocations", b"{not json", 400, ["not valid JSON"]),
    ("/invocations", b'["a list"]', 400, ["JSON object"]),
    ("/invocations", b'{"text": "hi"}', 400, ["unknown request dialect", "messages", "inputs"]),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "ten"}', 400, ["max_tokens",
                                                                       "whole number"]),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -5}', 400, ["max_tokens=-5",
                                                                    "at least 1"]),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1000000000}', 400,
     ["max_tokens=1000000000", f"max_model_len {MAX_MODEL_LEN}"]),
    ("/invocations", b'{"inputs": "hi", "parameters": {"max_new_tokens": 5000}}', 400,
     ["parameters.max_new_tokens=5000", "at most"]),
    ("/v1/completions", b'{"prompt": 42}', 400, ["prompt must be a string"]),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400,
     ["messages[0].role", "user"]),
    ("/v1/chat/completions", b'{"messages": "hello"}', 400, ["messages must be"]),
    ("/v1/completions", b'{"prompt": "hi", "temperature": -1}', 400, ["temperature=-1"]),
    ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', 400, ["stream must be true or false"]),
    ("/invocations", b'{"inputs": "hi", "parameters": {"top_p": 0}}', 400,
     ["parameters.top_p=0", "greater than 0"]),
    # A field nobody reads is refused by name, with the closest real one.
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
     b'"temprature": 0}', 400, ["'temprature'", "'temperature'"]),
    # Tools without a tool-call parser: vLLM's own 400, naming the flags it needs.
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "tools": '
     b'[{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}', 400,
     ["--enable-auto-tool-choice", "--tool-call-parser"]),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
     b'"top_logprobs": 2}', 400, ["top_logprobs", "logprobs"]),
]


@pytest.mark.parametrize("route,body,status,words", BAD_INPUTS,
                         ids=[f"{i}" for i in range(len(BAD_INPUTS))])
def test_bad_input_is_named_and_refused(byo_server, route, body, status, words):
    r = requests.post(byo_server.url + route, data=body,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    for word in words:
        assert word in error["message"], (word, error["message"])


def test_prompt_longer_than_the_context(byo_server):
    r = byo_server.post("/v1/completions", {"prompt": "spectrum " * (2 * MAX_MODEL_LEN)})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "prompt"
    assert f"max_model_len) is {MAX_MODEL_LEN}" in error["message"]
    assert f"at most {MAX_MODEL_LEN - 1} tokens" in error["message"]


def test_body_over_6_mb_is_413(byo_server):
    body = b'{"prompt": "' + b"x" * (6 * 1024 * 1024 + 10) + b'"}'
    r = requests.post(byo_server.url + "/invocations", data=body,
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert "6 MB" in r.json()["error"]["message"]


def test_body_over_6_mb_is_413_even_to_a_client_that_sends_it_all_first(byo_server):
    """urllib writes the whole body before it reads: the server answers 413 from the declared
    length and drops what follows instead of closing on the client mid-write."""
    body = b'{"prompt": "' + b"x" * (6 * 1024 * 1024 + 10) + b'"}'
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(urllib.request.Request(
            byo_server.url + "/v1/completions", data=body,
            headers={"Content-Type": "application/json"}), timeout=60)
    assert answer.value.code == 413
    assert "6 MB" in json.loads(answer.value.read())["error"]["message"]


PINGS = """
import json, sys, time, urllib.request
times = []
for _ in range(5):
    started = time.monotonic()
    with urllib.request.urlopen(sys.argv[1] + "/ping", timeout=10) as r:
        assert r.status == 200, r.status
    times.append(time.monotonic() - started)
    time.sleep(0.2)
print(json.dumps(times))
"""


def _half_sent(url: str, n: int) -> list[socket.socket]:
    """``n`` connections that stop mid-request: half with their headers cut short, half with
    complete headers and half a body."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "never finished", "max_tokens": 4}).encode()
    stalled = []
    for i in range(n):
        client = socket.create_connection((host, int(port)), timeout=30)
        if i % 2:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        else:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body[:len(body) // 2]))
        stalled.append(client)
    return stalled


def test_1000_half_sent_requests_leave_ping_fast_and_are_dropped(byo_server):
    """Slow or stuck clients cost the server a socket each, never its health check: /ping
    (timed from a process of its own, as SageMaker's checker) stays under 2 s with 1,000
    half-sent requests open, the server drops them after its read timeout (a cut header:
    closed; a cut body: 408), and it serves on."""
    started = time.monotonic()
    stalled = _half_sent(byo_server.url, 1000)
    try:
        pings = subprocess.run([sys.executable, "-c", PINGS, byo_server.url],
                               capture_output=True, text=True, timeout=120)
        assert pings.returncode == 0, pings.stderr
        times = json.loads(pings.stdout)
        assert max(times) < SAGEMAKER_PING_TIMEOUT_S, \
            f"/ping took {max(times):.2f} s with 1,000 stalled clients"
        # Every stalled request ends by the server's hand once the read timeout passes.
        answers = {}
        for i, client in enumerate(stalled):
            client.settimeout(max(1.0, READ_TIMEOUT_S + 30 - (time.monotonic() - started)))
            data = b""
            while chunk := client.recv(65536):
                data += chunk
            answers[i] = data
        cut_headers = [answers[i] for i in range(1, 1000, 2)]
        cut_bodies = [answers[i] for i in range(0, 1000, 2)]
        assert all(a == b"" for a in cut_headers), "a connection with cut headers was answered"
        assert all(a.startswith(b"HTTP/1.1 408") for a in cut_bodies), cut_bodies[0][:200]
        assert b"no part of the body" in cut_bodies[0]
        assert time.monotonic() - started >= READ_TIMEOUT_S
    finally:
        for client in stalled:
            client.close()
    r = byo_server.post("/v1/completions", {"prompt": "Still here?", "max_tokens": 3,
                                            "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_vllms_operational_routes_answer_as_vllms_do(byo_server):
    """What vLLM's clients and probes call first: guidellm and Kubernetes probes /health."""
    health = requests.get(byo_server.url + "/health", timeout=5)
    assert health.status_code == 200 and health.content == b""
    import vllm
    assert requests.get(byo_server.url + "/version", timeout=5).json() == {
        "version": vllm.__version__}
    tokens = byo_server.post("/tokenize", {"prompt": "hello world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] == MAX_MODEL_LEN
    chat = byo_server.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 2
    text = byo_server.post("/detokenize", {"tokens": tokens["tokens"][1:]}).json()["prompt"]
    assert text.strip() == "hello world"
    bad = byo_server.post("/tokenize", {"prompt": "x", "tokenise": True})
    assert bad.status_code == 400 and "'tokenise'" in bad.json()["error"]["message"]


def test_guidellm_benchmarks_the_server_with_its_default_checks(byo_server, tiny_model, tmp_path):
    """guidellm 0.8.1, from its own environment as a user runs it (tests/run.sh installs it),
    with its backend validation on: it calls GET /health before the first request."""
    guidellm = os.environ.get("SPECTRUM_GUIDELLM")
    assert guidellm and os.access(guidellm, os.X_OK), \
        "run the tests through bash tests/run.sh, which installs guidellm in .venv-guidellm"
    report = tmp_path / "guidellm.json"
    done = subprocess.run(
        [guidellm, "run", "--backend", f"kind=openai_http,target={byo_server.url},model={tiny_model}",
         "--profile", "kind=synchronous", "--constraint", "kind=max_requests,count=4",
         "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=4",
         "--tokenizer", f"kind=hf_auto,model={tiny_model}",
         "--output", f"kind=json,path={report}", "--disable-console-interactive"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals["successful"] == 4 and totals["errored"] == 0, totals
    assert benchmark["metrics"]["output_token_count"]["successful"]["mean"] == 4


def test_unknown_route_is_json_404(byo_server):
    r = requests.get(byo_server.url + "/nope", timeout=5)
    assert r.status_code == 404
    assert "/invocations" in r.json()["error"]["message"]


def test_server_still_serves_after_bad_input(byo_server):
    r = byo_server.post("/invocations", {"prompt": "Still here?", "max_tokens": 3,
                                         "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert byo_server.metric('byo_request_errors_total{kind="bad_request"') >= len(BAD_INPUTS) \
        or byo_server.metric("byo_request_errors_total") >= len(BAD_INPUTS)


def test_sigterm_finishes_requests_in_flight_then_exits_0(byo_server):
    """Last in the module: it stops the server."""
    n, max_tokens = 8, 960                     # long enough to still run at SIGTERM
    started = [threading.Event() for _ in range(n)]
    ended = [threading.Event() for _ in range(n)]

    def stream(i: int) -> tuple[int, list[dict]]:
        body = {"inputs": f"Request number {i}", "stream": True,
                "parameters": {"max_new_tokens": max_tokens, "ignore_eos": True,
                               "details": True}}
        try:
            r = requests.post(byo_server.url + "/invocations", json=body, stream=True,
                              timeout=120)
            events = []
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))
                    started[i].set()
            return r.status_code, events
        finally:
            ended[i].set()

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream, i) for i in range(n)]
        # Started as seen by the clients: on a loaded machine some streams may finish before
        # the last one starts, which is fine as long as some are still running at SIGTERM.
        for i, event in enumerate(started):
            assert event.wait(60), f"request {i} did not start streaming within 60 s"
        in_flight = sum(not e.is_set() for e in ended)
        byo_server.server.process.send_signal(signal.SIGTERM)
        assert in_flight >= 1, "every stream ended before SIGTERM: nothing was in flight"
        time.sleep(0.5)
        with pytest.raises((requests.ConnectionError, requests.Timeout)):   # no new work
            requests.get(byo_server.url + "/ping", timeout=2)
        results = [f.result(timeout=GRACEFUL_TIMEOUT_S) for f in futures]
    for status, events in results:
        assert status == 200
        assert len(events) == max_tokens
        assert events[-1]["details"]["generated_tokens"] == max_tokens
    assert byo_server.server.process.wait(60) == 0
