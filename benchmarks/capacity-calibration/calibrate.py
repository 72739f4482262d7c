"""Fit the capacity model's efficiencies on the public measurements in points.json, and write them.

    python benchmarks/capacity-calibration/calibrate.py            # fit, print the table
    python benchmarks/capacity-calibration/calibrate.py --write    # ... and write cost/hardware/data/efficiency-<date>.json
    python benchmarks/capacity-calibration/calibrate.py --loo      # leave each source out in turn: honest errors

What is fitted (every other figure is a spec or a stated prior): per GPU family with points
(hopper, ampere, ada) the achieved share of peak bandwidth and of dense matmul FLOP/s; shared by
all, the fixed costs per layer, step, sequence and request, the PCIe all-reduce latency, the
weight-only and MoE kernels' matmul rates and the KV read bandwidth; beside them, one output cap
per serving stack whose own points show a limit outside the engine (points.json's output_caps).
Blackwell has no public vLLM throughput point here and borrows Hopper's shares of peak; its fixed
costs a layer and a sequence are fitted apart on public decode steps (``blackwell_terms``). The
loss is the sum of squared log errors (a 2x miss weighs the same either way) plus a prior on each
parameter, bounded to physical ranges; Powell's derivative-free search (see fit).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from cost.hardware.calibration import (decode_step_rows, errors, moe_kernel_rows, shipped_output_caps,  # noqa: E402
                                       with_control)
from cost.hardware.roofline import DATA, Efficiency, efficiency_table  # noqa: E402

FAMILIES = ("hopper", "ampere", "ada")
# name, low, high, prior (the start too), prior's spread in log units. The priors keep a fit
# on a few dozen figures physical: a bandwidth share near what decode kernels reach (FACTS §13's
# ~77 % on an A100 at c=1, ~0.8-0.9 in AIConfigurator's roofline), matmuls near the 26-47 % of
# peak FACTS §13 reads off Hopper prefills (prefill includes attention and gaps: the GEMMs
# alone run higher), fixed costs of the order BLIS fits (~50 µs a layer with the all-reduce).
PARAMETERS = ([(f"{f}.bandwidth", 0.4, 1.0, 0.85, 0.1) for f in FAMILIES]
              + [(f"{f}.gemm", 0.15, 0.9, 0.55, 0.3) for f in FAMILIES]
              + [("layer_s", 1e-7, 2e-4, 2e-5, 1.0), ("step_s", 1e-6, 5e-3, 5e-4, 1.0),
                 ("seq_s", 1e-7, 3e-4, 2e-5, 1.0), ("request_s", 1e-5, 0.05, 5e-3, 1.0),
                 ("allreduce_pcie_s", 5e-6, 5e-4, 3e-5, 1.0), ("weight_only_gemm", 0.2, 1.0, 0.6, 0.3),
                 ("moe_gemm", 0.05, 1.0, 0.5, 0.5), ("kv_bandwidth", 0.2, 1.0, 0.7, 0.3)])
# frontend_request_s: the share of request_s that vLLM's API server spends on one event loop per
# request (parsing, tokenising, answering), so requests pass it one at a time; measured on this
# project's 2-core machine with vLLM's own server (benchmarks/server-vs-vllm, --max-tokens 1:
# 1.8-2.2 ms a request, median 2.1), rounded down for a GPU host's faster cores.
PRIORS = {"attention_of_gemm": 0.7, "link": 0.7, "allreduce_nvlink_s": 8e-6, "frontend_request_s": 2e-3}
FRONTEND_SOURCE = (f"{PRIORS['frontend_request_s'] * 1e3:g} ms of request_s spent one request at a time on "
                   "vLLM's API server (its one event loop; measured 1.8-2.2 ms with vLLM's own server on a "
                   "2-core machine, benchmarks/server-vs-vllm/README.md)")
MOE_SOURCE = ("moe_layer_s and moe_expert_s: fitted on the public fused-MoE kernel timings of "
              "benchmarks/capacity-calibration/moe-kernels.json (a decode step's regime), the other "
              "efficiencies at their priors")
# A serving stack's output cap (points.json's ``output_caps``), fitted beside the efficiencies on
# its own points: tok/s, bounds, prior and a spread wide enough to leave it to its points.
CAP = (100.0, 1e5, 3000.0, 3.0)


def parameters(caps=()) -> list[tuple]:
    """The fitted parameters: the efficiencies, then one output cap per serving stack named."""
    return PARAMETERS + [(f"cap:{c}", *CAP) for c in caps]


def caps_in(points) -> list[str]:
    return sorted({p["output_cap"] for p in points if p.get("output_cap")})


# The fused-MoE kernels' floor a MoE layer and cost an expert touched, per family: fitted on the
# public kernel timings in moe-kernels.json (cost.hardware.calibration.moe_kernel_rows says which
# points: a decode step's regime), with the other efficiencies at their priors. Grids in seconds.
MOE_KERNELS = HERE / "moe-kernels.json"
MOE_LAYER_GRID = [i * 1e-6 for i in range(0, 81)]
MOE_EXPERT_GRID = [i * 0.02e-6 for i in range(0, 101)]


@functools.lru_cache(maxsize=None)
def moe_kernel_terms() -> dict[str, float]:
    """``{family}.moe_layer_s`` and ``{family}.moe_expert_s`` for each family with kernel points:
    the pair on the grids with the least summed squared log error over its fitted points."""
    doc = json.loads(MOE_KERNELS.read_text())
    base = efficiencies(prior_values(), moe={}, blackwell={})
    out: dict[str, float] = {}
    for family in FAMILIES:
        rows = [r for r in moe_kernel_rows(doc, efficiency_for=base.__getitem__)
                if r["fitted"] and r["family"] == family]
        if not rows:
            continue
        # Both terms are 0 in ``base``: each row's prediction is its roofline part.
        best = min((sum((math.log(r["predicted_us"] + 1e6 * (layer + expert * r["touched"]))
                         - math.log(r["measured_us"])) ** 2 for r in rows), layer, expert)
                   for layer in MOE_LAYER_GRID for expert in MOE_EXPERT_GRID)
        out[f"{family}.moe_layer_s"], out[f"{family}.moe_expert_s"] = best[1], best[2]
    return out


# Blackwell's fixed costs a layer and a sequence a step, fitted on ML.ENERGY's saturated vLLM 0.11.1
# servers (mlenergy-decode.json): each B200 decode step against the H100's error on the same model,
# task and batch, so what both runs share and the data leave unknown (the prompt lengths, the
# serving stack) cancels; Blackwell's shares of peak stay Hopper's (no public B200 throughput
# point). The objective: squared log errors relative to the control, plus the same priors as the
# shared fixed costs (PARAMETERS). Both terms enter the step linearly (``decode_step_rows``), so
# one prediction a row and a grid (µs) search them exactly.
MLENERGY = HERE / "mlenergy-decode.json"
FIXED_COST_GRID = np.arange(1, 101) * 1e-6
BLACKWELL_SOURCE = ("layer_s and seq_s: fitted on ML.ENERGY's saturated vLLM 0.11.1 servers "
                    "(benchmarks/capacity-calibration/mlenergy-decode.json), each B200 decode step against the H100's "
                    "error on the same model, task and batch; the shares of peak and the MoE kernel terms are Hopper's")


def blackwell_rows() -> list[dict]:
    """The fitted B200 rows, predicted at the priors with Hopper's fixed costs, each with its H100 control."""
    base = efficiencies(prior_values(), blackwell={})
    rows, _ = decode_step_rows(json.loads(MLENERGY.read_text()), efficiency_for=base.__getitem__)
    return [r for r in with_control(rows, "H100") if r["gpu"] == "B200" and r["fit"]]


