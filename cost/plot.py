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
