"""The bench against the real bring-your-own server (vLLM on CPU, tiny model): exact counts.

With ``ignore_eos`` and fixed lengths every request must produce exactly ``max_tokens``
tokens, so the server-reported total is known in advance: requests × max_tokens.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from options.bench import runner
from options.bench.metrics import summarize
from options.bench.profile import Profile, parse_lengths
from options.contract import Request

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server_url(plain_server):
    return plain_server.url


def _cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "options.bench", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bench_file(server_url, tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    done = _cli("--url", server_url, "--level", "5", "--requests", "16", "--concurrency", "4",
                "--prompt-tokens", "20", "--output-tokens", "24", "--ignore-eos", "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TTFT" in done.stdout and "output tokens/s" in done.stdout     # the table for people
    return path


def test_cli_counts_exactly_requests_times_max_tokens(bench_file):
    doc = json.loads(bench_file.read_text())
    assert doc["schema"] == "spectrum.bench/1" and doc["level"] == 5 and doc["target"] == "local"
    assert doc["counts"]["completed"] == 16 and doc["counts"]["errors"] == {}
    assert doc["counts"]["output_tokens"] == 16 * 24
    # Prompts were sized with the server's own token counts (calibration): about 20 each.
    assert doc["counts"]["input_tokens"] / 16 == pytest.approx(20, rel=0.3)
    assert doc["details"]["prompt_calibration"]["tokens_per_word"] > 0
    assert doc["model"] == doc["details"]["served_model"] and doc["model"]   # from GET /v1/models
    m = doc["metrics"]
    assert m["output_tokens_per_second"] == pytest.approx(16 * 24 / doc["duration_s"])
    assert m["requests_per_second"] == pytest.approx(16 / doc["duration_s"])
    assert 0 < m["ttft_ms"]["p50"] <= m["e2e_ms"]["p50"]
    assert m["tpot_ms"]["mean"] > 0 and m["itl_ms"]["p99"] >= m["itl_ms"]["p50"] > 0
    assert doc["profile"]["output_tokens"] == {"kind": "fixed", "value": 24}


@pytest.mark.parametrize("dialect", ["openai-chat", "tgi"])
def test_other_dialects_count_exactly_with_poisson_arrivals(server_url, dialect):
    profile = Profile(requests=8, prompt_tokens=parse_lengths("12", "--prompt-tokens", ()),
                      output_tokens=parse_lengths("uniform:4:20", "--output-tokens", ()),
                      concurrency=None, request_rate=40.0, burstiness=0.5, seed=3)
    expected = sum(n for _, _, n in profile.plan())
    path = "/invocations" if dialect == "tgi" else None
    run = runner.run(profile, runner.http_target(server_url, dialect, path),
                     Request(prompt="-", ignore_eos=True, stream=True))
    s = summarize(run.records, run.duration_s)
    assert s.errors == {} and s.completed == 8
    assert s.output_tokens == expected
    assert all(r.e2e_s == pytest.approx(r.ttft_s + sum(r.itl_s)) for r in run.records)


def test_errors_are_counted_by_kind_and_the_exit_code_says_so(plain_server, tmp_path):
    path = tmp_path / "bad.json"
    # More output than the context holds: the server refuses each request with a 400.
    context = int(plain_server.env["SM_VLLM_MAX_MODEL_LEN"])
    done = _cli("--url", plain_server.url, "--requests", "3", "--concurrency", "3", "--warmup", "0",
                "--output-tokens", str(context * 4), "--json", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(path.read_text())
    assert doc["counts"]["errors"] == {"http_400": 3} and doc["counts"]["completed"] == 0


def test_a_bench_changes_the_breakeven_answer(bench_file):
    base = ["-m", "cost", "breakeven", "--model", "qwen.qwen3-32b-v1:0", "--instance", "ml.g6e.xlarge", "--json"]
    without = json.loads(subprocess.run([sys.executable, *base], capture_output=True, text=True,
                                        check=True).stdout)
    done = subprocess.run([sys.executable, *base, "--bench", str(bench_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with_bench = json.loads(done.stdout)
    measured = json.loads(bench_file.read_text())["metrics"]["output_tokens_per_second"]
    assert "capacity" not in without or without["capacity"] is None
    assert with_bench["capacity"]["output_tokens_per_second"] == pytest.approx(measured)
    assert with_bench["verdict"] != without["verdict"]
    assert with_bench["self_hosted_per_million"] is not None
