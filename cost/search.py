"""The deployment search behind ``python -m cost recommend --trace T --hf-model M``: every instance ×
TP × dtype that fits the model, each simulated on the trace with its autoscaling, the cheapest
that meets the SLO first.

A candidate is an instance type priced on SageMaker (rung 3 runs the model on LMI there), its
tensor-parallel degree every GPU it has (LMI's default, ``OPTION_TENSOR_PARALLEL_DEGREE=max``;
one size per GPU count is kept, the cheapest), and a weight format from ``--dtypes``. Its
capacity comes from specs (``cost.hardware``), with LMI's own batch limit (``max_num_seqs`` 256,
its ``max_rolling_batch_size``) unless ``--max-num-seqs`` says otherwise.

Simulating every candidate would take minutes on a day's trace, so the search bounds first: no
fleet can cost less than its instance's price over the trace's span, nor less than the hours its
saturated throughput needs to emit the trace's output tokens. Candidates are simulated cheapest
bound first, and one whose bound already costs more than the best answer so far is not simulated
(``pruned``); nor is one whose idle time to first token for the trace's 99th-percentile prompt
already misses the TTFT objective.
"""
from __future__ import annotations

import argparse
import copy
import math
from typing import Any

import numpy as np

from options.core import BadInput

LMI_MAX_NUM_SEQS = 256          # LMI's default option.max_rolling_batch_size (options/lmi/config.py)
SEARCH_LEVEL = 3


def parse_list(text: str | None, flag: str) -> list[str]:
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if text is not None and not items:
        raise BadInput(f"{flag} {text!r} names nothing: give a comma-separated list, e.g. {flag} g5,g6e,p5")
    return items


def candidate_instances(table, wanted: list[str]) -> list:
    """Priced GPU instances the hardware table models, filtered by family ('g6e') or name
    ('g6e.12xlarge'), the cheapest size of each family and GPU count."""
    from cost.hardware import gpus

    modelled = {i.name: i for i in gpus.instances()}
    priced = [i for i in table.instances() if i.name in modelled and i.sagemaker_hourly]
    if wanted:
        known = {i.name.split(".")[0] for i in priced} | {i.name for i in priced}
        unknown = [w for w in wanted if w.removeprefix("ml.") not in known]
        if unknown:
            raise BadInput(f"--instances {','.join(unknown)}: not a priced GPU instance or family; priced: "
                           f"{', '.join(sorted({i.name.split('.')[0] for i in priced}))}")
        names = {w.removeprefix("ml.") for w in wanted}
        priced = [i for i in priced if i.name in names or i.name.split(".")[0] in names]
    cheapest: dict[tuple[str, int], Any] = {}
    for inst in priced:
        key = (inst.name.split(".")[0], modelled[inst.name].gpus)
        if key not in cheapest or inst.sagemaker_hourly < cheapest[key].sagemaker_hourly:
            cheapest[key] = inst
    return sorted(cheapest.values(), key=lambda i: i.sagemaker_hourly)


