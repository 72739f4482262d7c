"""The spec model's decode step against ML.ENERGY's public vLLM runs on B200 and H100 (not fitted on).

The ML.ENERGY leaderboard (github.com/ml-energy/leaderboard, ``public/data/models/*.json``, data of
2026-02-16) publishes, per model, GPU and ``max_num_seqs``, the median inter-token latency of a
server kept saturated at that many sequences (its ``avg_batch_size`` is within 1 % of
``max_num_seqs``). The runs' settings are in github.com/ml-energy/benchmark: vLLM 0.11.1
(``vllm/vllm-openai:v0.11.1``), ``max-num-batched-tokens`` 8192, async scheduling, three API
servers, BF16 unless the checkpoint is quantized (gpt-oss: MXFP4), answers as long as the model
writes them (``avg_output_len`` published), prompts from LMArena conversations (lm-arena-chat) or
GPQA (gpqa), whose lengths are not published.

A saturated server's median inter-token latency is its decode step at that batch (a new request's
prefill joins one step in a few hundred). This sets it beside ``CapacityModel.step_s(batch,
batch x context, 0)`` from ``capacity_for(model, gpu, tp)``, with the context a sequence holds
halfway through its answer: ``--prompt-tokens`` (assumed: not published) plus half the mean answer.
Batches up to 64, one TP group (no expert or data parallelism).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/capacity-mlenergy/check.py --leaderboard PATH [--prompt-tokens 300]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cost.hardware.predict import capacity_for  # noqa: E402
from options.core import BadInput  # noqa: E402

GPUS = {"H100": "h100", "H200": "h200", "B200": "b200"}
MAX_BATCH = 64
ENGINE_BATCHED_TOKENS = 8192        # configs/vllm/*/*/*/monolithic.config.yaml in ml-energy/benchmark


def rows(leaderboard: Path, prompt_tokens: float) -> tuple[list[dict], list[str]]:
    out, skipped = [], []
    for path in sorted((leaderboard / "public" / "data" / "models").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("task") not in ("lm-arena-chat", "gpqa"):
            continue
        for c in doc["configurations"]:
            par = c["parallelization"]
            if c["gpu_model"] not in GPUS or c["max_num_seqs"] > MAX_BATCH:
                continue
            if par["expert_parallel"] != 1 or par["data_parallel"] != 1:
                continue
            # An FP8 re-upload is its base model at FP8, as the held-out harness reads one.
            name, dtype = doc["model_id"], "auto"
            if name.endswith("-FP8"):
                name, dtype = name[:-len("-FP8")], "fp8"
            try:
                capacity, _ = capacity_for(name, gpu=GPUS[c["gpu_model"]], tp=par["tensor_parallel"], dtype=dtype,
                                           max_num_batched_tokens=ENGINE_BATCHED_TOKENS)
            except BadInput as e:
                skipped.append(f"{doc['model_id']} on {c['gpu_model']} TP{par['tensor_parallel']}: {str(e).splitlines()[0]}")
                continue
            batch = round(c["avg_batch_size"])
            context = prompt_tokens + c["avg_output_len"] / 2
            predicted = 1e3 * capacity.step_s(batch, round(batch * context), 0)
            out.append({"gpu": c["gpu_model"], "model": doc["model_id"], "task": doc["task"], "dtype": dtype,
                        "tp": par["tensor_parallel"], "batch": batch, "measured_itl_ms": c["median_itl_ms"],
                        "predicted_step_ms": predicted, "ratio": predicted / c["median_itl_ms"]})
    return out, sorted(set(skipped))


def summary(rs: list[dict]) -> str:
    ratios = [r["ratio"] for r in rs]
    return (f"{len(rs)} points, predicted/measured median {statistics.median(ratios):.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}), median |error| "
            f"{100 * statistics.median(abs(x - 1) for x in ratios):.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaderboard", type=Path, required=True, help="a clone of ml-energy/leaderboard")
    parser.add_argument("--prompt-tokens", type=float, default=300.0,
                        help="the mean prompt assumed (the runs do not publish it); default 300")
    parser.add_argument("--json", type=Path, help="write every point here")
    args = parser.parse_args(argv)
    points, skipped = rows(args.leaderboard, args.prompt_tokens)
    for gpu in GPUS:
        for task in ("lm-arena-chat", "gpqa"):
            rs = [r for r in points if r["gpu"] == gpu and r["task"] == task]
            if rs:
                print(f"{gpu} {task}: {summary(rs)}")
    print("\n| GPU | model | task | TP | batch | measured median ITL (ms) | predicted step (ms) | ratio |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in points:
        print(f"| {r['gpu']} | {r['model']} | {r['task']} | {r['tp']} | {r['batch']} | "
              f"{r['measured_itl_ms']:.2f} | {r['predicted_step_ms']:.2f} | {r['ratio']:.2f} |")
    for s in skipped:
        print("skipped:", s)
    if args.json:
        args.json.write_text(json.dumps({"prompt_tokens": args.prompt_tokens, "points": points,
                                         "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
