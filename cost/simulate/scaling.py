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
- EKS with Ray Serve (rung 6, ``--engine rayservice``): Serve's request-based autoscaler on
  ongoing requests (queued + running) per replica, averaged over its look-back window, with its
  upscale and downscale delays and smoothing factors (``RayServe``); the same replica start.

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
from options.core.autoscaling import HPA_BEHAVIOUR, SAGEMAKER_METRIC_NAMES, HpaBehaviour

DATA = Path(__file__).resolve().parents[1] / "data"
SAGEMAKER_METRICS = ("invocations", "concurrency")


@lru_cache(maxsize=None)
def dated_defaults(kind: str) -> dict[str, Any]:
    """The newest dated file ``cost/data/KIND-*.json``: {section: {name: {"value", "source"}},
    "as_of": date, "path": where}."""
    newest = sorted(DATA.glob(f"{kind}-*.json"))[-1]
    doc = json.loads(newest.read_text())
    doc["path"] = str(newest)
    return doc


def scaling_defaults() -> dict[str, Any]:
    return dated_defaults("scaling")


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

    @property
    def scales(self) -> str:
        """What the policy scales: a variant's instances, or (down to 0) a component's copies."""
        return "copies" if self.min_instances == 0 else "instances"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "sagemaker_target_tracking", "scales": self.scales,
                "metric": SAGEMAKER_METRIC_NAMES[self.metric, self.scales], "target": self.target,
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


# Ray Serve's autoscaling_config keys the simulator models, in the order a config lists them.
RAY_SERVE_KEYS = ("min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s",
                  "downscale_delay_s", "downscale_to_zero_delay_s", "upscaling_factor", "downscaling_factor",
                  "look_back_period_s", "metrics_interval_s")


def parse_ray_autoscaling(pairs: list[str], elsewhere: dict[str, str]) -> dict[str, float]:
    """``--ray-autoscaling KEY=VALUE`` flags as ``{key: number}``, each key one of Ray Serve's
    autoscaling_config settings the simulator models; a key in ``elsewhere`` is refused naming
    the flag that gives it (``{"max_replicas": "--max-instances"}``). The values' ranges are
    RayServe's to check."""
    tunable = [k for k in RAY_SERVE_KEYS if k not in elsewhere]
    settings: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if key in elsewhere:
            raise BadInput(f"--ray-autoscaling {pair!r}: give {key} as {elsewhere[key]}")
        if not sep or key not in tunable:
            raise BadInput(f"--ray-autoscaling {pair!r} must be KEY=VALUE with KEY one of {', '.join(tunable)}, "
                           "e.g. --ray-autoscaling upscale_delay_s=10")
        try:
            settings[key] = float(value)
        except ValueError:
            raise BadInput(f"--ray-autoscaling {pair!r}: {value!r} is not a number of "
                           f"{'seconds' if key.endswith('_s') else 'times'}, e.g. {key}=10") from None
    return settings


def ray_default(name: str):
    return default("ray_serve", name)


