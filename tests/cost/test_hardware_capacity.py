"""Capacity from specs (cost.hardware): vLLM's memory arithmetic against its logged KV sizes, fit and
no-fit, the roofline's step shape, the CLI's answers and refusals, and the shipped efficiencies
against the public calibration points. Pure: no server, no GPU."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cost.hardware import catalog, gpus
from cost.hardware.memory import LOGGED_KV_SIZES, EngineFlags, engine_defaults, plan_memory
from cost.hardware.predict import DoesNotFit, burst, capacity_for, closed_loop, open_loop
from cost.simulate.capacity import CapacityModel, load_capacity
from options.core import BadInput

ROOT = Path(__file__).resolve().parents[2]
POINTS = ROOT / "benchmarks" / "capacity-calibration" / "points.json"


def cost_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cost", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


# --- memory --------------------------------------------------------------------------------------

@pytest.mark.parametrize("logged", LOGGED_KV_SIZES, ids=lambda p: p["model"].split("/")[1])
def test_kv_cache_size_is_within_3_percent_of_what_vllm_logged(logged):
    model, gpu = catalog.resolve(logged["model"]), gpus.gpu(logged["gpu"])
    plan = plan_memory(model, gpu, logged["tp"], "bf16", 2, EngineFlags(max_num_batched_tokens=2048,
                                                                        max_num_seqs=256))
    assert plan.kv_cache_tokens == pytest.approx(logged["kv_cache_tokens"], rel=0.03)
    assert plan.kv_cache_tokens % 16 == 0          # whole blocks


def test_engine_defaults_follow_vllms_table_by_gpu():
    assert engine_defaults(gpus.gpu("h100")) == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
    assert engine_defaults(gpus.gpu("b200")) == {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}
    # An A100 stays small even with 80 GB (vLLM PR #17885); a 24 GB GPU too.
    assert engine_defaults(gpus.gpu("a100-80gb")) == {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
    assert engine_defaults(gpus.gpu("l4"))["max_num_batched_tokens"] == 2048


def test_a_context_the_cache_cannot_hold_is_lowered_and_said():
    _, details = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="a10g")
    memory = details["memory"]
    assert memory["max_model_len_lowered_from"] == 131072
    assert memory["max_model_len"] <= details["kv_cache_tokens"]
    assert any("max_model_len lowered" in a["what"] for a in details["assumptions"])


def test_an_explicit_context_larger_than_the_cache_is_refused_with_the_limit():
    with pytest.raises(DoesNotFit, match=r"--max-model-len <= [\d,]+"):
        capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="a10g", max_model_len=131072)


# --- fit / no fit --------------------------------------------------------------------------------

def test_70b_bf16_on_one_l40s_is_refused_with_the_figures_and_what_fits():
    with pytest.raises(DoesNotFit) as info:
        capacity_for("meta-llama/Llama-3.1-70B-Instruct", gpu="l40s")
    text = str(info.value)
    assert "does not fit: weights 131.4 GiB per GPU" in text
    assert "GiB left per GPU" in text
    assert "--tp 4 on 4× l40s" in text          # the smallest TP that holds it
    assert "--instance" in text


def test_70b_on_four_l40s_at_tp4_fits():
    capacity, details = capacity_for("meta-llama/Llama-3.1-70B-Instruct", instance="g6e.12xlarge")
    assert json.loads(json.dumps(details)) == details          # JSON as it stands
    assert details["hardware"]["tp"] == 4 and details["hardware"]["link"] == "pcie"
    assert details["weights_gib"] == pytest.approx(131.4 / 4, rel=0.01)
    assert details["kv_cache_tokens"] > 50_000
    assert capacity.max_num_seqs == 256 and capacity.max_num_batched_tokens == 2048


def test_fp8_makes_a_70b_fit_one_h200_and_halves_its_weights():
    bf16 = catalog.resolve("meta-llama/Llama-3.1-70B-Instruct").weight_bytes("bf16")
    _, details = capacity_for("meta-llama/Llama-3.1-70B-Instruct", gpu="h200", dtype="fp8")
    # Linear layers at 1 byte; the embedding and lm_head (2.1 B parameters) stay 16-bit.
    assert details["model"]["weights_gib"] * 2**30 == pytest.approx(bf16 / 2, rel=0.04)


def test_fp8_on_an_a100_is_modelled_weight_only_and_says_so():
    _, details = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="a100-80gb", dtype="fp8")
    assert any("dequantised in the kernel" in a["what"] for a in details["assumptions"])


def test_mxfp4_experts_keep_16_bit_activations_even_where_the_gpu_has_fp4_matmuls():
    """vLLM's MXFP4 MoE backends (gpt-oss) take BF16 activations on B200 as on Hopper, where an
    NVFP4 checkpoint ("fp4" on a 16-bit one) runs the B200's FP4 matmuls."""
    def matmuls(model, dtype):
        capacity, details = capacity_for(model, gpu="b200", dtype=dtype)
        (what,) = [a for a in details["assumptions"] if a["what"].startswith("matmuls in ")]
        return capacity, what["what"]

    oss, what = matmuls("openai/gpt-oss-120b", "auto")
    assert what.startswith("matmuls in bf16 with mxfp4 weights dequantised"), what
    same, _ = matmuls("openai/gpt-oss-120b", "fp4")       # fp4 on an MXFP4 checkpoint is its own
    assert same.gemm_per_token_s == oss.gemm_per_token_s
    _, what = matmuls("meta-llama/Llama-3.1-70B-Instruct", "fp4")
    assert what == "matmuls in fp4", what


