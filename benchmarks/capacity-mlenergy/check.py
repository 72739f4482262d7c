"""The decode step against ML.ENERGY's public vLLM runs on B200 and H100 (B200's fixed costs fitted on them).

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

from cost.hardware.calibration import decode_step_rows  # noqa: E402

GPUS = ("H100", "H200", "B200")
MAX_BATCH = 64
ENGINE_BATCHED_TOKENS = 8192        # configs/vllm/*/*/*/monolithic.config.yaml in ml-energy/benchmark
SOURCE = ("ML.ENERGY leaderboard, github.com/ml-energy/leaderboard public/data/models/*.json (data of 2026-02-16; "
          "read at 0cd52dab897c5d91a45f4d413038f3b8b4251b0f); settings from github.com/ml-energy/benchmark "
          "(c1d6557): vLLM 0.11.1 (vllm/vllm-openai:v0.11.1), max-num-batched-tokens 8192, async scheduling, "
          "three API servers, BF16 unless the checkpoint is quantized; servers kept saturated at max_num_seqs")
# Rows read but not fitted on, each with why.
NOT_FITTED = [
    (lambda c, doc: c["gpu_model"] == "B200" and doc["task"] == "gpqa" and doc["model_id"].startswith("Qwen/Qwen3-"),
     "B200's GPQA runs of the Qwen3 models take 30-44 ms a token at a batch of 8, 4-7x the same models' chat rows "
     "on the same GPU and batch, where the H100's GPQA rows sit with its chat rows: something in those runs other "
     "than the decode step (not published) sets them"),
]


def extract(leaderboard: Path, prompt_tokens: float = 300.0) -> dict:
    """The leaderboard's saturated single-group runs of up to ``MAX_BATCH`` sequences on the GPUs
    read, chat and GPQA tasks, with what the decode step needs: the quoted figures, no prediction."""
    out = []
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
            row = {"model_id": doc["model_id"], "task": doc["task"], "gpu": c["gpu_model"],
                   "tp": par["tensor_parallel"], "max_num_seqs": c["max_num_seqs"],
                   "avg_batch_size": c["avg_batch_size"], "median_itl_ms": c["median_itl_ms"],
                   "avg_output_len": c["avg_output_len"]}
            for rule, why in NOT_FITTED:
                if rule(c, doc):
                    row.update(fit=False, why=why)
            out.append(row)
    return {"source": SOURCE, "max_num_batched_tokens": ENGINE_BATCHED_TOKENS, "prompt_tokens": prompt_tokens,
            "prompt_tokens_why": "the runs do not publish their prompt lengths (LMArena conversations, each turn "
                                 "with the conversation before it; GPQA questions): assumed",
            "rows": out}


def rows(leaderboard: Path, prompt_tokens: float) -> tuple[list[dict], list[str]]:
    return decode_step_rows(extract(leaderboard, prompt_tokens))


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
    parser.add_argument("--extract", type=Path, help="write the rows read (no predictions) here: the calibration's "
                                                     "copy is benchmarks/capacity-calibration/mlenergy-decode.json")
    args = parser.parse_args(argv)
    if args.extract:
        args.extract.write_text(json.dumps(extract(args.leaderboard, args.prompt_tokens), indent=1) + "\n")
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
