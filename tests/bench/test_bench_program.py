"""The bench's agent profile: programs of serial steps, their maths, the tail prediction, the
prefix-cache hit rate from ``/metrics`` and the JSON other tools read.

The maths runs on synthetic timings with known answers. The CLI runs against a stand-in
OpenAI server (stdlib HTTP, answering through the contract's own SSE writer and counting a
prefix cache the way vLLM does: prompt tokens looked up, tokens found); one test runs it
against the real bring-your-own server.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from options.bench import program
from options.bench.metrics import RequestRecord
from options.bench.profile import parse_lengths
from options.contract import OpenAICompletions, StreamEvent, Usage, sse_stream
from options.core import BadInput

STATS = ("mean", "p50", "p90", "p99")


def _profile(**kw):
    base = dict(programs=3, steps=3, think_ms=0.0, system_tokens=20,
                prompt_tokens=parse_lengths("5", "--prompt-tokens", ()),
                output_tokens=parse_lengths("4", "--output-tokens", ()), concurrency=2)
    return program.ProgramProfile(**{**base, **kw})


# --- prompts ----------------------------------------------------------------------------------

def test_every_step_prompt_extends_the_previous_one_and_all_share_the_system_prompt():
    system, programs = _profile().plan()
    assert system.startswith(program.SYSTEM_PROMPT_HEAD) and len(system.split()) == 20
    history, prompts = [], []
    for text, max_tokens in programs[0]:
        assert max_tokens == 4 and text.startswith("session 0 step")
        prompts.append(program.step_prompt(history, text))
        history.append((text, f"answer to {text[:12]}"))
    assert all(b.startswith(a.removesuffix("Answer:")) for a, b in zip(prompts, prompts[1:]))
    assert prompts[2].count("Answer:") == 3          # two answered steps, then the open one
    assert programs[0][0][0] != programs[1][0][0]    # each session's own context


def test_bad_profiles_name_the_flag():
    with pytest.raises(BadInput, match="--steps 0 must be a whole number >= 1"):
        _profile(steps=0)
    with pytest.raises(BadInput, match="--think-ms -1 must be between"):
        _profile(think_ms=-1.0)


# --- maths ------------------------------------------------------------------------------------

def _program(step_e2e, start=0.0, think=0.0, ttft=0.01):
    steps = [RequestRecord(ttft_s=ttft, e2e_s=e, input_tokens=10, output_tokens=4) for e in step_e2e]
    end = start + sum(step_e2e) + think * (len(step_e2e) - 1)
    return program.ProgramRecord(steps=steps, started=start, ended=end,
                                 last_step_first_token=end - step_e2e[-1] + ttft)


def test_prediction_of_independent_steps_has_the_exact_tail():
    # One call in ten is slow (1.0 s, else 0.1 s), three serial calls: P(one or more slow) =
    # 27.1 %, P(two or more) = 2.8 %, P(three) = 0.1 %. So the program p95 is one slow call
    # (1.2 s) and p99 two (2.1 s), while adding each step's p99 would say 2.757 s.
    step = [0.1] * 9 + [1.0]
    predicted = program.predict_program_ms([step, step, step], think_s=0.0)
    assert predicted == {"p95": pytest.approx(1200), "p99": pytest.approx(2100)}
    # Think time between the three steps adds twice.
    with_think = program.predict_program_ms([step, step, step], think_s=0.2)
    assert with_think == {"p95": pytest.approx(1600), "p99": pytest.approx(2500)}
    assert program.predict_program_ms([step, []], think_s=0.0) == {"p95": None, "p99": None}


def test_program_summary_from_synthetic_timings():
    think = 0.2
    runs = [_program([0.1, 0.2], start=0.0, think=think),      # 0.5 s
            _program([0.3, 0.4], start=0.0, think=think),      # 0.9 s
            program.ProgramRecord(steps=[RequestRecord(error="timeout")], started=0, ended=1,
                                  error="step 1: timeout")]
    parts = program.summarize_programs(program.ProgramRun(runs, "2026-11-30T00:00:00+00:00", 2.0), think)
    p = parts["program"]
    assert p["completed"] == 2 and p["errors"] == {"step 1: timeout": 1}
    assert p["programs_per_second"] == pytest.approx(1.0)
    assert p["e2e_ms"] == {"mean": pytest.approx(700), "p50": pytest.approx(700), "p90": pytest.approx(860),
                           "p95": pytest.approx(880), "p99": pytest.approx(896)}
    # Until the last step's first token: 0.1 + 0.2 + 0.01 and 0.3 + 0.2 + 0.01.
    assert p["ttft_ms"]["mean"] == pytest.approx(410)
    assert p["overhead_ms_mean"] == pytest.approx(0, abs=1e-9)
    # Each step's p99 from two values, then the think time once: 298 + 398 + 200.
    assert p["sum_of_step_p99_ms"] == pytest.approx(896)
    # Sums of one draw per step: 0.1|0.3 + 0.2|0.4 + 0.2 → 0.5 / 0.7 / 0.7 / 0.9 s.
    assert p["predicted_e2e_ms"] == {"p95": pytest.approx(900), "p99": pytest.approx(900)}
    steps = parts["steps"]
    assert [s["step"] for s in steps] == [1, 2] and [s["completed"] for s in steps] == [2, 2]
    assert steps[0]["e2e_ms"]["mean"] == pytest.approx(200) and steps[1]["ttft_ms"]["p50"] == pytest.approx(10)
    assert parts["requests"].completed == 4 and parts["requests"].errors == {"timeout": 1}


# --- the prefix cache's counters ----------------------------------------------------------------

METRICS_PAGE = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 300.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7648e+09
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 640.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 110.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 999.0
"""