# --- the roofline's shape ------------------------------------------------------------------------

def test_mxfp4_on_blackwell_says_what_vllms_recipe_runs_instead():
    """The B200 runs gpt-oss's experts as vLLM does by default; its own recipe's FP8 activations
    are not modelled, and the assumptions say so with what that recipe measured."""
    def notes(gpu):
        _, details = capacity_for("openai/gpt-oss-120b", gpu=gpu)
        return [a for a in details["assumptions"] if "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8" in a["what"]]

    (note,) = notes("b200")
    assert "0.73" in note["value"] and "capacity-inferencex" in note["source"]
    assert notes("h100") == []


def test_decode_at_batch_one_is_bounded_below_by_reading_the_weights():
    capacity, details = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100")
    weights_s = details["model"]["weights_gib"] * 2**30 / (3350e9)
    assert capacity.step_s(1, 1000, 0) > weights_s
    # Up to the knee more sequences cost little; far past it matmuls dominate.
    assert capacity.step_s(8, 8000, 0) < 1.2 * capacity.step_s(1, 1000, 0)
    assert capacity.step_s(2048, 0, 0) > 2 * capacity.step_s(1, 0, 0)


def test_a_moe_step_reads_more_experts_as_its_tokens_touch_more():
    capacity, _ = capacity_for("mistralai/Mixtral-8x7B-Instruct-v0.1", gpu="h100", tp=2, gpus=2)
    assert capacity.experts == 8 and capacity.experts_per_token == 2
    one, many = capacity.gemm_s(1), capacity.gemm_s(64)
    assert capacity.weights_read_s < one < many
    # 64 tokens touch (almost) every expert: the whole expert read, 1 - (6/8)^64 of it.
    assert many >= capacity.weights_read_s + capacity.experts_read_s * (1 - 0.75 ** 64) - 1e-12


def test_a_moe_step_pays_the_fused_moe_kernels_floor_and_a_cost_an_expert_touched():
    """Beside bytes and FLOPs, each MoE layer costs the kernels' floor (in the step's base) and a
    cost per expert touched (in gemm_s, by the share touched): Hopper's fitted pair, 32 experts
    of 128 touched by 4 tokens of top-8."""
    from cost.hardware.roofline import efficiency

    eff = efficiency("hopper")
    assert eff.moe_layer_s > 0 and eff.moe_expert_s > 0
    moe, _ = capacity_for("Qwen/Qwen3-30B-A3B", gpu="h100")
    dense, _ = capacity_for("Qwen/Qwen3-8B", gpu="h100")
    assert moe.experts_touch_s == pytest.approx(48 * 128 * eff.moe_expert_s)
    assert moe.step_base_s - 48 * eff.moe_layer_s == pytest.approx(48 * eff.layer_s + eff.step_s)
    assert dense.experts_touch_s == 0
    without = dataclasses.replace(moe, experts_touch_s=0.0)
    touched = 1 - (1 - 8 / 128) ** 4
    assert moe.gemm_s(4) - without.gemm_s(4) == pytest.approx(moe.experts_touch_s * touched)
    with pytest.raises(BadInput, match=r"experts_read_s or experts_touch_s is set, so experts \(0\)"):
        dataclasses.replace(dense, experts_touch_s=1e-3)


