"""Every rung on one trace: each one's bill, latency and SLO attainment, with the autoscaling
setting that achieves them, and the scale at which each self-hosted rung overtakes Bedrock.

Rung 1 runs through ``bedrock.py``; rungs 2-5 (SageMaker real-time, one bill, one autoscaler)
and rung 6 (EKS) through ``fleet.py`` with their policies from ``scaling.py``. Rungs 2-5 share
one simulation unless benches per level give them different capacities.

Rung 1's other forms (``--bedrock-batch``, Provisioned Throughput) are ``options`` of the level-1
row: each billed and simulated on the trace, or saying why it is out. ``cheapest_meeting_slo``
stays a level; where it is 1, ``cheapest_bedrock_form`` says which form (compared per month:
a Provisioned Throughput stays up, so its month is not its window times the month). Rung 6 on
spot (``--spot``) replaces its on-demand nodes in the one rung-6 row.

The recommended policy is the least costly candidate that meets the SLO. Candidates are ordered
from the most economical target to the most cautious; attainment falls as the target rises, so
a bisection finds the boundary in a few full simulations instead of one per candidate. Where no
rung meets the SLO, ``closest_to_slo`` gives each rung's best candidate (its setting, the
replicas it reached against its ceiling, its attainment), and so whether a higher ceiling
could help.

Every rung has its front door's timeouts (``timeouts.py``): a request past them is failed as
``timed_out``, and on rung 1 still billed.

``break_even_scale``: the ``--scale`` at which a self-hosted rung's bill equals Bedrock's. Both
sides are priced at scales other than the trace's own without re-simulating every request:
Bedrock's bill is linear in the scale; the self-hosted fleet is sized by the recommended
invocations-per-instance target (the highest one that met the SLO on the trace) replayed on the
trace's per-minute arrival counts × scale, with the same instance start time and floor. So the
self-hosted side keeps the per-instance load that met the SLO, which is what "at the same SLO
attainment" asks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from cost.prices import HOURS_PER_MONTH
from cost.traces import DEFAULT_BLOCK_TOKENS
from cost.simulate import fleet as fleet_mod
from cost.simulate.bedrock import THROTTLED, BedrockSettings, ProvisionedThroughput, batch_run, simulate_bedrock
from cost.simulate.fleet import INTERRUPTED, NO_CAPACITY, SERVED, TIMED_OUT, run_fleet
from cost.simulate.prefix import prefix_of
from cost.simulate.scaling import QueueDepth, RayServe, TargetTracking, default
from cost.simulate.spot import SpotMarket
from cost.simulate.timeouts import FrontDoor, default_front_doors, door_of
from options.core import BadInput
from options.core.autoscaling import SAGEMAKER_METRIC_NAMES

INVOCATIONS_METRICS = {name for (metric, _), name in SAGEMAKER_METRIC_NAMES.items() if metric == "invocations"}

SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
SAGEMAKER_LEVELS = (2, 3, 4, 5)
EKS_LEVEL = 6
ALL_LEVELS = (1, *SAGEMAKER_LEVELS, EKS_LEVEL)
# Shares of one replica's saturated request rate tried as InvocationsPerInstance targets, and
# the concurrency / queue-depth targets tried: from the most economical to the most cautious.
INVOCATION_SHARES = (1.0, 0.85, 0.7, 0.55, 0.4, 0.25)
CONCURRENCY_TARGETS = (256, 128, 64, 32, 16, 8, 4, 2)
WAITING_TARGETS = (32, 16, 8, 4, 2, 1, 0.5)
ONGOING_TARGETS = (256, 128, 64, 32, 16, 8, 4, 2, 1)
# Who scales rung 6: the HPA (KEDA) on the Deployment, or Ray Serve's autoscaler on the RayService.
RUNG6_AUTOSCALERS = ("hpa", "ray-serve")


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    attainment: float = 0.99        # share of requests that must be served within both bounds

    def __post_init__(self) -> None:
        for name, value in (("--slo-ttft-ms", self.ttft_ms), ("--slo-e2e-ms", self.e2e_ms)):
            if value is not None and not value > 0:
                raise BadInput(f"{name} {value!r} must be > 0 milliseconds")
        if not 0 < self.attainment <= 1:
            raise BadInput(f"--slo-attainment {self.attainment!r} must be in (0, 1], e.g. 0.99")

    def met(self, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, status: np.ndarray) -> np.ndarray:
        ok = status == SERVED
        with np.errstate(invalid="ignore"):
            if self.ttft_ms is not None:
                ok &= (first - arrival) * 1000 <= self.ttft_ms
            if self.e2e_ms is not None:
                ok &= (finish - arrival) * 1000 <= self.e2e_ms
        return ok

    def to_json(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "e2e_ms": self.e2e_ms, "attainment": self.attainment}


def routing_for(level: int, asked: str | None, rung6_autoscaler: str, scale_to_zero: bool) -> str:
    """The router of ``level``'s fleet: the one asked for, else what the deployed platform
    does: on rung 6 Ray Serve's power of two choices (scaled by Serve) or the Service's random
    pick (the HPA); on SageMaker its default random, except inference components
    (--scale-to-zero), which options.deploy gives LEAST_OUTSTANDING_REQUESTS."""
    if asked:
        return asked
    if level == EKS_LEVEL:
        return "power_of_two" if rung6_autoscaler == "ray-serve" else "random"
    return "least_outstanding" if scale_to_zero else "random"


@dataclass
class Setup:
    """What every rung's simulation needs besides the trace."""
    price: Any                       # cost.prices.TokenPrice of the Bedrock model
    tier: str
    instance: Any                    # cost.prices.InstanceType
    capacity: dict[int, Any]         # level -> CapacityModel (2-6)
    slo: Slo
    bedrock: BedrockSettings
    eks_fixed_hourly: float          # control plane + system nodes, per hour
    discount_pct: float = 0.0
    routing: str | None = None        # None: each rung's own (routing_for)
    scale_to_zero: bool = False      # SageMaker inference components with copy count 0
    min_instances: int | None = None
    max_instances: int | None = None
    sagemaker_policy: TargetTracking | None = None     # given: simulate with it instead of searching
    eks_policy: QueueDepth | RayServe | None = None
    rung6_autoscaler: str = "hpa"     # "hpa" | "ray-serve"
    ray_serve: dict[str, Any] | None = None   # autoscaling_config keys given (delays, factors, look-back)
    sagemaker_start_s: float | None = None
    eks_start_s: float | None = None
    seed: int = 0
    bedrock_batch: bool = False                          # also simulate rung 1 as batch inference
    bedrock_pt: ProvisionedThroughput | None = None      # also simulate rung 1 on Provisioned Throughput
    spot: SpotMarket | None = None   # rung 6's GPU nodes on EC2 Spot instead of on-demand
    timeouts: dict[str, FrontDoor] | None = None   # "bedrock"/"sagemaker"/"eks" -> limits; None: the defaults
    block_tokens: int = DEFAULT_BLOCK_TOKENS         # prompt tokens a trace's prefix block id stands for