def fit_fixed_costs(rows: list[dict], base: Efficiency) -> tuple[float, float]:
    """(layer_s, seq_s) on the grid with the least squared log error against the rows' controls."""
    prior = {name: (p, spread) for name, _, _, p, spread in PARAMETERS}
    pred = np.array([r["predicted_step_ms"] for r in rows]) / 1e3
    layers = np.array([r["layers"] for r in rows])
    batch = np.array([r["batch"] for r in rows])
    target = np.log(np.array([r["measured_itl_ms"] * r["control_ratio"] for r in rows]) / 1e3)
    layer, seq = np.meshgrid(FIXED_COST_GRID, FIXED_COST_GRID, indexing="ij")
    steps = (pred + layers * (layer[..., None] - base.layer_s) + batch * (seq[..., None] - base.seq_s))
    loss = (np.sum((np.log(steps) - target) ** 2, axis=-1)
            + (np.log(layer / prior["layer_s"][0]) / prior["layer_s"][1]) ** 2
            + (np.log(seq / prior["seq_s"][0]) / prior["seq_s"][1]) ** 2)
    i, j = np.unravel_index(np.argmin(loss), loss.shape)
    return float(layer[i, j]), float(seq[i, j])


@functools.lru_cache(maxsize=None)
def blackwell_terms() -> dict[str, float]:
    """``blackwell.layer_s`` and ``blackwell.seq_s``: ``fit_fixed_costs`` over every fitted B200 row."""
    base = efficiencies(prior_values(), blackwell={})["blackwell"]
    layer, seq = fit_fixed_costs(blackwell_rows(), base)
    return {"blackwell.layer_s": layer, "blackwell.seq_s": seq}