# What the shipped MoE kernel terms give the public fused-MoE kernel timings in a decode step's
# regime (the calibration README, "The fused-MoE kernels"): 41 points, median 4.1 %, worst 9.9 %;
# 4-66 % short before the terms.
MOE_KERNEL_MEDIAN_ERROR, MOE_KERNEL_WORST_ERROR = 0.06, 0.15


def test_the_public_fused_moe_kernel_timings_are_reproduced_layer_by_layer():
    """vLLM's and SGLang's published fused-MoE kernel times (five sources, H100, H200, A100,
    L40S; BF16 and FP8; 8-128 experts) against one MoE layer as the step model charges it."""
    from cost.hardware.calibration import moe_kernel_rows

    doc = json.loads((POINTS.parent / "moe-kernels.json").read_text())
    rows = moe_kernel_rows(doc)
    fitted = [r for r in rows if r["fitted"]]
    assert len(fitted) == 41 and {r["family"] for r in fitted} == {"hopper", "ampere", "ada"}
    assert float(np.median([abs(r["error"]) for r in fitted])) <= MOE_KERNEL_MEDIAN_ERROR
    assert max(abs(r["error"]) for r in fitted) <= MOE_KERNEL_WORST_ERROR, max(fitted, key=lambda r: abs(r["error"]))
    # Out of the regime the rows are kept, not fitted: one token read from L2, thousands of tokens.
    assert any(not r["fitted"] and r["tokens"] == 1 for r in rows)
    assert any(not r["fitted"] and r["tokens"] >= 1024 for r in rows)


def _calibrate_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate", POINTS.parent / "calibrate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_blackwell_borrows_hoppers_shares_of_peak_and_has_its_own_fixed_costs():
    from cost.hardware.roofline import efficiency, efficiency_table

    blackwell, hopper = efficiency("blackwell"), efficiency("hopper")
    entry = efficiency_table()["families"]["blackwell"]
    assert (blackwell.bandwidth, blackwell.gemm, blackwell.moe_layer_s) == (hopper.bandwidth, hopper.gemm,
                                                                           hopper.moe_layer_s)
    assert (blackwell.layer_s, blackwell.seq_s) == (entry["layer_s"], entry["seq_s"])
    assert blackwell.layer_s > hopper.layer_s and blackwell.seq_s > hopper.seq_s
    assert "shares of peak are hopper's" in blackwell.source and "ML.ENERGY" in blackwell.source
    # The step carries them: 32 layers and 16 sequences of Llama-3.1-8B on one B200.
    b200, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="b200")
    as_hopper, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="b200",
                                efficiency_override=dataclasses.replace(blackwell, layer_s=hopper.layer_s,
                                                                        seq_s=hopper.seq_s))
    assert b200.step_s(16, 0, 0) - as_hopper.step_s(16, 0, 0) == pytest.approx(
        32 * (blackwell.layer_s - hopper.layer_s) + 16 * (blackwell.seq_s - hopper.seq_s))


