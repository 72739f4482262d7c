"""Capacity from specs where the cost commands take a capacity: ``--hf-model`` in breakeven, compare,
simulate and recommend, ``cost predict``, and recommend's instance × TP × dtype search. Each runs
the real CLI in a subprocess on a window of the shipped conversation trace."""
from __future__ import annotations

import json

import pytest
from cost_cli import TRACE, cost, cost_json

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
BEDROCK = "meta.llama3-1-8b-instruct-v1:0"


def test_breakeven_takes_its_capacity_from_specs_and_says_so():
    data = cost_json("breakeven", "--model", BEDROCK, "--instance", "ml.g6e.xlarge", "--hf-model", LLAMA)
    assert data["capacity"]["origin"].startswith("specs: meta-llama/Llama-3.1-8B-Instruct (bf16) on 1× l40s "
                                                 "(g6e.xlarge)")
    assert any("predicted from specs" in a for a in data["assumptions"])
    spec = cost_json("capacity", "--model", LLAMA, "--instance", "g6e.xlarge", "--input-tokens", "600",
                     "--output-tokens", "200")
    assert data["capacity"]["output_tokens_per_second"] == pytest.approx(spec["saturated_output_tok_s"], rel=0.01)


def test_a_measured_capacity_and_specs_together_are_refused():
    done = cost("breakeven", "--model", BEDROCK, "--instance", "ml.g6e.xlarge", "--hf-model", LLAMA,
                "--capacity", "1500")
    assert done.returncode == 2 and "not both" in done.stderr


def test_compare_prices_every_rung_from_the_specs_capacity():
    data = cost_json("compare", "--model", BEDROCK, "--instance", "ml.g6e.xlarge", "--hf-model", LLAMA,
                     "--avg", "500", "--peak", "2000")
    assert any("specs" in a for a in data["assumptions"])
    assert {r["level"] for r in data["rungs"]} >= {1, 3, 6}


def test_simulate_runs_a_trace_on_the_specs_capacity():
    data = cost_json("simulate", "--trace", TRACE, "--window", "0:300", "--model", BEDROCK,
                     "--instance", "ml.g6e.xlarge", "--hf-model", LLAMA, "--rungs", "3", "--no-progress",
                     "--slo-ttft-ms", "2000", "--slo-e2e-ms", "60000")
    assert data["capacity"]["source"].startswith("specs: meta-llama/Llama-3.1-8B-Instruct")
    assert data["rungs"][0]["served"] > 0
    assert data["capacity"]["async_scheduling"] is True, "vLLM's default since 0.14.0"
    sync = cost_json("simulate", "--trace", TRACE, "--window", "0:300", "--model", BEDROCK,
                     "--instance", "ml.g6e.xlarge", "--hf-model", LLAMA, "--rungs", "3", "--no-progress",
                     "--slo-ttft-ms", "2000", "--slo-e2e-ms", "60000", "--no-async-scheduling")
    assert sync["capacity"]["async_scheduling"] is False
    assert sync["rungs"][0]["ttft_ms"]["p50"] < data["rungs"][0]["ttft_ms"]["p50"]


def test_predict_gives_the_latency_of_one_fixed_deployment_from_specs_or_a_bench(tmp_path):
    spec = cost_json("predict", "--trace", TRACE, "--window", "0:300", "--model", LLAMA,
                     "--instance", "g6e.xlarge")
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(spec["predicted"][key]) == {"mean", "p50", "p90", "p99"}
        assert spec["predicted"][key]["p99"] >= spec["predicted"][key]["p50"] > 0
    assert spec["throughput"]["output_tok_s"] > 0 and spec["served"] == spec["requests"]
    # The same capacity saved and given back as a bench predicts the same latencies.
    bench = tmp_path / "cap.json"
    bench.write_text(json.dumps(spec["capacity"]))
    again = cost_json("predict", "--trace", TRACE, "--window", "0:300", "--bench", str(bench))
    assert again["predicted"] == spec["predicted"]
    # Two replicas halve the queue: the tail can only shrink.
    two = cost_json("predict", "--trace", TRACE, "--window", "0:300", "--bench", str(bench), "--replicas", "2")
    assert two["predicted"]["ttft_ms"]["p99"] <= spec["predicted"]["ttft_ms"]["p99"]


