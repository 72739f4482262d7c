"""Public measurements as predictions to check: one calibration point (a model, GPU, TP, dtype,
workload and what was measured) predicted with the capacity model from specs.

The points live beside their fit in ``benchmarks/capacity-calibration/points.json``; the fit
itself (``benchmarks/capacity-calibration/calibrate.py``) searches the ``Efficiency`` that
minimises the log errors over them and writes ``cost/hardware/data/efficiency-*.json``. Kept in
the package, apart from the fit, so the tests check the shipped efficiencies against the same
points with the same code.

Workloads: ``burst`` (every request at t = 0: an offline batch, or a benchmark's N prompts at
once) and ``closed_loop`` (C requests always in flight). An ``offline`` engine (vLLM's LLM class,
as its CI benchmarks run) has the LLM class's defaults and no HTTP overhead.
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from cost.hardware.predict import burst, capacity_for, closed_loop

# vLLM's LLM-class defaults where they differ from the OpenAI server's (EngineArgs.get_batch_defaults).
OFFLINE_BATCHED_TOKENS = {True: 16384, False: 8192}     # by "a large GPU" (>= 70 GiB, not an A100)
OFFLINE_MAX_SEQS = {True: 1024, False: 256}
TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure-llm-inference-2023-conv.csv"


@lru_cache(maxsize=None)
def _trace_sizes() -> tuple[np.ndarray, np.ndarray]:
    import csv

    with TRACE.open() as f:
        rows = list(csv.DictReader(f))
    return (np.array([int(r["ContextTokens"]) for r in rows], dtype=float),
            np.array([int(r["GeneratedTokens"]) for r in rows], dtype=float))


def sharegpt_sizes(requests: int, input_mean: float, output_mean: float) -> tuple[np.ndarray, np.ndarray]:
    """``requests`` sizes with ShareGPT's means and the shipped conversation trace's shape: its
    first requests, inputs and outputs each scaled to the means (integers, at least 1)."""
    inputs, outputs = _trace_sizes()
    i, o = inputs[:requests], outputs[:requests]
    return (np.maximum(1, np.round(i * input_mean / i.mean())).astype(int),
            np.maximum(1, np.round(o * output_mean / o.mean())).astype(int))


def point_capacity(point: dict[str, Any], efficiency=None):
    """The capacity model a point's deployment gets (its engine flags, offline or server)."""
    from cost.hardware import gpus

    gpu = gpus.instance(point["instance"]).gpu if point.get("instance") else gpus.gpu(point["gpu"])
    flags = {"max_num_batched_tokens": point.get("max_num_batched_tokens"), "max_num_seqs": point.get("max_num_seqs")}
    if point.get("engine") == "offline":
        large = gpu.memory_gib >= 70 and not gpu.name.startswith("a100")
        flags["max_num_batched_tokens"] = flags["max_num_batched_tokens"] or OFFLINE_BATCHED_TOKENS[large]
        flags["max_num_seqs"] = flags["max_num_seqs"] or OFFLINE_MAX_SEQS[large]
    capacity, details = capacity_for(point["model"], gpu=None if point.get("instance") else point["gpu"],
                                     instance=point.get("instance"), tp=point["tp"], dtype=point["dtype"],
                                     efficiency_override=efficiency, **flags)
    if point.get("engine") == "offline":
        capacity = dataclasses.replace(capacity, request_overhead_s=0.0)
    return capacity, details


def predict_point(point: dict[str, Any], sharegpt_means: dict[str, float], efficiency=None) -> dict[str, float]:
    """The point's measured quantities, predicted (same keys as its ``measured``)."""
    capacity, _ = point_capacity(point, efficiency)
    w = point["workload"]
    if w.get("sizes") == "sharegpt":
        inputs, outputs = sharegpt_sizes(w["requests"], sharegpt_means["input_tokens"],
                                         w.get("output_mean", sharegpt_means["output_tokens"]))
    else:
        inputs = np.full(w.get("requests", 1), w["input_tokens"])
        outputs = np.full(w.get("requests", 1), w["output_tokens"])
    if w["kind"] == "burst":
        run = burst(capacity, inputs, outputs)
        makespan = float(outputs.sum()) / run["output_tok_s"]
    elif w["kind"] == "closed_loop":
        if w.get("sizes") == "sharegpt":
            run = _closed_loop_sizes(capacity, w["concurrency"], inputs, outputs)
        else:
            run = closed_loop(capacity, w["concurrency"], int(inputs[0]), int(outputs[0]))
        makespan = math.nan
    else:
        raise ValueError(f"workload kind {w['kind']!r}")
    derived = {"e2e_ms": run["e2e_ms"]["mean"], "ttft_ms": run["ttft_ms"]["mean"], "tpot_ms": run["tpot_ms"]["mean"],
               "output_tok_s": run["output_tok_s"],
               "requests_per_s": len(inputs) / makespan if makespan == makespan else None,
               "total_tok_s": float(inputs.sum() + outputs.sum()) / makespan if makespan == makespan else None,
               "decode_tok_s": w.get("concurrency", 1) * 1000.0 / run["tpot_ms"]["mean"]}
    return {k: derived[k] for k in point["measured"]}


def _closed_loop_sizes(capacity, concurrency: int, inputs: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """A closed loop over requests of varying sizes (a benchmark client at fixed concurrency
    working through a dataset): every request counted, as benchmark clients report."""
    from cost.hardware.predict import _run, _summary

    arrival, first, last = _run(capacity, np.zeros(len(inputs)), inputs, outputs, closed_concurrency=concurrency)
    return _summary(arrival, first, last, outputs, np.ones(len(inputs), dtype=bool))


def errors(points: list[dict[str, Any]], sharegpt_means: dict[str, float], efficiency_for=None) -> list[dict]:
    """Each point's predicted and measured figures with the relative error (predicted / measured − 1).
    ``efficiency_for(family)`` overrides the shipped efficiencies (the fit uses it)."""
    from cost.hardware import gpus

    rows = []
    for point in points:
        gpu = gpus.instance(point["instance"]).gpu if point.get("instance") else gpus.gpu(point["gpu"])
        eff = efficiency_for(gpu.family) if efficiency_for else None
        predicted = predict_point(point, sharegpt_means, eff)
        for metric, measured in point["measured"].items():
            rows.append({"id": point["id"], "gpu": gpu.name, "family": gpu.family, "metric": metric,
                         "measured": measured, "predicted": predicted[metric],
                         "error": predicted[metric] / measured - 1})
    return rows
