"""``python -m cost simulate``: its flags, its two modes and its table.

    python -m cost simulate --trace TRACE --model BEDROCK_ID --instance TYPE --bench BENCH.json [--rungs 1,3,6]
    python -m cost simulate --predict-replay REPLAY.json --bench BENCH.json

The first simulates every rung on the trace; the second re-predicts a replay that
``python -m options.bench --replay`` measured, on the capacity model of the same server, and
prints the prediction beside the measurement.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from options.core import BadInput

STATS = ("p50", "p90", "p99")


def add_arguments(s: argparse.ArgumentParser, add_pricing_args) -> None:
    """simulate's flags: the trace and how to simulate it (shared with ``cost recommend --trace``),
    the prices, one replica's capacity, and what only simulate does (--predict-replay, --plot)."""
    from cost.hardware.cli import add_spec_arguments

    add_trace_simulation_arguments(s, add_pricing=add_pricing_args)
    add_spec_arguments(s, model_flag="--hf-model", required=False, gpu_flags=False)
    s.add_argument("--predict-replay", metavar="REPLAY.json", nargs="+",
                   help="re-predict replays measured by python -m options.bench --replay on the server --bench "
                        "profiled (one or several: each is predicted and shown beside its measurement)")
    s.add_argument("--plot", metavar="FILE.png",
                   help="load and replicas over time per rung, and monthly cost against --scale with the "
                        "break-evens; with --predict-replay, predicted against measured TTFT and E2E CDFs")


def add_trace_simulation_arguments(s: argparse.ArgumentParser, add_pricing=None,
                                   eks_extended_support: bool = True) -> None:
    """The trace (--trace and how to read it), --rungs, the SLO, Bedrock's quota and the fleets'
    autoscaling flags, --seed and --no-progress: what ``simulate(args, ...)`` reads besides the
    prices and the capacity. With ``add_pricing`` (simulate's own parser) the pricing flags and a
    --capacity | --bench pair are added in between; ``cost recommend`` has its own of both, and of
    --eks-extended-support (``eks_extended_support=False`` leaves it to the caller)."""
    from cost.simulate.bedrock import PT_TERMS
    from cost.simulate.fleet import ROUTINGS
    from cost.simulate.rungs import RUNG6_AUTOSCALERS
    from cost.simulate.scaling import SAGEMAKER_METRICS
    from cost.simulate.timeouts import defaults_text as timeout_defaults_text
    from cost.traces import add_trace_arguments

    add_trace_arguments(s, flag="--trace")
    if add_pricing is not None:
        add_pricing(s)
        cap = s.add_mutually_exclusive_group()
        cap.add_argument("--capacity", type=float, metavar="TOK_S",
                         help="output tokens/s one replica sustains at saturation (a capacity model with stated defaults)")
        cap.add_argument("--bench", metavar="FILE",
                         help="a capacity bench of the server (python -m options.bench --profile capacity --json FILE)")
    s.add_argument("--rungs", default="1,2,3,4,5,6", metavar="LEVELS", help="levels to simulate (default all: 1,2,3,4,5,6)")
    slo = s.add_argument_group("service-level objective")
    slo.add_argument("--slo-ttft-ms", type=float, metavar="MS", help="time to first token each request must meet")
    slo.add_argument("--slo-e2e-ms", type=float, metavar="MS", help="end-to-end latency each request must meet")
    slo.add_argument("--slo-attainment", type=float, default=0.99, metavar="SHARE",
                     help="share of requests that must meet it for a rung to count as meeting the SLO (default 0.99)")
    bed = s.add_argument_group("Bedrock (rung 1)")
    bed.add_argument("--bedrock-tpm", type=float, metavar="N", help="on-demand tokens-per-minute quota (input + output)")
    bed.add_argument("--bedrock-rpm", type=float, metavar="N", help="requests-per-minute quota (default: none enforced)")
    bed.add_argument("--bedrock-ttft-ms", type=float, metavar="MS", help="Bedrock's time to first token (default: stated assumption)")
    bed.add_argument("--bedrock-output-tok-s", type=float, metavar="TOK_S", help="Bedrock's output tokens/s per request")
    bed.add_argument("--bedrock-batch", action="store_true",
                     help="also price rung 1 as batch inference (the model's batch price, 50 %% of on-demand; "
                          "answers within 24 h, so only with no --slo-ttft-ms and --slo-e2e-ms >= 86400000 or none)")
    bed.add_argument("--bedrock-pt-unit-tpm", type=float, metavar="N",
                     help="also simulate rung 1 on Provisioned Throughput: tokens per minute one model unit serves "
                          "(not published by AWS: from the console or your account team); needs "
                          "--bedrock-pt-unit-usd-hour")
    bed.add_argument("--bedrock-pt-unit-usd-hour", type=float, metavar="USD",
                     help="Provisioned Throughput: USD per model unit-hour for --bedrock-pt-term")
    bed.add_argument("--bedrock-pt-term", choices=PT_TERMS, default="none",
                     help="Provisioned Throughput commitment: none (hourly until deleted, the default), 1month, "
                          "6month (the term's every hour is billed)")
    bed.add_argument("--bedrock-pt-units", type=int, metavar="N",
                     help="Provisioned Throughput model units (default: the least that meets the SLO)")
    fl = s.add_argument_group("self-hosted fleets (rungs 2-6)")
    fl.add_argument("--routing", choices=ROUTINGS,
                    help="how requests pick a replica on every self-hosted rung (default: each platform's own: "
                         "random for SageMaker and the Service in front of rung 6's pods, power_of_two for "
                         "--rung6-autoscaler ray-serve, Ray Serve's router); affinity: the gateway's session "
                         "affinity with bounded loads, a request's session the first of its prompt blocks (a "
                         "trace with Mooncake hash_ids)")
    fl.add_argument("--min-instances", type=int, metavar="N", help="fleet floor (default 1)")
    fl.add_argument("--max-instances", type=int, metavar="N", help="fleet ceiling (default: twice the peak minute's need + 1)")
    fl.add_argument("--scale-to-zero", action="store_true",
                    help="SageMaker inference components with copy count 0: the first requests fail while a copy starts")
    fl.add_argument("--autoscale-metric", choices=SAGEMAKER_METRICS,
                    help="simulate SageMaker with this target-tracking metric and --autoscale-target instead of searching")
    fl.add_argument("--autoscale-target", type=float, metavar="X", help="the target value for --autoscale-metric")
    fl.add_argument("--target-waiting", type=float, metavar="X",
                    help="simulate EKS with this HPA/KEDA target of waiting requests per replica instead of searching")
    fl.add_argument("--instance-start-s", type=float, metavar="S",
                    help="SageMaker: launch to serving for a new instance (default: the dated table's)")
    fl.add_argument("--replica-start-s", type=float, metavar="S",
                    help="EKS: node launch + image pull + model load for a new replica (default: the dated table's)")
    fl.add_argument("--rung6-autoscaler", choices=RUNG6_AUTOSCALERS, default="hpa",
                    help="who scales rung 6: hpa (default; the Deployment's HPA/KEDA on waiting requests) or "
                         "ray-serve (--engine rayservice: Serve's autoscaler on ongoing requests per replica, "
                         "with its delays)")
    fl.add_argument("--target-ongoing", type=float, metavar="X",
                    help="with --rung6-autoscaler ray-serve: simulate this target_ongoing_requests instead of "
                         "searching")
    fl.add_argument("--ray-autoscaling", action="append", default=[], metavar="KEY=VALUE",
                    help="with --rung6-autoscaler ray-serve: one of Ray Serve's autoscaling_config settings "
                         "(upscale_delay_s, downscale_delay_s, downscale_to_zero_delay_s, upscaling_factor, "
                         "downscaling_factor, look_back_period_s, metrics_interval_s; default Ray 2.60's), "
                         "repeatable, e.g. --ray-autoscaling upscale_delay_s=10")
    fl.add_argument("--spot", action="store_true",
                    help="rung 6's GPU nodes on EC2 Spot: billed per second (60 s minimum) at --spot-discount off "
                         "on-demand, reclaimed at --spot-interruptions-per-hour after a 2-minute notice (drained, "
                         "replaced; requests still on the node then fail)")
    fl.add_argument("--spot-discount", type=float, metavar="FRACTION",
                    help="with --spot: 1 - spot price / on-demand price, e.g. 0.6 (no default: the price table has "
                         "on-demand prices only)")
    fl.add_argument("--spot-interruptions-per-hour", type=float, metavar="RATE",
                    help="with --spot: interruptions per node-hour (Poisson, seeded by --seed), e.g. 0.0003 for about "
                         "20 %% of nodes reclaimed a month (no default: AWS publishes only monthly buckets)")
    if eks_extended_support:
        fl.add_argument("--eks-extended-support", action="store_true",
                        help="price the EKS control plane on extended support")
    s.add_argument("--timeout-s", action="append", default=[], metavar="RUNG[.ttft|.e2e]=SECONDS",
                   help="a rung's front-door timeout, repeatable: RUNG bedrock (1), sagemaker (2-5) or eks (6); "
                        "ttft for a limit on the silence before the first token (an idle or read timeout: the "
                        "client streams), e2e on the whole answer; SECONDS or none. A request past it fails (not "
                        f"served, misses the SLO). Defaults: {timeout_defaults_text()}. e.g. --timeout-s "
                        "eks.e2e=600 --timeout-s bedrock.e2e=60")
    s.add_argument("--seed", type=int, default=0, help="seed of the router's and the retries' draws (default 0)")
    s.add_argument("--no-progress", action="store_true")