def blackwell_check(terms: dict[str, float]) -> dict:
    """Why the fit ships: each model left out in turn, fitted on the others and predicted, against
    Hopper's borrowed figures, as |(predicted / measured) / control − 1| (the median over rows)."""
    base = efficiencies(prior_values(), blackwell={})["blackwell"]
    rows = blackwell_rows()

    def rel(r, layer, seq):
        step = r["predicted_step_ms"] / 1e3 + r["layers"] * (layer - base.layer_s) + r["batch"] * (seq - base.seq_s)
        return abs(step * 1e3 / r["measured_itl_ms"] / r["control_ratio"] - 1)

    held_out, borrowed = [], []
    for model in sorted({r["model"] for r in rows}):
        layer, seq = fit_fixed_costs([r for r in rows if r["model"] != model], base)
        held_out += [rel(r, layer, seq) for r in rows if r["model"] == model]
        borrowed += [rel(r, base.layer_s, base.seq_s) for r in rows if r["model"] == model]
    fitted = [rel(r, terms["blackwell.layer_s"], terms["blackwell.seq_s"]) for r in rows]
    return {"rows": len(rows), "models": len({r["model"] for r in rows}),
            "borrowed": float(np.median(borrowed)), "leave_one_model_out": float(np.median(held_out)),
            "in_sample": float(np.median(fitted))}


def efficiencies(values: dict[str, float], source: str = "fit", moe: dict[str, float] | None = None,
                 blackwell: dict[str, float] | None = None) -> dict[str, Efficiency]:
    """The Efficiency of every family from fitted ``values``; the MoE kernel terms from ``moe``
    (default: ``moe_kernel_terms()``, 0 for a family without kernel points); Blackwell's fixed
    costs from ``blackwell`` (default: ``blackwell_terms()``; the shared ones where absent)."""
    moe = moe_kernel_terms() if moe is None else moe
    blackwell = blackwell_terms() if blackwell is None else blackwell
    out = {}
    for family in FAMILIES + ("blackwell",):
        base = "hopper" if family == "blackwell" else family
        gemm = values[f"{base}.gemm"]
        out[family] = Efficiency(family=family, bandwidth=values[f"{base}.bandwidth"], gemm=gemm,
                                 attention=gemm * PRIORS["attention_of_gemm"],
                                 weight_only_gemm=values["weight_only_gemm"], moe_gemm=values["moe_gemm"],
                                 kv_bandwidth=values["kv_bandwidth"],
                                 layer_s=blackwell.get(f"{family}.layer_s", values["layer_s"]),
                                 step_s=values["step_s"], seq_s=blackwell.get(f"{family}.seq_s", values["seq_s"]),
                                 request_s=values["request_s"],
                                 allreduce_s={"nvlink": PRIORS["allreduce_nvlink_s"],
                                              "pcie": values["allreduce_pcie_s"]},
                                 link=PRIORS["link"], frontend_request_s=PRIORS["frontend_request_s"],
                                 moe_layer_s=moe.get(f"{base}.moe_layer_s", 0.0),
                                 moe_expert_s=moe.get(f"{base}.moe_expert_s", 0.0), source=source)
    return out


def fitted(points) -> list[dict]:
    """The points the fit sees: all but those marked ``"fit": false`` (each says why)."""
    return [p for p in points if p.get("fit", True)]


def prior_values() -> dict[str, float]:
    return {name: prior for name, _, _, prior, _ in PARAMETERS}


def residuals(x, points, means, params=PARAMETERS, held: dict[str, float] | None = None) -> np.ndarray:
    """Log errors of every figure, then each parameter's log distance from its prior over its
    spread (a maximum a posteriori fit: the data move a parameter as far as they agree to).
    ``held``: parameters kept at these values, not searched."""
    values = {**(held or {}), **{name: v for (name, *_), v in zip(params, x)}}
    effs = efficiencies(values)
    rows = errors(points, means, efficiency_for=effs.__getitem__, output_caps=output_caps(values))
    data = [math.log(max(1e-6, 1 + r["error"])) for r in rows]
    prior = [math.log(v / p[3]) / p[4] for p, v in zip(params, x)]
    return np.array(data + prior)