def test_a_decode_step_row_moves_linearly_with_the_layer_and_sequence_costs():
    """What the Blackwell fit's grid relies on, against capacity_for itself; and the control is
    the H100's error on the same model, task and max_num_seqs."""
    from cost.hardware.calibration import decode_step_rows, with_control
    from cost.hardware.roofline import efficiency

    def row(gpu, seqs, itl, model="Qwen/Qwen3-14B"):
        return {"model_id": model, "task": "lm-arena-chat", "gpu": gpu, "tp": 1, "max_num_seqs": seqs,
                "avg_batch_size": seqs - 0.1, "median_itl_ms": itl, "avg_output_len": 600.0}

    doc = {"max_num_batched_tokens": 8192, "prompt_tokens": 300,
           "rows": [row("B200", 16, 8.0), row("H100", 16, 13.0), row("H100", 16, 14.0), row("B200", 32, 9.0)]}
    base, _ = decode_step_rows(doc)
    bw = efficiency("blackwell")
    moved = dataclasses.replace(bw, layer_s=bw.layer_s + 10e-6, seq_s=bw.seq_s + 5e-6)
    shifted, _ = decode_step_rows(doc, efficiency_for=lambda family: moved if family == "blackwell" else None)
    assert base[0]["layers"] == 40 and base[0]["batch"] == 16
    assert shifted[0]["predicted_step_ms"] - base[0]["predicted_step_ms"] == pytest.approx(1e3 * (40 * 10e-6 + 16 * 5e-6))
    assert shifted[1]["predicted_step_ms"] == pytest.approx(base[1]["predicted_step_ms"])    # an H100 row
    controlled = with_control(base, "H100")
    assert [r["max_num_seqs"] for r in controlled] == [16]       # no H100 run at 32 sequences
    assert controlled[0]["control_ratio"] == pytest.approx(np.median([base[1]["ratio"], base[2]["ratio"]]))


def test_the_shipped_blackwell_fixed_costs_are_the_fit_on_the_public_decode_steps():
    """ML.ENERGY's B200 decode steps against the H100's on the same runs
    (benchmarks/capacity-calibration/mlenergy-decode.json): the file holds what the fit gives, and
    the fit ships because it predicts each model left out better than Hopper's fixed costs."""
    from cost.hardware.roofline import efficiency

    calibrate = _calibrate_module()
    terms = calibrate.blackwell_terms()
    shipped = efficiency("blackwell")
    assert (shipped.layer_s, shipped.seq_s) == pytest.approx((terms["blackwell.layer_s"], terms["blackwell.seq_s"]),
                                                             rel=1e-3)
    check = calibrate.blackwell_check(terms)
    assert check["rows"] == 52 and check["models"] == 12
    assert check["leave_one_model_out"] < check["borrowed"] - 0.02, check
    assert check["in_sample"] <= 0.08


def test_tensor_parallel_over_pcie_pays_more_per_step_than_over_nvlink():
    pcie, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="l40s", tp=4)
    single, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="l40s", tp=1)
    nvlink, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", tp=4)
    assert pcie.step_base_s > single.step_base_s
    assert pcie.step_base_s - single.step_base_s > nvlink.step_base_s - single.step_base_s


def test_the_simulators_replica_runs_the_roofline_as_its_step_says():
    """A closed loop of one request is its prefill step then one decode step a token, each the
    model's own step_s: the replica's closed form and gemm term agree with it."""
    capacity, _ = capacity_for("Qwen/Qwen3-30B-A3B", gpu="h100")
    run = closed_loop(capacity, 1, 100, 11, requests=3)
    prefill = capacity.step_s(1, 100, 100)
    decode = [capacity.step_s(1, 101 + k, 0) for k in range(10)]
    # the summary keeps its times to the microsecond
    assert run["ttft_ms"]["mean"] == pytest.approx((capacity.request_overhead_s + prefill) * 1000, abs=1e-3)
    assert run["tpot_ms"]["mean"] == pytest.approx(sum(decode) / 10 * 1000, abs=1e-3)


def test_a_benchmarks_closed_loop_counts_the_first_wave_a_steady_state_leaves_out():
    """vllm bench serve --max-concurrency C and AIPerf start C requests at once on an empty
    server and count every request: the first wave's prompts queue through the step's token
    budget, which a steady state (ramp and drain left out) does not see."""
    capacity, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100")
    assert capacity.max_num_batched_tokens == 8192
    c, prompt = 32, 8192
    one_wave = closed_loop(capacity, c, prompt, 64, requests=c, steady_state=False)
    prefill = capacity.step_s(1, prompt, prompt)
    # one prompt a step: the k-th first token comes after about k prefill steps
    assert one_wave["requests"] == c
    assert one_wave["ttft_ms"]["mean"] > 0.9 * (c + 1) / 2 * prefill * 1000
    assert one_wave["ttft_ms"]["p99"] > 0.9 * c * prefill * 1000
    steady = closed_loop(capacity, c, prompt, 64, requests=20 * c)
    counted = closed_loop(capacity, c, prompt, 64, requests=20 * c, steady_state=False)
    assert steady["requests"] == 18 * c and counted["requests"] == 20 * c
    # the first wave carries 1/20 of the counted mean, and its queue is many steady TTFTs long
    assert counted["ttft_ms"]["mean"] > steady["ttft_ms"]["mean"] + one_wave["ttft_ms"]["mean"] / 20 * 0.5
    with pytest.raises(BadInput, match=r"requests 0 must be a whole number >= 1"):
        closed_loop(capacity, c, prompt, 64, requests=0, steady_state=False)


