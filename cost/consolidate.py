"""N models, three ways to serve them on SageMaker, per month; and the N from which sharing wins.

(a) dedicated: one endpoint per model, each sized like any fleet (cost/fleet.py: replicas =
    max(min_replicas, ceil(peak / capacity)) while active, min_replicas the rest of the day);
(b) adapters: the N models are LoRA adapters of one base, served by one endpoint sized for the
    summed traffic at the base's capacity times the measured adapter overhead (tok/s with 8
    adapters mixed over the base alone);
(c) inference components: each model keeps its own copies (as many as its dedicated endpoint
    has replicas while active; ``min_copies``, which may be 0, the rest of the day), packed onto
    shared instances, ``shared GPUs // GPUs per copy`` copies each.
A copy needs the accelerators of ``--instance`` (what the capacity was measured on), so the
shared instance must carry the same accelerator type.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cost.breakeven import Capacity, apply_discount, check_range
from cost.fleet import DAYS_PER_MONTH, Fleet, Traffic
from cost.prices import InstanceType, PriceTable
from options.core import BadInput

# Fleets here are SageMaker real-time endpoints: rungs 3-5 bill alike, and 5 is the rung whose
# server loads adapters (containers/byo-vllm).
LEVEL = 5
# How far break-even is looked for: past this, "never" is the honest answer.
MAX_MODELS = 1000
# What `python -m options.bench --adapters ... --json FILE` writes (options/bench/adapters.py).
ADAPTER_BENCH_FORMAT = ('a spectrum.bench/1 document from `python -m options.bench --adapters a1,...,a8 --json FILE`, '
                        'whose "adapters" object has throughput_ratio = output tok/s of the adapter mix / of the '
                        'base alone, in (0, 2]')


@dataclass(frozen=True)
class AdapterOverhead:
    throughput_ratio: float          # adapters mixed / base alone, output tok/s
    origin: str
    detail: dict


def check_ratio(ratio: Any, where: str) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 2:
        raise BadInput(f"{where}: adapter throughput ratio {ratio!r} must be a number in (0, 2] "
                       f"(output tok/s with adapters mixed / the base alone)")
    return float(ratio)


def load_adapter_bench(path: str | Path) -> AdapterOverhead:
    """The adapter overhead an adapter bench measured: its ``adapters.throughput_ratio`` (the
    median over rounds at its highest concurrency), with the spread and swaps beside it."""
    path = Path(path)
    where = f"adapter bench {str(path)!r}"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{where} does not exist (write one with `python -m options.bench --adapters "
                       f"a1,...,a8 --json FILE`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{where} is not readable JSON: {exc}") from None
    found = doc.get("adapters") if isinstance(doc, dict) else None
    if not isinstance(found, dict) or "throughput_ratio" not in found:
        raise BadInput(f"{where} has no adapters.throughput_ratio: expected {ADAPTER_BENCH_FORMAT}")
    ratio = check_ratio(found["throughput_ratio"], where)
    concurrency = found.get("concurrency")
    at = (found.get("by_concurrency") or {}).get(str(concurrency)) or {}
    band = at.get("throughput_ratio") or {}
    detail = {"target": doc.get("target"), "level": doc.get("level"), "concurrency": concurrency,
              "adapters": len(found.get("names") or []), "mix": found.get("mix"), "rounds": found.get("rounds"),
              "ratio_min": band.get("min"), "ratio_max": band.get("max"), "loads": found.get("loads"),
              "evictions": found.get("evictions")}
    return AdapterOverhead(ratio, where, detail)


def describe_overhead(overhead: AdapterOverhead) -> str:
    d = overhead.detail
    if not d:
        return f"x {overhead.throughput_ratio:g} ({overhead.origin})"
    text = (f"x {overhead.throughput_ratio:g} measured by {overhead.origin}: {d['adapters']} adapters mixed "
            f"{d['mix']} vs the base alone at concurrency {d['concurrency']}, median of {d['rounds']} rounds")
    if d["ratio_min"] is not None:
        text += f" (range {d['ratio_min']:.3g}-{d['ratio_max']:.3g})"
    if d["loads"] is not None:
        text += f", {d['loads']} loads and {d['evictions']} evictions"
    if d["target"] in ("local", "emulator"):
        text += (f"; measured on target {d['target']!r}, not on the priced instance: rerun it against the real "
                 f"endpoint before trusting the answer")
    return text


@dataclass(frozen=True)
class Packing:
    """Inference components on one shared instance type."""
    instance: InstanceType
    hourly: float
    copies_per_instance: int

    def instances(self, copies: int) -> int:
        return math.ceil(copies / self.copies_per_instance)


def packing_for(shared: InstanceType, copy_instance: InstanceType, discount_pct: float) -> Packing:
    if shared.gpu_type != copy_instance.gpu_type:
        raise BadInput(f"shared instance {shared.sagemaker_name} has {shared.gpu_type} but the capacity was "
                       f"measured on {copy_instance.sagemaker_name} ({copy_instance.gpu_type}): choose a shared "
                       f"instance with {copy_instance.gpu_type} accelerators")
    if shared.gpus < copy_instance.gpus:
        raise BadInput(f"shared instance {shared.sagemaker_name} has {shared.gpus} accelerators; one copy needs "
                       f"{copy_instance.gpus} (those of {copy_instance.sagemaker_name}): choose a larger one")
    return Packing(shared, apply_discount(shared.hourly("sagemaker"), discount_pct),
                   shared.gpus // copy_instance.gpus)


def shared_candidates(table: PriceTable, copy_instance: InstanceType) -> list[InstanceType]:
    """Instances with the copy's accelerator, enough of them and a SageMaker price."""
    return [i for i in table.instances() if i.gpu_type == copy_instance.gpu_type
            and i.gpus >= copy_instance.gpus and i.sagemaker_hourly is not None]