def percentiles_ms(values_s: np.ndarray, qs=(50, 99)) -> dict[str, float | None]:
    v = values_s[~np.isnan(values_s)]
    if not len(v):
        return {f"p{q}": None for q in qs}
    return {f"p{q}": round(float(np.percentile(v, q)) * 1000, 2) for q in qs}


def _timeline_stats(timeline: list[tuple[float, int, int]], span_s: float) -> dict[str, float]:
    """min, time-weighted mean and max of the serving replica count over [0, span]."""
    times = [t for t, _, _ in timeline] + [span_s]
    counts = [c for _, c, _ in timeline]
    weighted = sum(c * max(0.0, min(times[i + 1], span_s) - min(times[i], span_s)) for i, c in enumerate(counts))
    inside = [c for t, c, _ in timeline if t <= span_s] or [0]
    return {"min": int(min(inside)), "mean": round(weighted / span_s, 3), "max": int(max(inside))}


class Simulation:
    """One trace, simulated on the rungs asked for; ``run()`` gives the JSON document."""

    def __init__(self, trace, setup: Setup, levels: tuple[int, ...] = ALL_LEVELS,
                 progress: Callable[[str], None] | None = None) -> None:
        bad = [lv for lv in levels if lv not in ALL_LEVELS]
        if bad or not levels:
            raise BadInput(f"--rungs {','.join(map(str, levels))}: give levels from 1-6, e.g. 1,3,6")
        if len(trace) == 0:
            raise BadInput("the trace has no requests in the chosen window")
        self.trace, self.setup, self.levels = trace, setup, tuple(sorted(set(levels)))
        self.say = progress or (lambda _: None)
        self.arrival = trace.arrival_s
        self.inputs = trace.input_tokens
        self.outputs = trace.output_tokens
        self.span_s = float(trace.span_s)
        self.prefix = prefix_of(trace, setup.block_tokens)    # None: the trace names no prompt blocks
        self._cache: dict[Any, dict[str, Any]] = {}
        self._per_minute: np.ndarray | None = None
        self._scale_costs: dict[tuple[Any, float], float] = {}   # (simulation key, scale) -> window USD
        self.runs: dict[int, Any] = {}           # level -> the run behind its row (for the plot)
        self.doors = setup.timeouts or default_front_doors(setup.rung6_autoscaler)

    # --- the shape of the traffic, for candidate targets and fleet limits ---------------------

    def per_minute_counts(self) -> np.ndarray:
        """Arrivals in each minute of the trace (computed once: the break-even search asks often)."""
        if self._per_minute is None:
            bins = max(1, math.ceil(self.span_s / 60))
            self._per_minute = np.bincount(np.minimum((self.arrival // 60).astype(np.int64), bins - 1),
                                           minlength=bins)
        return self._per_minute

    def replica_request_rate(self, cap) -> float:
        """Requests per minute one replica serves when saturated, at the trace's mean sizes."""
        mean_in, mean_out = float(self.inputs.mean()), float(max(1.0, self.outputs.mean()))
        return cap.saturated_output_tok_s(mean_in, mean_out) / mean_out * 60

    def fleet_limits(self, cap) -> tuple[int, int]:
        low = self.setup.min_instances
        high = self.setup.max_instances
        if high is None:
            peak = float(self.per_minute_counts().max())
            high = max(2, math.ceil(2 * peak / max(1e-9, self.replica_request_rate(cap))) + 1)
        return (1 if low is None else low), high

    # --- one self-hosted fleet --------------------------------------------------------------

    def routing_for(self, level: int) -> str:
        return routing_for(level, self.setup.routing, self.setup.rung6_autoscaler, self.setup.scale_to_zero)

    def run_policy(self, level: int, policy) -> dict[str, Any]:
        key = (level if level == EKS_LEVEL else "sagemaker", id(self.setup.capacity[level]),
               repr(policy.to_json()))
        if key in self._cache:
            return self._cache[key]
        cap = self.setup.capacity[level]
        door = self.doors[door_of(level)]
        spot = self.setup.spot if level == EKS_LEVEL else None
        run = run_fleet(self.arrival, self.inputs, self.outputs, cap, policy, span_s=self.span_s,
                        routing=self.routing_for(level), seed=self.setup.seed, front_door=door,
                        interruption_notice=spot.notices(self.setup.seed) if spot else None,
                        notice_s=spot.notice_s if spot else 0.0, prefix=self.prefix)
        if level == EKS_LEVEL:
            hourly = self.eks_node_hourly()
            seconds = run.instance_seconds(self.span_s, default("eks", "ec2_minimum_billed_s"))
            fixed = self.setup.eks_fixed_hourly * self.span_s / 3600
        else:
            hourly = self.setup.instance.hourly("sagemaker") * (1 - self.setup.discount_pct / 100)
            seconds = run.instance_seconds(self.span_s)
            fixed = 0.0
        window = seconds * hourly / 3600 + fixed
        met = self.setup.slo.met(self.arrival, run.first_token_s, run.finish_s, run.status)
        served = run.status == SERVED
        busy = sum(i.replica.busy_s for i in run.instances if i.replica is not None)
        serving_s = sum(min(i.ended_s if i.ended_s is not None else self.span_s, self.span_s) - i.ready_s
                        for i in run.instances if i.replica is not None and i.ready_s < self.span_s)
        row = {
            "window_usd": round(window, 4),
            "served": int(served.sum()),
            "throttled": 0,
            "failed": int((~served).sum()),
            "failures": {fleet_mod.STATUS_NAMES[s]: int((run.status == s).sum())
                         for s in (NO_CAPACITY, TIMED_OUT, INTERRUPTED) if (run.status == s).any()},
            "billed_input_tokens": int(self.inputs[served].sum()),
            "billed_output_tokens": int(self.outputs[served].sum()),
            "slo_attainment": round(float(met.mean()), 5),
            "ttft_ms": percentiles_ms(np.where(served, run.first_token_s - self.arrival, np.nan)),
            "e2e_ms": percentiles_ms(np.where(served, run.finish_s - self.arrival, np.nan)),
            "replicas": _timeline_stats(run.timeline, self.span_s),
            "cold_starts": sum(1 for i in run.instances if i.launched_s > 0),
            "idle_share": round(max(0.0, 1 - busy / serving_s), 4) if serving_s > 0 else None,
            "instance_hours": round(seconds / 3600, 4),
            "timeout": door.to_json(),
            **({"prefix_cache": run.prefix_cache} if run.prefix_cache else {}),
            "policy": {**policy.to_json(), **({"spot": spot.to_json()} if spot else {})},
            **({"spot_interruptions": {"notices": len(run.interruptions),
                                       "requests_failed": int((run.status == INTERRUPTED).sum()),
                                       "replacements": sum(1 for i in run.interruptions if i["replaced"])}}
               if spot else {}),
        }
        self._cache[key] = row
        self.runs[key] = run
        row["_key"] = key
        return row

    def eks_node_hourly(self) -> float:
        """A rung-6 GPU node's hourly price: EC2 on-demand less --discount, or the spot price
        (on-demand less the spot discount; Savings Plans and reservations do not cover spot)."""
        on_demand = self.setup.instance.hourly("ec2")
        if self.setup.spot is not None:
            return self.setup.spot.hourly(on_demand)
        return on_demand * (1 - self.setup.discount_pct / 100)

    def search(self, level: int, candidates: list) -> dict[str, Any]:
        """The least costly candidate meeting the SLO (candidates ordered economical → cautious);
        if none does, the one with the best attainment (the most cautious tried)."""
        goal = self.setup.slo.attainment
        meets = lambda row: row["slo_attainment"] >= goal  # noqa: E731
        last = self.run_policy(level, candidates[-1])
        if not meets(last):
            return last
        lo, hi = 0, len(candidates) - 1      # candidates[hi] meets; find the first that does
        while lo < hi:
            mid = (lo + hi) // 2
            if meets(self.run_policy(level, candidates[mid])):
                hi = mid
            else:
                lo = mid + 1
        best = self.run_policy(level, candidates[hi])
        # A more economical candidate may still meet the SLO at a lower bill (attainment is not
        # strictly monotone in the target): keep the cheapest of those seen that meet it.
        seen = [r for r in self._cache.values() if r["_key"][0] == best["_key"][0] and meets(r)]
        return min(seen, key=lambda r: r["window_usd"]) if seen else best

    def sagemaker_candidates(self, cap) -> list[list[TargetTracking]]:
        low, high = self.fleet_limits(cap)
        if self.setup.scale_to_zero:
            low = 0
        start = self.setup.sagemaker_start_s if self.setup.sagemaker_start_s is not None else default("sagemaker", "start_s")
        rate = self.replica_request_rate(cap)
        common = dict(min_instances=low, max_instances=high, start_s=start)
        by_invocations = [TargetTracking("invocations", round(max(1.0, rate * s), 1), **common)
                          for s in INVOCATION_SHARES]
        by_concurrency = [TargetTracking("concurrency", c, **common)
                          for c in CONCURRENCY_TARGETS if c <= max(2, cap.max_num_seqs)]
        return [by_invocations, by_concurrency]

    def eks_candidates(self, cap) -> list[QueueDepth] | list[RayServe]:
        low, high = self.fleet_limits(cap)
        start = self.setup.eks_start_s
        extra = {} if start is None else {"start_s": start}
        if self.setup.rung6_autoscaler == "ray-serve":
            given = {k: v for k, v in (self.setup.ray_serve or {}).items()
                     if k not in ("min_replicas", "max_replicas", "target_ongoing_requests")}
            return [RayServe(t, min_replicas=max(1, low), max_replicas=high, **given, **extra)
                    for t in ONGOING_TARGETS if t <= max(2, cap.max_num_seqs)]
        return [QueueDepth(w, min_replicas=max(1, low), max_replicas=high, **extra) for w in WAITING_TARGETS]

    def fresh(self, policy):
        """A new copy of a given policy (policies keep state while a simulation runs)."""
        return replace(policy)

    def sagemaker_row(self, level: int) -> dict[str, Any]:
        cap = self.setup.capacity[level]
        if self.setup.sagemaker_policy is not None:
            return self.run_policy(level, self.fresh(self.setup.sagemaker_policy))
        rows = [self.search(level, group) for group in self.sagemaker_candidates(cap)]
        goal = self.setup.slo.attainment
        meeting = [r for r in rows if r["slo_attainment"] >= goal]
        return min(meeting, key=lambda r: r["window_usd"]) if meeting else max(rows, key=lambda r: r["slo_attainment"])

    def eks_row(self) -> dict[str, Any]:
        cap = self.setup.capacity[EKS_LEVEL]
        if self.setup.eks_policy is not None:
            return self.run_policy(EKS_LEVEL, self.fresh(self.setup.eks_policy))
        return self.search(EKS_LEVEL, self.eks_candidates(cap))

    # --- rung 1 -------------------------------------------------------------------------------

    def bedrock_outcomes(self, run) -> dict[str, Any]:
        """What a rung-1 run served, throttled and failed, and its latency against the SLO. A
        timed-out request is billed where the front door says Bedrock bills it."""
        served = run.status == SERVED
        throttled, timed_out = run.status == THROTTLED, run.status == TIMED_OUT
        billed = served | timed_out if self.doors["bedrock"].billed else served
        met = self.setup.slo.met(self.arrival, run.first_token_s, run.finish_s, run.status)
        return {
            "served": int(served.sum()),
            "throttled": int(run.throttled_requests),
            "failed": int((~served).sum()),
            "failures": {name: int(mask.sum()) for name, mask in
                         (("throttled_after_retries", throttled), ("timed_out", timed_out)) if mask.any()},
            "throttle_events": int(run.throttle_events),
            "billed_input_tokens": int(self.inputs[billed].sum()),
            "billed_output_tokens": int(self.outputs[billed].sum()),
            "slo_attainment": round(float(met.mean()), 5),
            "ttft_ms": percentiles_ms(np.where(served, run.first_token_s - self.arrival, np.nan)),
            "e2e_ms": percentiles_ms(np.where(served, run.finish_s - self.arrival, np.nan)),
        }

    def bedrock_row(self) -> dict[str, Any]:
        run = simulate_bedrock(self.arrival, self.inputs, self.outputs, self.setup.bedrock, self.setup.seed,
                               self.doors["bedrock"])
        self.runs[1] = run
        p_in, p_out = self.setup.price.per_million(self.setup.tier)
        outcomes = self.bedrock_outcomes(run)
        return {
            # exact: no rounding
            "window_usd": (outcomes["billed_input_tokens"] * p_in + outcomes["billed_output_tokens"] * p_out) / 1e6,
            **outcomes,
            "replicas": None,
            "cold_starts": 0,
            "idle_share": None,
            "timeout": self.doors["bedrock"].to_json(),
            "policy": {**self.setup.bedrock.to_json(), "tier": self.setup.tier,
                       "input_per_million": p_in, "output_per_million": p_out},
        }

    def bedrock_options(self) -> list[dict[str, Any]]:
        """Rung 1's other forms the user asked for (batch, Provisioned Throughput), each priced and
        simulated on the trace, or saying why it is out."""
        options = []
        if self.setup.bedrock_batch:
            options.append(self.batch_option())
        if self.setup.bedrock_pt is not None:
            options.append(self.provisioned_option())
        return options

    def _option(self, name: str, run, window_usd: float, monthly_usd: float, policy: dict[str, Any],
                **extra) -> dict[str, Any]:
        return {"option": name, "window_usd": window_usd, "monthly_usd": round(monthly_usd, 2),
                **self.bedrock_outcomes(run), **extra, "policy": policy}

    def batch_option(self) -> dict[str, Any]:
        price = self.setup.price
        window_s = default("bedrock", "batch_window_s")
        if price.batch_input_per_million is None or price.batch_output_per_million is None:
            return {"option": "batch", "window_usd": None, "monthly_usd": None, "meets_slo": False,
                    "excluded": f"no batch price for {price.model_id} in the price table (as of {price.as_of}): "
                                "Bedrock lists no batch inference for it"}
        slo = self.setup.slo
        why_not = None
        if slo.ttft_ms is not None:
            why_not = (f"--slo-ttft-ms {slo.ttft_ms:g}: a batch job streams nothing and answers within "
                       f"{window_s / 3600:g} h, so no first token comes within a TTFT bound")
        elif slo.e2e_ms is not None and slo.e2e_ms < window_s * 1000:
            why_not = (f"--slo-e2e-ms {slo.e2e_ms:g} is shorter than the batch window ({window_s * 1000:,.0f} ms "
                       f"= {window_s / 3600:g} h): a job may answer at any time within it")
        run = batch_run(self.arrival)
        self.runs["batch"] = run
        p_in, p_out = price.per_million("batch")
        policy = {"kind": "bedrock_batch", "window_s": window_s, "latency": "arrival + the window (worst case)",
                  "quota": "not counted against on-demand TPM/RPM", "input_per_million": p_in,
                  "output_per_million": p_out}
        bill = (int(self.inputs.sum()) * p_in + int(self.outputs.sum()) * p_out) / 1e6     # all served, exact
        option = self._option("batch", run, bill, bill * SECONDS_PER_MONTH / self.span_s, policy)
        if why_not:
            option.update(slo_attainment=0.0, excluded=why_not)
        return option

    def provisioned_option(self) -> dict[str, Any]:
        pt = self.setup.bedrock_pt
        goal = self.setup.slo.attainment
        runs: dict[int, Any] = {}

        def attainment(units: int) -> float:
            if units not in runs:
                runs[units] = pt.run(self.arrival, self.inputs, self.outputs, self.setup.bedrock, units,
                                     self.setup.seed, self.doors["bedrock"])
            met = self.setup.slo.met(self.arrival, runs[units].first_token_s, runs[units].finish_s,
                                     runs[units].status)
            return float(met.mean())

        enough = pt.units_without_throttling(self.inputs, self.outputs, self.arrival)
        if pt.units is not None:
            units = pt.units
        elif attainment(enough) < goal:
            units = enough     # no throttling left: the latency alone misses the SLO, more units will not help
        else:
            low, high = 1, enough              # attainment(high) meets: find the least that does
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if attainment(mid) >= goal else (mid + 1, high)
            units = high
        attainment(units)
        self.runs["provisioned_throughput"] = runs[units]
        commitment = pt.commitment_usd(units)
        return self._option("provisioned_throughput", runs[units], pt.window_usd(units, self.span_s),
                            pt.monthly_usd(units, HOURS_PER_MONTH), pt.to_json(units),
                            model_units=units, units_without_throttling=enough,
                            **({"commitment_usd": round(commitment, 2)} if commitment is not None else {}))

    # --- the answer -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        rows: dict[int, dict[str, Any]] = {}
        if 1 in self.levels:
            self.say("rung 1: Bedrock quotas and retries")
            rows[1] = self.bedrock_row()
        sagemaker = [lv for lv in self.levels if lv in SAGEMAKER_LEVELS]
        for level in sagemaker:
            self.say(f"rung {level}: SageMaker target tracking")
            rows[level] = dict(self.sagemaker_row(level))
        if EKS_LEVEL in self.levels:
            self.say("rung 6: EKS with " + ("Ray Serve's autoscaler on ongoing requests"
                                            if self.setup.rung6_autoscaler == "ray-serve"
                                            else "HPA/KEDA on queue depth"))
            rows[EKS_LEVEL] = dict(self.eks_row())
        goal = self.setup.slo.attainment
        factor = SECONDS_PER_MONTH / self.span_s
        self.level_runs = {lv: self.runs[1 if lv == 1 else rows[lv]["_key"]] for lv in rows}
        # Rungs that shared a simulation (2-5 on one capacity) share their costs at other scales too.
        self.level_keys = {lv: rows[lv]["_key"] for lv in rows if lv != 1}
        out = []
        for level in sorted(rows):
            row = {k: v for k, v in rows[level].items() if k != "_key"}
            row = {"level": level, **row, "monthly_usd": round(row["window_usd"] * factor, 2),
                   "meets_slo": row["slo_attainment"] >= goal}
            out.append(row)
        options = self.bedrock_options() if 1 in rows else []
        for option in options:
            option.setdefault("meets_slo", "excluded" not in option and option["slo_attainment"] >= goal)
        if options:
            out[0]["options"] = options
        cheapest, form = self.cheapest(out, options, factor)
        self.rows = {r["level"]: r for r in out}
        return {
            "trace": {**self.trace.summary(), "spec": self.trace.spec, "notes": list(self.trace.notes)},
            "slo": self.setup.slo.to_json(),
            "rungs": out,
            "cheapest_meeting_slo": cheapest,
            "closest_to_slo": None if cheapest else self.closest(out),
            **({"cheapest_bedrock_form": form} if options else {}),
            **({"rung6_autoscaler": self.setup.rung6_autoscaler} if EKS_LEVEL in rows else {}),
            **({"ray_serve_autoscaling_config": rows[EKS_LEVEL]["policy"]["autoscaling_config"]}
               if EKS_LEVEL in rows and "autoscaling_config" in rows[EKS_LEVEL]["policy"] else {}),
            "break_even_scale": self.break_even_scales() if 1 in rows else {},
            "extrapolation": f"monthly_usd = window_usd x {factor:,.1f}: the trace's {self.span_s:,.0f} s "
                             f"repeated through a {HOURS_PER_MONTH}-hour month",
        }

    @staticmethod
    def closest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Where no rung meets the SLO: each rung's candidate closest to it, best first (ties: the
        cheaper), rungs that shared a simulation (2-5) as one. For a fleet, its setting and the
        replicas it reached against its ceiling: one that reached it may meet the SLO with a
        higher ceiling; one that did not is held back by what more instances do not change
        (start time, timeouts, long requests)."""
        out: list[dict[str, Any]] = []
        for r in sorted(rows, key=lambda r: (-r["slo_attainment"], r["monthly_usd"], r["level"])):
            p = r["policy"]
            entry: dict[str, Any] = {"levels": [r["level"]], "slo_attainment": r["slo_attainment"],
                                     "monthly_usd": r["monthly_usd"], "failures": r["failures"]}
            if r["level"] == 1:
                entry["setting"] = {"tpm": p.get("tpm"), "rpm": p.get("rpm")}
            else:
                ceiling = p.get("max_instances", p.get("max_replicas"))
                entry["setting"] = {"metric": p.get("metric"), "target": p.get("target"),
                                    "min": p.get("min_instances", p.get("min_replicas")), "max": ceiling}
                entry["replicas_reached"] = r["replicas"]["max"]
                entry["at_ceiling"] = r["replicas"]["max"] >= ceiling
            same = out and {**out[-1], "levels": None} == {**entry, "levels": None}
            if same and 1 not in out[-1]["levels"] + entry["levels"]:
                out[-1]["levels"].append(r["level"])
            else:
                out.append(entry)
        return out

    @staticmethod
    def cheapest(rows: list[dict[str, Any]], options: list[dict[str, Any]], factor: float):
        """(the cheapest level meeting the SLO, and when it is rung 1 with options, the form that
        is: "on_demand", "batch" or "provisioned_throughput"). Compared per month, since a
        Provisioned Throughput's bill is not its window's times the month (it stays up); for the
        other rows that is their window's bill times the same factor, so their order is unchanged."""
        candidates = [(r["window_usd"] * factor, r["level"], "on_demand" if r["level"] == 1 else None)
                      for r in rows if r["meets_slo"]]
        per_month = {"batch": lambda o: o["window_usd"] * factor, "provisioned_throughput": lambda o: o["monthly_usd"]}
        candidates += [(per_month[o["option"]](o), 1, o["option"]) for o in options if o["meets_slo"]]
        if not candidates:
            return None, None
        _, level, form = min(candidates, key=lambda c: (c[0], c[1]))
        return level, form

    # --- break-even against Bedrock ------------------------------------------------------------

    def fleet_cost_at_scale(self, level: int, scale: float) -> float:
        """The self-hosted bill for the trace at ``scale``, sized by its invocations target."""
        key = (self.level_keys[level], scale)
        if key not in self._scale_costs:
            self._scale_costs[key] = self._fleet_cost_at_scale(level, scale)
        return self._scale_costs[key]

    def _fleet_cost_at_scale(self, level: int, scale: float) -> float:
        row = self.rows[level]
        cap = self.setup.capacity[level]
        target = self._invocations_target(level, row, cap)
        counts = self.per_minute_counts() * scale
        low = 1 if level == EKS_LEVEL else (0 if self.setup.scale_to_zero else 1)
        start = (row["policy"].get("replica_start_s") or row["policy"].get("instance_start_s")
                 or default("sagemaker", "start_s"))
        policy = TargetTracking("invocations", target, min_instances=low, max_instances=10 ** 7, start_s=start)
        seconds = fluid_instance_seconds(counts, policy, self.span_s)
        if level == EKS_LEVEL:
            return seconds * self.eks_node_hourly() / 3600 + self.setup.eks_fixed_hourly * self.span_s / 3600
        hourly = self.setup.instance.hourly("sagemaker") * (1 - self.setup.discount_pct / 100)
        return seconds * hourly / 3600

    def _invocations_target(self, level: int, row: dict[str, Any], cap) -> float:
        policy = row["policy"]
        if policy.get("metric") in INVOCATIONS_METRICS:
            return float(policy["target"])
        # The highest invocations target that met the SLO in the search, else a cautious share.
        goal = self.setup.slo.attainment
        met = [r["policy"]["target"] for r in self._cache.values()
               if r["policy"].get("metric") in INVOCATIONS_METRICS and r["slo_attainment"] >= goal]
        return float(max(met)) if met else max(1.0, self.replica_request_rate(cap) * 0.55)

    def bedrock_cost_unthrottled(self) -> float:
        """Bedrock's bill for every request of the trace at scale 1, throttled ones included: what a
        quota raised to fit the traffic would bill, the fair side of a comparison at equal service."""
        p_in, p_out = self.setup.price.per_million(self.setup.tier)
        return (int(self.inputs.sum()) * p_in + int(self.outputs.sum()) * p_out) / 1e6

    def break_even_scales(self) -> dict[str, float | None]:
        bedrock_per_scale = self.bedrock_cost_unthrottled()
        out: dict[str, float | None] = {}
        for level in [lv for lv in self.levels if lv != 1]:
            diff = lambda k: self.fleet_cost_at_scale(level, k) - bedrock_per_scale * k  # noqa: E731
            out[str(level)] = find_crossing(diff)
        return out

    def cost_curves(self, scales: list[float]) -> dict[int, list[float]]:
        """Monthly cost of each rung at each scale (for the plot)."""
        factor = SECONDS_PER_MONTH / self.span_s
        curves = {1: [self.bedrock_cost_unthrottled() * k * factor for k in scales]} if 1 in self.rows else {}
        for level in [lv for lv in self.rows if lv != 1]:
            curves[level] = [self.fleet_cost_at_scale(level, k) * factor for k in scales]
        return curves

    def option_cost_curves(self, scales: list[float]) -> dict[str, list[float]]:
        """Monthly cost of rung 1's priced options at each scale (for the plot): batch is linear in
        the scale; Provisioned Throughput keeps the units per unit of traffic it met the SLO with,
        ceil(scale x units), kept up through the month."""
        curves: dict[str, list[float]] = {}
        for o in (self.rows.get(1) or {}).get("options", []):
            if o["option"] == "batch" and o["window_usd"] is not None:
                curves["batch"] = [o["window_usd"] * k * SECONDS_PER_MONTH / self.span_s for k in scales]
            elif o["option"] == "provisioned_throughput":
                pt, units = self.setup.bedrock_pt, o["model_units"]
                curves["provisioned_throughput"] = [pt.monthly_usd(math.ceil(k * units - 1e-9), HOURS_PER_MONTH)
                                                    for k in scales]
        return curves


def fluid_instance_seconds(counts_per_minute: np.ndarray, policy: TargetTracking, span_s: float) -> float:
    """Instance-seconds a target-tracking policy keeps when fed per-minute arrival counts (which
    may be fractional: a scaled trace's expected counts). Launches serve after ``start_s``; every
    instance bills from launch."""
    from cost.simulate.fleet import FleetState

    serving, starting = policy.initial, []            # starting: the times they will serve
    total = 0.0
    for minute, arrivals in enumerate(counts_per_minute.tolist()):
        now = (minute + 1) * 60.0
        total += (serving + len(starting)) * 60.0
        serving += sum(1 for t in starting if t <= now)
        starting = [t for t in starting if t > now]
        refused = arrivals if serving == 0 else 0
        desired = policy.evaluate(FleetState(now, serving, len(starting), arrivals, 60.0, 0, 0, refused))
        current = serving + len(starting)
        if desired > current:
            starting += [now + policy.start_s] * (desired - current)
        elif desired < current:
            cut = min(current - desired, len(starting))
            starting = starting[:len(starting) - cut]
            serving -= current - desired - cut
    return total * span_s / (60.0 * max(1, len(counts_per_minute)))


def find_crossing(diff: Callable[[float], float], low: float = 1 / 64, high: float = 4096.0) -> float | None:
    """The scale where ``diff`` (self-hosted − Bedrock) changes sign from + to −, on a log grid
    then by bisection; None when it does not cross in [low, high]."""
    grid = [low * 2 ** i for i in range(int(math.log2(high / low)) + 1)]
    values = [diff(k) for k in grid]
    for (k0, v0), (k1, v1) in zip(zip(grid, values), zip(grid[1:], values[1:])):
        if v0 > 0 >= v1:
            a, b = k0, k1
            for _ in range(30):
                m = math.sqrt(a * b)
                if diff(m) > 0:
                    a = m
                else:
                    b = m
            return round(math.sqrt(a * b), 4)
    return None