def rung6_autoscaling(args) -> tuple[str, dict[str, Any]]:
    """(who scales rung 6, the Ray Serve autoscaling_config settings given): the flags checked
    against each other, each setting by name."""
    from cost.simulate.scaling import parse_ray_autoscaling

    rung6 = getattr(args, "rung6_autoscaler", "hpa") or "hpa"
    target_ongoing = getattr(args, "target_ongoing", None)
    pairs = getattr(args, "ray_autoscaling", None) or []
    if rung6 != "ray-serve":
        given = [f for f, v in (("--target-ongoing", target_ongoing is not None), ("--ray-autoscaling", pairs)) if v]
        if given:
            raise BadInput(f"{' and '.join(given)} set Ray Serve's autoscaler: add --rung6-autoscaler ray-serve "
                           "(rung 6 as --engine rayservice), or drop them for the HPA")
        return rung6, {}
    if args.target_waiting is not None:
        raise BadInput(f"--target-waiting {args.target_waiting:g} is the HPA's target, and --rung6-autoscaler "
                       "ray-serve scales on ongoing requests: give --target-ongoing X instead")
    return rung6, parse_ray_autoscaling(pairs, {"min_replicas": "--min-instances (the simulator bounds it)",
                                                "max_replicas": "--max-instances (the simulator bounds it)",
                                                "target_ongoing_requests": "--target-ongoing (or leave it to "
                                                                           "the simulator's search)"})


ROUTING_WORDS = {"random": "at random", "least_outstanding": "to the replica with the fewest outstanding requests",
                 "power_of_two": "by Ray Serve's power of two choices",
                 "affinity": "by the gateway's session affinity under bounded loads (a request's session: the "
                             "first of its prompt blocks; without blocks, to the fewest outstanding)"}


