"""The ML.ENERGY check (benchmarks/capacity-mlenergy/check.py) on SYNTHETIC files in the leaderboard's
layout (public/data/models/*.json), with made-up numbers: which configurations it reads, how it
names a quantized upload, and that its prediction is the capacity model's own decode step."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from cost.hardware.predict import capacity_for

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "capacity-mlenergy" / "check.py"
_spec = importlib.util.spec_from_file_location("mlenergy_check", SCRIPT)
check = importlib.util.module_from_spec(_spec)
sys.modules["mlenergy_check"] = check
_spec.loader.exec_module(check)


def configuration(gpu="H100", seqs=8, itl_ms=10.0, tp=1, ep=1, output=400.0) -> dict:
    return {"gpu_model": gpu, "max_num_seqs": seqs, "avg_batch_size": seqs - 0.04, "median_itl_ms": itl_ms,
            "avg_output_len": output, "num_gpus": tp,
            "parallelization": {"tensor_parallel": tp, "expert_parallel": ep, "data_parallel": 1, "notes": ""}}


@pytest.fixture
def leaderboard(tmp_path) -> Path:
    models = tmp_path / "public" / "data" / "models"
    models.mkdir(parents=True)

    def write(name: str, model_id: str, task: str, configurations: list[dict]) -> None:
        (models / name).write_text(json.dumps({"model_id": model_id, "task": task, "configurations": configurations}))

    write("llama8b.json", "meta-llama/Llama-3.1-8B-Instruct", "lm-arena-chat",
          [configuration("H100", 8, 7.0), configuration("B200", 16, 5.0),
           configuration("H100", 128, 16.0),            # above the batches the check reads
           configuration("L40S", 8, 20.0),              # a GPU it does not read
           configuration("H100", 8, 7.0, tp=2, ep=2)])  # not one TP group
    write("llama70b-fp8.json", "meta-llama/Llama-3.1-70B-Instruct-FP8", "lm-arena-chat",
          [configuration("H100", 8, 12.0, tp=2)])
    write("unknown.json", "nobody/Not-A-Model-7B", "gpqa", [configuration("H100", 8, 9.0)])
    write("images.json", "Qwen/Qwen3-VL-8B-Instruct", "image-chat", [configuration("H100", 8, 9.0)])
    return tmp_path


def test_it_reads_saturated_single_group_rows_and_predicts_the_models_own_decode_step(leaderboard):
    points, skipped = check.rows(leaderboard, prompt_tokens=300)
    got = {(p["model"], p["gpu"], p["batch"], p["tp"]) for p in points}
    assert got == {("meta-llama/Llama-3.1-8B-Instruct", "H100", 8, 1),
                   ("meta-llama/Llama-3.1-8B-Instruct", "B200", 16, 1),
                   ("meta-llama/Llama-3.1-70B-Instruct-FP8", "H100", 8, 2)}
    h100 = next(p for p in points if p["model"].endswith("8B-Instruct") and p["gpu"] == "H100")
    capacity, _ = capacity_for("meta-llama/Llama-3.1-8B-Instruct", gpu="h100", tp=1, max_num_batched_tokens=8192)
    step_ms = 1e3 * capacity.step_s(8, round(8 * (300 + 400 / 2)), 0)
    assert h100["predicted_step_ms"] == pytest.approx(step_ms)
    assert h100["ratio"] == pytest.approx(step_ms / 7.0)
    assert len(skipped) == 1 and "nobody/Not-A-Model-7B" in skipped[0] and "not in the catalog" in skipped[0]


def test_an_fp8_upload_is_its_base_model_at_fp8(leaderboard):
    points, _ = check.rows(leaderboard, prompt_tokens=300)
    fp8 = next(p for p in points if p["model"].endswith("-FP8"))
    assert fp8["dtype"] == "fp8"
    bf16, _ = capacity_for("meta-llama/Llama-3.1-70B-Instruct", gpu="h100", tp=2, max_num_batched_tokens=8192)
    # Half the weight bytes: a decode step at batch 8 is well under the BF16 one.
    assert fp8["predicted_step_ms"] < 0.8 * 1e3 * bf16.step_s(8, round(8 * 500), 0)


def test_a_longer_assumed_prompt_reads_more_kv_and_lengthens_the_step(leaderboard):
    short, _ = check.rows(leaderboard, prompt_tokens=100)
    long, _ = check.rows(leaderboard, prompt_tokens=4000)
    key = lambda p: (p["model"], p["gpu"])  # noqa: E731
    short_by, long_by = {key(p): p for p in short}, {key(p): p for p in long}
    assert all(long_by[k]["predicted_step_ms"] > short_by[k]["predicted_step_ms"] for k in short_by)


def test_the_command_prints_each_gpu_and_task_and_writes_every_point(leaderboard, tmp_path, capsys):
    out = tmp_path / "points.json"
    assert check.main(["--leaderboard", str(leaderboard), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "H100 lm-arena-chat: 2 points" in printed and "B200 lm-arena-chat: 1 points" in printed
    doc = json.loads(out.read_text())
    assert doc["prompt_tokens"] == 300 and len(doc["points"]) == 3


def test_the_extract_quotes_the_rows_and_marks_b200s_qwen3_gpqa_runs_not_fitted(leaderboard, tmp_path):
    models = leaderboard / "public" / "data" / "models"
    (models / "qwen.json").write_text(json.dumps({"model_id": "Qwen/Qwen3-8B", "task": "gpqa", "configurations": [
        configuration("B200", 8, 33.0), configuration("H100", 8, 9.7)]}))
    out = tmp_path / "extract.json"
    assert check.main(["--leaderboard", str(leaderboard), "--extract", str(out), "--prompt-tokens", "250"]) == 0
    doc = json.loads(out.read_text())
    assert doc["prompt_tokens"] == 250 and doc["max_num_batched_tokens"] == 8192 and "0cd52da" in doc["source"]
    qwen = {r["gpu"]: r for r in doc["rows"] if r["model_id"] == "Qwen/Qwen3-8B"}
    assert qwen["B200"]["fit"] is False and "4-7x" in qwen["B200"]["why"]
    assert "fit" not in qwen["H100"] and qwen["H100"]["median_itl_ms"] == 9.7
    # Quoted, not predicted: the unknown model is in the extract; the prediction skips it.
    assert any(r["model_id"] == "nobody/Not-A-Model-7B" for r in doc["rows"])
    assert not any("predicted_step_ms" in r for r in doc["rows"])
