"""Fleet sizing and the monthly cost of one traffic profile on every rung.

Rung 1 bills tokens. Rungs 2-5 bill SageMaker instance-hours; rung 6 bills EC2 instance-hours
plus the EKS control plane and the cluster's system node group. A self-hosted fleet runs
max(min_replicas, ceil(peak / capacity)) replicas (one instance each) during the active hours
and min_replicas the rest of the day, because a SageMaker real-time endpoint and a cluster's
serving floor do not go to zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from cost.breakeven import (SECONDS_PER_HOUR, Capacity, Mix, blended_price,
                            check_range, total_from_output)
from cost.prices import HOURS_PER_MONTH, InstanceType, PriceTable, TokenPrice
from options.core import RUNGS, BadInput, rung
from options.core.rungs import EC2, SAGEMAKER

# The self-hosted rungs, by whose price list bills them (the core's rung data).
SAGEMAKER_LEVELS = tuple(r.level for r in RUNGS if r.platform == SAGEMAKER)
EKS_LEVEL = next(r.level for r in RUNGS if r.platform == EC2)
SELF_HOSTED_LEVELS = (*SAGEMAKER_LEVELS, EKS_LEVEL)
DAYS_PER_MONTH = HOURS_PER_MONTH / 24


@dataclass(frozen=True)
class Traffic:
    avg_tokens_per_second: float     # input + output tokens/s while active
    peak_tokens_per_second: float
    hours_per_day: float
    mix: Mix

    @property
    def active_hours_per_month(self) -> float:
        return self.hours_per_day * DAYS_PER_MONTH

    @property
    def tokens_per_month(self) -> float:
        return self.avg_tokens_per_second * SECONDS_PER_HOUR * self.active_hours_per_month

    @property
    def peak_to_average(self) -> float:
        return self.peak_tokens_per_second / self.avg_tokens_per_second

    def scaled_to(self, tokens_per_month: float) -> "Traffic":
        """The same shape (mix, peak-to-average, hours) at another monthly volume."""
        factor = tokens_per_month / self.tokens_per_month
        return replace(self, avg_tokens_per_second=self.avg_tokens_per_second * factor,
                       peak_tokens_per_second=self.peak_tokens_per_second * factor)

    def to_json(self) -> dict[str, Any]:
        return {"avg_tokens_per_second": round(self.avg_tokens_per_second, 3),
                "peak_tokens_per_second": round(self.peak_tokens_per_second, 3),
                "hours_per_day": self.hours_per_day, "tokens_per_month": round(self.tokens_per_month),
                "mix": self.mix.label}


def make_traffic(mix: Mix, avg: float | None = None, peak: float | None = None,
                 tokens_per_month: float | None = None, hours_per_day: float = 24.0) -> tuple[Traffic, list[str]]:
    """A Traffic from the CLI's flags, and the assumptions it took."""
    check_range("hours per day", hours_per_day, 0.0, 24.0, low_open=True)
    notes: list[str] = []
    if (avg is None) == (tokens_per_month is None):
        raise BadInput("give the traffic as exactly one of --avg TOK_S (input+output tokens/s while active) "
                       "or --tokens-per-month N")
    if tokens_per_month is not None:
        check_range("tokens per month", tokens_per_month, 0.0, 1e15, low_open=True)
        avg = tokens_per_month / (SECONDS_PER_HOUR * hours_per_day * DAYS_PER_MONTH)
    check_range("average tokens/s", avg, 0.0, 1e9, low_open=True)
    if peak is None:
        peak = avg
        notes.append("no --peak given: the peak is taken as the average (real traffic peaks higher; "
                     "the fleet is sized for the peak)")
    check_range("peak tokens/s", peak, 0.0, 1e9, low_open=True)
    if peak < avg:
        raise BadInput(f"peak {peak:g} tokens/s is below the average {avg:g}: the peak must be >= the average")
    return Traffic(avg, peak, hours_per_day, mix), notes


@dataclass
class RungCost:
    level: int
    name: str
    billing: str
    monthly_usd: float
    per_million_usd: float
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "rung": self.name, "billing": self.billing,
                "monthly_usd": round(self.monthly_usd, 2), "per_million_usd": round(self.per_million_usd, 6),
                **self.detail}