def test_prefix_cache_counters_sum_engines_and_skip_other_series():
    assert program.prefix_cache_counters(METRICS_PAGE) == (1500.0, 750.0)
    assert program.prefix_cache_counters("byo_requests_total 3\n") is None
    assert program.hit_rate((1500.0, 750.0), (2500.0, 1550.0)) == pytest.approx(0.8)
    assert program.hit_rate((1500.0, 750.0), (1500.0, 750.0)) is None     # nothing was asked
    assert program.hit_rate(None, (1.0, 1.0)) is None
    # No page to read (SageMaker, Bedrock, a server that is gone): no rate, no failure.
    assert program.read_prefix_cache(None) is None
    assert program.read_prefix_cache("http://127.0.0.1:9") is None


# --- the CLI against a stand-in server ------------------------------------------------------------

class StandIn(BaseHTTPRequestHandler):
    """OpenAI completions (streamed, one word per token, a word per output token) and a
    /metrics page whose prefix cache finds the longest prefix (in words) seen before."""
    seen: list[list[str]] = []
    queries = hits = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = (f"vllm:prefix_cache_queries_total{{engine=\"0\"}} {StandIn.queries}\n"
                f"vllm:prefix_cache_hits_total{{engine=\"0\"}} {StandIn.hits}\n").encode()
        if self.path != "/metrics":
            self.send_response(404)
            body = b"{}"
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = OpenAICompletions().from_wire(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        words = req.prompt.split()
        with StandIn.lock:
            best = max((_common(words, w) for w in StandIn.seen), default=0)
            StandIn.seen.append(words)
            StandIn.queries += len(words)
            StandIn.hits += best
        events = [StreamEvent("text", text=f"w{i} ") for i in range(req.max_tokens)]
        events.append(StreamEvent("usage", usage=Usage(len(words), req.max_tokens)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in sse_stream(events, "openai-completions"):
            self.wfile.write(chunk)


def _common(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture
def standin_url():
    StandIn.seen, StandIn.queries, StandIn.hits = [], 0, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "options.bench", "--no-progress", "--profile", "agent", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_cli_writes_the_program_keys_and_the_hit_rate(standin_url, tmp_path):
    out = tmp_path / "agent.json"
    done = _cli("--url", standin_url, "--programs", "6", "--steps", "3", "--think-ms", "20",
                "--concurrency", "2", "--system-tokens", "40", "--prompt-tokens", "8",
                "--output-tokens", "5", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "predicted" in done.stdout and "prefix-cache hit rate" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "spectrum.bench/1" and doc["profile"]["kind"] == "agent"
    assert set(doc["program"]["e2e_ms"]) >= set(STATS)
    assert set(doc["program"]["predicted_e2e_ms"]) == {"p95", "p99"}
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3]
    for s in doc["steps"]:
        assert set(s["ttft_ms"]) == set(STATS) and set(s["e2e_ms"]) == set(STATS)
    assert doc["program"]["completed"] == 6 and doc["counts"]["completed"] == 18
    assert doc["counts"]["output_tokens"] == 18 * 5
    # Each step's prompt carries the earlier ones and their answers: it grows.
    means = [s["input_tokens_mean"] for s in doc["steps"]]
    assert means[0] < means[1] < means[2]
    # Think time is in every program: two gaps of 20 ms.
    assert doc["program"]["e2e_ms"]["p50"] >= 40
    # The stand-in's cache: all but each prompt's new part was seen before.
    rate = doc["prefix_cache_hit_rate"]
    assert 0.5 < rate < 1
    assert doc["metrics"]["output_tokens_per_second"] > 0          # `cost breakeven --bench` reads it


def test_cli_rejects_an_open_loop_rate_for_programs(standin_url):
    done = _cli("--url", standin_url, "--request-rate", "4")
    assert done.returncode == 2 and "closed-loop" in done.stdout


# --- the real server ----------------------------------------------------------------------------

@pytest.mark.engine
def test_programs_on_the_real_server_hit_the_prefix_cache(plain_server, tmp_path):
    out = tmp_path / "agent.json"
    done = _cli("--url", plain_server.url, "--level", "5", "--programs", "8", "--steps", "3",
                "--think-ms", "50", "--concurrency", "4", "--system-tokens", "128",
                "--prompt-tokens", "16", "--output-tokens", "16", "--ignore-eos", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["program"]["completed"] == 8 and doc["counts"]["output_tokens"] == 8 * 3 * 16
    means = [s["input_tokens_mean"] for s in doc["steps"]]
    assert means[0] < means[1] < means[2]
    # The shared system prompt and each session's earlier steps come from vLLM's prefix cache.
    assert doc["prefix_cache_hit_rate"] > 0.3
    p = doc["program"]
    assert p["e2e_ms"]["p99"] >= p["e2e_ms"]["p50"] >= 100             # two think gaps of 50 ms
    assert p["predicted_e2e_ms"]["p99"] >= p["predicted_e2e_ms"]["p95"] > 100
