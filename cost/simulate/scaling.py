"""Who decides the replica count: each rung's autoscaler, as its documentation describes it.

- SageMaker real-time (rungs 2-5): Application Auto Scaling target tracking on
  ``InvocationsPerInstance`` (one datapoint a minute) or ``ConcurrentRequestsPerModel`` (every
  10 s). A scale-out alarm after 3 datapoints above the target asks for
  ``ceil(serving × metric / target)``; a scale-in alarm after 15 one-minute datapoints below
  90 % of it; cooldowns after each. With inference components at copy count 0 a request that
  finds no copy fails (NoCapacityInvocationFailures), and a one-minute alarm on those failures
  starts the first copy.
- EKS (rung 6): the HPA on vLLM's ``num_requests_waiting`` per pod (served by prometheus-adapter,
  as rung 6 renders it), every sync period, ``ceil(current × metric / target)`` outside a 10 %
  tolerance, with the rendered ``behavior``: pods added at most N a period, scale-down to the
  highest recommendation of its stabilisation window, M pods a period. A new replica is a new
  GPU node (Karpenter) + image pull + model load.

Each policy has ``initial``, ``period_s``, ``start_s``, ``accepts_when_empty``, ``evaluate`` (see
``fleet.run_fleet``) and ``to_json`` (the setting it was simulated with, as a user would set it).
The defaults, dated and sourced, are in ``cost/data/scaling-*.json``.
"""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from options.core import BadInput
from options.core.autoscaling import HPA_BEHAVIOUR, HpaBehaviour

DATA = Path(__file__).resolve().parents[1] / "data"
SAGEMAKER_METRICS = ("invocations", "concurrency")


@lru_cache(maxsize=1)
def scaling_defaults() -> dict[str, Any]:
    """The newest dated defaults file: {section: {name: {"value", "source"}}, "as_of": date}."""
    newest = sorted(DATA.glob("scaling-*.json"))[-1]
    doc = json.loads(newest.read_text())
    doc["path"] = str(newest)
    return doc


def default(section: str, name: str):
    return scaling_defaults()[section][name]["value"]


@dataclass
class Fixed:
    """A fixed count: what ``cost compare`` assumes, and a baseline for the others."""
    count: int
    start_s: float = 0.0
    period_s: float = 3600.0
    accepts_when_empty: bool = True

    @property
    def initial(self) -> int:
        return self.count

    def evaluate(self, state) -> int:
        return self.count

    def to_json(self) -> dict[str, Any]:
        return {"kind": "fixed", "instances": self.count}


@dataclass
class TargetTracking:
    """SageMaker target tracking on one of its two predefined metrics (optionally from zero copies)."""
    metric: str                      # "invocations" (per instance per minute) | "concurrency" (per model)
    target: float
    min_instances: int = 1
    max_instances: int = 10
    start_s: float = field(default_factory=lambda: default("sagemaker", "start_s"))
    scale_out_cooldown_s: float = field(default_factory=lambda: default("sagemaker", "cooldown_s"))
    scale_in_cooldown_s: float = field(default_factory=lambda: default("sagemaker", "cooldown_s"))
    out_datapoints: int = field(default_factory=lambda: default("sagemaker", "scale_out_datapoints"))
    in_datapoints: int = field(default_factory=lambda: default("sagemaker", "scale_in_datapoints"))
    in_threshold: float = field(default_factory=lambda: default("sagemaker", "scale_in_threshold"))
    initial_instances: int | None = None

    def __post_init__(self) -> None:
        if self.metric not in SAGEMAKER_METRICS:
            raise BadInput(f"SageMaker scaling metric {self.metric!r}: use one of {', '.join(SAGEMAKER_METRICS)}")
        if not self.target > 0:
            raise BadInput(f"target {self.target!r} must be > 0")
        if not 0 <= self.min_instances <= self.max_instances:
            raise BadInput(f"min instances {self.min_instances} and max {self.max_instances}: need 0 <= min <= max")
        self.period_s = (default("sagemaker", "standard_period_s") if self.metric == "invocations"
                         else default("sagemaker", "high_resolution_period_s"))
        # Scale-in counts one-minute datapoints whatever the metric's period (AWS: high-resolution
        # metrics scale in at the standard pace).
        self._in_needed = math.ceil(self.in_datapoints * default("sagemaker", "standard_period_s") / self.period_s)
        self._recent: deque[float] = deque(maxlen=max(self.out_datapoints, self._in_needed))
        self._last_out = self._last_in = -math.inf
        self._zero_refusals_at: float | None = None

    @property
    def initial(self) -> int:
        return self.initial_instances if self.initial_instances is not None else max(1, self.min_instances)

    @property
    def accepts_when_empty(self) -> bool:
        # Inference components at zero copies fail requests; a variant with instances never is empty.
        return self.min_instances > 0

    def metric_value(self, state) -> float:
        if state.in_service == 0:
            return 0.0
        if self.metric == "invocations":       # per instance, per minute
            return state.arrivals * (60.0 / state.period_s) / state.in_service
        return state.outstanding / state.in_service

    def evaluate(self, state) -> int:
        current = state.in_service + state.starting
        if current == 0:
            return self._wake_from_zero(state)
        value = self.metric_value(state)
        self._recent.append(value)
        recent = list(self._recent)
        if len(recent) >= self.out_datapoints and all(v > self.target for v in recent[-self.out_datapoints:]):
            # Capacity still starting counts as added (Application Auto Scaling's scale-out
            # cooldown): only a larger need launches more.
            desired = min(self.max_instances, math.ceil(state.in_service * value / self.target - 1e-9))
            if desired > current:
                self._last_out = state.now
                return desired
            return current
        if (len(recent) >= self._in_needed
                and all(v < self.in_threshold * self.target for v in recent[-self._in_needed:])
                and state.now - self._last_in >= self.scale_in_cooldown_s
                and state.now - self._last_out >= self.scale_out_cooldown_s and state.starting == 0):
            desired = max(self.min_instances, math.ceil(state.in_service * value / self.target - 1e-9))
            if desired < current:
                self._last_in = state.now
                self._recent.clear()
                return desired
        return current

    def _wake_from_zero(self, state) -> int:
        """No copy runs: the one-minute NoCapacityInvocationFailures alarm starts the first one."""
        if not state.no_capacity and self._zero_refusals_at is None:
            return 0
        if self._zero_refusals_at is None:
            self._zero_refusals_at = state.now - state.period_s      # the period that saw the failures
        if state.now - self._zero_refusals_at + 1e-9 < default("sagemaker", "no_capacity_alarm_s"):
            return 0
        self._zero_refusals_at = None
        self._recent.clear()
        self._last_out = state.now
        return max(1, self.min_instances)

    def to_json(self) -> dict[str, Any]:
        metric = ("SageMakerVariantInvocationsPerInstance" if self.metric == "invocations"
                  else "SageMakerVariantConcurrentRequestsPerModelHighResolution")
        return {"kind": "sagemaker_target_tracking", "metric": metric, "target": self.target,
                "min_instances": self.min_instances, "max_instances": self.max_instances,
                "scale_out_cooldown_s": self.scale_out_cooldown_s, "scale_in_cooldown_s": self.scale_in_cooldown_s,
                "instance_start_s": self.start_s, "period_s": self.period_s}