def test_the_front_end_hands_requests_sent_together_to_the_engine_one_at_a_time():
    """vLLM's API server is one event loop: requests sent together reach the engine
    ``frontend_request_s`` apart, which breaks up a closed loop's synchronised waves. The share
    is carved out of the request overhead, so a lone request's latency does not change."""
    capacity, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", dtype="fp16")
    serial = capacity.frontend_request_s
    assert serial == pytest.approx(0.002) and serial < capacity.request_overhead_s
    at_once = dataclasses.replace(capacity, frontend_request_s=0.0)
    # Sixteen one-token answers sent at once: without the front end one step prefills them all.
    spread, together = burst(capacity, [128] * 16, [1] * 16), burst(at_once, [128] * 16, [1] * 16)
    assert together["ttft_ms"]["p99"] - together["ttft_ms"]["p50"] < 1.0
    assert spread["ttft_ms"]["p99"] - spread["ttft_ms"]["p50"] > 0.9 * 7 * serial * 1000
    # A closed loop of 64 fixed-size requests: waves prefilled in one step, or spread out
    waves = closed_loop(at_once, 64, 128, 128)["ttft_ms"]["mean"]
    broken = closed_loop(capacity, 64, 128, 128)["ttft_ms"]["mean"]
    assert broken < waves / 1.5
    with pytest.raises(BadInput, match=r"frontend_request_s = 0.01 must be a number from 0 to request_overhead_s"):
        dataclasses.replace(capacity, frontend_request_s=0.01)


