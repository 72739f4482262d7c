"""``python -m options.bench --profile capacity``: the plan and the limits (pure), bad input
(exit 2 before any server starts), and one profile of the bench's shared server (vLLM on CPU,
tiny model) whose fitted model must reproduce what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from bench_profiles import FIT_BOUND, decode_bound
from shared_servers import PLAIN_MAX_MODEL_LEN as MAX_MODEL_LEN   # the shared server's context
from cost.simulate.capacity import STEADY_MIN_OUTPUT, TOLERANCE, load_capacity
from options.bench.capacity import (CapacityPlan, ServerLimits, _configured_limits,
                                    kv_cache_from_metrics, steady_phase, steady_points)
from options.bench.metrics import RequestRecord
from options.core import BadInput

CACHE_INFO = ('vllm:cache_config_info{block_size="128",engine="0",kv_cache_size_tokens="%s",'
              'num_gpu_blocks="16384"} 1.0\n')


def limits(**values) -> ServerLimits:
    out = ServerLimits()
    base = {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "kv_cache_tokens": 2_097_152,
            "max_model_len": MAX_MODEL_LEN}
    for name, value in {**base, **values}.items():
        out.set(name, value, "test")
    return out


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "options.bench", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


# --- pure ----------------------------------------------------------------------------------------

def test_the_plan_spans_the_servers_limits():
    plan = CapacityPlan.for_limits(limits())
    assert plan.serial_prompts[0] == 16 and plan.serial_prompts[-1] <= 0.9 * MAX_MODEL_LEN
    assert len(plan.serial_prompts) == 6
    assert [c for c, p in plan.decode if p == 128] == [1, 2, 4, 8, 16, 32, 64]
    long = [(c, p) for c, p in plan.decode if p != 128]
    assert [c for c, _ in long] == [1, 4, 16] and all(p + 64 <= MAX_MODEL_LEN for _, p in long)
    assert plan.mixed_background == 8 and plan.mixed_prompt + 8 <= 2048


def test_a_small_server_gets_a_smaller_plan():
    plan = CapacityPlan.for_limits(limits(max_num_seqs=4, kv_cache_tokens=2000))
    assert max(c for c, _ in plan.decode) == 4 and plan.mixed_background == 3
    assert all(c * (p + 64) <= 2000 for c, p in plan.decode)
    with pytest.raises(BadInput, match="max_model_len 40 leaves no room"):
        CapacityPlan.for_limits(limits(max_model_len=40))


def test_the_kv_cache_comes_from_vllms_cache_config_info():
    page = "# HELP x\nvllm:num_requests_running 0.0\n" + CACHE_INFO % "2097152"
    assert kv_cache_from_metrics(page) == (2_097_152, "/metrics vllm:cache_config_info kv_cache_size_tokens")
    older = CACHE_INFO.replace('kv_cache_size_tokens="%s",', "")     # blocks × block size instead
    assert kv_cache_from_metrics(older)[0] == 16384 * 128
    assert kv_cache_from_metrics("vllm:num_requests_running 0.0\n") is None


def test_a_started_servers_limits_are_read_as_the_server_reads_them(monkeypatch):
    for var in ("SM_VLLM_MAX_NUM_SEQS", "OPTION_MAX_ROLLING_BATCH_SIZE", "MAX_BATCH_SIZE",
                "SM_VLLM_MAX_NUM_BATCHED_TOKENS", "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS"):
        monkeypatch.delenv(var, raising=False)
    args = argparse.Namespace(server_env={"OPTION_MAX_ROLLING_BATCH_SIZE": "16",
                                          "SM_VLLM_MAX_NUM_BATCHED_TOKENS": "4096"})
    got = _configured_limits(args)
    assert got["max_num_seqs"][0] == 16 and "OPTION_MAX_ROLLING_BATCH_SIZE=16" in got["max_num_seqs"][1]
    assert got["max_num_batched_tokens"][0] == 4096


def _answered(prompt: int, first_s: float, tokens: int, tpot_s: float) -> RequestRecord:
    return RequestRecord(ttft_s=first_s, e2e_s=first_s + (tokens - 1) * tpot_s, input_tokens=prompt,
                         output_tokens=tokens)


def test_steady_points_group_requests_by_the_batch_their_decode_met():
    # 24 requests decoding side by side (first token at 10 ms, 20 tokens 2 ms apart), then 24
    # decoding alone, one after another: two batches, two groups, each as it was.
    together = [(0.0, _answered(100, 0.010, 20, 0.002)) for _ in range(24)]
    alone = [(1.0 + k, _answered(300, 0.010, 20, 0.004)) for k in range(24)]
    sent, records = zip(*(together + alone))
    points = steady_points(list(sent), list(records), groups=6, min_group=12)
    assert [p["requests"] for p in points] == [12, 12, 12, 12][:len(points)] and len(points) == 4
    lone, full = points[0], points[-1]
    assert lone["decoding_seqs"] == pytest.approx(1.0) and lone["tpot_s"] == pytest.approx(0.004)
    assert lone["kv_tokens"] == pytest.approx(300 + 10, rel=0.02)      # its prompt and half its answer
    assert full["decoding_seqs"] == pytest.approx(24.0) and full["tpot_s"] == pytest.approx(0.002)
    assert full["kv_tokens"] == pytest.approx(24 * (100 + 10), rel=0.02)
    assert lone["prefill_tokens_per_s"] == 0 and full["prefill_tokens_per_s"] == 0   # none arrived meanwhile


def test_a_steady_phase_keeps_its_answered_requests_to_group_again():
    together = [(0.0, _answered(100, 0.010, 20, 0.002)) for _ in range(24)]
    alone = [(1.0 + k, _answered(300, 0.010, 20, 0.004)) for k in range(24)]
    sent, records = map(list, zip(*(together + alone)))
    sent.append(None)
    records.append(RequestRecord(error="client_overloaded"))      # never sent
    sent.append(30.0)
    records.append(RequestRecord(error="http_503"))               # sent, not answered
    view = {"requests": 48, "mean_ms": {"ttft": 8.0, "queue": 0.0, "prefill": 6.0, "e2e": 60.0}}
    phase = steady_phase(0.6, 25.0, sent, records, view)
    assert (phase["load"], phase["request_rate"], phase["sent"], phase["server"]) == (0.6, 25.0, 50, view)
    kept = phase["requests"]
    assert all(len(column) == 48 for column in kept.values())
    again = steady_points(kept["sent_s"], [RequestRecord(ttft_s=f, e2e_s=e, input_tokens=i, output_tokens=o)
                                           for f, e, i, o in zip(kept["ttft_s"], kept["e2e_s"], kept["input_tokens"],
                                                                 kept["output_tokens"])], groups=6, min_group=12)
    first = steady_points(sent, records, groups=6, min_group=12)
    assert len(again) == len(first) == 4
    for a, b in zip(again, first):                                # the same, to the kept rounding
        assert a == {k: pytest.approx(v, rel=1e-4) if isinstance(v, float) else v for k, v in b.items()}
    json.dumps(phase)                                             # it goes into the profile's JSON as it is


def test_a_steady_point_counts_the_prompts_prefilled_while_it_decodes():
    # A long answer (first token at 0.01 s, last at 1.01 s) while 30 short requests get their
    # first token inside it: 30 × 200 prompt tokens in 1 s. Too few answers make no point.
    long = (0.0, _answered(50, 0.01, 101, 0.01))
    short = [(0.1 + 0.02 * k, _answered(200, 0.005, STEADY_MIN_OUTPUT, 0.001)) for k in range(30)]
    sent, records = zip(long, *short)
    points = steady_points(list(sent), list(records), groups=1, min_group=31)
    assert points[0]["prefill_tokens_per_s"] > 0
    by_itself = steady_points(list(sent), list(records), groups=31, min_group=1)
    top = max(by_itself, key=lambda p: p["tpot_s"])
    assert top["tpot_s"] == pytest.approx(0.01) and top["prefill_tokens_per_s"] == pytest.approx(30 * 200, rel=1e-6)
    failed = [RequestRecord(error="http_503")] * 40
    assert steady_points([0.0] * 40, failed) == []
    assert steady_points(list(sent), list(records), groups=6, min_group=40) == []


@pytest.mark.parametrize("extra, message", [
    (["--adapters", "a1"], "leave out --adapters"),
    (["--level", "1"], "Bedrock has no switch"),
    (["--rounds", "0"], "--rounds 0 must be at least 1"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0 must be at least 1"),
    (["--replay", "x.csv", "--load", "0.5"], "--load paces a replay; --profile capacity saturates"),
    (["--max-input", "512"], "--max-input clips a trace's sizes: add --replay TRACE"),
    (["--window", "0:60"], "--window"),
    (["--replay", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
])
def test_bad_input_is_exit_2_before_any_server_starts(extra, message):
    done = _cli("--profile", "capacity", *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout + done.stderr
    assert "starting the local server" not in done.stdout + done.stderr


# --- against the real server -------------------------------------------------------------------
# The bench's shared server, profiled with a trace's mix (conftest.py's trace_profile): the plan's
# points, then the mix saturating the server and held steady below it.

@pytest.mark.engine
def test_the_profile_measures_every_point_and_the_servers_limits(trace_profile):
    doc, stdout = trace_profile.doc, trace_profile.stdout
    assert doc["schema"] == "spectrum.bench/1" and doc["counts"]["errors"] == {}
    assert doc["metrics"]["output_tokens_per_second"] > 0            # older readers' capacity
    assert doc["profile"]["concurrency"] == 64
    profile = doc["capacity_profile"]
    assert profile["schema"] == "spectrum.capacity_profile/1" and profile["rounds"] == 3
    lim, src = profile["limits"], profile["limit_sources"]
    assert lim["max_model_len"] == MAX_MODEL_LEN and src["max_model_len"] == "GET /v1/models"
    # The server says its scheduler limits on /v1/models.
    assert lim["max_num_seqs"] == 128 and src["max_num_seqs"] == "GET /v1/models"
    assert lim["max_num_batched_tokens"] == 2048 and src["max_num_batched_tokens"] == "GET /v1/models"
    assert lim["kv_cache_tokens"] > 100_000 and "cache_config_info" in src["kv_cache_tokens"]
    kinds = [p["kind"] for p in profile["points"]]
    assert kinds.count("prefill") == 6 and kinds.count("mixed") == 1
    decode = [p for p in profile["points"] if p["kind"] == "decode"]
    assert sorted(p["requests"] for p in decode if p["prompt_tokens"] < 200) == [1, 2, 4, 8, 16, 32, 64]
    assert all(p["step_s"] > 0 and p["itl_p50_s"] > 0 and p["samples"] >= 12 for p in decode)
    for name in ("capacity profile: measured vs the fitted model", "fitted model", "within 10%", "within 15%"):
        assert name in stdout


@pytest.mark.engine
def test_the_fitted_model_is_positive_and_reproduces_its_points(trace_profile):
    path, doc, stdout = trace_profile.path, trace_profile.doc, trace_profile.stdout
    model = doc["capacity_model"]
    assert model["schema"] == "spectrum.capacity/1"
    for name in ("step_base_s", "step_per_seq_s", "prefill_per_token_s", "request_overhead_s"):
        assert model[name] > 0, name
    # The tiny model's attention (one KV head of 64) is cheap: its KV share may fit to ~0, never below.
    assert model["step_per_kv_token_s"] >= 0
    # The bench prints its own 10 % / 15 % check (TOLERANCE); the test holds the fit to
    # bench_profiles.py's FIT_BOUND, which says why.
    check = model["fit"]["check"]
    assert TOLERANCE == {"decode": 0.10, "prefill": 0.15}
    assert check["decode"]["worst"] <= decode_bound(model["fit"]), stdout[-3000:]
    assert check["prefill"]["worst"] <= FIT_BOUND, stdout[-3000:]
    loaded = load_capacity(path)                     # what python -m cost simulate --bench reads
    assert loaded.coefficients() == tuple(model[k] for k in ("step_base_s", "step_per_seq_s",
                                                             "step_per_kv_token_s", "prefill_per_token_s",
                                                             "request_overhead_s"))
    assert loaded.source.startswith(f"bench {path} (fitted from")
    # Its saturated rate at the burst's sizes is at least what 64 at once achieved.
    assert loaded.saturated_output_tok_s(128, 64) >= 0.6 * doc["metrics"]["output_tokens_per_second"]
