"""The bench's ``--replay TRACE``: an open-loop replay of a request trace.

Most tests run the CLI in a subprocess (its own interpreter, as a user runs it) against a
stand-in OpenAI completions server on a real socket in this process: it answers each request
with ``max_tokens`` words over SSE, counts a prompt's words as its tokens (so the bench's
calibration finds one token per word), can wait before answering, and records every prompt and
how many requests it held at once. One test replays the shipped Azure trace against the real
server, which the bench starts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standin_http import serving, stream_completion

from cost.traces import AZURE_CONV_TRACE, read_trace, spec_trace
from options.bench import replay, runner
from options.bench.metrics import RequestRecord
from options.bench.profile import prompt_number
from options.bench.__main__ import main as bench_main
from options.contract import OpenAICompletions, Request

START = datetime(2023, 11, 16, 18, 15, 46)


# --- a stand-in server ---------------------------------------------------------------------------

class StandIn(BaseHTTPRequestHandler):
    """Answers completions after ``delay_s``; records (prompt, max_tokens) and the peak in flight."""
    delay_s = 0.0
    seen: list[tuple[str, int]] = []
    in_flight = 0
    peak_in_flight = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "standin"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        cls = StandIn
        req = OpenAICompletions().from_wire(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        with cls.lock:
            cls.seen.append((req.prompt, req.max_tokens))
            cls.in_flight += 1
            cls.peak_in_flight = max(cls.peak_in_flight, cls.in_flight)
        try:
            if cls.delay_s:
                time.sleep(cls.delay_s)
            stream_completion(self, [f"w{i} " for i in range(req.max_tokens)], len(req.prompt.split()))
        finally:
            with cls.lock:
                cls.in_flight -= 1


class BusyServer(ThreadingHTTPServer):
    # The default backlog of 5 would drop connections arriving 200 a second in a burst.
    request_queue_size = 1024


@contextmanager
def standin(delay_s: float = 0.0):
    StandIn.delay_s, StandIn.seen = delay_s, []
    StandIn.in_flight = StandIn.peak_in_flight = 0
    with serving(StandIn, BusyServer) as url:
        yield url


def measured_prompts() -> list[tuple[str, int]]:
    """What the stand-in got, without the warm-up and the two calibration requests."""
    return [(p, n) for p, n in StandIn.seen
            if not p.startswith("warm-up") and prompt_number(p) not in (-16, -96)]


# --- traces written by the tests -----------------------------------------------------------------

def azure_trace(path, rows: list[tuple[float, int, int]]):
    """An Azure-format CSV: (seconds from the start, input tokens, output tokens) per row."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, n_in, n_out in rows:
        stamp = (START + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        lines.append(f"{stamp},{n_in},{n_out}")
    path.write_text("\n".join(lines) + "\n")
    return path


def mooncake_trace(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bench_file(path, output_tok_s: float, **extra):
    doc = {"schema": "spectrum.bench/1", "level": 5, "target": "local", "model": "m",
           "profile": {"requests": 16, "concurrency": 8, "request_rate": None},
           "metrics": {"output_tokens_per_second": output_tok_s, "requests_per_second": 1.0},
           "counts": {"completed": 16, "errors": {}, "input_tokens": 100, "output_tokens": 100},
           **extra}
    path.write_text(json.dumps(doc))
    return path


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "options.bench", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def _replay(url, trace, out, *more, timeout=60):
    done = _cli("--url", url, "--replay", str(trace), *more, "--json", str(out), timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text()), done.stdout


# --- (1) the client keeps up ---------------------------------------------------------------------

# Runs of the 5 s replay before the client is judged late. This machine's 2 cores are shared with
# the suite's session servers: one stall of the machine (~30 ms, seen once in a full run) makes
# the few sends queued behind it late. A client that cannot keep up is late in every run.
ON_TIME_RUNS = 3


def test_sends_200_requests_a_second_for_5_s_on_time(tmp_path):
    rate, seconds = 200, 5
    trace = azure_trace(tmp_path / "steady.csv", [(i / rate, 8, 2) for i in range(rate * seconds)])
    for run in range(ON_TIME_RUNS):
        with standin() as url:
            doc, stdout = _replay(url, trace, tmp_path / f"out-{run}.json")
        s = doc["replay"]["summary"]
        print(f"run {run + 1}: {s['late_sends']} late sends, lateness {s['lateness_ms']}")
        assert s["lateness_ms"]["p99"] < 10, s["lateness_ms"]
        if s["late_sends"] == 0:
            break
    requests = doc["replay"]["requests"]
    assert len(requests) == rate * seconds and doc["counts"]["completed"] == rate * seconds
    assert s["lost"] == 0 and s["failed"] == 0 and doc["counts"]["errors"] == {}
    # Each request left at its own time: the sends span the trace, none was late.
    sent = [r["sent_s"] for r in requests]
    assert sent[-1] - sent[0] == pytest.approx((rate * seconds - 1) / rate, abs=0.02)
    lateness = [r["sent_s"] - r["arrival_s"] for r in requests]
    assert min(lateness) >= 0
    assert s["lateness_ms"]["p99"] < 10, s["lateness_ms"]
    assert s["late_sends"] == 0, s["lateness_ms"]
    assert s["lateness_ms"]["max"] == pytest.approx(max(lateness) * 1000, abs=0.01)
    assert doc["counts"]["output_tokens"] == 2 * rate * seconds
    print(f"lateness at {rate} req/s: p50 {s['lateness_ms']['p50']:.3f} ms, "
          f"p99 {s['lateness_ms']['p99']:.3f} ms, max {s['lateness_ms']['max']:.3f} ms")
    assert "send lateness" in stdout and "late sends" in stdout       # the table for people


# --- (2) open loop: a slow server does not slow the sends ----------------------------------------

def test_replay_is_open_loop_and_writes_the_replay_keys(tmp_path):
    rows = [(i * 0.05, 10 + i, 3 + i % 4) for i in range(30)]
    trace = azure_trace(tmp_path / "azure.csv", rows)
    with standin(delay_s=0.5) as url:
        doc, _ = _replay(url, trace, tmp_path / "out.json", "--warmup", "0")
        peak = StandIn.peak_in_flight
        prompts = measured_prompts()
    assert doc["schema"] == "spectrum.bench/1" and doc["profile"]["kind"] == "replay"
    assert set(doc["metrics"]) >= {"output_tokens_per_second", "ttft_ms", "e2e_ms", "tpot_ms", "itl_ms"}
    assert doc["counts"]["completed"] == 30 and doc["counts"]["errors"] == {}
    r = doc["replay"]
    assert set(r) >= {"spec", "requests", "summary"}
    spec = r["spec"]
    assert spec["trace"] == read_trace(trace).spec
    assert spec["time_scale"] == 1.0 and spec["load"] is None and spec["capacity_file"] is None
    assert spec["max_input"] is None and spec["max_output"] is None and spec["block_tokens"] == 512
    assert spec["target"]["url"] == url and spec["target"]["dialect"] == "openai-completions"
    assert spec["ignore_eos"] is True
    assert set(r["summary"]) >= {"ttft_ms", "e2e_ms", "tpot_ms", "throughput_tok_s", "lost", "late_sends",
                                 "lateness_ms", "offered_output_tok_s", "duration_s"}
    for key in ("ttft_ms", "e2e_ms", "tpot_ms"):
        assert set(r["summary"][key]) >= {"p50", "p90", "p99"}
    assert set(r["summary"]["lateness_ms"]) == {"p50", "p99", "max"}
    assert r["summary"]["server"] is None              # the stand-in has no /metrics to split TTFT by
    # Arrivals as the trace says; every request sent on time although each answer takes 0.5 s.
    for (t, n_in, n_out), req in zip(rows, r["requests"]):
        assert set(req) == {"arrival_s", "sent_s", "input_tokens", "output_tokens", "ttft_ms",
                            "e2e_ms", "status"}
        assert req["arrival_s"] == pytest.approx(t, abs=1e-6)
        assert 0 <= req["sent_s"] - req["arrival_s"] < 0.010
        assert req["status"] == "ok" and req["e2e_ms"] >= 500
        assert (req["input_tokens"], req["output_tokens"]) == (n_in, n_out)   # the server's counts
    # 0.5 s answers, a request every 0.05 s: about 10 held at once, by the server and the client.
    assert peak >= 8 and r["summary"]["peak_in_flight"] >= 8
    assert r["summary"]["late_sends"] == 0 and r["summary"]["lost"] == 0
    span = read_trace(trace).span_s
    assert r["summary"]["offered_output_tok_s"] == pytest.approx(sum(o for _, _, o in rows) / span)
    # Each prompt starts with the run's tag and its own request number: no two share a prefix,
    # nor with another run's.
    tag = r["spec"]["prompt_tag"]
    assert all(p.startswith(tag + ".") for p, _ in prompts)
    assert sorted(prompt_number(p) for p, _ in prompts) == list(range(30))


def test_prefix_blocks_are_shared_as_the_trace_says(tmp_path):
    """Mooncake's hash_ids: requests sharing leading ids share that many blocks of prompt text."""
    rows = [{"timestamp": 0, "input_length": 24, "output_length": 5, "hash_ids": [11, 12, 13]},
            {"timestamp": 20, "input_length": 20, "output_length": 2, "hash_ids": [11, 12, 14]},
            {"timestamp": 40, "input_length": 16, "output_length": 3, "hash_ids": [11, 15]},
            {"timestamp": 60, "input_length": 12, "output_length": 4, "hash_ids": [16]},
            {"timestamp": 80, "input_length": 10, "output_length": 0}]
    trace = mooncake_trace(tmp_path / "mooncake.jsonl", rows)
    with standin() as url:
        doc, stdout = _replay(url, trace, tmp_path / "out.json", "--block-tokens", "8")
        prompts = {n: p.split() for p, n in measured_prompts()}
    a, b, c, d = (prompts[n] for n in (5, 2, 3, 4))     # told apart by their max_tokens
    assert [len(a), len(b), len(c), len(d)] == [24, 20, 16, 12]      # words = tokens here
    assert a[:16] == b[:16] and a[16:] != b[16:20]                   # blocks 11, 12 shared
    assert a[:8] == c[:8] and a[8:16] != c[8:16]                     # block 11 only
    tag = doc["replay"]["spec"]["prompt_tag"]                       # a block's text starts with the run's tag and its id
    assert (a[0], a[8], c[8]) == (f"{tag}.11", f"{tag}.12", f"{tag}.15")
    assert d[0] == f"{tag}.16" and d[:8] != a[:8]                   # block 16 is its own
    assert d[8:] != a[8:12]                                          # and past its one block, text of its own
    assert doc["replay"]["spec"]["block_tokens"] == 8 and doc["replay"]["spec"]["prefix_blocks"] is True
    # The row with 0 output tokens was sent with max_tokens 1, and the run says so.
    assert doc["replay"]["summary"]["clipped"]["zero_output"] == 1
    assert "0 output tokens" in stdout
    last = doc["replay"]["requests"][-1]
    assert last["status"] == "ok" and last["output_tokens"] == 1


# --- (3) the pace from --load and --capacity -----------------------------------------------------

def test_load_picks_the_time_scale_from_the_capacity(tmp_path):
    rows = [(i * 0.1, 12, 4) for i in range(10)] + [(1.0, 12, 0)]
    trace = azure_trace(tmp_path / "azure.csv", rows)
    capacity = bench_file(tmp_path / "bench.json", 40.0)
    span = read_trace(trace).span_s
    # Clipped to 3 output tokens, and the 0-token row asks for 1: 31 tokens over the span.
    offered = (10 * 3 + 1) / span
    expected_scale = offered / (0.5 * 40.0)
    with standin() as url:
        doc, stdout = _replay(url, trace, tmp_path / "out.json", "--load", "0.5", "--capacity",
                              str(capacity), "--max-output", "3", "--max-input", "8")
    spec, s = doc["replay"]["spec"], doc["replay"]["summary"]
    assert spec["time_scale"] == pytest.approx(expected_scale)
    assert spec["load"] == 0.5 and spec["capacity_file"] == str(capacity)
    assert spec["capacity_output_tok_s"] == 40.0
    assert spec["capacity_source"] == "metrics.output_tokens_per_second"
    assert spec["max_output"] == 3 and spec["max_input"] == 8
    assert s["offered_output_tok_s"] == pytest.approx(20.0)          # 50 % of 40 tok/s
    assert s["clipped"] == {"input": 11, "output": 10, "zero_output": 1}
    for (t, _, _), req in zip(rows, doc["replay"]["requests"]):
        assert req["arrival_s"] == pytest.approx(t * expected_scale, abs=1e-6)
    assert [r["output_tokens"] for r in doc["replay"]["requests"]] == [3] * 10 + [1]
    assert [r["input_tokens"] for r in doc["replay"]["requests"]] == [8] * 11
    assert "11 of 11 prompts clipped" in stdout and "10 of 11 answers clipped" in stdout
    # The spec alone gives the same requests at the same times (what a simulator re-predicts from).
    again = replay.plan_replay(spec_trace(spec["trace"]), max_input=spec["max_input"],
                               max_output=spec["max_output"], time_scale=spec["time_scale"])
    assert again.arrival_s == pytest.approx([r["arrival_s"] for r in doc["replay"]["requests"]], abs=1e-6)
    assert list(again.output_tokens) == [r["output_tokens"] for r in doc["replay"]["requests"]]


def test_time_scale_arithmetic_and_capacity_sources(tmp_path):
    assert replay.time_scale_for_load(100.0, 0.5, 400.0) == 0.5       # 100 tok/s offered → 200: twice as fast
    assert replay.time_scale_for_load(100.0, 1.0, 50.0) == 2.0
    trace = read_trace(azure_trace(tmp_path / "azure.csv", [(0, 5, 10), (1, 5, 10), (2, 5, 10), (3, 5, 10)]))
    assert trace.span_s == pytest.approx(4.0)
    plan = replay.plan_replay(trace, time_scale=2.0)
    assert plan.arrival_s == pytest.approx((0, 2, 4, 6)) and plan.offered_output_tok_s == pytest.approx(5.0)
    # --capacity alone reports the load the replay offers against it.
    plain = bench_file(tmp_path / "plain.json", 20.0)
    plan = replay.plan_replay(trace, time_scale=2.0, capacity_file=str(plain))
    assert plan.pace.capacity_source == "metrics.output_tokens_per_second"
    assert plan.pace.load == pytest.approx(5.0 / 20.0) and plan.pace.time_scale == 2.0
    plan = replay.plan_replay(trace, load=0.25, capacity_file=str(plain))
    assert plan.pace.time_scale == pytest.approx(2.0) and plan.offered_output_tok_s == pytest.approx(5.0)
    # A plain saturated figure in the bench comes before its measured rate.
    saturated = bench_file(tmp_path / "sat.json", 10.0, capacity_model={"saturated_output_tok_s": 40.0})
    plan = replay.plan_replay(trace, load=0.5, capacity_file=str(saturated))     # 10 tok/s → 20
    assert plan.pace.capacity_source == "capacity_model.saturated_output_tok_s"
    assert plan.pace.time_scale == pytest.approx(0.5) and plan.offered_output_tok_s == pytest.approx(20.0)


def test_a_capacity_model_in_the_bench_gives_the_saturated_rate_at_the_trace_sizes(tmp_path):
    capacity = pytest.importorskip("cost.simulate.capacity")
    model = capacity.CapacityModel.from_throughput(300.0, "a test")
    bench = bench_file(tmp_path / "model.json", 100.0, capacity_model=model.to_json())
    trace = read_trace(azure_trace(tmp_path / "azure.csv", [(0, 50, 10), (1, 150, 30), (2, 100, 20)]))
    plan = replay.plan_replay(trace, load=0.5, capacity_file=str(bench))
    saturated = model.saturated_output_tok_s(100.0, 20.0)        # the trace's mean sizes
    assert plan.pace.capacity_output_tok_s == pytest.approx(saturated) and saturated != 100.0
    assert plan.pace.capacity_source.startswith("capacity_model: CapacityModel.saturated_output_tok_s")
    assert plan.offered_output_tok_s == pytest.approx(0.5 * saturated)


# --- (4) bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("more, words", [
    (["--load", "0.7"], ["--load 0.7", "--capacity BENCH.json"]),
    (["--load", "0", "--capacity", "{bench}"], ["--load 0 must be > 0"]),
    (["--load", "-0.5", "--capacity", "{bench}"], ["--load -0.5 must be > 0"]),
    (["--time-scale", "0"], ["--time-scale 0 must be > 0"]),
    (["--time-scale", "2", "--load", "0.5", "--capacity", "{bench}"], ["not both"]),
    (["--concurrency", "4"], ["open loop", "--concurrency"]),
    (["--request-rate", "4"], ["--request-rate"]),
    (["--profile", "agent"], ["--profile agent"]),
    (["--adapters", "a1,a2"], ["--adapters"]),
    (["--requests", "10"], ["--requests", "--window"]),
    (["--max-input", "0"], ["--max-input 0", ">= 1"]),
    (["--max-output", "0"], ["--max-output 0"]),
    (["--block-tokens", "0"], ["--block-tokens 0"]),
    (["--load", "0.5", "--capacity", "{missing}"], ["does not exist"]),
])
def test_bad_replay_arguments_exit_2_before_any_server_starts(more, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    trace = azure_trace(tmp_path / "azure.csv", [(0, 5, 5), (1, 5, 5)])
    bench = bench_file(tmp_path / "bench.json", 100.0)
    more = [m.format(bench=bench, missing=tmp_path / "none.json") for m in more]
    assert bench_main(["--no-progress", "--replay", str(trace), *more]) == 2
    out = capsys.readouterr().out
    assert out.count("error:") == 1
    for w in words:
        assert w in out, out
    assert "starting the local server" not in out


@pytest.mark.parametrize("argv, words", [
    (["--replay", "{missing}"], ["none.csv"]),
    (["--load", "0.5"], ["--load is for a trace replay", "--replay TRACE"]),
    (["--max-input", "64"], ["--max-input is for a trace replay"]),
    (["--window", "0:10"], ["--window", "--replay"]),
])
def test_replay_flags_without_a_trace_or_a_missing_trace_exit_2(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    argv = [a.format(missing=tmp_path / "none.csv") for a in argv]
    assert bench_main(["--no-progress", *argv]) == 2
    out = capsys.readouterr().out
    for w in words:
        assert w in out, out
    assert "starting the local server" not in out


# --- the client's limit ---------------------------------------------------------------------------

def test_the_servers_view_is_its_means_over_the_replay_beside_the_clients():
    before = {"ttft": (10.0, 100), "queue": (1.0, 100), "prefill": (4.0, 100), "e2e": (50.0, 100)}
    after = {"ttft": (10.0 + 4 * 0.030, 104), "queue": (1.0 + 4 * 0.002, 104), "prefill": (4.0 + 4 * 0.012, 104),
             "e2e": (50.0 + 4 * 0.5, 104)}
    records = [RequestRecord(ttft_s=t, e2e_s=0.5 + t, input_tokens=10, output_tokens=8)
               for t in (0.030, 0.036, 0.040, 0.054)] + [RequestRecord(error="http_500")]
    view = replay.server_view(before, after, records)
    assert view["requests"] == 4
    assert view["mean_ms"] == pytest.approx({"ttft": 30.0, "queue": 2.0, "prefill": 12.0, "e2e": 500.0})
    assert view["client_mean_ms"] == pytest.approx({"ttft": 40.0, "e2e": 540.0})
    assert view["ttft_outside_engine_ms"] == pytest.approx(40.0 - 2.0 - 12.0)
    # no reading on either side, or no request finished between them: nothing to say
    assert replay.server_view(None, after, records) is None and replay.server_view(before, None, records) is None
    assert replay.server_view(before, before, records) is None


def test_requests_beyond_the_in_flight_limit_are_lost_not_delayed():
    with standin(delay_s=0.4) as url:
        send = runner.http_target(url, "openai-completions")
        run = replay.send_open_loop([0.0, 0.01, 0.02, 0.03, 0.6],
                                    lambda i: Request(prompt=f"{i} a b", max_tokens=2, stream=True),
                                    send, max_in_flight=2)
    status = [r.error or "ok" for r in run.records]
    assert status == ["ok", "ok", replay.CLIENT_OVERLOADED, replay.CLIENT_OVERLOADED, "ok"]
    assert run.sent_s[2] is None and run.sent_s[4] == pytest.approx(0.6, abs=0.01)
    assert run.peak_in_flight == 2 and len(StandIn.seen) == 3


# --- against the real server ------------------------------------------------------------------------

@pytest.mark.engine
def test_replays_the_azure_trace_against_the_real_server(tmp_path, plain_server):
    """~40 requests of the shipped Azure conversation trace through the suite's shared server
    (the bench starting a server of its own is test_bench_adapters.py's and tests/e2e's)."""
    out = tmp_path / "replay.json"
    done = subprocess.run(
        [sys.executable, "-m", "options.bench", "--no-progress", "--level", "5", "--url", plain_server.url,
         "--replay", str(AZURE_CONV_TRACE), "--window", "120:128", "--max-input", "256", "--max-output", "32",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    trace = read_trace(AZURE_CONV_TRACE, window=(120, 128))
    r = doc["replay"]
    assert len(r["requests"]) == len(trace) == doc["counts"]["completed"]
    assert 30 <= len(trace) <= 50 and doc["counts"]["errors"] == {}
    assert r["spec"]["trace"]["window"] == [120, 128] and r["spec"]["max_input"] == 256
    # ignore_eos: the server generated exactly the clipped output of each row.
    for req, n_in, n_out in zip(r["requests"], trace.input_tokens.tolist(), trace.output_tokens.tolist()):
        assert req["status"] == "ok"
        assert req["output_tokens"] == max(1, min(n_out, 32))
        assert req["input_tokens"] == pytest.approx(min(n_in, 256), rel=0.15, abs=4)
    # A send the client made late is this machine's speed, not the bench's fault: it is counted
    # (and each request still sent and answered, as asserted above), never lost.
    assert r["summary"]["lost"] == 0 and 0 <= r["summary"]["late_sends"] <= len(trace)
    assert r["summary"]["ttft_ms"]["p50"] > 0 and doc["metrics"]["output_tokens_per_second"] > 0
    # vLLM's own histograms over the same requests: the client waits longer than the server counts
    # (HTTP, streaming), and the engine's queue and prefill are part of the server's TTFT.
    view = r["summary"]["server"]
    assert view["requests"] == len(trace)
    assert view["client_mean_ms"]["ttft"] > view["mean_ms"]["ttft"] > view["mean_ms"]["prefill"] > 0
    assert view["mean_ms"]["e2e"] > view["mean_ms"]["ttft"] and view["ttft_outside_engine_ms"] > 0
    assert "engine queue + prefill" in done.stdout
