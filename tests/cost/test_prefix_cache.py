"""Prompts the prefix cache serves (``--prefix-cache-hit-rate``): the replica skips their prefill but
keeps them in the KV cache, the saturated rate and the specs model follow, and every command that
takes a capacity model takes the rate, while those holding only a measured figure refuse it.
Pure simulation and the real CLI in subprocesses: no server, no GPU."""
from __future__ import annotations

import dataclasses
import json

import pytest
from cost_cli import TRACE, cost, cost_json

from cost.hardware.predict import burst, capacity_for, closed_loop
from cost.simulate.capacity import CapacityModel, load_capacity
from options.core import BadInput

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
BEDROCK = "meta.llama3-1-8b-instruct-v1:0"

PLAIN = CapacityModel(step_base_s=2e-3, step_per_seq_s=1e-4, step_per_kv_token_s=1e-7, prefill_per_token_s=1e-5,
                      max_num_seqs=8, max_num_batched_tokens=4096, kv_cache_tokens=20_000, max_model_len=None,
                      request_overhead_s=3e-3, source="test")


def test_the_cached_head_is_whole_tokens_and_never_the_last_one():
    cached = PLAIN.with_prefix_cache(0.75)
    assert PLAIN.cached_prompt_tokens(1000) == 0
    assert cached.cached_prompt_tokens(1000) == 750
    assert cached.cached_prompt_tokens(1001) == 750          # whole tokens, rounded down
    assert cached.with_prefix_cache(0.999).cached_prompt_tokens(10) == 9   # the last token is computed
    assert cached.cached_prompt_tokens(1) == 0 and cached.cached_prompt_tokens(0) == 0
    assert PLAIN.with_prefix_cache(0) is PLAIN and PLAIN.with_prefix_cache(None) is PLAIN
    assert "75% of prompt tokens" in cached.source and "75% of prompt tokens cached" in cached.describe()


@pytest.mark.parametrize("bad", [1.0, -0.1, 2, "half", float("nan")])
def test_a_hit_rate_outside_0_to_1_is_refused_naming_it(bad):
    with pytest.raises(BadInput, match=r"--prefix-cache-hit-rate .* must be a number from 0 up to \(not including\) 1"):
        PLAIN.with_prefix_cache(bad)
    with pytest.raises(BadInput, match=r"prefix_cache_hit_rate"):
        dataclasses.replace(PLAIN, prefix_cache_hit_rate=bad)


def test_an_idle_replica_prefills_only_the_uncached_tail_over_the_whole_context():
    cached = PLAIN.with_prefix_cache(0.5)
    run = burst(cached, [3000], [1])
    # one step computing 1,500 tokens while holding 3,000 in the KV cache
    assert run["ttft_ms"]["mean"] == pytest.approx((3e-3 + PLAIN.step_s(1, 3000, 1500)) * 1000, abs=1e-3)
    assert cached.idle_ttft_s(3000) == pytest.approx(3e-3 + PLAIN.step_s(1, 3000, 1500))
    # a prompt longer than the step's budget: only its uncached tail is chunked
    long = PLAIN.idle_ttft_s(6000)
    assert long == pytest.approx(3e-3 + PLAIN.step_s(1, 4096, 4096) + PLAIN.step_s(1, 6000, 1904))
    assert cached.idle_ttft_s(6000) == pytest.approx(3e-3 + PLAIN.step_s(1, 6000, 3000))


def test_cached_prompts_still_hold_their_whole_kv_so_admission_does_not_loosen():
    """Two requests whose prompt and answer each take most of the cache: the second waits for the
    first with or without reuse (each request's blocks are reserved whole: the cautious side)."""
    small = dataclasses.replace(PLAIN, kv_cache_tokens=12_000)
    for model in (small, small.with_prefix_cache(0.9)):
        ttfts = burst(model, [8000, 8000], [100, 100])["ttft_ms"]
        # the second starts after the first's 100 tokens
        assert ttfts["p99"] - ttfts["p50"] > 99 * model.step_s(1, 8000, 0) * 1000 / 2


