"""Which rung: the classic decision tree, weighed against what each rung would cost.

The tree climbs only as far as a requirement forces it (each rung up is more to build and run):
only need the output -> 1; must run in your account -> 2; the model or its config is not a
JumpStart one-click -> 3; the serving code must change -> 4; a custom image -> 5; you must own
the infrastructure -> 6. Cost can then move the answer up, but only when the saving is worth it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cost.breakeven import tokens
from cost.fleet import DAYS_PER_MONTH, Fleet, Traffic, bedrock_cost, compare
from cost.prices import TokenPrice
from options.core import BadInput
from options.core import RUNGS

# (flag dest, lowest rung that satisfies it, why, in plain words)
REQUIREMENTS: tuple[tuple[str, int, str], ...] = (
    ("own_account", 2, "the model must run in your own AWS account"),
    ("not_on_bedrock", 2, "the model is not offered on Bedrock"),
    ("custom_model", 3, "your model or its serving configuration is not a JumpStart one-click deploy"),
    ("custom_serving_code", 4, "the serving code (pre/post-processing, loading, batching) must change"),
    ("custom_image", 5, "you need your own serving image (CUDA, Python, engine, server)"),
    ("own_infrastructure", 6, "you must own the infrastructure (cluster, nodes, autoscaling)"),
)


@dataclass
class Requirements:
    flags: dict[str, bool]

    @property
    def floor(self) -> int:
        return max([1] + [level for dest, level, _ in REQUIREMENTS if self.flags.get(dest)])

    def reasons(self) -> list[str]:
        return [f"{why} -> rung {level} or above" for dest, level, why in REQUIREMENTS if self.flags.get(dest)]

    def without(self, dest: str) -> "Requirements":
        return Requirements({k: v for k, v in self.flags.items() if k != dest})


def recommend(req: Requirements, price: TokenPrice | None = None, traffic: Traffic | None = None,
              fleets: list[Fleet] | None = None, min_savings_pct: float = 30.0,
              tier: str = "on_demand") -> dict[str, Any]:
    floor = req.floor
    why = req.reasons() or ["no requirement given forces you past Bedrock: the decision tree stops at rung 1"]
    flip: list[str] = []
    costs = None
    level = floor
    if price is not None and traffic is not None and fleets:
        costs = compare(traffic, price, fleets, tier)
        monthly = {r["level"]: r["monthly_usd"] for r in costs["rungs"]}
        feasible = {lvl: usd for lvl, usd in monthly.items() if lvl >= floor}
        if not feasible:
            raise BadInput(f"rung {floor} or above is needed, but the table prices none of them for this "
                           f"instance: choose another --instance")
        if floor not in feasible:  # e.g. no SageMaker price for the instance: the lowest priced rung above
            level = min(feasible)
            why.append(f"rungs {floor}-{level - 1} have no price for this instance, so the lowest priced rung is {level}")
        # Climb one cheaper rung at a time, and only when the step saves enough to pay for the extra work.
        for higher in sorted(feasible):
            if higher <= level or feasible[higher] >= feasible[level]:
                continue
            saving = (feasible[level] - feasible[higher]) / feasible[level]
            if saving * 100 >= min_savings_pct:
                why.append(f"rung {higher} costs ${feasible[higher]:,.2f}/month against ${feasible[level]:,.2f} on "
                           f"rung {level}: a {saving:.0%} saving, at least the {min_savings_pct:g} % that pays for "
                           f"running more yourself")
                level = higher
            else:
                why.append(f"rung {higher} would be {saving:.0%} cheaper (${feasible[higher]:,.2f} vs "
                           f"${feasible[level]:,.2f}/month), below the {min_savings_pct:g} % worth the extra work")
        if min(feasible.values()) == feasible[level]:
            why.append(f"it is also the cheapest allowed rung: ${feasible[level]:,.2f}/month for "
                       f"{traffic.tokens_per_month:,.0f} tokens/month")
        flip += _cost_flips(level, floor, traffic, price, fleets, tier, min_savings_pct)
    elif floor == 1:
        flip.append("give the traffic (--avg or --tokens-per-month) and a capacity (--capacity or --bench) "
                    "to weigh self-hosting against the per-token price")
    for dest, req_level, _ in REQUIREMENTS:
        if req.flags.get(dest) and req.without(dest).floor < floor:
            flip.append(f"without --{dest.replace('_', '-')}, the tree would stop at rung "
                        f"{req.without(dest).floor} ({RUNGS[req.without(dest).floor - 1].name})")
    out = {"level": level, "rung": RUNGS[level - 1].name, "tree_level": floor, "why": why, "flip": flip,
           "min_savings_pct": min_savings_pct}
    if costs is not None:
        out["costs"] = costs
    return out


def _cost_flips(level: int, floor: int, traffic: Traffic, price: TokenPrice, fleets: list[Fleet],
                tier: str, min_savings_pct: float) -> list[str]:
    flips = []
    blended = bedrock_cost(traffic, price, tier).per_million_usd
    sagemaker = [f for f in fleets if f.level != 6 and f.level >= floor]
    if floor == 1 and sagemaker:
        fleet = sagemaker[0]
        volume = fleet.breakeven_tokens_per_month(traffic, blended)
        bedrock_monthly = traffic.tokens_per_month * blended / 1e6
        if level == 1:
            if volume is None:
                flips.append(f"at this traffic's peak-to-average ratio ({traffic.peak_to_average:.3g}x) no volume makes "
                             f"rung {fleet.level} cheaper with {fleet.capacity.output_tokens_per_second:,.0f} output "
                             f"tok/s per replica: replicas sized for the peak sit idle too much of the time")
            else:
                flips.append(f"traffic above {tokens(volume)} tokens/month (now {tokens(traffic.tokens_per_month)}) makes rung "
                             f"{fleet.level} cheaper than Bedrock; it is recommended once it saves {min_savings_pct:g} %")
            need = _capacity_to_match(fleet, traffic, bedrock_monthly)
            if need is None:
                floor_cost = fleet.monthly(traffic.scaled_to(traffic.tokens_per_month * 1e-9))
                flips.append(f"no replica speed would do at this volume: the {fleet.min_replicas} always-on "
                             f"replica(s) alone cost ${floor_cost:,.2f}/month against Bedrock's "
                             f"${bedrock_monthly:,.2f}")
            else:
                flips.append(f"a replica sustaining {need:,.0f} output tok/s or more (now "
                             f"{fleet.capacity.output_tokens_per_second:,.0f}) would make rung {fleet.level} "
                             f"cost no more than Bedrock at this traffic")
        elif volume is not None:
            flips.append(f"traffic below {tokens(volume)} tokens/month (now {tokens(traffic.tokens_per_month)}) makes "
                         f"Bedrock cheaper again")
    if level == 2 and floor < 3:
        flips.append("rungs 3-5 bill the same instance-hours: if the model is not a JumpStart one-click deploy, "
                     "rung 3 (your model on LMI) costs the same")
    eks = next((f for f in fleets if f.level == 6), None)
    if eks is not None and level != 6 and floor <= 6:
        chosen = next((f for f in fleets if f.level == level), None)
        if chosen is not None:
            delta = chosen.monthly(traffic) - eks.monthly(traffic)
            if delta > 0:
                flips.append(f"rung 6 (EC2 + EKS) would cost ${delta:,.2f}/month less than rung {level}: worth it "
                             f"only if running the cluster costs you less than that")
    return flips


def _capacity_to_match(fleet: Fleet, traffic: Traffic, budget_monthly: float) -> float | None:
    """Output tok/s per replica at which the fleet's monthly cost fits within ``budget_monthly``."""
    idle = (24 - traffic.hours_per_day) * DAYS_PER_MONTH
    spare = budget_monthly - fleet.fixed_monthly - fleet.hourly * fleet.min_replicas * idle
    replicas = math.floor(spare / (fleet.hourly * traffic.active_hours_per_month))
    if replicas < fleet.min_replicas:
        return None
    total_per_replica = traffic.peak_tokens_per_second / replicas
    return total_per_replica * traffic.mix.output_share
