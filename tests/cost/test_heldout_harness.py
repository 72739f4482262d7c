"""The held-out harness (benchmarks/capacity-heldout/evaluate.py) on SYNTHETIC rows: the column
layouts of AIConfigurator's silicon_sample.csv and of the sim-to-real error records, with made-up
numbers (none of them measured by anyone). No held-out data is in this repository; the real files
are read by the script at run time. Pure: no predictor, no network."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from options.core import BadInput

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "capacity-heldout" / "evaluate.py"
_spec = importlib.util.spec_from_file_location("heldout_evaluate", SCRIPT)
ev = importlib.util.module_from_spec(_spec)
sys.modules["heldout_evaluate"] = ev
_spec.loader.exec_module(ev)

AIC_COLUMNS = ("id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,"
               "gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,"
               "moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,"
               "prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,"
               "decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,decode_moe_tp_size,"
               "decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms").split(",")


def aic_row(**values) -> dict[str, str]:
    """A synthetic silicon_sample row: every column present, made-up numbers."""
    row = {c: "" for c in AIC_COLUMNS}
    row.update(id="synthetic", silicon_data_source="synthetic; vllm/vllm-openai:v9.9.9", backend="vllm",
               model_path="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", precision="bf16", mode="agg",
               isl="1000", osl="100", batch_size="8", tp_size="1", pp_size="1", attention_dp_size="1",
               moe_tp_size="1", moe_ep_size="1", silicon_ttft_ms="111.0", silicon_tpot_ms="11.0")
    row.update({k: str(v) for k, v in values.items()})
    return row


def test_aiconfigurator_rows_in_scope_become_closed_loop_workloads():
    kept, skipped = ev.normalise_aiconfigurator([aic_row()])
    assert skipped == []
    (w,) = kept
    assert w["load"] == {"kind": "closed", "concurrency": 8, "input_tokens": 1000, "output_tokens": 100,
                         "requests": 160}, "20 rounds of C, as AIConfigurator's benchmark scripts send"
    assert w["measured"] == {"ttft_mean": 111.0, "tpot_mean": 11.0}
    assert w["engine"] == {"max_num_seqs": 8, "max_num_batched_tokens": 8 + 1000 + 1500, "max_model_len": 1000 + 100 + 1500,
                           "async_scheduling": True}, \
        "the flags AIConfigurator's generator gives the deployment it benchmarks, and its vLLM's scheduler"
    assert (w["gpu"], w["tp"], w["dtype"], w["family"], w["moe"]) == ("h100", 1, "auto", "llama-3", False)
    assert w["vllm_version"] == "9.9.9", "read from the image tag when backend_version is empty"


@pytest.mark.parametrize("source, version, generated", [
    ("db-dump; measured=2026-03-27T00:00:00.000Z", "0.18.0", True),
    ("source_file=x.csv; measured=2025-10-29T00:00:00.000Z", "", False),   # before the generator passed flags
    ("source_file=gap-analysis.csv", "0.15.1", True),                      # undated: released 2026-02-05
    ("source_file=gap-analysis.csv", "0.12.0", False),                     # undated: released 2025-12-03
    ("source_file=gap-analysis.csv", "0.17.0", True),                      # newer than the table's newest
    ("source_file=gap-analysis.csv", "", False),
])
def test_only_points_measured_since_the_generator_passed_its_flags_get_them(source, version, generated):
    """The generator's flags (and FP8 KV for an FP8 checkpoint) where the point's date, or its
    vLLM's release, says the generator made its deployment; vLLM's defaults elsewhere. (Async
    scheduling, vLLM's default from 0.14.0, happens to fall on the same points here.)"""
    (w,) = ev.normalise_aiconfigurator([aic_row(silicon_data_source=source, backend_version=version,
                                                model_path="Qwen/Qwen3-235B-A22B-FP8", gemm_quant_mode="fp8",
                                                tp_size="4", moe_tp_size="4")])[0]
    assert ev.by_the_generator({"silicon_data_source": source}, version or None) is generated
    assert ("max_num_seqs" in w["engine"]) is generated and (w["kv_dtype"] == "fp8") is generated, w
    assert w["engine"]["async_scheduling"] is generated, w


@pytest.mark.parametrize("version, source, on", [
    ("0.13.0", "", False), ("0.14.0", "", True), ("0.19.0", "", True),
    ("nightly-5b8c30d62b754b57", "measured=2026-04-02T00:00:00Z", True),    # a nightly: by its date
    ("nightly-0", "measured=2025-12-01T00:00:00Z", False),
    (None, "measured=2025-10-29T00:00:00.000Z", False), (None, "", False),
])
def test_async_scheduling_is_given_to_the_points_whose_vllm_ran_it_by_default(version, source, on):
    assert ev.async_by_default(version, {"silicon_data_source": source}) is on


@pytest.mark.parametrize("changes, reason", [
    ({"backend": "trtllm"}, "not vLLM"),
    ({"mode": "disagg"}, "disaggregated"),
    ({"system": "b300_sxm"}, "not in Spectrum's GPU table"),
    ({"model_path": "MiniMaxAI/MiniMax-M2.5"}, "not in scope"),
    ({"model_path": "meta-llama/Llama-4-Scout-17B-16E"}, "not in scope"),
    ({"model_path": "openai/gpt-oss-120b", "tp_size": "4", "attention_dp_size": "4", "moe_ep_size": "16"},
     "attention data parallel 4"),
    ({"model_path": "Qwen/Qwen3-235B-A22B-FP8", "tp_size": "1", "moe_tp_size": "2"}, "not a plain TP group"),
    ({"silicon_ttft_ms": "", "silicon_tpot_ms": ""}, "no measured"),
])
def test_aiconfigurator_rows_out_of_scope_are_skipped_with_the_reason(changes, reason):
    kept, skipped = ev.normalise_aiconfigurator([aic_row(**changes)])
    assert kept == [] and reason in skipped[0]["reason"], skipped


def test_aiconfigurator_weight_formats_and_parallel_layouts():
    rows = [aic_row(model_path="meta-llama/Llama-3.1-70B", gemm_quant_mode="fp8", tp_size="4", moe_tp_size="1"),
            aic_row(model_path="meta-llama/Llama-3.1-70B", gemm_quant_mode="nvfp4", system="b200_sxm"),
            aic_row(model_path="openai/gpt-oss-120b", gemm_quant_mode="nvfp4", tp_size="2", moe_tp_size="2"),
            aic_row(model_path="Qwen/Qwen3-235B-A22B-FP8", gemm_quant_mode="fp8", tp_size="4", moe_tp_size="1",
                    moe_ep_size="4"),
            aic_row(model_path="moonshotai/Kimi-K2.5", gemm_quant_mode="int4_wo", system="h200_sxm", tp_size="8",
                    moe_tp_size="8")]
    kept, skipped = ev.normalise_aiconfigurator(rows)
    assert skipped == []
    assert [w["dtype"] for w in kept] == ["fp8", "fp4", "auto", "fp8", "int4"]
    # An FP8 KV cache where the checkpoint itself is FP8 (or NVFP4), as AIConfigurator deploys it;
    # a 16-bit checkpoint served at FP8 or FP4 matmuls keeps the 16-bit cache.
    assert [w["kv_dtype"] for w in kept] == ["auto", "auto", "auto", "fp8", "auto"]
    assert kept[3]["catalog_model"] == "Qwen3-235B-A22B", "a quantized re-upload is looked up by its base"
    assert ev.catalog_name("nvidia/Llama-3.1-8B-Instruct-FP8") == ("Llama-3.1-8B-Instruct", "fp8")
    assert ev.catalog_name("RedHatAI/Foo-7B-FP8-dynamic") == ("Foo-7B", "fp8")
    assert ev.catalog_name("meta-llama/Llama-3.1-70B") == ("meta-llama/Llama-3.1-70B", None)
    assert [w["tp"] for w in kept] == [4, 1, 2, 4, 8], "a dense row's moe_tp/moe_ep do not matter"
    assert [w["moe"] for w in kept] == [False, False, True, True, True]
    assert kept[3]["notes"][0].startswith("expert parallel 4")
    assert kept[4]["family"] == "deepseek-v3"


# --- sim-to-real ---------------------------------------------------------------------------------

# Documents in the layout of the repository's design notes; the numbers are made up.
DESIGN = """
| Workload | Input Tokens | Output Tokens | Load Pattern |
|----------|-------------|---------------|--------------|
| general | ~500 | ~200 | 4→10 req/s (2 stages, 300s each) |
| roleplay | ~700 | ~250 | 3 req/s (1 stage, 600s) |
| reasoning | ~1000 | ~1500 | 2 req/s (1 stage, 600s) |

All experiments: vLLM v9.9.9, H100 GPU, max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=64, fp16.
"""
FIGURES_SPEC = "- **Workloads (4+1):** General-Lite (same token distributions as General at 5 rps peak; used for ...)"
TRAINVAL = """- **reasoning-lite**: Multi-turn chat with shared prefix caching (reduced intensity, 0.5 req/s)
  - System prompt (50 tokens) + question (950 tokens) + output (1500 tokens) ≈ 2500 tokens/request"""

S2R_COLUMNS = ("simulator,experiment_folder,model,workload,stage_index,metric_name,predicted,actual,mape,mpe,"
               "absolute_error,exp_id,hardware,dp,cpu_offload,gpu_mem_util,precision,tp,max_num_batched_tokens"
               ).split(",")


def s2r_rows(folder, model, workload, stages, hardware="H100", tp=1, simulators=("sim-a", "sim-b"),
             metrics=("e2e_mean", "ttft_mean", "itl_mean", "e2e_p90")):
    """Synthetic error records: actual = 100 × (stage + 2) + metric index; sim-a is 10 % high."""
    rows = []
    for sim in simulators:
        for stage in stages:
            for k, metric in enumerate(metrics):
                actual = 100.0 * (stage + 2) + k
                predicted = actual * (1.1 if sim == "sim-a" else 0.5)
                rows.append(dict(zip(S2R_COLUMNS, [sim, f"/somewhere/ground_truth/{folder}", model, workload, str(stage),
                                                   metric, str(predicted), str(actual), "", "", "", "1", hardware, "",
                                                   "False", "0.9", "FP16", str(tp), "2048"])))
    return rows


@pytest.fixture()
def specs():
    specs, engine = ev.parse_workload_table(DESIGN)
    specs["general-lite"] = ev.parse_general_lite(FIGURES_SPEC, specs["general"])
    specs["reasoning-lite"] = ev.parse_reasoning_lite(TRAINVAL, specs["reasoning"])
    return specs, engine


def test_the_workload_descriptions_parse(specs):
    specs, engine = specs
    assert specs["general"]["stages"] == [{"rate": 4.0, "duration": 300.0}, {"rate": 10.0, "duration": 300.0}]
    assert (specs["general"]["input_tokens"], specs["general"]["output_tokens"]) == (500, 200)
    assert specs["roleplay"]["stages"] == [{"rate": 3.0, "duration": 600.0}]
    assert engine == {"max_model_len": 4096, "max_num_seqs": 64, "vllm_version": "9.9.9"}
    assert specs["general-lite"]["stages"] == [None, {"rate": 5.0, "duration": 300.0}], "only the peak is known"
    assert (specs["general-lite"]["input_tokens"], specs["general-lite"]["output_tokens"]) == (500, 200)
    assert specs["reasoning-lite"]["stages"] == [{"rate": 0.5, "duration": 600.0}]
    assert (specs["reasoning-lite"]["input_tokens"], specs["reasoning-lite"]["output_tokens"]) == (1000, 1500)


def test_sim_to_real_records_become_one_open_loop_workload_per_stage(specs):
    specs, engine = specs
    rows = s2r_rows("16-llama-3-1-8b-tp1-general-1", "meta-llama/Llama-3.1-8B-Instruct", "general", (-1, 0, 1))
    kept, skipped = ev.normalise_sim_to_real(rows, specs, engine)
    assert skipped == []
    by_stage = {w["stage"]: w for w in kept}
    assert set(by_stage) == {-1, 0, 1}
    assert by_stage[1]["load"]["stages"] == [{"rate": 10.0, "duration": 300.0}]
    assert len(by_stage[-1]["load"]["stages"]) == 2, "the whole run is both stages"
    w = by_stage[0]
    assert w["measured"] == {"e2e_mean": 200.0, "ttft_mean": 201.0, "tpot_mean": 202.0, "e2e_p90": 203.0}
    assert w["comparators"]["sim-a"]["e2e_mean"] == pytest.approx(220.0)
    assert w["engine"] == {"max_num_batched_tokens": 2048, "max_num_seqs": 64, "max_model_len": 4096,
                           "gpu_memory_utilization": 0.9, "async_scheduling": True}
    assert (w["gpu"], w["family"], w["moe"], w["vllm_version"]) == ("h100", "llama-3", False, "9.9.9")


def test_a_workloads_shared_system_prompt_and_chat_users_are_found_by_its_lengths(specs):
    specs, engine = specs
    golden = json.dumps({"experiments": [
        {"id": "1", "workload": {"inference_perf": {"shared_prefix": {
            "system_prompt_len": 100, "question_len": 400, "output_len": 200, "enable_multi_turn_chat": True,
            "num_unique_system_prompts": 9, "num_users_per_system_prompt": 5}}},
         "expected": {"ttft_mean_ms": 1.0}},                           # BLIS's own prediction: never read
        {"id": "2", "workload": {"inference_perf": {"shared_prefix": {
            "system_prompt_len": 50, "question_len": 651, "output_len": 250}}}},   # 701 in: no workload's
        {"id": "3", "workload": {"inference_perf": {"shared_prefix": {          # single-turn: no users
            "system_prompt_len": 150, "question_len": 550, "output_len": 250, "num_unique_system_prompts": 3}}}},
    ]})
    specs = {name: dict(spec) for name, spec in specs.items()}
    assert ev.attach_workload_blocks(ev.golden_experiments(golden), specs) == 3   # general, general-lite, roleplay
    assert specs["general"]["system_prompt_tokens"] == 100 and specs["general"]["users"] == 45
    assert specs["roleplay"]["system_prompt_tokens"] == 150 and "users" not in specs["roleplay"]
    assert "system_prompt_tokens" not in specs["reasoning"]
    assert ev.system_prompt_reuse(specs["general"]) == pytest.approx(96 / 500)    # six whole 16-token blocks
    assert ev.system_prompt_reuse(specs["reasoning"]) == 0
    assert ev.attach_workload_blocks(ev.golden_experiments("not json"), specs) == 0
    rows = s2r_rows("16-llama-3-1-8b-tp1-general-1", "meta-llama/Llama-3.1-8B-Instruct", "general", (0,))
    (w,) = ev.normalise_sim_to_real(rows, specs, engine)[0]
    assert w["engine"]["prefix_cache_hit_rate"] == pytest.approx(0.192)
    assert "100 tokens shared by each group" in w["notes"][1] and "not credited" in w["notes"][1]
    assert w["load"]["sessions"] == 45 and "45 users" in w["notes"][-1]
    rows = s2r_rows("19-llama-3-1-8b-tp1-roleplay-1", "meta-llama/Llama-3.1-8B-Instruct", "roleplay", (0,))
    (single,) = ev.normalise_sim_to_real(rows, specs, engine)[0]
    assert "sessions" not in single["load"]


def test_each_stage_is_predicted_with_the_workloads_users():
    seen = []

    def open_loop(cap, rate_per_s, input_tokens, output_tokens, requests=1000, seed=0, sessions=None):
        seen.append(sessions)
        return fake_api().open_loop(cap, rate_per_s, input_tokens, output_tokens, requests, seed)

    api = SimpleNamespace(**{**vars(fake_api()), "open_loop": open_loop})
    load = {"kind": "open", "input_tokens": 500, "output_tokens": 200,
            "stages": [{"rate": 4.0, "duration": 10.0}, {"rate": 10.0, "duration": 10.0}]}
    w = {"set": "sim-to-real", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100", "tp": 1, "dtype": "auto",
         "kv_dtype": "auto", "engine": {}, "load": {**load, "sessions": 45}}
    ev.predict(w, api, {}, 3000)
    ev.predict({**w, "load": load}, api, {}, 3000)
    assert seen == [45, 45, None, None]


def test_the_logged_kv_caches_of_the_deployments_are_set_beside_the_memory_arithmetic():
    from cost.hardware.predict import capacity_for

    _, details = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", max_num_seqs=128,
                              max_num_batched_tokens=2048, max_model_len=4096)
    golden = json.dumps({"experiments": [
        {"id": "7", "model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "H100", "tp": 1, "max_num_seqs": 128,
         "max_num_batched_tokens": 2048, "total_kv_blocks": details["kv_cache_tokens"] // 16 * 2},
        {"id": "8", "model": "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "hardware": "H100", "tp": 2,
         "total_kv_blocks": 8253},                     # out of scope: left out
    ]})
    (check,) = ev.kv_cache_checks(ev.golden_experiments(golden), {"max_model_len": 4096},
                                  SimpleNamespace(capacity_for=capacity_for))
    assert check["predicted_tokens"] == details["kv_cache_tokens"]
    assert check["logged_tokens"] == details["kv_cache_tokens"] // 16 * 32
    assert check["error"] == pytest.approx(-0.5, abs=1e-3)


def test_the_prompt_compute_a_loops_measured_rate_implies_against_the_gpus_peak():
    from cost.hardware.predict import capacity_for

    _, details = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", dtype="fp8")
    fast = ev.normalise_aiconfigurator([aic_row(id="fast", isl="2000", osl="100", batch_size="64",
                                                gemm_quant_mode="fp8", silicon_ttft_ms="100", silicon_tpot_ms="10")])[0]
    slow = ev.normalise_aiconfigurator([aic_row(id="slow", silicon_ttft_ms="100", silicon_tpot_ms="30")])[0]
    no_tpot = ev.normalise_aiconfigurator([aic_row(id="no-tpot", silicon_tpot_ms="")])[0]
    checks = {c["id"]: c for c in ev.implied_prompt_compute(fast + slow + no_tpot,
                                                              SimpleNamespace(capacity_for=capacity_for))}
    assert set(checks) == {"fast", "slow"}                  # a loop without its TPOT has no measured rate
    # 64 in flight, each 100 + 99 × 10 ms: 58.7 requests/s of 2,000 prompt tokens, 2 FLOPs an active weight,
    # against one H100's FP8 peak (the weights' format)
    want = 64 / 1.09 * 2000 * 2 * details["model"]["active_params"] / 1978e12
    assert checks["fast"]["share_of_peak"] == pytest.approx(want, rel=1e-9) and want > ev.PREFILL_SHARE_CEILING
    # 8 in flight, 100 + 99 × 30 ms, 1,000 prompt tokens at the 16-bit peak: far below it
    want = 8 / 3.07 * 1000 * 2 * details["model"]["active_params"] / 989e12
    assert checks["slow"]["share_of_peak"] == pytest.approx(want, rel=1e-9) and want < 0.1


def test_the_answer_spread_what_if_varies_only_aiconfigurators_answers_about_the_same_mean():
    from cost.hardware import predict as api

    (w,) = ev.normalise_aiconfigurator([aic_row()])[0]
    (spread,) = ev.what_if_answer_spread([w], 0.2)
    assert spread["load"]["answer_spread"] == 0.2 and "answer_spread" not in w["load"]
    assert "what-if" in spread["notes"][-1]
    identical, varied = ev.predict(w, api, {}, 3000), ev.predict(spread, api, {}, 3000)
    assert varied["tpot_mean"] == pytest.approx(identical["tpot_mean"], rel=0.1)    # the same work a request
    assert varied != identical
    with pytest.raises(BadInput, match="--what-if-answer-spread 2.5 must lie between 0 and 2"):
        ev.what_if_answer_spread([w], 2.5)


def test_the_prefix_reuse_what_if_changes_only_its_copies_and_says_so(specs):
    specs, engine = specs
    rows = s2r_rows("16-llama-3-1-8b-tp1-general-1", "meta-llama/Llama-3.1-8B-Instruct", "general", (0,))
    kept, _ = ev.normalise_sim_to_real(rows, specs, engine)
    (what_if,) = ev.what_if_prefix_reuse(kept, 0.5)
    assert what_if["engine"]["prefix_cache_hit_rate"] == 0.5 and "prefix_cache_hit_rate" not in kept[0]["engine"]
    assert "what-if" in what_if["notes"][-1]
    with pytest.raises(BadInput, match="--what-if-prefix-hit-rate"):
        ev.what_if_prefix_reuse(kept, 1.5)


def test_sim_to_real_skips_what_it_cannot_describe(specs):
    specs, engine = specs
    rows = (s2r_rows("57-codellama-34b-tp2-general-lite-2-1", "codellama/CodeLlama-34b-Instruct-hf",
                     "general-lite", (-1, 0, 1), hardware="A100-80GB", tp=2)
            + s2r_rows("17-llama-4-scout-17b-16e-tp2-general-lite-2-1", "RedHatAI/Llama-4-Scout-17B-16E", "general", (0,))
            + s2r_rows("12-mixtral-8x7b-tp2-codegen", "mistralai/Mixtral-8x7B-v0.1", "codegen", (0,)))
    kept, skipped = ev.normalise_sim_to_real(rows, specs, engine)
    assert [(w["experiment"], w["stage"], w["gpu"], w["moe"]) for w in kept] == [
        ("57-codellama-34b-tp2-general-lite-2-1", 1, "a100-80gb", False)]
    reasons = sorted(s["reason"] for s in skipped)
    assert any("stage 0: its arrival rate is not published" in r for r in reasons)
    assert any("whole-run row needs every stage's rate" in r for r in reasons)
    assert any("Llama-4-Scout" in r and "not in scope" in r for r in reasons)
    assert any("'codegen': no published description" in r for r in reasons)


def test_the_folder_name_says_lite_when_the_label_does_not():
    assert ev.workload_of("/x/66-qwen2-5-7b-instruct-tp1-reasoning-lite-1-1", "reasoning") == "reasoning-lite"
    assert ev.workload_of("/x/65-01-ai-yi-34b-tp2-general-lite-2-1", "general") == "general-lite"
    assert ev.workload_of("/x/20260217-155451-llama-2-7b-tp1-codegen", "codegen") == "codegen"


# --- scoring with a fake predictor ----------------------------------------------------------------

def fake_api(ttft=100.0, e2e=2000.0):
    """A stand-in with cost.hardware.predict's interface; constant latencies, open loop adds the rate."""
    def stats(v):
        return {"mean": v, "p50": v, "p90": 1.5 * v, "p99": 2 * v}

    def capacity_for(model, gpu=None, gpus=None, instance=None, tp=None, dtype="auto", kv_dtype="auto", **flags):
        if "unknown" in model:
            raise ValueError(f"no such model {model}")
        return "cap", {"fits": True}

    def closed_loop(cap, concurrency, input_tokens, output_tokens, requests=None):
        return {"ttft_ms": stats(ttft), "tpot_ms": stats(10.0), "e2e_ms": stats(e2e), "output_tok_s": 1.0, "requests": 1}

    def open_loop(cap, rate_per_s, input_tokens, output_tokens, requests=1000, seed=0):
        return {"ttft_ms": stats(ttft * rate_per_s), "tpot_ms": stats(10.0), "e2e_ms": stats(e2e * rate_per_s),
                "output_tok_s": 1.0, "requests": requests}

    return SimpleNamespace(capacity_for=capacity_for, closed_loop=closed_loop, open_loop=open_loop)


def test_errors_by_metric_gpu_and_moe_with_a_fake_predictor(specs):
    specs, engine = specs
    aic, _ = ev.normalise_aiconfigurator([aic_row(silicon_ttft_ms="200", silicon_tpot_ms="10"),
                                          aic_row(model_path="unknown/Llama-3-9B")])
    s2r, _ = ev.normalise_sim_to_real(
        s2r_rows("9-mixtral-8x7b-tp2-general", "mistralai/Mixtral-8x7B-v0.1", "general", (-1, 0, 1), tp=2),
        specs, engine)
    rows, skipped = ev.evaluate(aic + s2r, fake_api())
    assert [s["reason"] for s in skipped if s["set"] == "aiconfigurator"] == [
        "predictor: ValueError: no such model unknown/Llama-3-9B"]
    assert any("whole-run percentile" in s["reason"] for s in skipped), "p90 of a two-stage run is not predicted"
    got = {(r["id"], r["metric"]): r for r in rows}
    assert got[("synthetic", "ttft_mean")]["ape"] == pytest.approx(0.5)        # 100 vs 200
    assert got[("synthetic", "tpot_mean")]["ape"] == pytest.approx(0.0)
    stage1 = got[("9-mixtral-8x7b-tp2-general/stage1", "e2e_mean")]
    assert stage1["predicted"] == pytest.approx(2000.0 * 10)                    # the stage's 10 req/s
    whole = got[("9-mixtral-8x7b-tp2-general/stage-1", "e2e_mean")]
    assert whole["predicted"] == pytest.approx(2000.0 * (4 * 4 + 10 * 10) / 14), "stages weighted by requests"
    itl = got[("9-mixtral-8x7b-tp2-general/stage0", "tpot_mean")]
    assert itl["predicted"] == pytest.approx((2000.0 * 4 - 100.0 * 4) / 199), "(E2E − TTFT) / (output − 1)"
    assert itl["comparators"]["sim-a"]["ape"] == pytest.approx(0.1)
    summary = ev.summarise(rows)
    assert summary["overall"]["all"]["ttft_mean"]["n"] == 4
    assert set(summary["by_gpu"]) == {"aiconfigurator:h100", "sim-to-real:h100"}
    assert set(summary["dense_vs_moe"]) == {"aiconfigurator:dense", "sim-to-real:moe"}
    sim_a = summary["comparators"]["sim-a [per-stage, main]"]["e2e_mean"]
    assert sim_a["n"] == 2 and sim_a["their_median_ape"] == pytest.approx(0.1)
    md = ev.markdown(rows, skipped, summary, ["synthetic"], "2000-01-01")
    assert "## Dense vs MoE" in md and "| sim-to-real:moe |" in md


def test_aiconfigurators_own_predictions_are_matched_by_id():
    kept, _ = ev.normalise_aiconfigurator([aic_row(id="a", silicon_ttft_ms="200", silicon_tpot_ms="10"),
                                           aic_row(id="b")])
    theirs = [dict(aic_row(id="a"), aic_predicted_ttft_ms="150", aic_predicted_tpot_ms="12"),
              dict(aic_row(id="b"), aic_predicted_ttft_ms="", aic_predicted_tpot_ms=""),
              dict(aic_row(id="not-kept"), aic_predicted_ttft_ms="1", aic_predicted_tpot_ms="1")]
    assert ev.attach_aiconfigurator_predictions(kept, theirs) == 1
    assert kept[0]["comparators"] == {"aiconfigurator (aic)": {"ttft_mean": 150.0, "tpot_mean": 12.0}}
    assert kept[1]["comparators"] == {}
    rows, _ = ev.evaluate(kept, fake_api(ttft=100.0))
    theirs = ev.summarise(rows)["comparators"]["aiconfigurator (aic) [closed loop]"]
    assert theirs["ttft_mean"] == {"n": 1, "spectrum_median_ape": 0.5, "their_median_ape": 0.25}


def test_files_are_read_from_a_git_directory_even_after_deletion(tmp_path):
    repo = tmp_path / "clone"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "old.csv").write_text("a,b\n1,2\n")
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "add"], check=True)
    subprocess.run(git + ["rm", "-q", "old.csv"], check=True)
    subprocess.run(git + ["commit", "-qm", "drop"], check=True)
    for root in (repo, repo / ".git"):                   # a clone, and its git directory alone
        r = ev.Repo(root)
        assert r.read("old.csv") is None
        rev = r.last_commit_with("old.csv")
        assert rev and r.read("old.csv", rev) == "a,b\n1,2\n"