def test_reuse_raises_the_saturated_rate_and_cuts_a_closed_loops_ttft():
    base, _ = capacity_for(LLAMA, gpu="h100", input_tokens=2000, output_tokens=200)
    reused, details = capacity_for(LLAMA, gpu="h100", input_tokens=2000, output_tokens=200,
                                   prefix_cache_hit_rate=0.8)
    assert reused.prefix_cache_hit_rate == 0.8 and "80% of prompt tokens from the prefix cache" in reused.source
    assert any("prefix cache" in a["what"] and a["value"] == "80.0% of prompt tokens" for a in details["assumptions"])
    # The computed tail attends over the cached head: dearer a token, far fewer tokens.
    assert reused.prefill_per_token_s > base.prefill_per_token_s
    assert reused.saturated_output_tok_s(2000, 200) > 1.3 * base.saturated_output_tok_s(2000, 200)
    assert closed_loop(reused, 16, 2000, 200)["ttft_ms"]["mean"] < 0.6 * closed_loop(base, 16, 2000, 200)["ttft_ms"]["mean"]
    # The KV cache and what it holds do not change.
    assert details["kv_cache_tokens"] == capacity_for(LLAMA, gpu="h100")[1]["kv_cache_tokens"]


def test_the_rate_round_trips_through_json(tmp_path):
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(PLAIN.with_prefix_cache(0.4).to_json()))
    saved = load_capacity(path)
    assert saved.prefix_cache_hit_rate == 0.4
    assert saved.with_prefix_cache(None) is saved                      # not given: as saved
    assert saved.with_prefix_cache(0).prefix_cache_hit_rate == 0.0     # given 0: no reuse
    path.write_text(json.dumps({k: v for k, v in PLAIN.to_json().items() if k != "prefix_cache_hit_rate"}))
    assert load_capacity(path).prefix_cache_hit_rate == 0.0       # a file from before the field: no reuse


def test_capacity_and_predict_take_the_rate_from_specs_or_a_bench(tmp_path):
    spec = cost_json("capacity", "--model", LLAMA, "--gpu", "h100", "--input-tokens", "2000", "--output-tokens",
                     "200", "--prefix-cache-hit-rate", "0.6")
    plain = cost_json("capacity", "--model", LLAMA, "--gpu", "h100", "--input-tokens", "2000", "--output-tokens",
                      "200")
    assert spec["capacity"]["prefix_cache_hit_rate"] == 0.6
    table = cost("capacity", "--model", LLAMA, "--gpu", "h100", "--prefix-cache-hit-rate", "0.6")
    assert table.returncode == 0 and "(60% of prompt tokens from the prefix cache)" in table.stdout
    assert spec["saturated_output_tok_s"] > plain["saturated_output_tok_s"]
    bench = tmp_path / "cap.json"
    bench.write_text(json.dumps(plain["capacity"]))
    window = ("--trace", TRACE, "--window", "0:300", "--bench", str(bench))
    without, with_reuse = cost_json("predict", *window), cost_json("predict", *window, "--prefix-cache-hit-rate", "0.6")
    assert with_reuse["capacity"]["prefix_cache_hit_rate"] == 0.6
    assert with_reuse["predicted"]["ttft_ms"]["mean"] < without["predicted"]["ttft_ms"]["mean"]


def test_simulate_applies_the_rate_to_the_replica_it_runs():
    args = ("simulate", "--trace", TRACE, "--window", "0:300", "--model", BEDROCK, "--instance", "ml.g5.xlarge",
            "--rungs", "3", "--no-progress", "--slo-ttft-ms", "2000", "--slo-e2e-ms", "60000", "--capacity", "1500")
    without, with_reuse = cost_json(*args), cost_json(*args, "--prefix-cache-hit-rate", "0.5")
    assert with_reuse["capacity"]["source"].endswith("50% of prompt tokens from the prefix cache")
    assert (with_reuse["rungs"][0]["ttft_ms"]["p50"] < without["rungs"][0]["ttft_ms"]["p50"])


@pytest.mark.parametrize("args, says", [
    (("capacity", "--model", LLAMA, "--gpu", "h100", "--prefix-cache-hit-rate", "1"),
     "--prefix-cache-hit-rate 1.0 must be a number from 0 up to (not including) 1"),
    (("breakeven", "--model", BEDROCK, "--instance", "g5.xlarge", "--capacity", "1500", "--prefix-cache-hit-rate",
      "0.3"), "here the capacity is a measured throughput"),
    (("compare", "--model", BEDROCK, "--instance", "g5.xlarge", "--tokens-per-month", "1e9",
      "--prefix-cache-hit-rate", "0.3"),
     "here the capacity is not given"),
    (("recommend", "--trace", TRACE, "--window", "0:60", "--model", BEDROCK, "--hf-model", LLAMA, "--instances",
      "g5", "--slo-ttft-ms", "3000", "--slo-e2e-ms", "60000", "--prefix-cache-hit-rate", "1.5"),
     "--prefix-cache-hit-rate 1.5 must be a number from 0 up to (not including) 1"),
])
def test_a_rate_that_cannot_apply_exits_2_saying_why(args, says):
    done = cost(*args)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
