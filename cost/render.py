"""Readable tables for people (rich); the CLI prints JSON instead with --json."""
from __future__ import annotations

import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from cost.breakeven import tokens

# A terminal gets its own width; a pipe or a file gets room for the widest table.
console = Console(width=None if sys.stdout.isatty() else 120)
# Short names that fit a table row; the JSON carries the full names from options.spectrum.
SHORT_NAMES = {1: "Bedrock", 2: "JumpStart", 3: "LMI + config", 4: "LMI + model.py", 5: "own image",
               6: "EKS (EC2)"}


def _money(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"${value:,.{digits}f}"


def _assumptions(items: list[str]) -> None:
    if items:
        console.print("[bold]Assumptions[/bold]")
        for item in items:
            console.print(f"  • {item}", highlight=False)


def prices(data: dict[str, Any]) -> None:
    console.print(f"Price table {data['path']} (region {data['region']}, as of {data['as_of']})", highlight=False)
    if data.get("bedrock"):
        t = Table(title="Bedrock, USD per 1M tokens")
        for col in ("model id", "name", "input", "output", "batch in/out", "flex in/out", "priority in/out", "as of"):
            t.add_column(col, justify="right" if col in ("input", "output") else "left", no_wrap=col == "model id")
        for r in data["bedrock"]:
            t.add_row(r["model_id"], r["name"], f"{r['input_per_million']:g}", f"{r['output_per_million']:g}",
                      *(_pair(r, tier) for tier in ("batch", "flex", "priority")), r["as_of"])
        console.print(t)
    if data.get("instances"):
        t = Table(title="Instances, USD per hour (on-demand)")
        for col in ("instance", "EC2", "SageMaker", "GPUs", "GPU", "GB/GPU", "usable GiB/GPU", "vCPU", "GiB", "as of"):
            t.add_column(col, justify="left" if col in ("instance", "GPU", "as of") else "right")
        for r in data["instances"]:
            t.add_row(r["name"], _money(r["ec2_hourly"]), _money(r["sagemaker_hourly"]), str(r["gpus"]), r["gpu_type"],
                      f"{r['gpu_memory_gb_per_gpu']:g}", "—" if r["usable_gpu_memory_gib_per_gpu"] is None
                      else f"{r['usable_gpu_memory_gib_per_gpu']:g}", str(r["vcpus"]), f"{r['memory_gib']:g}", r["as_of"])
        console.print(t)
    if data.get("eks"):
        t = Table(title="EKS")
        for col in ("fee", "USD per hour", "as of", "source"):
            t.add_column(col)
        for r in data["eks"]:
            t.add_row(r["name"], f"{r['hourly']:g}", r["as_of"], r["source"])
        console.print(t)
    console.print("Every row's source: --json", style="dim")


def _pair(row: dict[str, Any], tier: str) -> str:
    i, o = row.get(f"{tier}_input_per_million"), row.get(f"{tier}_output_per_million")
    return "—" if i is None else f"{i:g} / {o:g}"


def refresh(data: dict[str, Any]) -> None:
    r = data["refresh"]
    console.print(f"Wrote {r['path']} (region {r['region']}, as of {r['as_of']})", highlight=False)
    t = Table(title="Refreshed from the AWS Price List API")
    for col in ("prices", "refreshed", "not found (kept with their old date)"):
        t.add_column(col)
    for kind in ("ec2", "sagemaker", "bedrock"):
        t.add_row(kind, str(r["refreshed"][kind]), ", ".join(r["not_found"][kind]) or "—")
    console.print(t)
    for why, count in r["skipped_rows"].items():
        console.print(f"  skipped {count} {why}", highlight=False)


def breakeven(data: dict[str, Any]) -> None:
    t = Table(title="Break-even: one replica against per-token prices", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    t.add_row("hourly cost of the replica", _money(data["hourly_usd"]))
    t.add_row("per-token price (blended)" if "mix" in data else "per-token price",
              f"{_money(data['blended_price_per_million'])} per 1M tokens")
    t.add_row("break-even tokens per hour", f"{data['breakeven_tokens_per_hour']:,.0f}")
    t.add_row("break-even tokens per second", f"{data['breakeven_tokens_per_second']:,.1f}")
    if "breakeven_output_tokens_per_second" in data:
        t.add_row("  of which output tokens/s", f"{data['breakeven_output_tokens_per_second']:,.1f}")
    t.add_row("break-even tokens per month", f"{data['breakeven_tokens_per_month']:,.0f}")
    if "capacity" in data:
        cap = data["capacity"]
        t.add_row("capacity of one replica", f"{cap['tokens_per_second']:,.1f} tok/s "
                                             f"({cap['output_tokens_per_second']:,.1f} output)")
        t.add_row("self-hosted cost", f"{_money(data['self_hosted_per_million'])} per 1M tokens")
        t.add_row("shortfall (parity / capacity)", f"x{data['shortfall_ratio']:.2f}")
        t.add_row("utilisation needed to break even", f"{data['utilization_to_break_even']:.0%}")
    console.print(t)
    console.print(f"[bold]Verdict:[/bold] {data['verdict']}", highlight=False)
    _assumptions(data["assumptions"])


def compare(data: dict[str, Any]) -> None:
    tr = data["traffic"]
    t = Table(box=box.SIMPLE_HEAD, title=f"Monthly cost of {tokens(tr['tokens_per_month'])} tokens/month ({tr['mix']}, peak "
                    f"{tr['peak_tokens_per_second']:,} tok/s, {tr['hours_per_day']:g} h/day)")
    for col in ("lvl", "rung", "runs on", "replicas", "USD/month", "USD/1M", "breaks even"):
        t.add_column(col, justify="left" if col in ("rung", "runs on") else "right", no_wrap=True)
    for r in data["rungs"]:
        be = r.get("breakeven_tokens_per_month_vs_bedrock")
        style = "bold green" if r["level"] == data["cheapest_level"] else None
        t.add_row(str(r["level"]), SHORT_NAMES[r["level"]],
                  "per token" if r["level"] == 1 else r["instance_type"],
                  str(r.get("replicas_at_peak", "—")), _money(r["monthly_usd"], 2), _money(r["per_million_usd"]),
                  "—" if r["level"] == 1 else ("never" if be is None else f"{tokens(be)} tok/mo"), style=style)
    console.print(t)
    console.print(f"Cheapest: rung {data['cheapest_level']} ({data['cheapest_rung']})", highlight=False)
    if data.get("plot"):
        console.print(f"Plot written to {data['plot']}", highlight=False)
    _assumptions(data["assumptions"])


def recommend(data: dict[str, Any]) -> None:
    console.print(f"[bold]Recommended: rung {data['level']} — {data['rung']}[/bold]"
                  + (f" (the decision tree alone says rung {data['tree_level']})"
                     if data["tree_level"] != data["level"] else ""), highlight=False)
    console.print("[bold]Why[/bold]")
    for line in data["why"]:
        console.print(f"  • {line}", highlight=False)
    if data["flip"]:
        console.print("[bold]What would flip it[/bold]")
        for line in data["flip"]:
            console.print(f"  • {line}", highlight=False)
    if "costs" in data:
        compare({**data["costs"], "assumptions": data["assumptions"]})
    else:
        _assumptions(data["assumptions"])