@dataclass
class RayServe:
    """Ray Serve's request-based autoscaler (``replica_queue_length_autoscaling_policy``, Ray
    2.60), as KubeRay runs rung 6 with ``--engine rayservice``.

    Every replica records its ongoing requests (queued + running) every
    ``min(look_back_period_s x 0.2, metrics_interval_s)`` and pushes them every
    ``metrics_interval_s``; the controller averages the total over the last
    ``look_back_period_s`` of what has arrived. Its wish is ``total / target_ongoing_requests``
    replicas, smoothed by ``upscaling_factor``/``downscaling_factor`` (``ceil(running + factor x
    (wish - running))``, at least one fewer when a downscale would otherwise stall). A wish above
    the current target (running + starting) acts only after it has held for ``upscale_delay_s``,
    one below after ``downscale_delay_s`` (``downscale_to_zero_delay_s`` for 1 -> 0); the clock
    restarts whenever the wish changes direction or matches. Then ``min_replicas``/``max_replicas``
    bound it. With no replica running and requests waiting, one starts at once (the cold-start
    path). A new replica is a Ray worker pod on a new GPU node: node + image pull + model load.

    The simulator evaluates at each metrics record, not at the controller's 0.1 s loop: the
    controller's input changes only when metrics arrive, so a delay ends at the first record at
    or after it (the hand-worked tests choose delays that are multiples of the record interval).
    """
    target_ongoing_requests: float = field(default_factory=lambda: ray_default("target_ongoing_requests"))
    min_replicas: int = 1
    max_replicas: int = 10
    upscale_delay_s: float = field(default_factory=lambda: ray_default("upscale_delay_s"))
    downscale_delay_s: float = field(default_factory=lambda: ray_default("downscale_delay_s"))
    downscale_to_zero_delay_s: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    look_back_period_s: float = field(default_factory=lambda: ray_default("look_back_period_s"))
    metrics_interval_s: float = field(default_factory=lambda: ray_default("metrics_interval_s"))
    start_s: float = field(default_factory=lambda: default("eks", "node_start_s") + default("eks", "image_pull_s")
                           + default("eks", "model_load_s"))
    accepts_when_empty: bool = True     # Serve's handles hold requests until a replica runs

    def __post_init__(self) -> None:
        def bad(name: str, value, why: str) -> BadInput:
            return BadInput(f"Ray Serve autoscaling_config {name} {value!r} {why}")

        def number(name: str, value, low: float, strict: bool, optional: bool = False) -> None:
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or (value <= low if strict else value < low):
                raise bad(name, value, f"must be a number {'>' if strict else '>='} {low:g} "
                                       f"(Ray's AutoscalingConfig), e.g. {ray_default(name) or 1!r}")

        number("target_ongoing_requests", self.target_ongoing_requests, 0, strict=True)
        for name in ("upscale_delay_s", "downscale_delay_s"):
            number(name, getattr(self, name), 0, strict=False)
        number("downscale_to_zero_delay_s", self.downscale_to_zero_delay_s, 0, strict=False, optional=True)
        for name in ("upscaling_factor", "downscaling_factor"):
            number(name, getattr(self, name), 0, strict=True, optional=True)
        for name in ("look_back_period_s", "metrics_interval_s"):
            number(name, getattr(self, name), 0, strict=True)
        for name, low in (("min_replicas", 0), ("max_replicas", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, value, f"must be a whole number >= {low}")
        if self.min_replicas > self.max_replicas:
            raise BadInput(f"Ray Serve autoscaling_config min_replicas {self.min_replicas} > max_replicas "
                           f"{self.max_replicas}: need min_replicas <= max_replicas")
        self.period_s = min(self.look_back_period_s * ray_default("record_interval_factor"), self.metrics_interval_s)
        self._samples: deque[tuple[float, float]] = deque()     # (time recorded, ongoing requests in all)
        self._direction = 0                 # +1 wishing up, -1 wishing down, 0 neither
        self._since: float | None = None    # when the current wish began

    @property
    def initial(self) -> int:
        return self.min_replicas

    def ongoing(self, now: float) -> float:
        """The controller's view at ``now``: the mean of the records pushed by the last push
        (``metrics_interval_s`` apart) within ``look_back_period_s`` of it."""
        pushed = math.floor(now / self.metrics_interval_s + 1e-9) * self.metrics_interval_s
        seen = [v for t, v in self._samples if pushed - self.look_back_period_s + 1e-9 < t <= pushed + 1e-9]
        return sum(seen) / len(seen) if seen else 0.0

    def _bound(self, n: int) -> int:
        return min(self.max_replicas, max(self.min_replicas, n))

    def evaluate(self, state) -> int:
        now = state.now
        self._samples.append((now, float(state.outstanding)))
        while self._samples and self._samples[0][0] < now - self.look_back_period_s - self.metrics_interval_s:
            self._samples.popleft()
        running, target_now = state.in_service, state.in_service + state.starting
        total = self.ongoing(now)
        if running == 0:
            # Cold start: requests wait and nothing runs, so start replicas now, no delay.
            self._direction, self._since = 0, None
            if total > 0 or state.outstanding > 0:
                return self._bound(max(math.ceil(self.upscaling_factor or 1.0), target_now))
            return self._bound(target_now)
        wish = total / self.target_ongoing_requests
        up = wish > running
        factor = (self.upscaling_factor if up else self.downscaling_factor) or 1.0
        smoothed = math.ceil(running + factor * (wish - running) - 1e-9)
        if math.ceil(wish - 1e-9) < running and smoothed == running:
            smoothed -= 1                   # a downscale the factor would stall still takes one
        smoothed = max(0, smoothed)
        direction = (smoothed > target_now) - (smoothed < target_now)
        if direction == 0:
            self._direction, self._since = 0, None
            return self._bound(target_now)
        if direction != self._direction:
            self._direction, self._since = direction, now
        if direction > 0:
            delay = self.upscale_delay_s
        else:
            delay = (self.downscale_to_zero_delay_s if target_now == 1 and self.downscale_to_zero_delay_s is not None
                     else self.downscale_delay_s)
            if target_now > 1:
                smoothed = max(1, smoothed)
        if now - self._since + 1e-6 >= delay:
            self._direction, self._since = 0, None
            return self._bound(smoothed)
        return self._bound(target_now)

    def autoscaling_config(self) -> dict[str, Any]:
        """The setting as Ray Serve's ``autoscaling_config`` takes it (options left at Ray's
        defaults that Ray deprecates are left out)."""
        config: dict[str, Any] = {key: getattr(self, key) for key in RAY_SERVE_KEYS}
        for key in ("downscale_to_zero_delay_s", "upscaling_factor", "downscaling_factor"):
            if config[key] is None:
                del config[key]
        if config["metrics_interval_s"] == ray_default("metrics_interval_s"):
            del config["metrics_interval_s"]     # deprecated in Ray 2.60: set only when changed
        return config

    def to_json(self) -> dict[str, Any]:
        return {"kind": "ray_serve_ongoing_requests", "metric": "ongoing requests (queued + running) per replica",
                "target": self.target_ongoing_requests, "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas, "period_s": self.period_s, "replica_start_s": self.start_s,
                "autoscaling_config": self.autoscaling_config()}


def ray_serve_from_config(config: dict[str, Any], **extra) -> RayServe:
    """A RayServe policy from an ``autoscaling_config`` mapping; unknown keys refused by name."""
    if not isinstance(config, dict):
        raise BadInput(f"Ray Serve autoscaling_config {config!r} must be a mapping, e.g. "
                       "{target_ongoing_requests: 8, min_replicas: 1, max_replicas: 4}")
    unknown = sorted(set(config) - set(RAY_SERVE_KEYS))
    if unknown:
        raise BadInput(f"Ray Serve autoscaling_config key(s) {', '.join(unknown)} not modelled by the simulator: "
                       f"use {', '.join(RAY_SERVE_KEYS)}")
    return RayServe(**{**config, **extra})