def test_async_scheduling_is_vllms_default_and_can_be_turned_off():
    """vLLM 0.14.0 on schedules each step while the one before it runs: at a steady load a new
    request waits one decode step more for its first token, and the step itself is unchanged."""
    on, details = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100")
    off, details_off = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", async_scheduling=False)
    assert on.async_scheduling is True and off.async_scheduling is False
    assert any(a["what"] == "async scheduling" and "0.14.0" in a["source"] for a in details["assumptions"])
    assert any(a["what"] == "async scheduling off" for a in details_off["assumptions"])
    # Poisson arrivals at 5 a second, ~8 requests in flight: nearly every one meets a busy engine.
    later, sooner = open_loop(on, 5, 1000, 200, requests=400), open_loop(off, 5, 1000, 200, requests=400)
    assert later["tpot_ms"]["mean"] == pytest.approx(sooner["tpot_ms"]["mean"], rel=0.01)
    assert later["ttft_ms"]["mean"] - sooner["ttft_ms"]["mean"] == pytest.approx(sooner["tpot_ms"]["mean"], rel=0.2)
    done = cost_cli("capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100",
                    "--no-async-scheduling", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["capacity"]["async_scheduling"] is False


def test_users_each_waiting_for_their_answer_cap_what_reaches_the_server():
    """``sessions`` U: request i is user (i mod U)'s and is sent no sooner than request i − U ends,
    its clock starting then; a rate the server cannot serve waits at the client, not in a queue."""
    from cost.hardware.predict import _run

    capacity, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100")
    # More users than requests: nobody waits, the same as the open loop.
    assert open_loop(capacity, 5, 1000, 200, requests=300, sessions=300) == open_loop(capacity, 5, 1000, 200,
                                                                                        requests=300)
    # One user: each request leaves when the one before it ends, whatever its arrival.
    arrival = np.arange(40) * 0.01
    sent, first, last = _run(capacity, arrival, np.full(40, 800), np.full(40, 50), sessions=1)
    assert sent[0] == 0.0 and np.all(sent[1:] == np.maximum(arrival[1:], last[:-1]))
    assert np.all(first > sent) and np.all(last >= first)
    # Users sent together: a closed loop of U requests (identical sizes: the same times).
    zero, inputs, outputs = np.zeros(96), np.full(96, 1000), np.full(96, 200)
    users = _run(capacity, zero, inputs, outputs, sessions=8)
    loop = _run(capacity, zero, inputs, outputs, closed_concurrency=8)
    for a, b in zip(users, loop):
        assert np.allclose(np.sort(a), np.sort(b))
    # Far above what one replica serves (200 requests a second): an open loop's queue grows
    # to tens of seconds; 45 users each waiting for an answer keep 45 in flight, as a closed loop.
    queued = open_loop(capacity, 200, 1000, 200, requests=1500)
    chatted = open_loop(capacity, 200, 1000, 200, requests=1500, sessions=45)
    assert queued["ttft_ms"]["mean"] > 50 * chatted["ttft_ms"]["mean"]
    assert chatted["ttft_ms"]["mean"] == pytest.approx(closed_loop(capacity, 45, 1000, 200)["ttft_ms"]["mean"], rel=0.25)
    for bad in (0, True, 2.5):
        with pytest.raises(BadInput, match=f"sessions {bad!r} must be a whole number >= 1"):
            open_loop(capacity, 5, 1000, 200, requests=10, sessions=bad)


def test_a_loop_of_identical_requests_stays_in_step_and_varied_answers_break_it_up():
    """Identical requests that finish in one step come back together and are prefilled together
    again; answers varied by a fifth (same mean) break the groups up, so the same work meets
    shorter prefill queues (gpt-oss-120b on one H200 at 1k / 1k, 8 in flight, 2,532 tokens a step:
    the AIConfigurator deployment whose servers measured 106 ms)."""
    capacity, _ = capacity_for("openai/gpt-oss-120b", gpu="h200", max_num_seqs=8, max_num_batched_tokens=2532,
                               max_model_len=3548)
    in_step = closed_loop(capacity, 8, 1024, 1024, requests=160, steady_state=False)
    broken = closed_loop(capacity, 8, 1024, 1024, requests=160, steady_state=False, answer_spread=0.2)
    assert broken["ttft_ms"]["mean"] < 0.6 * in_step["ttft_ms"]["mean"]
    assert broken["tpot_ms"]["mean"] == pytest.approx(in_step["tpot_ms"]["mean"], rel=0.1)
    again = closed_loop(capacity, 8, 1024, 1024, requests=160, steady_state=False, answer_spread=0.2)
    assert again == broken                                        # seeded
    with pytest.raises(BadInput, match="answer spread 2 must lie from 0 to < 2"):
        closed_loop(capacity, 8, 1024, 1024, answer_spread=2)


def test_a_burst_larger_than_the_batch_queues():
    capacity, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", max_num_seqs=4)
    run = burst(capacity, [100] * 12, [50] * 12)
    idle = capacity.idle_ttft_s(100) * 1000
    # Three waves of four: the median request waits one wave's 50 tokens, the last two.
    assert run["ttft_ms"]["p50"] > 10 * idle
    assert run["ttft_ms"]["p90"] > 1.8 * run["ttft_ms"]["p50"]


def test_a_spec_model_round_trips_through_json_and_load_capacity(tmp_path):
    capacity, _ = capacity_for("Qwen/Qwen3-30B-A3B", gpu="h100")
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(capacity.to_json()))
    loaded = load_capacity(path)
    assert loaded.frontend_request_s == capacity.frontend_request_s > 0
    assert loaded.experts_touch_s == capacity.experts_touch_s > 0
    assert loaded.gemm_s(7) == pytest.approx(capacity.gemm_s(7))
    assert loaded.step_s(9, 900, 300) == pytest.approx(capacity.step_s(9, 900, 300))


def test_a_bench_model_without_roofline_terms_is_unchanged():
    plain = CapacityModel(step_base_s=1e-3, step_per_seq_s=1e-4, step_per_kv_token_s=0, prefill_per_token_s=1e-5,
                          max_num_seqs=8, max_num_batched_tokens=512, kv_cache_tokens=10_000, max_model_len=None,
                          request_overhead_s=0, source="test")
    assert plain.gemm_s(100) == 0
    assert plain.step_s(4, 0, 100) == pytest.approx(1e-3 + 4e-4 + 1e-3)