@dataclass
class QueueDepth:
    """Kubernetes HPA on the average ``vllm:num_requests_waiting`` per replica, with the behaviour
    rung 6 renders (``options.core.autoscaling.HPA_BEHAVIOUR``): scale-up at most N pods a period,
    scale-down to the highest recommendation of the stabilisation window, at most M pods a period."""
    target_waiting: float
    min_replicas: int = 1
    max_replicas: int = 10
    start_s: float = field(default_factory=lambda: default("eks", "node_start_s") + default("eks", "image_pull_s")
                           + default("eks", "model_load_s"))
    period_s: float = field(default_factory=lambda: default("eks", "hpa_period_s"))
    tolerance: float = field(default_factory=lambda: default("eks", "hpa_tolerance"))
    behaviour: HpaBehaviour = HPA_BEHAVIOUR
    accepts_when_empty: bool = True

    def __post_init__(self) -> None:
        if not self.target_waiting > 0:
            raise BadInput(f"--target-waiting {self.target_waiting!r} must be > 0 requests waiting per replica")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise BadInput(f"min replicas {self.min_replicas} and max {self.max_replicas}: need 1 <= min <= max")
        self._history: deque[tuple[float, int]] = deque()
        self._changes: deque[tuple[float, int]] = deque()     # (time, pods added or removed)

    @property
    def initial(self) -> int:
        return self.min_replicas

    def _changed_within(self, now: float, period_s: float, sign: int) -> int:
        return sum(abs(d) for t, d in self._changes if now - t < period_s and d * sign > 0)

    def evaluate(self, state) -> int:
        b = self.behaviour
        current = state.in_service + state.starting
        if state.in_service == 0:
            return max(current, self.min_replicas)
        ratio = (state.waiting / state.in_service) / self.target_waiting
        # The HPA scales on the pods that are ready; starting pods count as they are.
        proposal = current if abs(ratio - 1) <= self.tolerance else math.ceil(state.in_service * ratio - 1e-9)
        proposal = min(self.max_replicas, max(self.min_replicas, proposal))
        self._history.append((state.now, proposal))
        while self._history and self._history[0][0] < state.now - b.scale_down_stabilization_s:
            self._history.popleft()
        if proposal > current:
            room = b.scale_up_pods - self._changed_within(state.now, b.scale_up_period_s, +1)
            desired = current + max(0, min(proposal - current, room))
        else:
            stabilized = max(p for _, p in self._history)
            room = b.scale_down_pods - self._changed_within(state.now, b.scale_down_period_s, -1)
            desired = current - max(0, min(current - stabilized, room))
        if desired != current:
            self._changes.append((state.now, desired - current))
        return desired

    def to_json(self) -> dict[str, Any]:
        b = self.behaviour
        return {"kind": "hpa_keda_queue_depth", "metric": "vllm:num_requests_waiting", "target": self.target_waiting,
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas, "period_s": self.period_s,
                "scale_up": f"{b.scale_up_pods} pods / {b.scale_up_period_s} s",
                "scale_down_stabilization_s": b.scale_down_stabilization_s,
                "scale_down": f"{b.scale_down_pods} pods / {b.scale_down_period_s} s", "replica_start_s": self.start_s}