def routing_text(args) -> str:
    """How the simulated fleets routed requests, in words (rungs.routing_for decides)."""
    from cost.simulate.rungs import EKS_LEVEL, routing_for

    if args.routing:
        return f"{ROUTING_WORDS[args.routing]} on every self-hosted rung"
    sagemaker, rung6 = (routing_for(level, None, args.rung6_autoscaler, args.scale_to_zero)
                        for level in (2, EKS_LEVEL))
    why_sagemaker = ("inference components: LEAST_OUTSTANDING_REQUESTS, as options.deploy sets it"
                     if args.scale_to_zero else "its default")
    why_rung6 = ("the fewer outstanding of two replicas drawn at random" if rung6 == "power_of_two"
                 else "the pods' Service")
    return f"{ROUTING_WORDS[sagemaker]} on SageMaker ({why_sagemaker}), {ROUTING_WORDS[rung6]} on rung 6 ({why_rung6})"


def bedrock_forms(args, levels: tuple[int, ...]):
    """(--bedrock-batch, the Provisioned Throughput asked for or None): the flags checked together."""
    from cost.simulate.bedrock import ProvisionedThroughput

    batch = bool(getattr(args, "bedrock_batch", False))
    unit_tpm, unit_usd = getattr(args, "bedrock_pt_unit_tpm", None), getattr(args, "bedrock_pt_unit_usd_hour", None)
    term, units = getattr(args, "bedrock_pt_term", "none"), getattr(args, "bedrock_pt_units", None)
    given = [flag for flag, on in (("--bedrock-batch", batch), ("--bedrock-pt-unit-tpm", unit_tpm is not None),
                                   ("--bedrock-pt-unit-usd-hour", unit_usd is not None),
                                   ("--bedrock-pt-term", term != "none"), ("--bedrock-pt-units", units is not None))
             if on]
    if given and 1 not in levels:
        raise BadInput(f"{', '.join(given)} price rung 1 in another form, and --rungs "
                       f"{','.join(map(str, levels))} leaves rung 1 out: add 1 to --rungs")
    pt_given = [f for f in given if f.startswith("--bedrock-pt")]
    if pt_given and (unit_tpm is None or unit_usd is None):
        missing = [f for f, v in (("--bedrock-pt-unit-tpm", unit_tpm), ("--bedrock-pt-unit-usd-hour", unit_usd))
                   if v is None]
        raise BadInput(f"{', '.join(pt_given)} without {' and '.join(missing)}: Provisioned Throughput's "
                       "tokens per minute and price per model unit are not published for every model, so the "
                       "simulator takes them from you (the Bedrock console or your account team)")
    pt = ProvisionedThroughput(unit_tpm, unit_usd, term, units) if pt_given else None
    return batch, pt


def spot_market(args, levels: tuple[int, ...]):
    """The SpotMarket --spot asks for (None without it): the three flags checked together."""
    from cost.simulate.spot import SpotMarket

    spot = bool(getattr(args, "spot", False))
    discount, rate = getattr(args, "spot_discount", None), getattr(args, "spot_interruptions_per_hour", None)
    if not spot:
        given = [f for f, v in (("--spot-discount", discount), ("--spot-interruptions-per-hour", rate)) if v is not None]
        if given:
            raise BadInput(f"{' and '.join(given)} describe spot nodes: add --spot, or leave them out for on-demand")
        return None
    if 6 not in levels:
        raise BadInput(f"--spot prices rung 6's nodes, and --rungs {','.join(map(str, levels))} leaves rung 6 out: "
                       "add 6 to --rungs")
    missing = [f for f, v in (("--spot-discount", discount), ("--spot-interruptions-per-hour", rate)) if v is None]
    if missing:
        raise BadInput(f"--spot needs {' and '.join(missing)}: the price table holds on-demand prices only and AWS "
                       "publishes no interruption rate, so the simulator takes them from you (e.g. --spot-discount "
                       "0.6 --spot-interruptions-per-hour 0.0003)")
    return SpotMarket(discount, rate)


def parse_levels(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and 1 <= int(p) <= 6 for p in parts):
        raise BadInput(f"--rungs {text!r}: give levels 1-6 separated by commas, e.g. 1,3,6")
    return tuple(sorted({int(p) for p in parts}))


def capacity_from_args(args, trace=None):
    """One replica's CapacityModel from --bench, --capacity, or --hf-model on the --instance's GPUs
    (at the ``trace``'s mean request sizes)."""
    from cost.simulate.capacity import CapacityModel, load_capacity

    benches = args.bench if isinstance(args.bench, list) else [args.bench] if args.bench else []
    spec_model = getattr(args, "spec_model", None)
    if spec_model:
        if benches or args.capacity is not None:
            raise BadInput(f"give --hf-model {spec_model} (capacity from specs) or --capacity/--bench (measured), "
                           "not both: each is the capacity of one replica")
        from cost.hardware.cli import capacity_from_spec_args

        sizes = ((float(trace.input_tokens.mean()), float(trace.output_tokens.mean())) if trace is not None
                 else (None, None))
        return capacity_from_spec_args(args, *sizes)[0]
    if len(benches) > 1:   # cost recommend's --bench is repeatable (one per level, for its tree)
        raise BadInput(f"--bench given {len(benches)} times ({', '.join(map(str, benches))}): a simulation "
                       "takes one capacity bench, for every self-hosted rung; give one")
    if benches and args.capacity is not None:
        raise BadInput(f"give --capacity {args.capacity:g} or --bench {benches[0]}, not both: each is the "
                       "capacity of one replica")
    hit_rate = getattr(args, "prefix_cache_hit_rate", None)
    if benches:
        return load_capacity(benches[0]).with_prefix_cache(hit_rate)
    if args.capacity is not None:
        if not args.capacity > 0:
            raise BadInput(f"--capacity {args.capacity!r} must be > 0 output tokens/s")
        return CapacityModel.from_throughput(args.capacity, f"--capacity {args.capacity:g}").with_prefix_cache(hit_rate)
    raise BadInput("give the capacity of one replica: --bench FILE (python -m options.bench --profile capacity "
                   "--json FILE), --capacity OUTPUT_TOK_S, or --hf-model M (from the model's config and the "
                   "instance's specs)")


