"""The InferenceX check (benchmarks/capacity-inferencex/check.py) on SYNTHETIC artifacts in the
layout of InferenceX's agg_bmk.json, with made-up numbers: which rows it reads, the recipe's flags
each GPU gets, the sizes it draws, and that its prediction is the closed loop of the model's own
capacity."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from cost.hardware.calibration import closed_loop_sizes
from cost.hardware.predict import capacity_for

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "capacity-inferencex" / "check.py"
_spec = importlib.util.spec_from_file_location("inferencex_check", SCRIPT)
check = importlib.util.module_from_spec(_spec)
sys.modules["inferencex_check"] = check
_spec.loader.exec_module(check)


def row(hw="h100", conc=4, tp=8, isl=1024, osl=1024, framework="vllm", model="openai/gpt-oss-120b",
        ttft=0.05, tpot=0.004, e2el=4.0, disagg=False) -> dict:
    return {"hw": hw, "conc": conc, "tp": tp, "isl": isl, "osl": osl, "framework": framework, "model": model,
            "precision": "fp4", "disagg": disagg, "mean_ttft": ttft, "mean_tpot": tpot, "mean_e2el": e2el}


@pytest.fixture
def mantile(tmp_path) -> Path:
    for run, rows in {"20667906037": [row(), row("b200-nvd", 8, 1, 8192, 1024), row("h200", 4, 8),
                                      row(framework="sglang"), row("mi355x"), row(model="amd/DeepSeek-R1"),
                                      row(disagg=True)],
                      "20218553330": [row("h100", 16, 8, 1024, 8192)]}.items():
        d = tmp_path / check.RAW / f"run_{run}"
        d.mkdir(parents=True)
        (d / "agg_bmk.json").write_text(json.dumps(rows))
    return tmp_path


def test_it_reads_the_vllm_gpt_oss_rows_of_both_runs_on_the_three_gpus(mantile):
    points = check.rows(mantile)
    assert sorted((p["run"], p["gpu"], p["concurrency"]) for p in points) == [
        ("20218553330", "h100", 16), ("20667906037", "b200", 8), ("20667906037", "h100", 4), ("20667906037", "h200", 4)]
    assert {p["vllm"] for p in points} == {"v0.13.0", "v0.11.2"}


def test_each_point_is_the_closed_loop_of_its_recipes_deployment(mantile):
    b200 = next(p for p in check.rows(mantile) if p["gpu"] == "b200")
    flags = check.engine_flags("b200", 8192, 1024, 8)
    assert flags["kv_dtype"] == "fp8" and flags["max_num_seqs"] == 512 and flags["max_model_len"] == 9416
    capacity, _ = capacity_for("openai/gpt-oss-120b", gpu="b200", tp=1, input_tokens=0.9 * 8192,
                               output_tokens=0.9 * 1024, **flags)
    inputs, outputs = check.request_sizes(8192, 1024, 80)
    expected = closed_loop_sizes(capacity, 8, inputs, outputs)
    assert b200["ttft_ms"]["predicted"] == pytest.approx(expected["ttft_ms"]["mean"])
    assert b200["tpot_ms"]["measured"] == pytest.approx(4.0)
    assert b200["e2e_ms"]["ratio"] == pytest.approx(expected["e2e_ms"]["mean"] / 4000.0)
    # Hopper keeps the recipe's max_num_seqs = C, and the H100 its longer context.
    assert check.engine_flags("h100", 1024, 1024, 32) == {"max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9,
                                                          "async_scheduling": True, "max_num_seqs": 32,
                                                          "max_model_len": 10240}
    assert check.engine_flags("h200", 1024, 1024, 8)["max_model_len"] == 2068


def test_sizes_are_drawn_as_vllms_random_dataset_draws_them_with_a_range_ratio():
    inputs, outputs = check.request_sizes(1000, 500, 4000)
    assert inputs.min() >= 800 and inputs.max() <= 1000 and outputs.min() >= 400 and outputs.max() <= 500
    assert np.mean(inputs) == pytest.approx(900, rel=0.01) and np.mean(outputs) == pytest.approx(450, rel=0.01)
    again, _ = check.request_sizes(1000, 500, 4000)
    assert (again == inputs).all()


def test_the_command_prints_each_run_and_gpu_and_writes_every_point(mantile, tmp_path, capsys):
    out = tmp_path / "points.json"
    assert check.main(["--mantile", str(mantile), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "vLLM v0.13.0 b200 8192/1024: 1 points" in printed and "all: 4 points" in printed
    assert "blog all: 34 points" in printed
    doc = json.loads(out.read_text())
    assert len(doc["artifacts"]) == 4 and len(doc["blog"]) == 34


def test_the_quoted_blog_tpot_is_set_beside_its_recipes_closed_loop(tmp_path):
    point = {"checkpoint": "nvidia/Kimi-K2.5-NVFP4", "model": "moonshotai/Kimi-K2.5", "dtype": "fp4", "gpu": "b200",
             "tp": 4, "isl": 8192, "osl": 1024, "concurrency": 8, "vllm": "v0.21.0", "tpot_ms": 11.0,
             "flags": {"max_num_batched_tokens": 16384, "kv_dtype": "fp8", "max_num_seqs": 8,
                       "gpu_memory_utilization": 0.9, "max_model_len": 9472}}
    unset = {**point, "flags": {**point["flags"], "max_num_batched_tokens": None}}
    path = tmp_path / "blog.json"
    path.write_text(json.dumps({"points": [point, unset]}))
    quoted, default = check.blog_rows(path)
    capacity, _ = capacity_for("moonshotai/Kimi-K2.5", gpu="b200", tp=4, dtype="fp4", input_tokens=0.9 * 8192,
                               output_tokens=0.9 * 1024, **point["flags"])
    inputs, outputs = check.request_sizes(8192, 1024, 80)
    expected = closed_loop_sizes(capacity, 8, inputs, outputs)["tpot_ms"]["mean"]
    assert quoted["tpot_ms"] == pytest.approx({"predicted": expected, "measured": 11.0, "ratio": expected / 11.0})
    # A flag the recipe leaves unset is vLLM's default, not a null passed on.
    flags = {k: v for k, v in point["flags"].items() if k != "max_num_batched_tokens"}
    capacity, _ = capacity_for("moonshotai/Kimi-K2.5", gpu="b200", tp=4, dtype="fp4", input_tokens=0.9 * 8192,
                               output_tokens=0.9 * 1024, **flags)
    assert default["tpot_ms"]["predicted"] == pytest.approx(closed_loop_sizes(capacity, 8, inputs, outputs)["tpot_ms"]["mean"])


def test_the_shipped_blog_tables_are_quoted_with_their_posts():
    doc = json.loads(check.BLOG.read_text())
    assert len(doc["points"]) == 34 and {p["gpu"] for p in doc["points"]} == {"b200", "h200"}
    assert all(p["post"] in doc["posts"] and p["recipe"].startswith("SemiAnalysisAI/InferenceX@") for p in doc["points"])