@dataclass(frozen=True)
class Fleet:
    """How one self-hosted rung serves the traffic: instance, platform, capacity, replica floor."""
    level: int
    instance: InstanceType
    platform: str                    # "sagemaker" | "ec2"
    hourly: float                    # USD per replica-hour after any discount
    capacity: Capacity
    min_replicas: int
    fixed_monthly: float = 0.0       # EKS control plane and system nodes

    def capacity_tokens_per_second(self, mix: Mix) -> float:
        return total_from_output(self.capacity.output_tokens_per_second, mix)

    def replicas(self, traffic: Traffic) -> int:
        return max(self.min_replicas,
                   math.ceil(traffic.peak_tokens_per_second / self.capacity_tokens_per_second(traffic.mix) - 1e-9))

    def monthly(self, traffic: Traffic) -> float:
        idle_hours = (24 - traffic.hours_per_day) * DAYS_PER_MONTH
        replica_hours = self.replicas(traffic) * traffic.active_hours_per_month + self.min_replicas * idle_hours
        return replica_hours * self.hourly + self.fixed_monthly

    def breakeven_tokens_per_month(self, traffic: Traffic, price_per_million: float) -> float | None:
        """The smallest monthly volume (same traffic shape) at which this fleet costs no more than
        paying ``price_per_million`` per token; None if per-token stays cheaper at any volume."""
        cap = self.capacity_tokens_per_second(traffic.mix)
        active = traffic.active_hours_per_month
        idle = (24 - traffic.hours_per_day) * DAYS_PER_MONTH
        ratio = traffic.peak_to_average
        per_token = price_per_million / 1e6
        # Volume n replicas can carry at the traffic's peak-to-average ratio.
        carry = cap * SECONDS_PER_HOUR * active / ratio
        margin = carry * per_token - self.hourly * active  # per-replica gain at full load
        if margin <= 0:
            return None
        fixed = self.hourly * self.min_replicas * idle + self.fixed_monthly
        n = max(self.min_replicas, math.floor(fixed / margin))
        while True:  # at most a couple of steps past the closed-form estimate
            cost = self.hourly * (n * active + self.min_replicas * idle) + self.fixed_monthly
            volume = cost / per_token
            if volume <= n * carry:
                return volume
            n += 1

    def to_json(self, traffic: Traffic) -> dict[str, Any]:
        return {"instance_type": self.instance.sagemaker_name if self.platform == "sagemaker" else self.instance.name,
                "platform": self.platform, "replicas_at_peak": self.replicas(traffic),
                "min_replicas": self.min_replicas, "hourly_per_replica_usd": round(self.hourly, 6),
                "capacity_output_tokens_per_second": self.capacity.output_tokens_per_second,
                "capacity_tokens_per_second": round(self.capacity_tokens_per_second(traffic.mix), 3),
                "capacity_origin": self.capacity.origin,
                "fixed_monthly_usd": round(self.fixed_monthly, 2),
                "price_as_of": self.instance.as_of}


def bedrock_cost(traffic: Traffic, price: TokenPrice, tier: str = "on_demand") -> RungCost:
    p_in, p_out = price.per_million(tier)
    blended = blended_price(p_in, p_out, traffic.mix)
    return RungCost(1, RUNGS[0].name, RUNGS[0].billed, traffic.tokens_per_month * blended / 1e6, blended,
                    {"model_id": price.model_id, "tier": tier, "input_per_million": p_in,
                     "output_per_million": p_out, "price_as_of": price.as_of})


def fleet_cost(fleet: Fleet, traffic: Traffic) -> RungCost:
    rung = RUNGS[fleet.level - 1]
    monthly = fleet.monthly(traffic)
    return RungCost(fleet.level, rung.name, rung.billed, monthly, monthly / traffic.tokens_per_month * 1e6,
                    fleet.to_json(traffic))


def build_fleets(table: PriceTable, instance: InstanceType, capacities: dict[int, Capacity],
                 default_capacity: Capacity, min_replicas: int, discount_pct: float, *,
                 eks_fixed_hourly: float) -> list[Fleet]:
    """One Fleet per self-hosted rung: SageMaker prices for 2-5, EC2 plus EKS for 6.

    ``eks_fixed_hourly`` is what rung 6's cluster costs per hour whatever its GPU count (the
    control plane and the system nodes: ``infra.eks.cluster.fixed_hourly``)."""
    from cost.breakeven import apply_discount

    check_range("min replicas", min_replicas, 1, 10000)
    fleets = []
    for level in SELF_HOSTED_LEVELS:
        platform = rung(level).platform
        listed = instance.sagemaker_hourly if platform == "sagemaker" else instance.ec2_hourly
        if listed is None:  # not offered there, or not in the table: that rung is left out, not guessed
            continue
        fixed = eks_fixed_hourly * HOURS_PER_MONTH if level == EKS_LEVEL else 0.0
        fleets.append(Fleet(level, instance, platform, apply_discount(listed, discount_pct),
                            capacities.get(level, default_capacity), int(min_replicas), fixed))
    if not fleets:
        raise BadInput(f"{instance.name} has neither a SageMaker nor an EC2 price in the table: choose another "
                       f"instance type or refresh the table with `python -m cost prices --refresh`")
    return fleets


def compare(traffic: Traffic, price: TokenPrice, fleets: list[Fleet], tier: str = "on_demand") -> dict[str, Any]:
    """Every rung priced for one traffic profile, with the break-even volume of each self-hosted rung."""
    bedrock = bedrock_cost(traffic, price, tier)
    rows = [bedrock]
    for fleet in fleets:
        row = fleet_cost(fleet, traffic)
        volume = fleet.breakeven_tokens_per_month(traffic, bedrock.per_million_usd)
        row.detail["breakeven_tokens_per_month_vs_bedrock"] = None if volume is None else round(volume)
        rows.append(row)
    cheapest = min(rows, key=lambda r: (round(r.monthly_usd, 2), r.level))
    return {"traffic": traffic.to_json(), "rungs": [r.to_json() for r in rows],
            "cheapest_level": cheapest.level, "cheapest_rung": cheapest.name}
