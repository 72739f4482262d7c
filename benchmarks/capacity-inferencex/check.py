"""The spec model against InferenceX's public vLLM closed loops of gpt-oss-120b on H100, H200 and B200 (not fitted on).

InferenceX (SemiAnalysis; formerly InferenceMAX, github.com/SemiAnalysisAI/InferenceX) benchmarks
each (GPU, TP, ISL/OSL, concurrency) point on a fresh ``vllm serve`` with its recipe's flags and
vLLM's own serving benchmark client, and publishes the client's summary per point (CI artifact
``results_bmk/agg_bmk.json``). Two of those artifacts, kept verbatim in github.com/gminneci/mantile
(``reconcile/sources/inferencemax/raw/run_<id>/agg_bmk.json``, read at ``72ff84e``), hold vLLM runs
of gpt-oss-120b on all three GPUs:

- run 20667906037 (2026-01-02, ``vllm/vllm-openai:v0.13.0``, recipe at InferenceX ``4e52ed4c6``);
- run 20218553330 (about 2025-12-15 by the run ids' order, ``v0.11.2``, recipe at ``9c0fcc9af``).

How a point ran (InferenceX ``benchmarks/benchmark_lib.sh`` and the recipes
``benchmarks/gptoss_fp4_{h100,h200,b200}*.sh``): ``--dataset-name random --random-range-ratio 0.8
--ignore-eos --request-rate inf --max-concurrency C --num-prompts 10·C``, so each request's prompt
and answer lengths are drawn uniformly from [0.8·ISL, ISL] and [0.8·OSL, OSL], all 10·C requests
are queued at once and C are kept in flight (the first C start together), and every request is
counted; one untimed warm-up request before them. Server flags: ``--max-num-batched-tokens 8192
--async-scheduling --no-enable-prefix-caching``, ``--gpu-memory-utilization 0.9``; H100 and H200
``--max-num-seqs C`` (H100 ``--max-model-len 10240``; H200 2,068 at 1k/1k, else 9,416); B200
``--max-num-seqs 512 --kv-cache-dtype fp8`` (``--max-model-len`` as H200) with
``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1`` (the MXFP4 experts take FP8 activations, which the
spec model does not: it runs them as vLLM's default does, 16-bit activations).

Each point is predicted with the shipped efficiencies by ``closed_loop_sizes``: the same 10·C
sizes drawn from the same ranges (fixed seed), C in flight, every request counted; the means of
TTFT, TPOT and E2E set beside the client's.

    git clone https://github.com/gminneci/mantile ../mantile
    PYTHONPATH=$PWD .venv/bin/python benchmarks/capacity-inferencex/check.py --mantile ../mantile [--json FILE]

Nothing from the artifacts is stored in this repository (the mirror states no licence for reuse):
the script reads them from the clone, and ``--json`` writes its rows where you say.

Beside them, ``blog-tpot.json`` quotes the TPOT tables of InferenceX's blog posts on MiniMax-M2.5
(FP8, NVFP4) and Kimi-K2.5 (INT4, NVFP4) on B200 and H200 (vLLM 0.21.0, 8k/1k, each row with its
recipe's flags and commit): predicted the same way, TPOT only (the posts give no TTFT or E2E).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cost.hardware.calibration import closed_loop_sizes  # noqa: E402
from cost.hardware.predict import capacity_for  # noqa: E402

RUNS = {"20667906037": "v0.13.0", "20218553330": "v0.11.2"}
BLOG = Path(__file__).resolve().parent / "blog-tpot.json"
RAW = Path("reconcile/sources/inferencemax/raw")
MODEL = "openai/gpt-oss-120b"
GPUS = ("h100", "h200", "b200")
RANGE_RATIO = 0.8
METRICS = {"ttft_ms": "mean_ttft", "tpot_ms": "mean_tpot", "e2e_ms": "mean_e2el"}


def engine_flags(gpu: str, isl: int, osl: int, concurrency: int) -> dict:
    """The recipe's vLLM flags for a point, as ``capacity_for`` takes them."""
    # Every recipe passes --async-scheduling (vLLM's default only from 0.14.0).
    flags = {"max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9, "async_scheduling": True}
    if gpu == "h100":
        return {**flags, "max_num_seqs": concurrency, "max_model_len": 10240}
    context = 2068 if isl + osl == 2048 else 9416
    if gpu == "h200":
        return {**flags, "max_num_seqs": concurrency, "max_model_len": context}
    return {**flags, "max_num_seqs": 512, "max_model_len": context, "kv_dtype": "fp8"}


def request_sizes(isl: int, osl: int, requests: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and answer lengths as vLLM's random dataset draws them with a range ratio: uniform
    integers from ``int(ratio · length)`` to ``length``."""
    rng = np.random.default_rng(seed)
    return (rng.integers(int(RANGE_RATIO * isl), isl + 1, requests),
            rng.integers(int(RANGE_RATIO * osl), osl + 1, requests))


def rows(mantile: Path) -> list[dict]:
    out = []
    for run, version in RUNS.items():
        path = mantile / RAW / f"run_{run}" / "agg_bmk.json"
        for r in json.loads(path.read_text()):
            gpu = r["hw"].split("-")[0]
            if r["framework"] != "vllm" or r["model"] != MODEL or gpu not in GPUS or r.get("disagg"):
                continue
            isl, osl, c = r["isl"], r["osl"], r["conc"]
            capacity, _ = capacity_for(MODEL, gpu=gpu, tp=r["tp"], input_tokens=0.9 * isl, output_tokens=0.9 * osl,
                                       **engine_flags(gpu, isl, osl, c))
            inputs, outputs = request_sizes(isl, osl, 10 * c)
            run_ = closed_loop_sizes(capacity, c, inputs, outputs)
            row = {"run": run, "vllm": version, "gpu": gpu, "tp": r["tp"], "isl": isl, "osl": osl, "concurrency": c}
            for metric, key in METRICS.items():
                predicted, measured = run_[metric]["mean"], 1e3 * r[key]
                row[metric] = {"predicted": predicted, "measured": measured, "ratio": predicted / measured}
            out.append(row)
    return out


def blog_rows(path: Path = BLOG) -> list[dict]:
    """Each quoted TPOT beside the closed loop of its recipe's deployment (a checkpoint in NVFP4 is
    its base model at ``fp4``; flags the recipe leaves unset are vLLM's defaults)."""
    out = []
    for p in json.loads(path.read_text())["points"]:
        isl, osl, c = p["isl"], p["osl"], p["concurrency"]
        flags = {k: v for k, v in p["flags"].items() if v is not None}
        capacity, _ = capacity_for(p["model"], gpu=p["gpu"], tp=p["tp"], dtype=p["dtype"], input_tokens=0.9 * isl,
                                   output_tokens=0.9 * osl, **flags)
        inputs, outputs = request_sizes(isl, osl, 10 * c)
        predicted = closed_loop_sizes(capacity, c, inputs, outputs)["tpot_ms"]["mean"]
        out.append({"checkpoint": p["checkpoint"], "gpu": p["gpu"], "tp": p["tp"], "concurrency": c, "vllm": p["vllm"],
                    "tpot_ms": {"predicted": predicted, "measured": p["tpot_ms"], "ratio": predicted / p["tpot_ms"]}})
    return out


def summary(rs: list[dict], metrics=tuple(METRICS)) -> str:
    parts = []
    for metric in metrics:
        ratios = [r[metric]["ratio"] for r in rs]
        parts.append(f"{metric.removesuffix('_ms').upper()} {statistics.median(ratios):.2f} "
                     f"({100 * statistics.median(abs(x - 1) for x in ratios):.0f} %)")
    return f"{len(rs)} points; predicted/measured median (median |error|): " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mantile", type=Path, required=True, help="a clone of github.com/gminneci/mantile")
    parser.add_argument("--json", type=Path, help="write every point (predicted, measured, ratio) here")
    parser.add_argument("--blog", type=Path, default=BLOG, help="the quoted blog tables (default: blog-tpot.json here)")
    args = parser.parse_args(argv)
    points = rows(args.mantile)
    for version in RUNS.values():
        for gpu in GPUS:
            for shape in ((1024, 1024), (1024, 8192), (8192, 1024)):
                rs = [r for r in points if (r["vllm"], r["gpu"], (r["isl"], r["osl"])) == (version, gpu, shape)]
                if rs:
                    print(f"vLLM {version} {gpu} {shape[0]}/{shape[1]}: {summary(rs)}")
            rs = [r for r in points if (r["vllm"], r["gpu"]) == (version, gpu)]
            if rs:
                print(f"vLLM {version} {gpu} all: {summary(rs)}")
    print(f"all: {summary(points)}")
    blog = blog_rows(args.blog)
    for checkpoint, gpu in sorted({(r["checkpoint"], r["gpu"]) for r in blog}):
        rs = [r for r in blog if (r["checkpoint"], r["gpu"]) == (checkpoint, gpu)]
        print(f"blog {checkpoint} {gpu}: {summary(rs, ('tpot_ms',))}")
    print(f"blog all: {summary(blog, ('tpot_ms',))}")
    if args.json:
        args.json.write_text(json.dumps({"artifacts": points, "blog": blog}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