@dataclass(frozen=True)
class Plan:
    """The three ways for ``n`` models of ``traffic`` each."""
    fleet: Fleet                     # one dedicated endpoint
    traffic: Traffic                 # per model
    overhead: AdapterOverhead | None
    packing: Packing
    min_copies: int = 1              # inference components may scale to 0 copies when idle

    @property
    def copy_fleet(self) -> Fleet:
        return replace(self.fleet, min_replicas=self.min_copies)

    @property
    def adapter_fleet(self) -> Fleet:
        ratio = self.overhead.throughput_ratio
        cap = self.fleet.capacity
        return replace(self.fleet, capacity=Capacity(cap.output_tokens_per_second * ratio,
                                                     f"{cap.origin} x {ratio:g} ({self.overhead.origin})"))

    def combined(self, n: int) -> Traffic:
        return self.traffic.scaled_to(self.traffic.tokens_per_month * n)

    def dedicated(self, n: int) -> float:
        return n * self.fleet.monthly(self.traffic)

    def adapters(self, n: int) -> float:
        return self.adapter_fleet.monthly(self.combined(n))

    def components(self, n: int) -> float:
        active_copies = n * self.copy_fleet.replicas(self.traffic)
        idle_copies = n * self.min_copies
        idle_hours = (24 - self.traffic.hours_per_day) * DAYS_PER_MONTH
        hours = (self.packing.instances(active_copies) * self.traffic.active_hours_per_month
                 + self.packing.instances(idle_copies) * idle_hours)
        return hours * self.packing.hourly

    def strategies(self) -> dict[str, Any]:
        out = {"dedicated": self.dedicated, "inference_components": self.components}
        if self.overhead is not None:
            out["adapters"] = self.adapters
        return out

    def breakeven(self, strategy: str) -> int | None:
        """The fewest models at which ``strategy`` costs less than dedicated endpoints."""
        cost = self.strategies()[strategy]
        return next((n for n in range(1, MAX_MODELS + 1) if round(cost(n), 2) < round(self.dedicated(n), 2)), None)


