"""`python -m cost agent`: one agent task priced on every rung, with exact figures from the dated
price table (2026-11-29: Qwen3 32B $0.15/$0.60 per 1M, Claude Sonnet 4.5 $3/$15, Nova Micro
$0.035/$0.14; ml.g6e.xlarge $2.6054/h, g6e.xlarge $1.861/h, ml.g5.xlarge $1.408/h; 730 h a month).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cost.hardware.predict import capacity_for

REPO = Path(__file__).resolve().parents[2]
PRICES = str(REPO / "cost" / "data" / "prices-2026-11-29.json")
QWEN = "qwen.qwen3-32b-v1:0"
SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
NOVA_MICRO = "amazon.nova-micro-v1:0"


def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cost", "agent", "--prices", PRICES, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def cli_json(*args: str) -> dict:
    return json.loads(cli(*args, "--json").stdout)


@pytest.fixture
def trace(tmp_path):
    """A trace as `python -m options.agent --trace` writes it: three calls, 10,000 in + 1,000 out."""
    calls = [{"endpoint": "bedrock-runtime", "role": role, "input_tokens": n_in, "output_tokens": n_out,
              "ttft_ms": 90.0, "e2e_ms": 800.0, "cost_usd": 0.0}
             for role, n_in, n_out in (("plan", 2000, 200), ("summarise", 3000, 300), ("analyse", 5000, 500))]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schema": "spectrum.agent-trace/1", "level": 1, "target": "aws", "model": QWEN,
                                "calls": calls, "totals": {"e2e_ms": 2400.0}}))
    return path


def agent_bench(tmp_path, p99_ms=9000.0, programs_per_second=0.25):
    """An agent bench as `python -m options.bench --profile agent --json` writes it: 8 programs of
    4 steps, 500 input and 100 output tokens a call (2,000 + 400 a task)."""
    stats = {"mean": 5000.0, "p50": 4800.0, "p90": 7000.0, "p95": 8000.0, "p99": p99_ms}
    doc = {"schema": "spectrum.bench/1", "level": 5, "target": "aws", "model": "m",
           "profile": {"kind": "agent", "programs": 8, "steps": 4, "think_ms": 200, "concurrency": 4,
                       "requests": 32, "request_rate": None},
           "metrics": {"output_tokens_per_second": 100.0},
           "counts": {"completed": 32, "errors": {}, "input_tokens": 16000, "output_tokens": 3200},
           "program": {"completed": 8, "programs_per_second": programs_per_second, "e2e_ms": stats,
                       "predicted_e2e_ms": {"p95": 7900.0, "p99": 8800.0}},
           "steps": [], "prefix_cache_hit_rate": 0.6}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(doc))
    return path


def rung(data, level):
    return next(r for r in data["rungs"] if r["level"] == level)


def test_trace_priced_on_every_rung_with_exact_figures(trace):
    data = cli_json("--trace", str(trace), "--model", QWEN, "--instance", "ml.g6e.xlarge", "--capacity", "500")
    assert data["task"]["input_tokens"] == 10000 and data["task"]["output_tokens"] == 1000
    # Bedrock: 10,000 x $0.15 + 1,000 x $0.60 per 1M.
    assert rung(data, 1)["per_task_usd"] == pytest.approx(0.0021)
    assert rung(data, 1)["monthly_usd"] == pytest.approx(210.0)
    # 500 output tok/s = 0.5 tasks/s = 1,800 tasks/h; one replica all month: 730 h x $2.6054.
    for level in (2, 3, 4, 5):
        r = rung(data, level)
        assert r["per_task_at_full_load_usd"] == pytest.approx(2.6054 / 1800)
        assert r["replicas"] == 1 and r["monthly_usd"] == pytest.approx(730 * 2.6054)
        assert r["per_task_usd"] == pytest.approx(730 * 2.6054 / 100_000)
        # The replica's month costs as much as this many Bedrock tasks.
        assert r["flip_tasks_per_month"] == pytest.approx(730 * 2.6054 / 0.0021)
    eks = rung(data, 6)
    assert eks["instance_type"] == "g6e.xlarge"
    assert eks["per_task_at_full_load_usd"] == pytest.approx(1.861 / 1800)
    assert eks["flip_tasks_per_month"] == pytest.approx(eks["monthly_usd"] / 0.0021)
    assert data["cheapest_level"] == 1
    assert data["flip"] == {"level": 6, "rung": eks["rung"], "tasks_per_month": eks["flip_tasks_per_month"]}


def test_volume_past_the_flip_makes_a_self_hosted_rung_cheapest(trace):
    data = cli_json("--trace", str(trace), "--model", QWEN, "--instance", "ml.g6e.xlarge", "--capacity", "500",
                    "--tasks-per-month", "1000000")
    assert rung(data, 1)["monthly_usd"] == pytest.approx(2100.0)
    assert data["cheapest_level"] == 6
    table = cli("--trace", str(trace), "--model", QWEN, "--instance", "ml.g6e.xlarge", "--capacity", "500",
                "--tasks-per-month", "1000000").stdout
    assert "Cheapest: rung 6" in table and "cheaper than Bedrock above 815,167 tasks/month" in table


def test_bench_gives_tokens_capacity_and_the_p99_target(tmp_path):
    path = agent_bench(tmp_path)
    # Sonnet 4.5: 2,000 x $3 + 400 x $15 per 1M = $0.012 a task. 0.25 tasks/s = 900 tasks/h.
    ok = cli_json("--bench", str(path), "--model", SONNET, "--instance", "ml.g5.xlarge", "--slo-p99", "10000")
    assert ok["task"]["calls"] == 4 and ok["task"]["e2e_p99_ms"] == 9000.0
    assert rung(ok, 1)["per_task_usd"] == pytest.approx(0.012)
    r = rung(ok, 5)
    assert r["meets_slo"] is True and r["per_task_at_full_load_usd"] == pytest.approx(1.408 / 900)
    assert r["flip_tasks_per_month"] == pytest.approx(730 * 1.408 / 0.012)
    assert ok["cheapest_level"] == 2                      # $1,027.84 a month against $1,200
    # The same capacity over a 5 s target: the self-hosted rungs miss it and drop out.
    tight = cli_json("--bench", str(path), "--model", SONNET, "--instance", "ml.g5.xlarge", "--slo-p99", "5000")
    assert rung(tight, 5)["meets_slo"] is False and tight["cheapest_level"] == 1
    assert any("over the 5,000 ms target" in a for a in tight["assumptions"])
    assert not any("rerun it against the real endpoint" in a for a in tight["assumptions"])    # it ran on aws


def test_a_bench_run_here_says_it_was_not_the_priced_instance(tmp_path):
    path = agent_bench(tmp_path)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "target": "local"}))
    data = cli_json("--bench", str(path), "--model", SONNET, "--instance", "ml.g5.xlarge")
    assert any("ran on target 'local', not on ml.g5.xlarge" in a for a in data["assumptions"])


def test_a_cheap_model_never_flips(tmp_path):
    # Nova Micro: $0.000126 a task; a replica's 657,000 tasks a month earn $82.78 < $1,027.84.
    data = cli_json("--bench", str(agent_bench(tmp_path)), "--model", NOVA_MICRO, "--instance", "ml.g5.xlarge",
                    "--tasks-per-month", "1000000")
    assert rung(data, 1)["per_task_usd"] == pytest.approx(0.000126)
    assert rung(data, 2)["replicas"] == 2 and rung(data, 2)["flip_tasks_per_month"] is None
    assert data["flip"] is None


@pytest.mark.parametrize("args, message", [
    (["--model", QWEN, "--instance", "ml.g5.xlarge"], "one of the arguments --trace --bench is required"),
    (["--trace", "missing.json", "--model", QWEN, "--instance", "ml.g5.xlarge"], "does not exist"),
    (["--trace", "TRACE", "--instance", "ml.g5.xlarge"], "give --model"),
    (["--trace", "TRACE", "--model", QWEN, "--instance", "ml.g5.xlarge", "--slo-p99", "0"],
     "--slo-p99 0 ms is out of range"),
    (["--trace", "TRACE", "--model", QWEN, "--instance", "ml.g5.xlarge", "--mix", "3:1"], "--mix does not apply"),
    (["--bench", "TRACE", "--model", QWEN, "--instance", "ml.g5.xlarge"], "is not an agent bench"),
])
def test_bad_input_says_what_to_do(trace, args, message):
    args = [str(trace) if a == "TRACE" else a for a in args]
    done = cli(*args, code=2)
    assert message in done.stderr


def test_a_trace_without_calls_is_refused(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"schema": "spectrum.agent-trace/1", "calls": []}))
    done = cli("--trace", str(path), "--model", QWEN, "--instance", "ml.g5.xlarge", code=2)
    assert "has no calls" in done.stderr


def test_a_trace_is_priced_on_a_capacity_from_specs_and_reuse_lowers_its_cost(trace):
    """--hf-model: one replica's saturated output tok/s predicted at the task's mean call (10,000 in /
    1,000 out over three calls), as `cost capacity` gives it; reused prompts make a task cheaper."""
    args = ("--trace", str(trace), "--model", QWEN, "--instance", "ml.g6e.xlarge", "--hf-model", "Qwen/Qwen3-32B",
            "--dtype", "fp8")
    plain, reused = cli_json(*args), cli_json(*args, "--prefix-cache-hit-rate", "0.5")
    _, spec = capacity_for("Qwen/Qwen3-32B", instance="g6e.xlarge", dtype="fp8", input_tokens=10_000 / 3,
                           output_tokens=1_000 / 3)
    note = next(a for a in plain["assumptions"] if a.startswith("one replica:"))
    assert f"{spec['saturated_output_tok_s']:,.1f} output tok/s (specs: Qwen/Qwen3-32B (fp8) on 1× l40s" in note
    assert "50% of prompt tokens from the prefix cache" in next(a for a in reused["assumptions"]
                                                                if a.startswith("one replica:"))
    assert rung(reused, 2)["per_task_at_full_load_usd"] < rung(plain, 2)["per_task_at_full_load_usd"]


@pytest.mark.parametrize("args, message", [
    (["--bench", "BENCH", "--hf-model", "Qwen/Qwen3-32B"], "an agent bench carries its measured capacity"),
    (["--trace", "TRACE", "--capacity", "500", "--hf-model", "Qwen/Qwen3-32B"], "not both"),
    (["--trace", "TRACE", "--capacity", "500", "--prefix-cache-hit-rate", "0.3"], "give --hf-model"),
])
def test_a_capacity_from_specs_is_refused_where_another_is_given(trace, tmp_path, args, message):
    bench = str(agent_bench(tmp_path))
    args = [str(trace) if a == "TRACE" else bench if a == "BENCH" else a for a in args]
    done = cli(*args, "--model", QWEN, "--instance", "ml.g6e.xlarge", code=2)
    assert message in done.stderr
