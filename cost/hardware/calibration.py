"""Public measurements as predictions to check: one calibration point (a model, GPU, TP, dtype,
workload and what was measured) predicted with the capacity model from specs.

The points live beside their fit in ``benchmarks/capacity-calibration/points.json``; the fit
itself (``benchmarks/capacity-calibration/calibrate.py``) searches the ``Efficiency`` that
minimises the log errors over them and writes ``cost/hardware/data/efficiency-*.json``. Kept in
the package, apart from the fit, so the tests check the shipped efficiencies against the same
points with the same code.

Workloads: ``burst`` (every request at t = 0: an offline batch, or a benchmark's N prompts at
once) and ``closed_loop`` (C requests always in flight: with the benchmark's ``requests`` N,
those N from an empty server, every one counted as the client reports them; without, a steady
state, for sources that do not say N). An ``offline`` engine (vLLM's LLM class,
as its CI benchmarks run) has the LLM class's defaults and no HTTP overhead.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from cost.hardware import catalog
from cost.hardware.predict import burst, capacity_for, closed_loop

# vLLM's LLM-class defaults where they differ from the OpenAI server's (EngineArgs.get_batch_defaults).
OFFLINE_BATCHED_TOKENS = {True: 16384, False: 8192}     # by "a large GPU" (>= 70 GiB, not an A100)
OFFLINE_MAX_SEQS = {True: 1024, False: 256}


# vLLM's benchmark sampler keeps a ShareGPT conversation only if both its lengths are at least 4
# tokens, its prompt at most 1,024 and the two together at most 2,048 (``is_valid_sequence`` in
# vllm/benchmarks/datasets.py, the same filter its throughput and serving benchmarks used before).
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048
SHAREGPT_SEED = 0


def sharegpt_sizes(requests: int, input_mean: float, output_mean: float) -> tuple[np.ndarray, np.ndarray]:
    """``requests`` sizes with ShareGPT's measured means under vLLM's sampling filter.

    Only the means are published with the points, so the shape is an assumption: exponential
    (the maximum-entropy shape for a positive length of known mean), drawn with a fixed seed,
    kept or dropped by vLLM's own filter, then scaled to the means. The tail matters: a burst of
    N prompts lasts as long as its longest answers, decoded at a small batch once the rest are
    done. A bounded shape (a chat trace's, whose 200 first answers reach 2.5x the mean) makes
    vLLM's 200-prompt throughput tests look 70-80 % faster than they ran; an exponential
    reaches 5-7x the mean in 200 draws, as long-tailed as ShareGPT's answers are known to be."""
    rng = np.random.default_rng(SHAREGPT_SEED)
    kept_in: list[float] = []
    kept_out: list[float] = []
    while len(kept_in) < requests:
        i, o = rng.exponential(input_mean), rng.exponential(output_mean)
        if (min(i, o) >= SHAREGPT_MIN_LEN and i <= SHAREGPT_MAX_PROMPT
                and i + o <= SHAREGPT_MAX_TOTAL):
            kept_in.append(i)
            kept_out.append(o)
    i, o = np.array(kept_in), np.array(kept_out)
    inputs = np.clip(np.round(i * input_mean / i.mean()), SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT)
    outputs = np.clip(np.round(o * output_mean / o.mean()), SHAREGPT_MIN_LEN,
                      SHAREGPT_MAX_TOTAL - inputs)
    return inputs.astype(int), outputs.astype(int)


def point_capacity(point: dict[str, Any], efficiency=None):
    """The capacity model a point's deployment gets (its engine flags, offline or server; async
    scheduling only where the point says its vLLM ran it)."""
    from cost.hardware import gpus

    gpu = gpus.instance(point["instance"]).gpu if point.get("instance") else gpus.gpu(point["gpu"])
    flags = {"max_num_batched_tokens": point.get("max_num_batched_tokens"), "max_num_seqs": point.get("max_num_seqs")}
    if point.get("engine") == "offline":
        large = gpu.memory_gib >= 70 and not gpu.name.startswith("a100")
        flags["max_num_batched_tokens"] = flags["max_num_batched_tokens"] or OFFLINE_BATCHED_TOKENS[large]
        flags["max_num_seqs"] = flags["max_num_seqs"] or OFFLINE_MAX_SEQS[large]
    capacity, details = capacity_for(point["model"], gpu=None if point.get("instance") else point["gpu"],
                                     instance=point.get("instance"), tp=point["tp"], dtype=point["dtype"],
                                     efficiency_override=efficiency,
                                     async_scheduling=point.get("async_scheduling", False), **flags)
    if point.get("engine") == "offline":
        capacity = dataclasses.replace(capacity, request_overhead_s=0.0, frontend_request_s=0.0)
    return capacity, details


def predict_point(point: dict[str, Any], sharegpt_means: dict[str, float], efficiency=None,
                  output_cap_tok_s: float | None = None) -> dict[str, float]:
    """The point's measured quantities, predicted (same keys as its ``measured``): means
    (``ttft_ms``, ``tpot_ms``, ``e2e_ms``) or medians (``ttft_p50_ms``, ``tpot_p50_ms``), as the
    source published them.

    ``output_cap_tok_s``: the rate at which the point's serving stack (its front end or client)
    hands tokens on, when its own measurements show one below the engine's (points.json's
    ``output_caps``). A closed loop whose engine would emit faster is held to it: with the same
    requests in flight, each stream's time per token grows by the same factor (Little's law);
    the first token, sent as soon as prefill ends, is left as the engine gives it."""
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
            run = closed_loop_sizes(capacity, w["concurrency"], inputs, outputs)
        elif "requests" in w:           # the benchmark's own N from an empty server, all counted
            run = closed_loop(capacity, w["concurrency"], int(inputs[0]), int(outputs[0]),
                              requests=w["requests"], steady_state=False)
        else:                           # N not published: what a server kept at C sees
            run = closed_loop(capacity, w["concurrency"], int(inputs[0]), int(outputs[0]))
        makespan = math.nan
    else:
        raise ValueError(f"workload kind {w['kind']!r}")
    if output_cap_tok_s and w["kind"] == "closed_loop" and run["output_tok_s"] > output_cap_tok_s:
        slower = run["output_tok_s"] / output_cap_tok_s
        run = {**run, "output_tok_s": output_cap_tok_s,
               "tpot_ms": {k: v * slower for k, v in run["tpot_ms"].items()}}
    derived = {"e2e_ms": run["e2e_ms"]["mean"], "ttft_ms": run["ttft_ms"]["mean"], "tpot_ms": run["tpot_ms"]["mean"],
               "ttft_p50_ms": run["ttft_ms"]["p50"], "tpot_p50_ms": run["tpot_ms"]["p50"],
               "output_tok_s": run["output_tok_s"],
               "requests_per_s": len(inputs) / makespan if makespan == makespan else None,
               "total_tok_s": float(inputs.sum() + outputs.sum()) / makespan if makespan == makespan else None,
               "decode_tok_s": w.get("concurrency", 1) * 1000.0 / run["tpot_ms"]["mean"]}
    return {k: derived[k] for k in point["measured"]}


def closed_loop_sizes(capacity, concurrency: int, inputs: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """A closed loop over requests of varying sizes (a benchmark client at fixed concurrency
    working through a dataset): every request counted, as benchmark clients report."""
    from cost.hardware.predict import _run, _summary

    arrival, first, last = _run(capacity, np.zeros(len(inputs)), inputs, outputs, closed_concurrency=concurrency)
    return _summary(arrival, first, last, outputs, np.ones(len(inputs), dtype=bool))


def shipped_output_caps() -> dict[str, float]:
    """The serving stacks' output caps fitted beside the shipped efficiencies (calibration only)."""
    from cost.hardware.roofline import efficiency_table

    return dict(efficiency_table().get("output_caps", {}).get("fitted", {}))


def errors(points: list[dict[str, Any]], sharegpt_means: dict[str, float], efficiency_for=None,
           output_caps: dict[str, float] | None = None) -> list[dict]:
    """Each point's predicted and measured figures with the relative error (predicted / measured − 1).
    ``efficiency_for(family)`` overrides the shipped efficiencies (the fit uses it);
    ``output_caps`` gives the output rate of each serving stack a point names (``output_cap``),
    fitted beside the efficiencies and not part of them: a point whose stack's cap is not given
    is predicted from the engine alone."""
    from cost.hardware import gpus

    rows = []
    for point in points:
        gpu = gpus.instance(point["instance"]).gpu if point.get("instance") else gpus.gpu(point["gpu"])
        eff = efficiency_for(gpu.family) if efficiency_for else None
        cap = (output_caps or {}).get(point.get("output_cap"))
        predicted = predict_point(point, sharegpt_means, eff, cap)
        for metric, measured in point["measured"].items():
            rows.append({"id": point["id"], "gpu": gpu.name, "family": gpu.family, "metric": metric,
                         "measured": measured, "predicted": predicted[metric],
                         "error": predicted[metric] / measured - 1})
    return rows


# --- the fused-MoE kernels (benchmarks/capacity-calibration/moe-kernels.json) ---------------------

# The largest step a decode runs at, for the kernel points the per-expert terms are fitted on.
MOE_KERNEL_MAX_TOKENS = 128


def moe_kernel_rows(doc: dict[str, Any], efficiency_for=None) -> list[dict]:
    """Every public fused-MoE kernel timing against ``roofline.routed_experts_layer_s`` (µs),
    with ``fitted``: whether it is in the regime a decode step runs in (at most
    ``MOE_KERNEL_MAX_TOKENS`` tokens, and more expert bytes touched than the GPU's L2 cache holds,
    since the benchmark replays the same weights). ``efficiency_for(family)`` overrides the
    shipped efficiencies (the fit uses it)."""
    from cost.hardware import gpus
    from cost.hardware.catalog import bytes_per_weight
    from cost.hardware.roofline import efficiency, routed_experts_layer_s
    from cost.simulate.capacity import experts_touched

    rows = []
    for point in doc["points"]:
        gpu = gpus.gpu(point["gpu"])
        eff = efficiency_for(gpu.family) if efficiency_for else efficiency(gpu.family)
        e, k = point["experts"], point["experts_per_token"]
        expert_bytes = 3 * point["hidden"] * point["intermediate"] * bytes_per_weight(point["dtype"])
        for tokens, measured in sorted(((int(t), us) for t, us in point["kernel_us"].items())):
            predicted = 1e6 * routed_experts_layer_s(gpu, point["dtype"], eff, e, k, point["hidden"],
                                                     point["intermediate"], tokens)
            touched = e * experts_touched(e, k, tokens)
            rows.append({"id": point["id"], "gpu": gpu.name, "family": gpu.family, "tokens": tokens,
                         "touched": touched, "measured_us": measured, "predicted_us": predicted,
                         "error": predicted / measured - 1,
                         "fitted": (tokens <= MOE_KERNEL_MAX_TOKENS
                                    and touched * expert_bytes / 1e6 > doc["l2_mb"][gpu.name])})
    return rows


# --- saturated servers' decode steps (benchmarks/capacity-calibration/mlenergy-decode.json) ---------

def decode_step_rows(doc: dict[str, Any], efficiency_for=None) -> tuple[list[dict], list[str]]:
    """Each saturated server's median inter-token latency beside ``CapacityModel.step_s`` at its
    batch, and the rows the catalog cannot predict (``skipped``, each with why).

    A server kept at ``max_num_seqs`` sequences decodes them all every step, and a new request's
    prefill joins one step in hundreds, so its median inter-token latency is the decode step at
    that batch. A sequence holds, halfway through its answer, the prompt (``doc["prompt_tokens"]``:
    assumed where the source does not publish it) plus half the mean answer. An ``-FP8`` upload is
    its base model at FP8. ``efficiency_for(family)`` overrides the shipped efficiencies (a fit
    uses it). Each row carries ``layers`` and ``batch``: how the step moves with the per-layer and
    per-sequence fixed costs (``layer_s``, ``seq_s``), which it is linear in."""
    from cost.hardware import gpus
    from options.core import BadInput

    out, skipped = [], []
    for r in doc["rows"]:
        name, dtype = r["model_id"], "auto"
        if name.endswith("-FP8"):
            name, dtype = name[:-len("-FP8")], "fp8"
        gpu = gpus.gpu(r["gpu"])
        try:
            spec = catalog.resolve(name)
            capacity, _ = capacity_for(spec, gpu=gpu.name, tp=r["tp"], dtype=dtype,
                                       max_num_batched_tokens=doc["max_num_batched_tokens"],
                                       efficiency_override=efficiency_for(gpu.family) if efficiency_for else None)
        except BadInput as e:
            skipped.append(f"{r['model_id']} on {r['gpu']} TP{r['tp']}: {str(e).splitlines()[0]}")
            continue
        batch = round(r["avg_batch_size"])
        context = doc["prompt_tokens"] + r["avg_output_len"] / 2
        predicted = 1e3 * capacity.step_s(batch, round(batch * context), 0)
        out.append({"gpu": r["gpu"], "family": gpu.family, "model": r["model_id"], "task": r["task"], "dtype": dtype,
                    "tp": r["tp"], "max_num_seqs": r["max_num_seqs"], "batch": batch, "layers": spec.layers,
                    "measured_itl_ms": r["median_itl_ms"], "predicted_step_ms": predicted,
                    "ratio": predicted / r["median_itl_ms"], "fit": r.get("fit", True)})
    return out, sorted(set(skipped))


def with_control(rows: list[dict], control_gpu: str) -> list[dict]:
    """The rows of other GPUs, each with ``control_ratio``: the median predicted/measured of
    ``control_gpu``'s rows of the same model, task and ``max_num_seqs`` (any TP) — the same runs
    on a GPU whose efficiencies were fitted, which carries what both share and the data leave
    unknown (the prompt lengths, the serving stack). Rows without such a control are dropped."""
    controls: dict[tuple, list[float]] = {}
    for r in rows:
        if r["gpu"] == control_gpu:
            controls.setdefault((r["model"], r["task"], r["max_num_seqs"]), []).append(r["ratio"])
    return [{**r, "control_ratio": float(np.median(controls[key]))} for r in rows
            if r["gpu"] != control_gpu and (key := (r["model"], r["task"], r["max_num_seqs"])) in controls]