def test_predict_refuses_two_capacities_and_none():
    assert cost("predict", "--trace", TRACE, "--window", "0:60").returncode == 2
    done = cost("predict", "--trace", TRACE, "--window", "0:60", "--bench", "x.json", "--model", LLAMA,
                "--gpu", "h100")
    assert done.returncode == 2 and "one of them" in done.stderr


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    plot = tmp_path_factory.mktemp("search") / "search.png"
    data = cost_json("recommend", "--trace", TRACE, "--window", "0:600", "--model", BEDROCK, "--hf-model", LLAMA,
                     "--instances", "g5,g6e", "--dtypes", "auto,fp8", "--slo-ttft-ms", "3000",
                     "--slo-e2e-ms", "60000", "--no-progress", "--search-plot", str(plot))
    return data, plot


def test_the_search_answers_the_cheapest_candidate_meeting_the_slo(searched):
    data, plot = searched
    found = data["search"]
    best = found["best"]
    assert best is not None and best["meets_slo"]
    simulated = [r for r in found["candidates"] if r["status"] == "simulated"]
    assert best["window_usd"] == min(r["window_usd"] for r in simulated if r["meets_slo"])
    # A pruned candidate could not have been cheaper: its floor is above the answer's bill.
    for r in found["candidates"]:
        if r["status"] == "pruned":
            assert r["floor_usd"] >= best["window_usd"]
        if r["status"] == "simulated":
            assert r["window_usd"] >= r["floor_usd"] - 1e-6
    assert {r["dtype"] for r in found["candidates"]} == {"auto", "fp8"}
    assert plot.stat().st_size > 10_000


def test_the_search_deploys_what_it_simulated(searched):
    data, _ = searched
    best = data["search"]["best"]
    # Rungs 3-5 carry the searched configuration in their command; JumpStart (rung 2) chooses its
    # own, so its answer names rung 3's command that deploys the searched one.
    command = (data["deploy"]["command"] if data["level"] in (3, 4, 5)
               else next(n for n in data["deploy"]["notes"] if "OPTION_TENSOR_PARALLEL_DEGREE" in n))
    assert f"OPTION_TENSOR_PARALLEL_DEGREE={best['tp']}" in command
    assert "--model meta-llama/Llama-3.1-8B-Instruct" in command
    assert data["simulation"]["capacity"]["source"].startswith("specs: meta-llama/Llama-3.1-8B-Instruct")


def test_the_search_lists_what_does_not_fit():
    data = cost_json("recommend", "--trace", TRACE, "--window", "0:120", "--model", "meta.llama3-1-70b-instruct-v1:0",
                     "--hf-model", "meta-llama/Llama-3.1-70B-Instruct", "--instances", "g6e",
                     "--slo-ttft-ms", "5000", "--slo-e2e-ms", "120000", "--no-progress")
    rows = {r["instance"]: r for r in data["search"]["candidates"]}
    assert rows["ml.g6e.xlarge"]["status"] == "does not fit"
    assert "does not fit: weights" in rows["ml.g6e.xlarge"]["why"]
    assert rows["ml.g6e.12xlarge"]["status"] in ("simulated", "pruned")


def test_the_search_refuses_an_unknown_family():
    done = cost("recommend", "--trace", TRACE, "--window", "0:60", "--model", BEDROCK, "--hf-model", LLAMA,
                "--instances", "x9", "--slo-ttft-ms", "3000", "--no-progress")
    assert done.returncode == 2 and "--instances x9" in done.stderr and "Traceback" not in done.stderr