# --- bad input -----------------------------------------------------------------------------------

def test_tp_not_dividing_the_kv_heads_is_refused():
    with pytest.raises(BadInput, match="does not divide 01-ai/Yi-34B's 8 KV heads"):
        capacity_for("01-ai/Yi-34B", gpu="h100", tp=7)


def test_tp_above_the_instances_gpus_is_refused():
    with pytest.raises(BadInput, match=r"--tp 8 is more than the 4 GPU\(s\) of g6e.12xlarge"):
        capacity_for("meta-llama/Llama-3.1-8B-Instruct", instance="g6e.12xlarge", tp=8)


def test_cli_capacity_json_has_the_promised_fields_and_a_loadable_capacity(tmp_path):
    done = cost_cli("capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--instance", "ml.g6e.xlarge",
                    "--input-tokens", "1000", "--output-tokens", "200", "--concurrency", "8", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data["model"]) >= {"params", "active_params", "weights_gib", "kv_bytes_per_token"}
    assert set(data["hardware"]) >= {"gpu", "gpus", "tp", "memory_gib", "bandwidth_gb_s", "tflops", "link"}
    assert data["fits"] is True and data["kv_cache_tokens"] > 0 and data["max_concurrent_seqs"] > 0
    assert data["saturated_output_tok_s"] > 0
    assert all(a["source"] for a in data["assumptions"])
    at = data["at_concurrency"]
    assert at["ttft_ms"] > 0 and at["tpot_ms"] > 0 and at["e2e_ms"] > at["ttft_ms"] and at["output_tok_s"] > 0
    varied = at["answers_varied"]
    assert varied["spread"] == 0.2 and varied["tpot_ms"] == pytest.approx(at["tpot_ms"], rel=0.15)
    (loop,) = [a for a in data["assumptions"] if a["what"].startswith("closed loop")]
    assert "8 requests of exactly 1000 in / 200 out" in loop["what"], loop   # what the figures assume
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(data["capacity"]))
    assert load_capacity(path).kv_cache_tokens == data["kv_cache_tokens"]


