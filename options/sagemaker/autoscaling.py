"""A SageMaker endpoint's autoscaling, from the ``--autoscale-*`` and ``--scale-to-zero`` flags:
what target tracking holds (``Autoscaling``), the metrics and defaults it reads, and the checks
that name a flag which does not describe one. Pure; ``options.sagemaker.plan`` turns an
``Autoscaling`` into Application Auto Scaling and CloudWatch requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from options.core import BadInput
from options.core.autoscaling import SAGEMAKER_METRIC_NAMES
from options.sagemaker import is_cloud_run

# Application Auto Scaling's predefined metrics (options.core.autoscaling), by the name
# --autoscale-metric takes: for a variant's instances, and with --scale-to-zero the inference
# component's copies.
AUTOSCALE_METRICS = {m: name for (m, scales), name in SAGEMAKER_METRIC_NAMES.items() if scales == "instances"}
COMPONENT_METRICS = {m: name for (m, scales), name in SAGEMAKER_METRIC_NAMES.items() if scales == "copies"}
AUTOSCALE_UNITS = {"invocations": "invocations per instance per minute",
                   "concurrency": "concurrent requests per model copy"}
COMPONENT_UNITS = {"invocations": "invocations per copy per minute",
                   "concurrency": "concurrent requests per copy"}
# Waking from zero copies (AWS: "Scale an endpoint to zero instances"): a request that finds no
# copy fails and counts in NoCapacityInvocationFailures; an alarm on it (this period, one
# datapoint; python -m cost simulate assumes the same minute) runs a step-scaling policy that
# adds one copy; target tracking takes over from there.
NO_CAPACITY_METRIC = "NoCapacityInvocationFailures"
NO_CAPACITY_ALARM_PERIOD_S = 60
WAKE_COOLDOWN_S = 60
DEFAULT_INVOCATIONS_TARGET = 100.0
# Both cooldowns at Application Auto Scaling's own default for SageMaker variants, as
# ``python -m cost simulate`` assumes: what it recommends is what runs.
AUTOSCALE_COOLDOWN_S = 300


@dataclass
class Autoscaling:
    min_capacity: int
    max_capacity: int
    target_value: float
    metric: str = "invocations"        # a key of AUTOSCALE_METRICS
    scale_in_cooldown_s: int = AUTOSCALE_COOLDOWN_S
    scale_out_cooldown_s: int = AUTOSCALE_COOLDOWN_S
    # The endpoint's inference component scales its copies, down to 0 (levels 3-5).
    scale_to_zero: bool = False

    @property
    def predefined_metric(self) -> str:
        return (COMPONENT_METRICS if self.scale_to_zero else AUTOSCALE_METRICS)[self.metric]

    @property
    def units(self) -> str:
        return (COMPONENT_UNITS if self.scale_to_zero else AUTOSCALE_UNITS)[self.metric]


def add_autoscaling_arguments(group) -> None:
    """Target tracking on the endpoint's variant (Application Auto Scaling), levels 2-5."""
    group.add_argument("--autoscale-min", type=int, metavar="N",
                       help="autoscaling: fewest instances (default: --instance-count), e.g. --autoscale-min 1")
    group.add_argument("--autoscale-max", type=int, metavar="N",
                       help="autoscaling: most instances; setting it turns autoscaling on, e.g. --autoscale-max 4")
    group.add_argument("--autoscale-metric", choices=tuple(AUTOSCALE_METRICS),
                       help="autoscaling: what target tracking holds: invocations (per instance per minute, "
                            "the default) or concurrency (requests in flight per model copy, every 10 s), "
                            "e.g. --autoscale-metric concurrency")
    group.add_argument("--autoscale-target", type=float, metavar="X",
                       help=f"autoscaling: the metric's target value (invocations: default "
                            f"{DEFAULT_INVOCATIONS_TARGET:g}; concurrency: no default), e.g. --autoscale-target 60")
    group.add_argument("--scale-to-zero", action="store_true",
                       help="levels 3-5: serve the model as an inference component whose copies scale "
                            "between 0 and --autoscale-max (the instances follow), woken from 0 by a "
                            f"{NO_CAPACITY_METRIC} alarm; the first requests after an idle spell fail "
                            "while a copy starts, e.g. --scale-to-zero --autoscale-max 2")