def command(args, table_from, eks_fixed_hourly):
    """The handler ``python -m cost simulate`` dispatches to: (data, render). ``eks_fixed_hourly``
    (infra.eks.cluster's, handed down by the CLI) prices the cluster's control plane and system nodes."""
    if args.predict_replay:
        return predict_replay(args), render_prediction
    return simulate(args, table_from, eks_fixed_hourly), render_simulation


def simulate(args, table_from, eks_fixed_hourly) -> dict[str, Any]:
    from cost.breakeven import check_discount
    from cost.simulate.bedrock import BedrockSettings
    from cost.simulate.rungs import Setup, Simulation, Slo
    from cost.simulate.scaling import QueueDepth, RayServe, TargetTracking, scaling_defaults
    from cost.simulate.timeouts import describe as describe_timeouts
    from cost.simulate.timeouts import front_doors
    from cost.traces import trace_from_args

    if not args.trace:
        raise BadInput("give --trace FILE (a request trace: Azure CSV, Mooncake JSONL, the gateway's ledger or a "
                       "curve CSV) or --predict-replay REPLAY.json")
    if not args.model or not args.instance:
        raise BadInput("give --model (the Bedrock model to compare against) and --instance (the instance a "
                       "self-hosted replica runs on)")
    if args.mix:
        raise BadInput("--mix does not apply to simulate: the trace's own input and output sizes are its mix")
    levels = parse_levels(args.rungs)
    if (args.autoscale_metric is None) != (args.autoscale_target is None):
        raise BadInput("give --autoscale-metric and --autoscale-target together (e.g. --autoscale-metric "
                       "invocations --autoscale-target 70)")
    for name, value in (("--min-instances", args.min_instances), ("--max-instances", args.max_instances)):
        if value is not None and value < 0:
            raise BadInput(f"{name} {value} must be >= 0")
    table = table_from(args)
    price = table.bedrock(args.model)
    price.per_million(args.tier)
    instance = table.instance(args.instance)
    check_discount(args.discount)
    trace = trace_from_args(args)
    capacity = capacity_from_args(args, trace)
    bedrock = BedrockSettings()
    for flag, attr, scale in (("bedrock_tpm", "tpm", 1), ("bedrock_rpm", "rpm", 1),
                              ("bedrock_ttft_ms", "ttft_s", 1e-3), ("bedrock_output_tok_s", "output_tok_s", 1)):
        value = getattr(args, flag)
        if value is not None:
            if not value > 0:
                raise BadInput(f"--{flag.replace('_', '-')} {value!r} must be > 0")
            setattr(bedrock, attr, value * scale)
    low = 0 if args.scale_to_zero else (args.min_instances if args.min_instances is not None else 1)
    sagemaker_policy = None
    if args.autoscale_metric:
        extra = {} if args.instance_start_s is None else {"start_s": args.instance_start_s}
        sagemaker_policy = TargetTracking(args.autoscale_metric, args.autoscale_target, min_instances=low,
                                          max_instances=args.max_instances or max(low, 10), **extra)
    eks_policy = None
    if args.target_waiting is not None:
        extra = {} if args.replica_start_s is None else {"start_s": args.replica_start_s}
        eks_policy = QueueDepth(args.target_waiting, min_replicas=max(1, args.min_instances or 1),
                                max_replicas=args.max_instances or 10, **extra)
    rung6, ray_serve = rung6_autoscaling(args)
    bedrock_batch, bedrock_pt = bedrock_forms(args, levels)
    spot = spot_market(args, levels)
    doors = front_doors(getattr(args, "timeout_s", None) or [], rung6)
    if rung6 == "ray-serve":
        extra = {} if args.replica_start_s is None else {"start_s": args.replica_start_s}
        if args.target_ongoing is not None:
            eks_policy = RayServe(args.target_ongoing, min_replicas=max(1, args.min_instances or 1),
                                  max_replicas=args.max_instances or 10, **ray_serve, **extra)
        else:
            RayServe(min_replicas=1, max_replicas=1, **ray_serve)      # checks the given settings first
    eks_fee = "control_plane_extended_support" if args.eks_extended_support else "control_plane"
    setup = Setup(price=price, tier=args.tier, instance=instance, capacity={lv: capacity for lv in range(2, 7)},
                  slo=Slo(args.slo_ttft_ms, args.slo_e2e_ms, args.slo_attainment), bedrock=bedrock,
                  eks_fixed_hourly=eks_fixed_hourly(table, eks_fee)["hourly"], discount_pct=args.discount,
                  routing=args.routing, scale_to_zero=args.scale_to_zero, min_instances=args.min_instances,
                  max_instances=args.max_instances, sagemaker_policy=sagemaker_policy, eks_policy=eks_policy,
                  sagemaker_start_s=args.instance_start_s, eks_start_s=args.replica_start_s, seed=args.seed,
                  rung6_autoscaler=rung6, ray_serve=ray_serve, bedrock_batch=bedrock_batch, bedrock_pt=bedrock_pt,
                  spot=spot, timeouts=doors, block_tokens=args.block_tokens)
    with _progress(args) as say:
        sim = Simulation(trace, setup, levels, progress=say)
        data = sim.run()
        if args.plot:
            say("plotting")
            from cost.plot import plot_simulation
            data["plot"] = str(plot_simulation(args.plot, sim, data))
    defaults = scaling_defaults()
    data["capacity"] = capacity.to_json()
    data["assumptions"] = [
        f"Bedrock {price.model_id} ({args.tier}), prices as of {price.as_of}; {price.source}",
        f"{instance.name}: SageMaker ${instance.sagemaker_hourly}/h (rungs 2-5, billed per second of instance "
        f"life, starting ones included), EC2 ${instance.ec2_hourly}/h (rung 6, per second with a 60 s minimum, "
        f"plus the EKS control plane and system nodes), as of {instance.as_of}"
        + (f", less {args.discount:g} %" if args.discount else ""),
        f"capacity of one replica: {capacity.source}",
        f"autoscaling and quota defaults from {Path(defaults['path']).name} (as of {defaults['as_of']}), each with "
        "its source there",
        describe_timeouts(doors, levels),
        "each replica is a continuous-batching server (FCFS queue, admission bounded by max sequences, the "
        "step's token budget and the KV cache); requests are routed " + routing_text(args),
        "Bedrock's latency is a stated assumption (TTFT + input/prompt rate + output/decode rate), not a measurement",
        *(["Bedrock batch: the model's batch price on every request (not throttled: batch jobs are outside the "
           "on-demand quotas); each answer taken at arrival + the 24 h window, the worst case it allows"]
          if bedrock_batch else []),
        *([f"Bedrock Provisioned Throughput ({bedrock_pt.term} term): {bedrock_pt.unit_tpm:g} tokens/min and "
           f"${bedrock_pt.unit_usd_hour:g}/h per model unit as given; every started hour billed, kept up through the "
           "month; over capacity a request is throttled and retried by the SDK as over a quota; the same latency "
           "assumption as on-demand"] if bedrock_pt else []),
        ("rung 6 scaled by Ray Serve's autoscaler (--engine rayservice): ongoing requests per replica averaged "
         "over look_back_period_s, upscale/downscale delays, evaluated at each metrics record; a new replica is a "
         "Ray worker pod on a new GPU node (node + image pull + model load)" if rung6 == "ray-serve" else
         "rung 6 scaled by the HPA (KEDA) on vllm:num_requests_waiting with the behaviour rung 6 renders"),
        "break_even_scale prices other scales with the recommended invocations-per-instance target on the trace's "
        "per-minute counts x scale (cost/simulate/rungs.py says why)",
        *([f"rung 6 on EC2 Spot: ${spot.hourly(instance.ec2_hourly):.4g}/h a node ({spot.discount:.0%} off on-demand, "
           "--discount not applied: Savings Plans do not cover spot); interruptions a Poisson process at "
           f"{spot.interruptions_per_hour:g} per node-hour from each node's launch (seed {args.seed}); at the "
           f"{spot.notice_s:g} s notice the node is drained and replaced, then requests still on it fail; "
           "break_even_scale prices spot nodes without interruptions"] if spot else []),
        *trace.notes,
    ]
    return data