def search(args: argparse.Namespace, table_from, eks_fixed_hourly) -> dict[str, Any]:
    """Every candidate with its capacity, bound and (where simulated) its rung-3 simulation;
    ``best`` the cheapest meeting the SLO, else ``closest`` (highest attainment)."""
    from cost.hardware.predict import capacity_for
    from cost.simulate.capacity import check_hit_rate
    from cost.simulate.prefix import check_one_source, prefix_of, reuse_bound
    from cost.traces import trace_from_args

    table = table_from(args)
    trace = trace_from_args(args)
    if trace is None:
        raise BadInput("the search simulates a trace: give --trace FILE")
    dtypes = parse_list(args.dtypes, "--dtypes") or ["auto"]
    hit_rate = args.prefix_cache_hit_rate or 0.0
    check_hit_rate(hit_rate, "--prefix-cache-hit-rate")   # before any candidate reads it
    prefix = prefix_of(trace, args.block_tokens)
    check_one_source(prefix, hit_rate)
    # The floors and the idle-TTFT filter must not exceed what a candidate can do: with the trace's
    # blocks they take the most reuse any replica could see (each simulation finds its own).
    bound_rate = reuse_bound(prefix, trace.input_tokens) if prefix is not None else hit_rate
    instances = candidate_instances(table, parse_list(args.instances, "--instances"))
    if not instances:
        raise BadInput("no priced GPU instance to search: widen --instances")
    mean_in, mean_out = float(trace.input_tokens.mean()), float(trace.output_tokens.mean())
    span_h = trace.span_s / 3600
    output_tokens = float(trace.output_tokens.sum())
    p99_prompt = float(np.percentile(trace.input_tokens, 99))
    rows: list[dict[str, Any]] = []
    for inst in instances:
        for dtype in dtypes:
            row: dict[str, Any] = {"instance": inst.sagemaker_name, "dtype": dtype,
                                   "hourly_usd": inst.sagemaker_hourly}
            try:
                capacity, details = capacity_for(
                    args.spec_model, instance=inst.name, tp=args.tp, dtype=dtype, kv_dtype=args.kv_dtype,
                    max_num_seqs=args.max_num_seqs or LMI_MAX_NUM_SEQS,
                    max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                    gpu_memory_utilization=args.gpu_memory_utilization, input_tokens=mean_in,
                    prefix_cache_hit_rate=hit_rate, async_scheduling=getattr(args, "async_scheduling", True),
                    output_tokens=mean_out)
            except BadInput as exc:
                rows.append({**row, "status": "does not fit", "why": str(exc).split(". What fits")[0]})
                continue
            bound = capacity.with_prefix_cache(bound_rate)
            saturated = bound.saturated_output_tok_s(mean_in, mean_out)
            row.update(tp=details["hardware"]["tp"], gpu=details["hardware"]["gpu"],
                       weights_dtype=details["model"]["dtype"], kv_cache_tokens=details["kv_cache_tokens"],
                       saturated_output_tok_s=round(saturated, 1),
                       idle_ttft_ms=round(bound.idle_ttft_s(p99_prompt) * 1000, 1),
                       floor_usd=round(inst.sagemaker_hourly * max(span_h, output_tokens / saturated / 3600), 4))
            rows.append(row)
    fitting = sorted((r for r in rows if "floor_usd" in r), key=lambda r: r["floor_usd"])
    if not fitting:
        raise BadInput(f"{args.spec_model} fits none of the searched instances "
                       f"({', '.join(i.sagemaker_name for i in instances)}): " + rows[0]["why"])
    best = None
    slo_ttft = getattr(args, "slo_ttft_ms", None)
    queue = []
    for row in fitting:
        if slo_ttft and row["idle_ttft_ms"] > slo_ttft:
            row["status"] = "cannot meet TTFT"
            row["why"] = (f"an idle replica's TTFT for the trace's p99 prompt ({p99_prompt:,.0f} tokens) is "
                          f"{row['idle_ttft_ms']:,.0f} ms, above --slo-ttft-ms {slo_ttft:g}")
        else:
            queue.append(row)
    # Two candidates at a time (this machine class has two cores), cheapest floors first; between
    # rounds, the best bill so far prunes every floor above it.
    with _pool() as pool:
        while queue:
            if best is not None:
                for row in [r for r in queue if r["floor_usd"] >= best["window_usd"]]:
                    row["status"] = "pruned"
                    row["why"] = (f"its floor ${row['floor_usd']:,.2f} (price × the trace's span or its busy "
                                  f"hours) is above ${best['window_usd']:,.2f}, the best answer's bill")
                    queue.remove(row)
            batch, queue = queue[:WORKERS], queue[WORKERS:]
            runs = pool.map(_simulate_rung, [(candidate_args(args, row), table_from, eks_fixed_hourly)
                                             for row in batch])
            for row, rung in zip(batch, runs):
                row.update(status="simulated", window_usd=rung["window_usd"], monthly_usd=rung["monthly_usd"],
                           slo_attainment=rung["slo_attainment"], meets_slo=rung["meets_slo"],
                           policy=rung["policy"], replicas=rung["replicas"], ttft_ms=rung["ttft_ms"],
                           e2e_ms=rung["e2e_ms"])
                if rung["meets_slo"] and (best is None or rung["window_usd"] < best["window_usd"]):
                    best = row
    simulated = [r for r in rows if r.get("status") == "simulated"]
    closest = None if best or not simulated else max(simulated, key=lambda r: (r["slo_attainment"],
                                                                              -r["window_usd"]))
    return {"candidates": rows, "best": best, "closest": closest,
            "mix": {"input_tokens": round(mean_in, 1), "output_tokens": round(mean_out, 1)},
            "prefix_reuse_bound": round(bound_rate, 4) if prefix is not None else None,
            "note": (f"each candidate is rung {SEARCH_LEVEL} (LMI on SageMaker) with TP = its GPUs and "
                     f"max_num_seqs {args.max_num_seqs or LMI_MAX_NUM_SEQS}; candidates are simulated cheapest "
                     "floor first and pruned once their floor exceeds the best bill"
                     + (f"; saturated rates and floors at the most reuse the trace's prompt blocks allow "
                        f"({bound_rate:.1%} of prompt tokens), each simulation at its replicas' own hits"
                        if prefix is not None else ""))}


