"""Monthly cost against monthly tokens for every rung, with the break-even points marked.

matplotlib is imported here only, with the Agg backend, so no CLI pays for it unless it plots.
"""
from __future__ import annotations

from pathlib import Path

from cost.breakeven import tokens
from cost.fleet import Fleet, Traffic, bedrock_cost
from cost.prices import TokenPrice
from options.core import BadInput
from options.core.rungs import SAGEMAKER

# Colours per rung group, readable on white: Bedrock blue, EKS green, SageMaker groups in warm tones
# (one per distinct capacity when benches per level differ).
COLOURS = {1: "#1f77b4", 6: "#2ca02c"}
SAGEMAKER_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")


def volumes(traffic: Traffic, points: int = 400) -> list[float]:
    """Log-spaced monthly volumes spanning three decades either side of the profile's."""
    import math

    centre = math.log10(traffic.tokens_per_month)
    low, high = max(3.0, centre - 3), centre + 3
    return [10 ** (low + (high - low) * i / (points - 1)) for i in range(points)]


def _start(path: str | Path):
    """(checked path, pyplot with the Agg backend), or BadInput naming what is wrong."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise BadInput(f"plot file {str(path)!r} must end in .png")
    if not path.parent.exists():
        raise BadInput(f"plot folder {str(path.parent)!r} does not exist")
    try:
        import matplotlib
    except ImportError:
        raise BadInput("plotting needs matplotlib: pip install 'spectrum[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return path, plt


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def plot_compare(path: str | Path, traffic: Traffic, price: TokenPrice, fleets: list[Fleet],
                 tier: str = "on_demand") -> Path:
    path, plt = _start(path)
    xs = volumes(traffic)
    shapes = [traffic.scaled_to(v) for v in xs]
    blended = bedrock_cost(traffic, price, tier).per_million_usd
    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=110)
    ax.plot(xs, [v * blended / 1e6 for v in xs], color=COLOURS[1], lw=2.2,
            label=f"1 Bedrock {price.model_id} (${blended:.4g}/1M blended, {traffic.mix.label})")

    # Rungs 2-5 share SageMaker prices: draw one line unless their capacities differ.
    groups: dict[tuple, list[Fleet]] = {}
    for fleet in fleets:
        key = (fleet.platform, fleet.hourly, fleet.capacity.output_tokens_per_second, fleet.fixed_monthly)
        groups.setdefault(key, []).append(fleet)
    for index, fleets_in_group in enumerate(groups.values()):
        fleet = fleets_in_group[0]
        levels = [f.level for f in fleets_in_group]
        label_levels = f"{levels[0]}-{levels[-1]}" if len(levels) > 1 else str(levels[0])
        sagemaker_groups = [g for g in groups.values() if g[0].platform == SAGEMAKER]
        colour = (COLOURS[fleet.level] if fleet.platform != SAGEMAKER else
                  SAGEMAKER_COLOURS[sagemaker_groups.index(fleets_in_group) % len(SAGEMAKER_COLOURS)])
        where = ("EC2 + EKS control plane and system nodes" if fleet.platform != SAGEMAKER
                 else "SageMaker")
        volume = fleet.breakeven_tokens_per_month(traffic, blended)
        ax.step(xs, [fleet.monthly(s) for s in shapes], where="post", color=colour, lw=2,
                linestyle="-" if fleet.platform == SAGEMAKER else "--",
                label=f"{label_levels} {where}: {fleet.instance.name} "
                      f"${fleet.hourly:.4g}/h/replica, {fleet.capacity.output_tokens_per_second:,.0f} out tok/s"
                      + ("" if volume is not None else " (never breaks even)"))
        if volume is not None and xs[0] <= volume <= xs[-1]:
            cost = volume * blended / 1e6
            ax.plot([volume], [cost], marker="o", ms=9, color=colour, markeredgecolor="black", zorder=5)
            ax.annotate(f"break-even rung {label_levels}: {tokens(volume)} tokens/month, ${cost:,.0f}/month",
                        (volume, cost), textcoords="offset points", xytext=(20, -40 - 28 * index), fontsize=8,
                        arrowprops={"arrowstyle": "-", "color": colour})
    ax.axvline(traffic.tokens_per_month, color="grey", linestyle=":", lw=1.5)
    ax.annotate(f"this profile\n{tokens(traffic.tokens_per_month)} tokens/month", (traffic.tokens_per_month, 1),
                xycoords=("data", "axes fraction"), xytext=(4, -28), textcoords="offset points",
                fontsize=8, color="dimgrey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per month (input + output)")
    ax.set_ylabel("cost per month (USD)")
    ax.set_title(f"Monthly cost by rung: peak/avg {traffic.peak_to_average:.2g}x, "
                 f"{traffic.hours_per_day:g} h/day active, prices as of {price.as_of}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, plt, path)


def plot_bill(path: str | Path, data: dict) -> Path:
    """One bar per tenant, stacked by model/upstream, with its monthly budget marked."""
    path, plt = _start(path)
    tenants = data["tenants"]
    parts = sorted({f"{ln['model']}/{ln['upstream']}" for t in tenants for ln in t["upstreams"]
                    if ln["upstream"] is not None})
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.55 * max(1, len(tenants))), dpi=110)
    names = [t["tenant"] for t in tenants]
    left = [0.0] * len(tenants)
    colours = plt.get_cmap("tab10")
    for index, part in enumerate(parts):
        widths = [sum(ln["usd"] for ln in t["upstreams"] if f"{ln['model']}/{ln['upstream']}" == part)
                  for t in tenants]
        ax.barh(names, widths, left=left, color=colours(index % 10), label=part)
        left = [a + b for a, b in zip(left, widths)]
    for row, tenant in enumerate(tenants):
        if tenant["budget_usd_month"]:
            ax.plot([tenant["budget_usd_month"]] * 2, [row - 0.4, row + 0.4], color="black", lw=2)
        ax.annotate(f"${tenant['usd']:,.2f}" + (f" ({tenant['budget_used_pct']:.0f} % of budget)"
                                                 if tenant["budget_used_pct"] is not None else ""),
                    (left[row], row), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("USD this month (black bar: the tenant's budget_usd_month)")
    ax.set_title(f"Gateway bill {data['month']}: total ${data['total_usd']:,.2f}"
                 + (f", ${data['unallocated_usd']:,.2f} of idle fleets unallocated" if data["unallocated_usd"] else ""))
    ax.grid(True, axis="x", alpha=0.3)
    if parts:
        ax.legend(loc="lower right", fontsize=8)
    return _save(fig, plt, path)


def plot_consolidate(path: str | Path, xs: list[int], series: dict[str, list[float]], n: int,
                     title: str) -> Path:
    """Monthly cost against the number of models for each way to serve them; N marked."""
    path, plt = _start(path)
    fig, ax = plt.subplots(figsize=(10, 6), dpi=110)
    styles = {"dedicated": ("#d62728", "-"), "adapters": ("#1f77b4", "-"), "inference_components": ("#2ca02c", "--")}
    for name, ys in series.items():
        colour, line = styles.get(name, ("grey", ":"))
        ax.step(xs, ys, where="mid", color=colour, linestyle=line, lw=2, label=name.replace("_", " "))
    ax.axvline(n, color="grey", linestyle=":", lw=1.5)
    ax.annotate(f"N = {n}", (n, 1), xycoords=("data", "axes fraction"), xytext=(4, -16),
                textcoords="offset points", fontsize=8, color="dimgrey")
    ax.set_xlabel("models served")
    ax.set_ylabel("cost per month (USD)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    return _save(fig, plt, path)


def plot_simulation(path: str | Path, sim, data: dict) -> Path:
    """``cost simulate --plot``: above, the trace's load and each rung's serving replicas over
    time, with launches (cold starts) and Bedrock's throttled attempts marked; below, monthly cost
    against ``--scale`` for every rung, with each self-hosted rung's break-even against Bedrock."""
    import numpy as np

    path, plt = _start(path)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 9), dpi=110)
    minutes = sim.per_minute_counts()
    xs = np.arange(len(minutes)) / 60            # hours
    top.bar(xs, minutes, width=1 / 60, align="edge", color="#cccccc", label="requests per minute (left)")
    top.set_xlabel("hours into the trace")
    top.set_ylabel("requests per minute")
    right = top.twinx()
    drawn = set()
    for row in data["rungs"]:
        level = row["level"]
        run = sim.level_runs[level]
        if level == 1:
            if len(run.throttle_times):
                per_min = np.bincount((np.asarray(run.throttle_times) // 60).astype(int), minlength=len(minutes))
                hit = np.nonzero(per_min)[0]
                top.scatter(hit / 60, minutes[np.minimum(hit, len(minutes) - 1)], marker="x", color=COLOURS[1],
                            s=18, label="Bedrock: minutes with throttling", zorder=3)
            continue
        key = (row["policy"]["kind"], repr(row["policy"]))
        if key in drawn:                     # rungs 2-5 share one simulation: draw it once
            continue
        drawn.add(key)
        colour = COLOURS.get(level, SAGEMAKER_COLOURS[len(drawn) % len(SAGEMAKER_COLOURS)])
        times = [t / 3600 for t, _, _ in run.timeline]
        counts = [c for _, c, _ in run.timeline]
        label = "EKS replicas" if level == 6 else f"SageMaker replicas (rung{'s 2-5' if level == 2 else ' ' + str(level)})"
        right.step(times, counts, where="post", color=colour, lw=2, label=label)
        launches = [i.launched_s / 3600 for i in run.instances if i.launched_s > 0]
        if launches:
            right.scatter(launches, [0.15] * len(launches), marker="^", color=colour, s=30,
                          label=f"{'EKS' if level == 6 else 'SageMaker'} cold starts (launch)")
    right.set_ylabel("serving replicas")
    right.set_ylim(bottom=0)
    handles = top.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    top.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=8)
    t = data["trace"]
    top.set_title(f"{t['requests']:,} requests over {t['span_s'] / 3600:.2f} h: load and replicas per rung")

    scales = [2 ** (i / 4) for i in range(-24, 49)]
    curves = sim.cost_curves(scales)
    for level, ys in curves.items():
        if level in (3, 4, 5) and 2 in curves:
            continue                          # the same bill as rung 2
        colour = COLOURS.get(level, SAGEMAKER_COLOURS[0])
        label = {1: "Bedrock (per token)", 2: "SageMaker, rungs 2-5", 6: "EKS, rung 6"}.get(level, f"rung {level}")
        bottom.plot(scales, ys, color=colour, lw=2, label=label)
    option_labels = {"batch": "Bedrock batch (per token)",
                     "provisioned_throughput": "Bedrock Provisioned Throughput (units x scale)"}
    for name, ys in sim.option_cost_curves(scales).items():
        bottom.plot(scales, ys, color=COLOURS[1], lw=1.5, linestyle="--" if name == "batch" else "-.",
                    label=option_labels[name])
    marked = [(level, k) for level, k in (data.get("break_even_scale") or {}).items()
              if k is not None and level not in ("3", "4", "5")]
    for row, (level, k) in enumerate(marked):
        bottom.axvline(k, color=COLOURS.get(int(level), SAGEMAKER_COLOURS[0]), linestyle=":", lw=1.5)
        bottom.annotate(f"rung {'2-5' if level == '2' else level} = Bedrock at x{k:.3g}",
                        (k, 0.92 - 0.07 * row), xycoords=("data", "axes fraction"), fontsize=8,
                        xytext=(4, 0), textcoords="offset points")
    bottom.axvline(1, color="black", lw=1, alpha=0.4)
    bottom.set_xscale("log")
    bottom.set_yscale("log")
    bottom.set_xlabel("--scale (arrival rate x the trace's)")
    bottom.set_ylabel("USD per month")
    bottom.set_title("Monthly cost against scale (self-hosted sized at the recommended per-instance load)")
    bottom.grid(True, which="both", alpha=0.25)
    bottom.legend(loc="upper left", fontsize=9)
    return _save(fig, plt, path)


def plot_prediction_cdfs(path: str | Path, runs: list, capacity_source: str) -> Path:
    """``cost simulate --predict-replay ... --plot``: for each replay, the CDF of TTFT and of E2E,
    predicted (dashed) against measured (solid), one colour per replay."""
    import numpy as np

    path, plt = _start(path)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    colours = ("#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#9467bd")
    for i, (label, samples) in enumerate(runs):
        colour = colours[i % len(colours)]
        for ax, metric in zip(axes, ("ttft_ms", "e2e_ms")):
            for side, style in (("measured", "-"), ("predicted", "--")):
                values = np.sort(np.asarray(samples[side][metric], dtype=float))
                if not len(values):
                    continue
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, color=colour, lw=1.8,
                        label=f"{label}, {side}")
    for ax, metric in zip(axes, ("TTFT", "E2E")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{metric} (ms, log scale)")
        ax.set_ylabel("share of requests")
        ax.grid(True, which="both", alpha=0.25)
        ax.set_title(f"{metric}: predicted (dashed) vs measured (solid)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Replays re-predicted from {capacity_source}", fontsize=9)
    return _save(fig, plt, path)