def _progress(args):
    """A context giving ``say(message)``: a rich status line on stderr unless --no-progress/--json."""
    import contextlib
    import sys

    @contextlib.contextmanager
    def quiet():
        yield lambda message: None

    if args.no_progress or args.json or not sys.stderr.isatty():
        return quiet()

    @contextlib.contextmanager
    def status():
        from rich.console import Console
        with Console(stderr=True).status("simulating") as line:
            yield lambda message: line.update(f"simulating: {message}")
    return status()


# --- predicting a replay ----------------------------------------------------------------------

def replay_trace(spec: dict[str, Any]):
    """The requests a replay sent, rebuilt from its recorded spec: the trace re-read, its times
    multiplied by the time scale, its sizes clipped as the replay clipped them."""
    import dataclasses

    from cost.traces import sent_sizes, spec_trace

    try:
        trace = spec_trace(spec["trace"])
        time_scale = float(spec.get("time_scale") or 1.0)
        max_input, max_output = spec.get("max_input"), spec.get("max_output")
        sizes = sent_sizes(trace, int(max_input) if max_input else None, int(max_output) if max_output else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"the replay's spec lacks what re-reading it needs ({exc}): record it with "
                       "python -m options.bench --replay ... --json FILE") from None
    return dataclasses.replace(trace, arrival_s=trace.arrival_s * time_scale, input_tokens=sizes.input_tokens,
                               output_tokens=sizes.output_tokens, span_s=trace.span_s * time_scale)