def autoscaling_from_args(args) -> Autoscaling | None:
    """The --autoscale-* flags as an Autoscaling (None when none is given); BadInput naming the
    value when they do not describe one, or when nothing would be autoscaled (--target local)."""
    to_zero = bool(getattr(args, "scale_to_zero", False))
    given = [flag for flag, value in (("--autoscale-min", args.autoscale_min), ("--autoscale-max", args.autoscale_max),
                                      ("--autoscale-metric", args.autoscale_metric),
                                      ("--autoscale-target", args.autoscale_target),
                                      ("--scale-to-zero", True if to_zero else None)) if value is not None]
    if not given:
        return None
    if not is_cloud_run(args):
        raise BadInput(f"{' '.join(given)}: nothing is autoscaled on --target local (one server on this "
                       f"machine); autoscaling is registered with Application Auto Scaling for a SageMaker "
                       f"endpoint: add --target aws (or --target emulator, or --plan to see its requests)")
    if args.autoscale_max is None:
        rest = [f for f in given if f != "--autoscale-max"]
        raise BadInput(f"{' and '.join(rest)} need{'s' if len(rest) == 1 else ''} --autoscale-max (autoscaling "
                       f"turns on with a maximum), e.g. --autoscale-min 1 --autoscale-max 4")
    if to_zero:
        return _scale_to_zero(args)
    low = args.autoscale_min if args.autoscale_min is not None else args.instance_count
    where = f"--autoscale-min {low}" if args.autoscale_min is not None else \
        f"--instance-count {low} (the default --autoscale-min)"
    if low < 1:
        raise BadInput(f"{where} must be at least 1: a SageMaker variant keeps one instance or more "
                       f"(e.g. --autoscale-min 1 --autoscale-max 4); to scale to 0, add --scale-to-zero "
                       f"(levels 3-5: an inference component whose copies scale)")
    if args.autoscale_max < low:
        raise BadInput(f"--autoscale-max {args.autoscale_max} is below {where}: need "
                       f"1 <= --autoscale-min <= --autoscale-max, e.g. --autoscale-min 1 --autoscale-max 4")
    metric, target = _metric_and_target(args, AUTOSCALE_UNITS)
    return Autoscaling(low, args.autoscale_max, target, metric)


def _scale_to_zero(args) -> Autoscaling:
    """--scale-to-zero: the component's copies between 0 and --autoscale-max."""
    if args.autoscale_min not in (None, 0):
        raise BadInput(f"--autoscale-min {args.autoscale_min} with --scale-to-zero: the copies scale down to 0; "
                       f"drop --autoscale-min, or drop --scale-to-zero to keep {args.autoscale_min} instance(s)")
    if args.autoscale_max < 1:
        raise BadInput(f"--autoscale-max {args.autoscale_max} with --scale-to-zero: at least 1 copy must be "
                       f"possible, e.g. --scale-to-zero --autoscale-max 2")
    metric, target = _metric_and_target(args, COMPONENT_UNITS)
    return Autoscaling(0, args.autoscale_max, target, metric, scale_to_zero=True)


def _metric_and_target(args, units: dict[str, str]) -> tuple[str, float]:
    metric = args.autoscale_metric or "invocations"
    target = args.autoscale_target
    if target is None:
        if metric != "invocations":
            raise BadInput(f"--autoscale-metric {metric} needs --autoscale-target X: the "
                           f"{units[metric]} to hold, e.g. --autoscale-target 4")
        target = DEFAULT_INVOCATIONS_TARGET
    if not (target > 0 and math.isfinite(target)):
        raise BadInput(f"--autoscale-target {target:g} must be above 0 {units[metric]}, "
                       f"e.g. --autoscale-target {DEFAULT_INVOCATIONS_TARGET if metric == 'invocations' else 4:g}")
    return metric, float(target)