def fit(points, means, evaluations: int = 700, engine_at_priors: bool = False) -> dict[str, float]:
    """Powell's derivative-free search on the summed squares, in log-parameter space (fixed costs
    span decades). Derivative-free because each figure comes out of a discrete-event run, whose
    finite differences are noise at small steps: a gradient method stopped after ~30 evaluations.
    ``engine_at_priors``: the efficiencies stay at their priors and only the output caps are fitted."""
    from scipy.optimize import minimize

    train = fitted(points)
    params = parameters(caps_in(train))
    held = None
    if engine_at_priors:
        params, held = params[len(PARAMETERS):], prior_values()
    low = np.log([p[1] for p in params])
    high = np.log([p[2] for p in params])
    start = np.log([p[3] for p in params])
    result = minimize(lambda z: float(np.sum(residuals(np.exp(z), train, means, params, held) ** 2)), start,
                      method="Powell",
                      bounds=list(zip(low, high)), options={"maxfev": evaluations, "xtol": 1e-3, "ftol": 1e-4})
    print(f"Powell: {result.message} ({result.nfev} evaluations, sum of squares {result.fun:.4g})", flush=True)
    return {**(held or {}), **{name: float(v) for (name, *_), v in zip(params, np.exp(result.x))}}


def output_caps(values: dict[str, float]) -> dict[str, float]:
    return {name.removeprefix("cap:"): v for name, v in values.items() if name.startswith("cap:")}


def table(rows) -> str:
    lines = ["| point | GPU | metric | measured | predicted | error |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['gpu']} | {r['metric']} | {r['measured']:,.4g} | {r['predicted']:,.4g} | "
                     f"{r['error'] * 100:+.1f} % |")
    return "\n".join(lines)


def median_abs(rows) -> float:
    return float(np.median([abs(r["error"]) for r in rows])) if rows else math.nan


# Why the efficiencies are what they are when they stay at their priors (--engine-at-priors).
AT_PRIORS = ("the priors of benchmarks/capacity-calibration/calibrate.py (PARAMETERS), kept because, left out "
             "one source at a time, they predicted the unseen public points better than a fit on the others "
             "(benchmarks/capacity-calibration/README.md); checked against every point of points.json: ")