@pytest.mark.parametrize("args, says", [
    (["--model", "llama-3.1-8b-instruc", "--gpu", "h100"], "meta-llama/Llama-3.1-8B-Instruct"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h1000"], "h100"),
    (["--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "l40s"], "does not fit"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--instance", "inf2.xlarge"], "not modelled"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--instance", "g6e.xlarge", "--tp", "2"], "more than the 1"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--concurrency", "4"], "request mix"),
])
def test_cli_bad_input_exits_2_with_a_message_and_no_traceback(args, says):
    done = cost_cli("capacity", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_a_config_missing_a_field_exits_2_naming_it(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 8192,
              "vocab_size": 32000, "max_position_embeddings": 4096}          # no num_hidden_layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = cost_cli("capacity", "--model", str(tmp_path), "--gpu", "l4")
    assert done.returncode == 2
    assert "num_hidden_layers" in done.stderr and "Traceback" not in done.stderr
    config["num_hidden_layers"] = 16
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = cost_cli("capacity", "--model", str(tmp_path), "--gpu", "l4", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["kv_bytes_per_token"] == 2 * 16 * 4 * 128 * 2


# --- calibration ---------------------------------------------------------------------------------

def test_the_shipped_efficiencies_reproduce_the_public_calibration_points():
    """The efficiencies in cost/hardware/data were fitted on these points
    (benchmarks/capacity-calibration/calibrate.py): re-predicting them with the shipped file
    must land where the fit reported, so the data and the code cannot drift apart."""
    from cost.hardware.calibration import errors, shipped_output_caps

    doc = json.loads(POINTS.read_text())
    caps = shipped_output_caps()
    assert set(caps) == set(doc["output_caps"]), "every serving stack's cap was fitted beside the file"
    rows = errors([p for p in doc["points"] if p.get("fit", True)], doc["sharegpt_means"], output_caps=caps)
    median = float(np.median([abs(r["error"]) for r in rows]))
    assert len(rows) >= 30
    assert median <= MEDIAN_CALIBRATION_ERROR


# What calibrate.py reported for the shipped fit (benchmarks/capacity-calibration/README.md).
MEDIAN_CALIBRATION_ERROR = 0.16    # measured 0.143 over the 48 figures (2026-12-06: vLLM CI on H100 and A100 joined)


def test_the_public_moe_decode_checks_hold_the_expert_read_form():
    """The unfitted public checks (points.json ``checks``) decided that routed experts stream at
    the dense layers' bandwidth: at batch 8-10 they are predicted within 30 %, where reading them
    at the expert matmuls' efficiency (the form before) made both 48-77 % slow."""
    from cost.hardware.calibration import errors

    doc = json.loads(POINTS.read_text())
    rows = errors([c for c in doc["checks"] if c["question"] == "moe-small-batch-reads"], doc["sharegpt_means"])
    assert {r["id"] for r in rows} == {"vllm-ci-h200-latency-mixtral", "vllm-pr23151-h100-qwen3-30b-a3b-c10"}
    assert len(rows) == 4
    for row in rows:
        assert abs(row["error"]) <= 0.30, row


# What the large-batch MoE checks measured with the shipped priors (the calibration README,
# "Large-batch MoE"): the median over their 37 figures, and the throughput of the deployments
# whose memory does not bind (gpt-oss-120b at TP2 and TP4, gpt-oss-20b at TP1).
MEDIAN_LARGE_BATCH_MOE_ERROR = 0.23    # measured 0.203 (2026-12-06, the fused-MoE kernels' terms; 0.274 before)
UNBOUND_GPT_OSS_THROUGHPUT = {"gpustack-h100-gpt-oss-120b-tp2-sharegpt": -0.036,
                              "gpustack-h100-gpt-oss-120b-tp4-sharegpt": -0.060,
                              "gpustack-h100-gpt-oss-20b-sharegpt": 0.014}


def test_the_public_large_batch_moe_checks_keep_their_recorded_errors():
    """The large-batch MoE checks (hundreds of sequences at once, gpustack's performance lab) are
    not fitted and not all met: the README says which miss and why. What holds is guarded: where
    memory does not bind, gpt-oss's throughput at large batch is within 10 % as measured (the dense
    Qwen3-8B of the same lab is +9 %), and the median error over all of them does not grow."""
    from cost.hardware.calibration import errors

    doc = json.loads(POINTS.read_text())
    large = [c for c in doc["checks"] if c["question"] == "moe-large-batch"]
    rows = errors(large, doc["sharegpt_means"])
    assert len(large) == 11 and len(rows) == 37
    assert float(np.median([abs(r["error"]) for r in rows])) <= MEDIAN_LARGE_BATCH_MOE_ERROR
    throughput = {r["id"]: r["error"] for r in rows if r["metric"] == "total_tok_s"}
    for check, recorded in UNBOUND_GPT_OSS_THROUGHPUT.items():
        assert abs(throughput[check] - recorded) <= 0.01, (check, throughput[check])
        assert abs(throughput[check]) <= 0.10


def test_the_public_small_model_sweep_holds_the_step_and_not_the_first_token():
    """A 0.5B model on an L4 (a public closed-loop sweep, c = 1-32, 256 in / 128 out; not fitted):
    the engine's step holds (TPOT within 10 % at every concurrency, output within 25 %), while
    the measured TTFT is 2.7-5.6x the engine's (the calibration README, "Small models"): the
    README says why that is left unmodelled, and this guards that it stays a first-token gap."""
    from cost.hardware.calibration import errors

    doc = json.loads(POINTS.read_text())
    sweep = [c for c in doc["checks"] if c["question"] == "small-model-overheads"]
    rows = errors(sweep, doc["sharegpt_means"])
    assert len(sweep) == 6 and len(rows) == 18
    by_metric = {m: [r["error"] for r in rows if r["metric"] == m] for m in ("tpot_p50_ms", "output_tok_s", "ttft_p50_ms")}
    assert all(abs(e) <= 0.10 for e in by_metric["tpot_p50_ms"]), by_metric
    assert all(abs(e) <= 0.25 for e in by_metric["output_tok_s"]), by_metric
    assert all(-0.85 <= e <= -0.55 for e in by_metric["ttft_p50_ms"]), by_metric