def consolidate(plan: Plan, n: int, *, shared_chosen: bool) -> dict[str, Any]:
    check_range("models", n, 1, MAX_MODELS)
    replicas = plan.fleet.replicas(plan.traffic)
    rows = [{"strategy": "dedicated", "monthly_usd": round(plan.dedicated(n), 2),
             "instance_type": plan.fleet.instance.sagemaker_name, "endpoints": n,
             "instances_at_peak": n * replicas, "hourly_per_instance_usd": round(plan.fleet.hourly, 6)}]
    if plan.overhead is not None:
        fleet, combined = plan.adapter_fleet, plan.combined(n)
        rows.append({"strategy": "adapters", "monthly_usd": round(plan.adapters(n), 2),
                     "instance_type": fleet.instance.sagemaker_name, "endpoints": 1,
                     "instances_at_peak": fleet.replicas(combined),
                     "hourly_per_instance_usd": round(fleet.hourly, 6),
                     "throughput_ratio": plan.overhead.throughput_ratio, "overhead_origin": plan.overhead.origin,
                     "capacity_output_tokens_per_second": round(fleet.capacity.output_tokens_per_second, 3)})
    pk = plan.packing
    copies = plan.copy_fleet.replicas(plan.traffic)
    rows.append({"strategy": "inference_components", "monthly_usd": round(plan.components(n), 2),
                 "instance_type": pk.instance.sagemaker_name, "endpoints": 1, "copies_per_model": copies,
                 "min_copies_per_model": plan.min_copies,
                 "copies_per_instance": pk.copies_per_instance, "instances_at_peak": pk.instances(n * copies),
                 "hourly_per_instance_usd": round(pk.hourly, 6)})
    cheapest = min(rows, key=lambda r: r["monthly_usd"])
    dedicated = rows[0]["monthly_usd"]
    for row in rows[1:]:
        row["saves_vs_dedicated_usd"] = round(dedicated - row["monthly_usd"], 2)
        row["breakeven_models"] = plan.breakeven(row["strategy"])
    return {"models": n, "traffic_per_model": plan.traffic.to_json(),
            "capacity": {"output_tokens_per_second": plan.fleet.capacity.output_tokens_per_second,
                         "tokens_per_second": round(plan.fleet.capacity_tokens_per_second(plan.traffic.mix), 3),
                         "origin": plan.fleet.capacity.origin},
            "strategies": rows, "cheapest": cheapest["strategy"],
            "shared_instance_chosen": shared_chosen}


def cheapest_packing(table: PriceTable, fleet: Fleet, traffic: Traffic, n: int, discount_pct: float,
                     min_copies: int) -> Packing:
    """The shared instance that makes inference components cheapest at ``n`` models."""
    plans = [Plan(fleet, traffic, None, packing_for(i, fleet.instance, discount_pct), min_copies)
             for i in shared_candidates(table, fleet.instance)]
    return min(plans, key=lambda p: (round(p.components(n), 2), p.packing.hourly)).packing


def curves(plan: Plan, n: int) -> tuple[list[int], dict[str, list[float]]]:
    """Monthly cost against the number of models, for the plot: 1 .. past N and every break-even."""
    marks = [n] + [b for b in (plan.breakeven(s) for s in plan.strategies() if s != "dedicated") if b]
    xs = list(range(1, max(8, 2 * max(marks)) + 1))
    return xs, {name: [cost(x) for x in xs] for name, cost in plan.strategies().items()}


def render(data: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    from cost.render import _assumptions, _money, console

    tr = data["traffic_per_model"]
    t = Table(box=box.SIMPLE_HEAD, title=f"{data['models']} models, {tr['avg_tokens_per_second']:,} tok/s each "
                                         f"(peak {tr['peak_tokens_per_second']:,}, {tr['mix']}, "
                                         f"{tr['hours_per_day']:g} h/day)")
    for col in ("strategy", "runs on", "endpoints", "instances at peak", "USD/month", "saves", "cheaper from N"):
        t.add_column(col, justify="left" if col in ("strategy", "runs on") else "right", no_wrap=True)
    for row in data["strategies"]:
        be = row.get("breakeven_models", "—")
        t.add_row(row["strategy"].replace("_", " "), row["instance_type"], str(row["endpoints"]),
                  str(row["instances_at_peak"]), _money(row["monthly_usd"], 2),
                  _money(row["saves_vs_dedicated_usd"], 2) if "saves_vs_dedicated_usd" in row else "—",
                  "never" if be is None else str(be), style="bold green" if row["strategy"] == data["cheapest"] else None)
    console.print(t)
    console.print(f"Cheapest at {data['models']} models: {data['cheapest'].replace('_', ' ')}", highlight=False)
    if data.get("plot"):
        console.print(f"Plot written to {data['plot']}", highlight=False)
    _assumptions(data["assumptions"])