WORKERS = 2


def _pool():
    """Processes forked from this one (the trace and tables already read); a plain map where
    fork is not available."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from contextlib import nullcontext

    if "fork" not in multiprocessing.get_all_start_methods():
        class Serial:
            map = staticmethod(lambda f, items: list(map(f, items)))
        return nullcontext(Serial())
    return ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("fork"))


def _simulate_rung(job) -> dict[str, Any]:
    from cost.simulate.cli import simulate

    args, table_from, eks_fixed_hourly = job
    return simulate(args, table_from, eks_fixed_hourly)["rungs"][0]


def candidate_args(args: argparse.Namespace, row: dict[str, Any]) -> argparse.Namespace:
    """The simulate arguments of one candidate: its instance and format, rung 3 alone, no plot."""
    ns = copy.copy(args)
    ns.instance, ns.dtype, ns.tp = row["instance"], row["dtype"], row["tp"]
    ns.max_num_seqs = args.max_num_seqs or LMI_MAX_NUM_SEQS
    ns.rungs, ns.plot, ns.no_progress = str(SEARCH_LEVEL), None, True
    return ns


def deploy_options(row: dict[str, Any], max_num_seqs: int | None) -> list[str]:
    """The LMI options that deploy what the candidate simulated."""
    argv = ["--option", f"OPTION_TENSOR_PARALLEL_DEGREE={row['tp']}"]
    quantize = {"fp8": "fp8", "int4": "awq"}.get(row["dtype"])
    if quantize:
        argv += ["--option", f"OPTION_QUANTIZE={quantize}"]
    if max_num_seqs:
        argv += ["--option", f"OPTION_MAX_ROLLING_BATCH_SIZE={max_num_seqs}"]
    return argv


def plot_search(result: dict[str, Any], path: str) -> None:
    """Monthly cost against SLO attainment, one point per simulated candidate, the answer ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["candidates"] if r.get("status") == "simulated"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.scatter(r["slo_attainment"] * 100, r["monthly_usd"], color="tab:green" if r["meets_slo"] else "tab:red")
        ax.annotate(f"{r['instance']} {r['dtype']}", (r["slo_attainment"] * 100, r["monthly_usd"]), fontsize=7,
                    xytext=(4, 2), textcoords="offset points")
    best = result["best"]
    if best:
        ax.scatter(best["slo_attainment"] * 100, best["monthly_usd"], s=200, facecolors="none",
                   edgecolors="black", label="the answer")
        ax.legend()
    ax.set_xlabel("requests within the SLO (%)")
    ax.set_ylabel("USD a month")
    ax.set_title("instance × TP × dtype, each simulated with its autoscaling")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_search(result: dict[str, Any]) -> None:
    from rich.table import Table

    from cost.render import console

    t = Table(title="the search: instance × TP × dtype (rung 3, LMI)")
    for col in ("instance", "TP", "dtype", "KV tokens", "sat. tok/s", "floor $", "SLO met", "$/month", "status"):
        # every column but the status whole: an instance cut to "ml.g6…" names no instance
        t.add_column(col, justify="right" if col not in ("instance", "dtype", "status") else "left",
                     no_wrap=col != "status")
    for r in sorted(result["candidates"], key=lambda r: (r.get("monthly_usd", math.inf), r.get("floor_usd", math.inf))):
        t.add_row(r["instance"], str(r.get("tp", "")), r["dtype"], f"{r['kv_cache_tokens']:,}" if "kv_cache_tokens" in r
                  else "", f"{r['saturated_output_tok_s']:,.0f}" if "saturated_output_tok_s" in r else "",
                  f"{r['floor_usd']:,.2f}" if "floor_usd" in r else "",
                  f"{r['slo_attainment']:.1%}" if "slo_attainment" in r else "",
                  f"{r['monthly_usd']:,.0f}" if "monthly_usd" in r else "",
                  ("★ " if _same(r, result["best"]) else "") + r["status"])
    console.print(t)


def _same(row: dict[str, Any], other: dict[str, Any] | None) -> bool:
    return other is not None and (row["instance"], row["dtype"]) == (other["instance"], other["dtype"])