def write_table(values: dict[str, float], points, engine_at_priors: bool = False) -> Path:
    today = datetime.date.today().isoformat()
    points = fitted(points)
    ids = ", ".join(p["id"] for p in points)
    how = AT_PRIORS if engine_at_priors else "fitted on every point of points.json: "
    doc = {"schema": "spectrum.efficiency/1", "as_of": today,
           "note": ("Chosen" if engine_at_priors else "Fitted") + " by benchmarks/capacity-calibration/calibrate.py "
                   "on the public vLLM measurements in benchmarks/capacity-calibration/points.json (FACTS §13); "
                   "none of the held-out sets.",
           "families": {f: {"bandwidth": round(values[f"{f}.bandwidth"], 4), "gemm": round(values[f"{f}.gemm"], 4),
                            **{k.split(".")[1]: float(f"{v:.3g}") for k, v in moe_kernel_terms().items()
                               if k.startswith(f + ".")},
                            "source": (AT_PRIORS if engine_at_priors else f"fitted on the {f} points of points.json: ")
                                      + ", ".join(p["id"] for p in points if _family(p) == f)
                                      + (f"; {MOE_SOURCE}" if f + ".moe_layer_s" in moe_kernel_terms() else "")}
                        for f in FAMILIES},
           "shared": {"attention_of_gemm": PRIORS["attention_of_gemm"],
                      "weight_only_gemm": round(values["weight_only_gemm"], 4),
                      "moe_gemm": round(values["moe_gemm"], 4), "kv_bandwidth": round(values["kv_bandwidth"], 4),
                      "layer_s": float(f"{values['layer_s']:.4g}"), "step_s": float(f"{values['step_s']:.4g}"),
                      "seq_s": float(f"{values['seq_s']:.4g}"), "request_s": float(f"{values['request_s']:.4g}"),
                      "allreduce_s": {"nvlink": PRIORS["allreduce_nvlink_s"],
                                      "pcie": float(f"{values['allreduce_pcie_s']:.4g}")},
                      "link": PRIORS["link"], "frontend_request_s": PRIORS["frontend_request_s"],
                      "source": f"{how}{ids}; priors (not fitted): attention "
                                f"at {PRIORS['attention_of_gemm']} of the matmul rate, NVLink all-reduce "
                                f"{PRIORS['allreduce_nvlink_s'] * 1e6:g} µs (vLLM's custom all-reduce), links at "
                                f"{PRIORS['link']} of their bandwidth, {FRONTEND_SOURCE}"}}
    doc["output_caps"] = {
        "fitted": {cap: round(v) for cap, v in output_caps(values).items()},
        "why": "tok/s: the rate at which each serving stack named by points.json's output_caps handed tokens on, "
               "fitted beside the efficiencies so that a limit outside the engine is not read as a slow engine. "
               "Calibration only: no prediction applies them."}
    doc["families"]["blackwell"] = {
        "same_as": "hopper", "why": "no public vLLM throughput or latency point on B200 among points.json's",
        **{k.split(".")[1]: float(f"{v:.3g}") for k, v in blackwell_terms().items()}, "source": BLACKWELL_SOURCE}
    path = DATA / f"efficiency-{today}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _family(point) -> str:
    from cost.hardware import gpus
    gpu = gpus.instance(point["instance"]).gpu if point.get("instance") else gpus.gpu(point["gpu"])
    return gpu.family


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write cost/hardware/data/efficiency-<today>.json")
    ap.add_argument("--loo", action="store_true", help="leave each source out in turn and predict it")
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    ap.add_argument("--evaluations", type=int, default=700, help="Powell's budget per fit (default 700)")
    ap.add_argument("--engine-at-priors", action="store_true",
                    help="keep the efficiencies at their priors and fit only the output caps (what --loo chose "
                         "on 2026-12-05); --write then ships the priors")
    args = ap.parse_args()
    doc = json.loads((HERE / "points.json").read_text())
    points, means = doc["points"], doc["sharegpt_means"]
    shipped = errors(points, means, output_caps=shipped_output_caps())
    print(f"shipped ({efficiency_table()['file']}): median |error| {median_abs(shipped) * 100:.1f} %")
    values = fit(points, means, args.evaluations, args.engine_at_priors)
    print(json.dumps(values, indent=1))
    rows = errors(points, means, efficiency_for=efficiencies(values).__getitem__, output_caps=output_caps(values))
    print(table(rows))
    print(f"{'at the priors' if args.engine_at_priors else 'fitted'}: median |error| "
          f"{median_abs(rows) * 100:.1f} % over {len(rows)} figures")
    # The unfitted public checks (points.json "checks"), predicted with the same values.
    check_rows = errors(doc.get("checks", []), means, efficiency_for=efficiencies(values).__getitem__)
    print("public checks, not fitted:\n" + table(check_rows))
    out = {"fit": values, "rows": rows, "checks": check_rows}
    terms = blackwell_terms()
    bw = blackwell_check(terms)
    print(f"Blackwell (mlenergy-decode.json, {bw['rows']} B200 rows of {bw['models']} models against their H100 "
          f"controls): layer_s {terms['blackwell.layer_s'] * 1e6:.0f} µs, seq_s {terms['blackwell.seq_s'] * 1e6:.0f} µs; "
          f"median |relative error| {bw['in_sample'] * 100:.1f} % in sample, {bw['leave_one_model_out'] * 100:.1f} % "
          f"with each model left out, {bw['borrowed'] * 100:.1f} % with Hopper's fixed costs")
    out["blackwell"] = {"terms": terms, **bw}
    if args.loo:
        # Each source left out in turn: fitted on the others, predicted beside the priors alone
        # (no fit), so the fit earns its place only if it predicts unseen sources better.
        groups = sorted({p["source"].split(",")[0] for p in points})
        prior_values = {name: p[3] for name, *p in [(q[0], *q[1:]) for q in PARAMETERS]}
        priors_only = efficiencies({q[0]: q[3] for q in PARAMETERS})
        loo_rows, prior_rows = [], []
        for group in groups:
            train = [p for p in points if p["source"].split(",")[0] != group]
            test = [p for p in fitted(points) if p["source"].split(",")[0] == group]
            held = errors(test, means, efficiency_for=efficiencies(fit(train, means, args.evaluations)).__getitem__)
            prior = errors(test, means, efficiency_for=priors_only.__getitem__)
            loo_rows += held
            prior_rows += prior
            print(f"left out {group!r}: median |error| fitted on the rest {median_abs(held) * 100:.1f} %, "
                  f"priors alone {median_abs(prior) * 100:.1f} %", flush=True)
        print(table(loo_rows))
        print(f"leave-one-source-out: median |error| {median_abs(loo_rows) * 100:.1f} % over {len(loo_rows)} "
              f"figures; the priors alone {median_abs(prior_rows) * 100:.1f} %")
        out["leave_one_source_out"] = {"fitted": loo_rows, "priors": prior_rows, "prior_values": prior_values}
    if args.write:
        print(f"wrote {write_table(values, points, args.engine_at_priors)}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
