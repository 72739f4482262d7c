"""The bench's ``--adapters`` run and the agent profile's ``--priority``: the Zipf mix, the
swap counters from ``/metrics``, the JSON keys other tools read, and bad input refused before
any load.

Most tests run the CLI against a stand-in OpenAI server (stdlib HTTP, answering through the
contract's own SSE writer) that lists adapters at ``/v1/models``, keeps the last ``SLOTS``
adapters asked for and counts loads and evictions in ``/metrics`` the way the
bring-your-own server names them, and records every body it gets. One test runs the adapter
bench against the real server, which the bench starts with two adapters it writes itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler

import pytest
from standin_http import serving, stream_completion

from options.bench import adapters, priority
from options.bench.__main__ import main as bench_main
from options.bench.adapters import Mix, parse_adapters, parse_mix
from options.contract import OpenAICompletions
from options.core import BadInput

SLOTS = 2


# --- the mix ----------------------------------------------------------------------------------

def test_zipf_weights_follow_one_over_rank_to_the_s():
    w = parse_mix("zipf:1.1").weights(8)
    assert sum(w) == pytest.approx(1)
    for i in range(1, 8):
        assert w[0] / w[i] == pytest.approx((i + 1) ** 1.1)
    assert parse_mix("uniform").weights(4) == [0.25] * 4
    assert str(parse_mix("zipf:1.10")) == "zipf:1.1" and str(parse_mix(" uniform ")) == "uniform"


def test_the_draw_is_seeded_and_matches_the_weights():
    names = [f"a{i}" for i in range(1, 9)]
    mix = Mix("zipf", 1.1)
    first = mix.assign(names, 20_000, seed=7)
    assert first == mix.assign(names, 20_000, seed=7)          # reproducible
    assert first != mix.assign(names, 20_000, seed=8)
    counts = Counter(first)
    for name, w in zip(names, mix.weights(8)):
        # 20,000 draws: a share's standard deviation is at most 0.0035.
        assert counts[name] / 20_000 == pytest.approx(w, abs=0.012), name
    assert counts["a1"] > counts["a2"] > counts["a4"] > counts["a8"]
    uniform = Counter(Mix("uniform").assign(names, 20_000, seed=1))
    assert all(abs(uniform[n] / 20_000 - 1 / 8) < 0.012 for n in names)
    assert adapters.request_counts(first[:50], names) == {n: first[:50].count(n) for n in names}
    assert sum(adapters.request_counts(first[:50], names).values()) == 50


@pytest.mark.parametrize("spec, words", [
    ("zipf:0", ["zipf:0", "S > 0"]), ("zipf:-1.1", ["S > 0"]), ("zipf:abc", ["'zipf:abc'", "uniform"]),
    ("pareto:1", ["'pareto:1'", "zipf:S"]), ("zipf", ["'zipf'"]), ("zipf:nan", ["S > 0"]),
])
def test_bad_mixes_name_the_value_and_what_would_do(spec, words):
    with pytest.raises(BadInput) as info:
        parse_mix(spec)
    for w in words:
        assert w in str(info.value)


def test_bad_adapter_lists():
    assert parse_adapters("a1, a2,b.3") == ["a1", "a2", "b.3"]
    for spec, word in (("a1,,a2", "empty"), ("a1,a1", "'a1' twice"), ("a/1", "'a/1'")):
        with pytest.raises(BadInput, match=word):
            parse_adapters(spec)


# --- swaps from /metrics ------------------------------------------------------------------------

PAGE = """# HELP byo_adapter_loads_total Adapter loads into the engine
# TYPE byo_adapter_loads_total counter
byo_adapter_loads_total{adapter="a1"} 3.0
byo_adapter_loads_total{adapter="a2"} 1.0
byo_adapter_evictions_total{adapter="a1"} 2.0
byo_adapter_hits_total{adapter="a2"} 10.0
byo_adapter_load_seconds_sum{adapter="a1"} 0.06
byo_adapter_load_seconds_count{adapter="a1"} 3.0
byo_adapter_load_seconds_bucket{adapter="a1",le="0.1"} 3.0
byo_requests_total{route="/v1/completions"} 99.0
"""


def test_adapter_counters_and_their_growth():
    before = adapters.adapter_counters(PAGE)
    assert before["loads"] == {"a1": 3.0, "a2": 1.0} and before["evictions"] == {"a1": 2.0}
    after = adapters.adapter_counters(PAGE.replace('"a1"} 3.0', '"a1"} 5.0')
                                      + 'byo_adapter_loads_total{adapter="a3"} 1.0\n')
    assert adapters.counter_delta(before, after)["loads"] == 3           # a1 +2, a3 new +1
    assert adapters.counter_delta(before, after, ["a3"])["loads"] == 1
    assert adapters.counter_delta(before, after)["hits"] == 0
    assert adapters.adapter_counters("vllm:num_requests_running 1\n") is None   # no adapters here
    assert adapters.adapter_counters(None) is None
    assert adapters.counter_delta(None, after) is None


def test_rounds_summarise_to_per_round_ratios():
    runs = []
    for rnd, (base, mix) in enumerate([(100, 90), (200, 150), (100, 80)], start=1):
        for who, tps in (("base", base), ("mix", mix)):
            runs.append({"round": rnd, "concurrency": 8, "contender": who,
                         "output_tokens_per_second": tps, "ttft_ms_p50": tps / 10,
                         "ttft_ms_p99": tps / 5,
                         "swaps": {"loads": 2, "evictions": 1, "hits": 5} if who == "mix" else
                         {"loads": 0, "evictions": 0, "hits": 0}})
    by = adapters.summarize_runs(runs, [8])["8"]
    # Ratios are taken within each round (0.9, 0.75, 0.8), then their median.
    assert by["throughput_ratio"] == {"median": 0.8, "min": 0.75, "max": 0.9}
    assert by["base"]["output_tokens_per_second"]["median"] == 100
    assert by["loads"] == 6 and by["evictions"] == 3


# --- a stand-in server ------------------------------------------------------------------------

class StandIn(BaseHTTPRequestHandler):
    base = "base-model"
    known = ("a1", "a2", "a3")
    bodies: list[dict] = []
    resident: list[str] = []
    loads: Counter = Counter()
    evictions: Counter = Counter()
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def _send(self, status, body: bytes, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        cls = StandIn
        if self.path == "/v1/models":
            data = [{"id": cls.base}] + [{"id": a, "parent": cls.base} for a in cls.known]
            return self._send(200, json.dumps({"data": data}).encode())
        if self.path == "/metrics":
            with cls.lock:
                lines = [f'byo_adapter_loads_total{{adapter="{a}"}} {n}' for a, n in cls.loads.items()]
                lines += [f'byo_adapter_evictions_total{{adapter="{a}"}} {n}'
                          for a, n in cls.evictions.items()]
            return self._send(200, ("\n".join(lines) + "\nbyo_adapter_info 1\n").encode(), "text/plain")
        if self.path.startswith("/models/"):
            name = self.path.split("/")[2]
            where = "gpu" if name in cls.resident else "registered"
            return self._send(200, json.dumps({"modelName": name, "residency": where}).encode())
        self._send(404, b"{}")

    def do_POST(self):
        cls = StandIn
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        req = OpenAICompletions().from_wire(body)
        with cls.lock:
            cls.bodies.append(body)
            name = body.get("model")
            if name in cls.known and name not in cls.resident:
                cls.loads[name] += 1
                cls.resident.append(name)
                if len(cls.resident) > SLOTS:
                    cls.evictions[cls.resident.pop(0)] += 1
        stream_completion(self, [f"w{i} " for i in range(req.max_tokens)], len(req.prompt.split()))


@pytest.fixture
def standin_url():
    StandIn.bodies, StandIn.resident = [], []
    StandIn.loads, StandIn.evictions = Counter(), Counter()
    with serving(StandIn) as url:
        yield url


def _cli(*args, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "options.bench", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_cli_mixes_adapters_against_the_base_and_counts_swaps(standin_url, tmp_path):
    out = tmp_path / "adapters.json"
    done = _cli("--url", standin_url, "--adapters", "a1,a2,a3", "--adapter-mix", "zipf:1.1",
                "--concurrency", "2,4", "--rounds", "3", "--requests", "12", "--prompt-tokens", "6",
                "--output-tokens", "3", "--cold-burst", "3", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tok/s ratio" in done.stdout and "cold burst" in done.stdout
    doc = json.loads(out.read_text())
    a = doc["adapters"]
    assert doc["schema"] == "spectrum.bench/1" and a["names"] == ["a1", "a2", "a3"]
    assert a["mix"] == "zipf:1.1" and a["rounds"] == 3 and a["concurrency"] == 4
    assert sum(a["requests_per_adapter"].values()) == a["requests"] == 12
    # The same seeded draw in every mix run: the bodies say so.
    mix_models = [b["model"] for b in StandIn.bodies if b.get("model") in StandIn.known
                  and b["prompt"] != "cold adapter burst"]
    assert Counter(mix_models) == Counter({k: 6 * v for k, v in a["requests_per_adapter"].items()})
    assert len(a["runs"]) == 3 * 2 * 2
    assert [r["contender"] for r in a["runs"][:4]] == ["base", "mix", "base", "mix"]
    assert [r["contender"] for r in a["runs"][4:8]] == ["mix", "base", "mix", "base"]   # alternated
    for key in ("throughput_ratio", "ttft_ratio_p50", "ttft_ratio_p99"):
        assert a[key] == a["by_concurrency"]["4"][key]["median"] and a[key] > 0
    # Swaps are the stand-in's own counters: 3 adapters through 2 slots.
    assert a["loads"] == sum(StandIn.loads.values()) - a["cold_burst"]["loads"]
    assert a["evictions"] > 0 and a["loads"] > 0
    assert a["cold_burst"]["adapter"] == "a3" and a["cold_burst"]["loads"] == 1
    assert a["cold_burst"]["ttft_ms"]["p50"] > 0
    assert doc["metrics"]["output_tokens_per_second"] > 0 and doc["profile"]["concurrency"] == [2, 4]


def test_cli_refuses_adapters_the_target_does_not_serve_before_sending_any(standin_url):
    done = _cli("--url", standin_url, "--adapters", "a1,a9,zz")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a9, zz are not served" in done.stdout and "a1, a2, a3" in done.stdout
    assert StandIn.bodies == []


@pytest.mark.parametrize("argv, words", [
    (["--adapters", "a1,a2", "--adapter-mix", "zipf:0"], ["zipf:0", "S > 0"]),
    (["--adapters", "a1,a2", "--adapter-mix", "zeta"], ["'zeta'", "uniform"]),
    (["--adapters", "a1,a2", "--rounds", "0"], ["--rounds 0"]),
    (["--adapters", "a1,a2", "--request-rate", "3"], ["--request-rate"]),
    (["--adapters", "a1,a2", "--adapter-slots", "0"], ["--adapter-slots 0"]),
    (["--concurrency", "8,32"], ["several values are for --adapters"]),
    (["--adapters", "a1", "--profile", "agent"], ["--profile agent"]),
])
def test_bad_arguments_exit_2_before_any_server_starts(argv, words, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert bench_main(["--no-progress", *argv]) == 2
    out = capsys.readouterr().out
    for w in words:
        assert w in out, out
    assert "starting the local server" not in out


def test_concurrency_must_be_whole_numbers(capsys):
    with pytest.raises(SystemExit) as info:
        bench_main(["--concurrency", "8,x"])
    assert info.value.code == 2 and "'8,x'" in capsys.readouterr().err


# --- program-aware priority -------------------------------------------------------------------

def test_priorities_by_step_and_bedrock_refused():
    assert priority.step_priorities(4) == [-1, -2, -3, -4]
    assert priority.priorities_for("off", 3, {}) is None
    assert priority.priorities_for("later-steps", 3, {"url": "http://x", "dialect": "tgi"}) == [-1, -2, -3]
    with pytest.raises(BadInput, match="Bedrock has no request priority"):
        priority.priorities_for("compare", 3, {"service": "bedrock-runtime"})


def test_priority_compare_alternates_and_sends_minus_k_on_step_k(standin_url, tmp_path):
    out = tmp_path / "priority.json"
    done = _cli("--url", standin_url, "--profile", "agent", "--priority", "compare", "--rounds", "3",
                "--programs", "4", "--steps", "3", "--think-ms", "0", "--concurrency", "2",
                "--system-tokens", "8", "--prompt-tokens", "4", "--output-tokens", "2",
                "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "program-aware priority" in done.stdout
    doc = json.loads(out.read_text())
    p = doc["priority"]
    assert [r["mode"] for r in p["runs"]] == ["off", "on", "on", "off", "off", "on"]
    assert p["step_priorities"] == [-1, -2, -3]
    for key in ("p99_ratio", "p50_ratio"):
        assert p[key]["min"] <= p[key]["median"] <= p[key]["max"]
    assert len(p["on"]["step_ttft_ms_p50"]) == 3 and p["off"]["program_e2e_ms_p99"]["median"] > 0
    # Each step's body carries -k with the priorities on and nothing without.
    steps = [b for b in StandIn.bodies if "step" in b["prompt"]]
    with_p = Counter(b["priority"] for b in steps if "priority" in b)
    assert with_p == {-1: 12, -2: 12, -3: 12}
    assert sum(1 for b in steps if "priority" not in b) == 36
    for b in steps:
        if "priority" in b:
            assert f"step {-b['priority']}:" in b["prompt"].rsplit("session", 1)[1]
    assert doc["program"]["completed"] == 4


# --- against the real server ---------------------------------------------------------------------

@pytest.mark.engine
def test_adapter_bench_on_the_real_server(tiny_model, tmp_path):
    """The bench starts the server with LoRA on and two adapters it writes, one slot: the mix
    swaps them, and the server's counters say so."""
    out = tmp_path / "adapters.json"
    done = _cli("--model", str(tiny_model), "--adapters", "x1,x2", "--adapter-mix", "uniform",
                "--adapter-slots", "1", "--concurrency", "2", "--rounds", "1", "--requests", "6",
                "--prompt-tokens", "8", "--output-tokens", "4", "--ignore-eos", "--cold-burst", "2",
                "--json", str(out), timeout=600,
                env={"SPECTRUM_CACHE": str(tmp_path / "cache"), "SM_VLLM_ENFORCE_EAGER": "",
                     "SM_VLLM_MAX_MODEL_LEN": "512"})
    assert done.returncode == 0, done.stdout + done.stderr
    a = json.loads(out.read_text())["adapters"]
    assert sum(a["requests_per_adapter"].values()) == 6 == a["requests"]
    assert a["loads"] > 0 and a["evictions"] > 0
    assert a["cold_burst"]["loads"] == 1              # two concurrent first requests, one load
    for run in a["runs"]:
        assert run["completed"] == 6 and run["errors"] == {}
    assert a["load_ms_mean"] > 0