def read_replay(path: Path) -> dict[str, Any]:
    """A replay document's ``replay`` part; BadInput naming the file and what it lacks."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"--predict-replay {str(path)!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"--predict-replay {str(path)!r} is not a replay JSON: {exc}") from None
    replay = doc.get("replay") if isinstance(doc, dict) else None
    if not isinstance(replay, dict) or "spec" not in replay or "summary" not in replay:
        raise BadInput(f"--predict-replay {str(path)!r} has no replay.spec and replay.summary: write it with "
                       "python -m options.bench --replay TRACE ... --json FILE")
    return replay


SENSITIVITY = 0.05      # --predict-replay also predicts at capacity ±5 %


def predict_one(path: Path, replay: dict[str, Any], capacity, seed: int):
    """(the prediction beside the measurement, per-request predicted and measured milliseconds)."""
    import numpy as np

    from cost.simulate.fleet import SERVED, run_fleet
    from cost.simulate.prefix import prefix_of
    from cost.simulate.scaling import Fixed
    from cost.traces import DEFAULT_BLOCK_TOKENS

    trace = replay_trace(replay["spec"])
    # A replay of a trace with prompt blocks sent shared heads, which the server's prefix cache served.
    prefix = prefix_of(trace, int(replay["spec"].get("block_tokens") or DEFAULT_BLOCK_TOKENS))

    def latencies_ms(model):
        run = run_fleet(trace.arrival_s, trace.input_tokens, trace.output_tokens, model, Fixed(1),
                        span_s=trace.span_s, seed=seed, prefix=prefix)
        served = run.status == SERVED
        return (np.where(served, run.first_token_s - trace.arrival_s, np.nan) * 1000,
                np.where(served, run.finish_s - trace.arrival_s, np.nan) * 1000)

    ttft, e2e = latencies_ms(capacity)
    predicted = {"ttft_ms": _stats_ms(ttft / 1000), "e2e_ms": _stats_ms(e2e / 1000)}
    measured = {k: {s: replay["summary"].get(k, {}).get(s) for s in STATS} for k in ("ttft_ms", "e2e_ms")}
    # How much the prediction moves if the server is SENSITIVITY faster or slower than its model:
    # little far below capacity, a lot near it, where a few per cent decide whether a queue grows.
    band = {}
    for side, factor in (("slower", 1 - SENSITIVITY), ("faster", 1 + SENSITIVITY)):
        t, e = latencies_ms(capacity.with_step_speed(factor))
        band[side] = {"ttft_ms": _stats_ms(t / 1000), "e2e_ms": _stats_ms(e / 1000)}
    within = {k: {s: (None if measured[k][s] is None or band["slower"][k][s] is None else
                      min(band["faster"][k][s], band["slower"][k][s]) <= measured[k][s]
                      <= max(band["faster"][k][s], band["slower"][k][s])) for s in STATS} for k in predicted}
    ratio = _ratios(predicted, measured)
    ok = [r for r in replay.get("requests", []) if r.get("status") == "ok"]
    samples = {"predicted": {"ttft_ms": ttft[~np.isnan(ttft)], "e2e_ms": e2e[~np.isnan(e2e)]},
               "measured": {"ttft_ms": np.array([r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]),
                            "e2e_ms": np.array([r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None])}}
    doc = {"replay": str(path), "requests": len(trace), "load": replay["spec"].get("load"),
           "time_scale": replay["spec"].get("time_scale"),
           "predicted": predicted, "measured": measured, "ratio": ratio,
           "sensitivity": {"capacity_change": SENSITIVITY, "predicted_slower": band["slower"],
                           "predicted_faster": band["faster"], "measured_within": within},
           "at_replay_speed": None,
           "offered_output_tok_s": replay["summary"].get("offered_output_tok_s"),
           "measured_output_tok_s": replay["summary"].get("throughput_tok_s"),
           "saturated_output_tok_s": round(capacity.saturated_output_tok_s(float(trace.input_tokens.mean()),
                                                                          float(trace.output_tokens.mean())), 1)}
    # The same prediction with the model at the speed the replay's server actually decoded at: it
    # judges the queue and batching apart from how far the server's speed moved since its profile.
    speed = replay_speed(replay, capacity)
    if speed is not None:
        t, e = latencies_ms(capacity.with_step_speed(speed["factor"]))
        at_speed = {"ttft_ms": _stats_ms(t / 1000), "e2e_ms": _stats_ms(e / 1000)}
        doc["at_replay_speed"] = {**speed, "predicted": at_speed, "ratio": _ratios(at_speed, measured)}
    return doc, samples


def replay_speed(replay: dict[str, Any], capacity) -> dict[str, Any] | None:
    """How fast the replay's server decoded against the capacity model: the replay's answered
    requests grouped by the batch their decode met (``group_by_batch``, as the profile's steady
    points are), and per group the model's time per output token there over the measured one;
    ``factor`` is their mean weighted by requests (above 1: the server ran faster than its
    profile says). ``over_time``: the same, the requests cut in the order they were sent, which
    shows a spell (another process taking the CPU for a few seconds) that the batch groups mix
    with the rest. None where too few requests say a time per token."""
    from cost.simulate.capacity import group_by_batch

    ok = [r for r in replay.get("requests", []) if r.get("status") == "ok" and r.get("sent_s") is not None]
    columns = ([r["sent_s"] for r in ok], [None if r.get("ttft_ms") is None else r["ttft_ms"] / 1000 for r in ok],
               [None if r.get("e2e_ms") is None else r["e2e_ms"] / 1000 for r in ok],
               [r.get("input_tokens") for r in ok], [r.get("output_tokens") for r in ok])
    groups = group_by_batch(*columns)
    if not groups:
        return None

    def described(group: dict[str, Any]) -> dict[str, Any]:
        out = {"decoding_seqs": round(group["decoding_seqs"], 1), "requests": group["requests"],
               "tpot_ms": round(group["tpot_s"] * 1000, 3),
               "model_over_measured": capacity.steady_tpot_s(group) / group["tpot_s"]}
        if "sent_from_s" in group:
            out.update(sent_from_s=round(group["sent_from_s"], 2), sent_to_s=round(group["sent_to_s"], 2))
        return out

    by_batch = [described(g) for g in groups]
    factor = sum(g["model_over_measured"] * g["requests"] for g in by_batch) / sum(g["requests"] for g in by_batch)
    over_time = [described(g) for g in group_by_batch(*columns, by="sent")]
    for g in by_batch + over_time:
        g["model_over_measured"] = round(g["model_over_measured"], 3)
    return {"factor": round(factor, 3), "groups": by_batch, "over_time": over_time}


def _ratios(predicted: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """predicted / measured per metric and statistic (None where either is missing)."""
    return {k: {s: (round(predicted[k][s] / measured[k][s], 3) if measured[k][s] and predicted[k][s] is not None
                    else None) for s in STATS} for k in predicted}


def predict_replay(args) -> dict[str, Any]:
    """Each replay re-predicted on ``--bench`` (or ``--capacity``), or, without either, on the
    capacity file the replay was paced from (its spec's ``capacity_file``: ``--load F
    --capacity BENCH.json``), which is the profile measured right before it."""
    paths = [Path(p) for p in args.predict_replay]
    replays = [read_replay(p) for p in paths]            # every file checked before any simulation
    given = bool(args.bench) or args.capacity is not None
    capacities = ([capacity_from_args(args)] * len(paths) if given
                  else [replay_capacity(path, replay) for path, replay in zip(paths, replays)])
    docs, samples = [], []
    for path, replay, capacity in zip(paths, replays, capacities):
        doc, sample = predict_one(path, replay, capacity, args.seed)
        if not given:
            doc["capacity"] = capacity.to_json()
        docs.append(doc)
        samples.append((f"load {doc['load']:g}" if doc["load"] else path.stem, sample))
    data: dict[str, Any] = docs[0] if len(docs) == 1 else {"replays": docs}
    if given:
        data["capacity"] = capacities[0].to_json()
    if args.plot:
        from cost.plot import plot_prediction_cdfs
        source = capacities[0].source if given else "the capacity profile each replay was paced from"
        data["plot"] = str(plot_prediction_cdfs(args.plot, samples, source))
    return data


def replay_capacity(path: Path, replay: dict[str, Any]):
    """The capacity model of the bench a replay names as its ``capacity_file``."""
    from cost.simulate.capacity import load_capacity

    named = replay["spec"].get("capacity_file")
    if not named:
        raise BadInput(f"--predict-replay {str(path)!r} was not paced from a capacity file (no --load/"
                       "--capacity when it ran): give --bench FILE, the capacity bench of the server it ran on")
    return load_capacity(named)


def _stats_ms(values_s) -> dict[str, float | None]:
    import numpy as np
    v = values_s[~np.isnan(values_s)]
    return {s: (round(float(np.percentile(v, int(s[1:]))) * 1000, 2) if len(v) else None) for s in STATS}


# --- tables -------------------------------------------------------------------------------------

def _ms(x) -> str:
    if x is not None and x >= 3_600_000:
        return f"{x / 3_600_000:,.3g} h"         # batch's 24 h window: hours read better than 86,400,000
    return "—" if x is None else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _policy_brief(row: dict[str, Any]) -> str:
    """The simulated setting in a few words: what a user would type into the console."""
    p = row["policy"]
    if row["level"] == 1:
        return f"TPM {p['tpm']:,.0f}" if p.get("tpm") else "no quota"
    if p["kind"] == "sagemaker_target_tracking":
        per = "copy" if p.get("scales") == "copies" else "instance"
        metric = f"invocations/{per}/min" if "Invocations" in p["metric"] else f"concurrency/{per}"
        return f"{metric} {p['target']:g}, {p['min_instances']}-{p['max_instances']}"
    spot = ", spot" if p.get("spot") else ""
    if p["kind"] == "hpa_keda_queue_depth":
        return f"waiting/replica {p['target']:g}, {p['min_replicas']}-{p['max_replicas']}{spot}"
    if p["kind"] == "ray_serve_ongoing_requests":
        return f"Ray Serve ongoing/replica {p['target']:g}, {p['min_replicas']}-{p['max_replicas']}{spot}"
    return p["kind"]


OPTION_NAMES = {"on_demand": "on-demand", "batch": "batch", "provisioned_throughput": "Provisioned Throughput"}
OPTION_LABELS = {"batch": "1 batch", "provisioned_throughput": "1 PT"}      # the table's narrow rung column


def _option_brief(o: dict[str, Any]) -> str:
    p = o["policy"]
    if o["option"] == "provisioned_throughput":
        return f"{p['model_units']} unit(s), {p['capacity_tpm']:,.0f} TPM, {p['term']}"
    return f"{p['window_s'] / 3600:g} h window"


def render_simulation(data: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    from cost.render import SHORT_NAMES, _assumptions, console

    t = data["trace"]
    slo = data["slo"]
    bounds = ", ".join(f"{k.replace('_ms', '').upper()} <= {v:g} ms" for k, v in slo.items() if k.endswith("_ms") and v)
    table = Table(title=f"{t['requests']:,} requests over {t['span_s']:,.0f} s · SLO: {bounds or 'served'} for "
                        f"{slo['attainment']:.0%} of requests", box=box.SIMPLE_HEAD)
    for col in ("rung", "window $", "month $", "failed", "SLO met", "TTFT p50/p99 ms", "E2E p50/p99 ms",
                "replicas", "cold", "idle", "autoscaling"):
        table.add_column(col, justify="left" if col in ("rung", "autoscaling") else "right", no_wrap=True)
    for r in data["rungs"]:
        reps = r["replicas"]
        mark = "[green]✓[/green]" if r["meets_slo"] else "[red]✗[/red]"
        failed = f"{r['failed']:,}" + (f" ({r['throttled']:,} thr.)" if r["throttled"] else "")
        if r["failures"].get("timed_out"):
            failed += f" ({r['failures']['timed_out']:,} t/o)"
        table.add_row(f"{r['level']} {SHORT_NAMES[r['level']]}", f"{r['window_usd']:,.2f}", f"{r['monthly_usd']:,.0f}",
                      failed, f"{mark} {r['slo_attainment']:.1%}",
                      f"{_ms(r['ttft_ms']['p50'])} / {_ms(r['ttft_ms']['p99'])}",
                      f"{_ms(r['e2e_ms']['p50'])} / {_ms(r['e2e_ms']['p99'])}",
                      "—" if reps is None else f"{reps['min']}/{reps['mean']:.1f}/{reps['max']}",
                      str(r["cold_starts"]), "—" if r["idle_share"] is None else f"{r['idle_share']:.0%}",
                      _policy_brief(r))
        for o in r.get("options", []):
            if o["window_usd"] is None:
                continue
            failed = f"{o['failed']:,}" + (f" ({o['throttled']:,} thr.)" if o["throttled"] else "")
            mark = "[green]✓[/green]" if o["meets_slo"] else "[red]✗[/red]"
            table.add_row(f"  {OPTION_LABELS[o['option']]}", f"{o['window_usd']:,.2f}", f"{o['monthly_usd']:,.0f}",
                          failed, f"{mark} {o['slo_attainment']:.1%}",
                          f"{_ms(o['ttft_ms']['p50'])} / {_ms(o['ttft_ms']['p99'])}",
                          f"{_ms(o['e2e_ms']['p50'])} / {_ms(o['e2e_ms']['p99'])}", "—", "0", "—", _option_brief(o))
    # Eleven columns need more than the 120 columns a pipe gets by default.
    from rich.console import Console
    (console if console.is_terminal else Console(width=170)).print(table)
    cheapest = data["cheapest_meeting_slo"]
    form = data.get("cheapest_bedrock_form")
    console.print(f"Cheapest meeting the SLO: {'rung ' + str(cheapest) if cheapest else 'none'}"
                  + (f" as {OPTION_NAMES[form]}" if form else "")
                  + " (replicas: min/time-weighted mean/max; cold: instances launched)", highlight=False)
    for line in closest_lines(data):
        console.print(line, highlight=False)
    for r in data["rungs"]:
        for o in r.get("options", []):
            if "excluded" in o:
                console.print(f"  rung 1 {OPTION_NAMES[o['option']]} left out: {o['excluded']}", highlight=False)
            if o.get("commitment_usd") is not None:
                console.print(f"  rung 1 Provisioned Throughput: the {o['policy']['term']} commitment bills "
                              f"${o['commitment_usd']:,.0f} whatever the traffic", highlight=False)
    hits = [(r["level"], r["prefix_cache"]) for r in data["rungs"] if (r.get("prefix_cache") or {}).get("hit_rate")
            is not None]
    if hits:
        console.print("prefix cache (the trace's prompt blocks, each replica its own): "
                      + ", ".join(f"rung {level} {h['hit_rate']:.1%}" for level, h in hits)
                      + " of prompt tokens served from it", highlight=False)
    for r in data["rungs"]:
        if r.get("spot_interruptions"):
            s, market = r["spot_interruptions"], r["policy"]["spot"]
            console.print(f"  rung 6 on spot ({market['discount']:.0%} off, {market['interruptions_per_node_hour']:g} "
                          f"interruptions/node-hour): {s['notices']} notice(s), {s['replacements']} replacement(s), "
                          f"{s['requests_failed']:,} request(s) failed at reclaim", highlight=False)
    if data.get("rung6_autoscaler") == "ray-serve":
        console.print("rung 6 scaled by Ray Serve's autoscaler (--engine rayservice); its autoscaling_config: "
                      + json.dumps(data.get("ray_serve_autoscaling_config")), highlight=False)
    elif data.get("rung6_autoscaler"):
        console.print("rung 6 scaled by the HPA/KEDA on vllm:num_requests_waiting (--rung6-autoscaler ray-serve "
                      "simulates Ray Serve's autoscaler)", highlight=False)
    for level, k in (data.get("break_even_scale") or {}).items():
        console.print(f"  rung {level} vs Bedrock: break-even at --scale {k:g}" if k is not None else
                      f"  rung {level} vs Bedrock: no break-even between 1/64 and 4096 x the trace", highlight=False)
    console.print(data["extrapolation"], highlight=False)
    if data.get("plot"):
        console.print(f"plot: {data['plot']}", highlight=False)
    _assumptions(data.get("assumptions", []))


def closest_lines(data: dict[str, Any]) -> list[str]:
    """Where no rung meets the SLO: each rung's closest candidate, and whether its fleet's
    ceiling held it back."""
    rows = {r["level"]: r for r in data["rungs"]}
    lines = []
    for c in data.get("closest_to_slo") or []:
        levels = c["levels"]
        said = _policy_brief(rows[levels[0]])
        if levels[0] != 1:
            said += (f": reached {c['replicas_reached']} = its ceiling, so a higher --max-instances may meet it"
                     if c["at_ceiling"] else f": reached {c['replicas_reached']}, below its ceiling, so more "
                     "instances alone would not")
        failed = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in c["failures"].items())
        name = (f"rung {levels[0]}" if len(levels) == 1 else f"rungs {levels[0]}-{levels[-1]}"
                if levels == list(range(levels[0], levels[-1] + 1)) else f"rungs {','.join(map(str, levels))}")
        lines.append(f"  closest, {name}: {c['slo_attainment']:.1%} of requests within the SLO with {said}"
                     + (f" (failed: {failed})" if failed else ""))
    return lines


def render_prediction(data: dict[str, Any]) -> None:
    from rich.table import Table

    from cost.render import console

    for doc in data.get("replays", [data]):
        load = f", offered {doc['load']:g} of capacity" if doc.get("load") else ""
        table = Table(title=f"Predicted vs measured: {doc['replay']} ({doc['requests']:,} requests{load})")
        band = doc.get("sensitivity")
        cols = ("metric", "stat", "predicted ms", "measured ms", "ratio")
        if band:
            cols += (f"capacity ±{band['capacity_change']:.0%}", "measured in it")
        speed = doc.get("at_replay_speed")
        if speed:
            cols += (f"at the replay's speed (x{speed['factor']:.2f}) ms", "its ratio")
        for col in cols:
            table.add_column(col, justify="right" if col not in ("metric", "stat") else "left")
        for metric in ("ttft_ms", "e2e_ms"):
            for s in STATS:
                r = doc["ratio"][metric][s]
                row = [metric.replace("_ms", "").upper(), s, _ms(doc["predicted"][metric][s]),
                       _ms(doc["measured"][metric][s]), "—" if r is None else f"{r:.2f}"]
                if band:
                    fast, slow = band["predicted_faster"][metric][s], band["predicted_slower"][metric][s]
                    inside = band["measured_within"][metric][s]
                    row += [f"{_ms(fast)} – {_ms(slow)}", "—" if inside is None else "yes" if inside else "no"]
                if speed:
                    r = speed["ratio"][metric][s]
                    row += [_ms(speed["predicted"][metric][s]), "—" if r is None else f"{r:.2f}"]
                table.add_row(*row)
        console.print(table)
        if speed:
            console.print(f"  the replay's requests decoded x{speed['factor']:.2f} as fast as the model says at the "
                          "batches they met: the last columns predict with the model at that speed, which judges "
                          "the queue and batching apart from the server's speed moving since its profile",
                          highlight=False)
    if data.get("plot"):
        console.print(f"plot: {data['plot']}", highlight=False)
