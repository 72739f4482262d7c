"""python -m cost {prices,breakeven,compare,capacity,predict,simulate,recommend,agent,bill,consolidate}: which rung
is cheapest for your traffic (from a profile, or from a real trace through every rung's autoscaling and batching),
one replica's capacity from a model's config and a GPU's specs before any deployment, what each gateway tenant
owes, and what serving many models on one endpoint saves.

Exit codes: 0 ok, 1 failure (e.g. the Price List API unreachable), 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from options.core import BadInput, exit_code


def main(argv: list[str] | None = None, prog: str = "python -m cost") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        data, render = args.handler(args)
    except BaseException as exc:  # noqa: BLE001 - exit_code re-raises what is not ours
        return exit_code(exc, lambda line: print(line, file=sys.stderr))
    try:
        if args.json:
            print(json.dumps(data, indent=2, ensure_ascii=False))
        else:
            render(data)
    except BrokenPipeError:  # `| head` closed the pipe: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# --- argument parsing -------------------------------------------------------------------------

def build_parser(prog: str = "python -m cost") -> argparse.ArgumentParser:
    from cost.hardware.cli import add_capacity_command, add_predict_command, add_spec_arguments

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for machines instead of tables")
    common.add_argument("--prices", metavar="FILE",
                        help="price table to use (default: the newest cost/data/prices-YYYY-MM-DD.json)")
    parser = argparse.ArgumentParser(
        prog=prog, description="Dated prices, break-evens, per-rung monthly cost, capacity from specs and a "
                                "recommendation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{prices,breakeven,compare,capacity,predict,simulate,recommend,agent,bill,consolidate}")

    p = sub.add_parser("prices", parents=[common], help="list, filter or refresh the price table")
    p.add_argument("--kind", choices=("all", "bedrock", "instance", "eks"), default="all")
    p.add_argument("--filter", metavar="TEXT", help="keep rows whose name, model id or GPU contains TEXT")
    p.add_argument("--gpu", metavar="TYPE", help="keep instances with this GPU (A10G, L4, L40S, A100, H100, ...)")
    p.add_argument("--min-gpu-memory", type=float, metavar="GB", help="keep instances with at least this much GPU memory in total")
    p.add_argument("--refresh", action="store_true", help="rebuild the table from the AWS Price List API")
    p.add_argument("--region", default="us-east-1", help="region to price with --refresh (default us-east-1)")
    p.add_argument("--out", metavar="FILE", help="where --refresh writes (default cost/data/prices-<today>.json)")
    p.set_defaults(handler=cmd_prices)

    b = sub.add_parser("breakeven", parents=[common], help="parity throughput of one replica against per-token prices",
                       description="Raw form: --instance-price USD/h --token-price USD/1M. Full form: --model ID "
                                   "--instance TYPE [--platform] [--mix] [--utilization] [--discount] "
                                   "[--capacity TOK_S | --bench FILE].")
    b.add_argument("--instance-price", type=float, metavar="USD_PER_HOUR", help="hourly price of one replica (raw form)")
    b.add_argument("--token-price", type=float, metavar="USD_PER_1M", help="one per-token price for every token (raw form)")
    add_pricing_args(b)
    b.add_argument("--platform", choices=("sagemaker", "ec2"), default="sagemaker",
                   help="which hourly price of the instance (default sagemaker)")
    b.add_argument("--utilization", type=float, default=1.0, metavar="U",
                   help="share of each hour the replica serves at its capacity, in (0, 1] (default 1)")
    add_capacity_args(b, repeat=False)
    add_spec_arguments(b, model_flag="--hf-model", required=False, gpu_flags=False)
    b.set_defaults(handler=cmd_breakeven)

    c = sub.add_parser("compare", parents=[common], help="one traffic profile priced on every rung")
    add_pricing_args(c)
    add_traffic_args(c)
    add_capacity_args(c, repeat=True)
    add_spec_arguments(c, model_flag="--hf-model", required=False, gpu_flags=False)
    c.add_argument("--plot", metavar="FILE.png", help="draw monthly cost against monthly tokens for every rung")
    c.set_defaults(handler=cmd_compare)

    add_capacity_command(sub, common)
    add_predict_command(sub, common)

    sm = sub.add_parser("simulate", parents=[common], help="a request trace through every rung's autoscaling, batching, "
                                                           "throttling and bill; or a replay re-predicted",
                        description="Replays a trace (arrival times and sizes) through Bedrock's quotas, SageMaker's "
                                    "target tracking and EKS's HPA/KEDA, each replica a continuous-batching server, "
                                    "and prices what each rung ran.")
    from cost.simulate.cli import add_arguments as add_simulate_arguments
    add_simulate_arguments(sm, add_pricing_args)
    sm.set_defaults(handler=cmd_simulate)

    r = sub.add_parser("recommend", parents=[common], help="which rung, why, and what would flip it",
                       description="From the decision tree and a traffic profile (--avg/--peak), or from a "
                                   "request trace (--trace) simulated through every rung's autoscaling: the "
                                   "rung, its instance and autoscaling policy, and the deploy command.")
    from cost.recommend import REQUIREMENTS
    tree = r.add_argument_group("the decision tree (each flag is a requirement that pushes the rung up)")
    for dest, level, why in REQUIREMENTS:
        tree.add_argument("--" + dest.replace("_", "-"), dest=dest, action="store_true", help=f"{why} (rung >= {level})")
    add_pricing_args(r)
    add_traffic_args(r)
    add_capacity_args(r, repeat=True)
    r.add_argument("--min-savings", type=float, default=30.0, metavar="PCT",
                   help="climb past the tree's rung, one rung at a time, only if each step saves at least PCT %% "
                        "a month (default 30: more than SageMaker's usual premium over EC2)")
    # With --trace: simulate's own flags (the trace, the SLO, Bedrock's quota, the fleets).
    from cost.simulate.cli import add_trace_simulation_arguments
    add_trace_simulation_arguments(r, eks_extended_support=False)
    add_spec_arguments(r, model_flag="--hf-model", required=False, gpu_flags=False)
    hunt = r.add_argument_group("the deployment search (with --trace and --hf-model, without --instance)")
    hunt.add_argument("--instances", metavar="LIST", help="instance families or types to search, e.g. g5,g6e,p5 "
                                                          "(default: every priced GPU instance)")
    hunt.add_argument("--dtypes", metavar="LIST", help="weight formats to search, e.g. bf16,fp8 (default: auto, "
                                                       "the checkpoint's own)")
    hunt.add_argument("--search-plot", metavar="FILE.png", help="draw each searched candidate's monthly cost "
                                                                "against its SLO attainment")
    r.set_defaults(handler=cmd_recommend, plot=None)

    a = sub.add_parser("agent", parents=[common], help="dollars per agent task on every rung, and the volume that flips it",
                       description="One agent task priced on every rung, from its trace (python -m options.agent "
                                   "--trace) or an agent bench (python -m options.bench --profile agent --json).")
    from cost.agent import DEFAULT_TASKS_PER_MONTH
    source = a.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE", help="an agent trace: one task's calls and tokens")
    source.add_argument("--bench", metavar="FILE", help="an agent bench: tokens per task, tasks/s, program p99")
    add_pricing_args(a)
    a.add_argument("--slo-p99", type=float, metavar="MS", help="the program's p99 latency target, in ms")
    a.add_argument("--tasks-per-month", type=float, default=DEFAULT_TASKS_PER_MONTH, metavar="N",
                   help=f"monthly tasks to price (default {DEFAULT_TASKS_PER_MONTH:,})")
    a.add_argument("--capacity", type=float, metavar="TOK_S",
                   help="output tokens/s one replica sustains (with --trace; a bench carries its own)")
    a.add_argument("--hours-per-day", type=float, default=24.0, metavar="H", help="active hours a day (default 24)")
    a.add_argument("--min-replicas", type=int, default=1, metavar="N", help="replicas kept running (default 1)")
    add_spec_arguments(a, model_flag="--hf-model", required=False, gpu_flags=False)
    a.set_defaults(handler=cmd_agent)

    bl = sub.add_parser("bill", parents=[common], help="each gateway tenant's bill for a month, from the metered ledger",
                        description="Per-token upstreams at their token prices; self-hosted upstreams by the "
                                    "tenant's share of the tokens its fleet served (the fleet runs all month).")
    bl.add_argument("--month", required=True, metavar="YYYY-MM", help="the calendar month (UTC) to bill")
    bl.add_argument("--config", metavar="GATEWAY_YAML",
                    help="the gateway's config: upstream kinds, Bedrock model ids, budgets, and (without --usage) "
                         "the ledger itself, from its store (Redis, or the memory store's usage.jsonl)")
    bl.add_argument("--usage", metavar="FILE", help="ledger records: JSON lines, or `containers/gateway/admin usage "
                                                    "--json` output (read instead of the store)")
    from cost.bill import FLEET_SYNTAX, PER_TOKEN_SYNTAX
    bl.add_argument("--fleet", action="append", default=[], metavar="UPSTREAM=INSTANCE[:COUNT]",
                    help=f"the instances behind a self-hosted upstream (repeatable): {FLEET_SYNTAX}; ml. names bill "
                         f"SageMaker hours, others EC2 hours")
    bl.add_argument("--per-token", action="append", default=[], metavar="UPSTREAM=MODEL_ID",
                    help=f"a per-token upstream when no config says so (repeatable): {PER_TOKEN_SYNTAX}")
    bl.add_argument("--plot", metavar="FILE.png", help="draw each tenant's dollars by upstream against its budget")
    bl.set_defaults(handler=cmd_bill)

    co = sub.add_parser("consolidate", parents=[common], help="N models: dedicated endpoints, adapters on one base, "
                                                              "or inference components on shared instances")
    co.add_argument("--models", type=int, required=True, metavar="N", help="how many models to serve")
    co.add_argument("--traffic-per-model", type=float, required=True, metavar="TOK_S",
                    help="average input+output tokens/s of each model while active")
    co.add_argument("--peak-per-model", type=float, metavar="TOK_S", help="peak tokens/s of each model (default: the average)")
    co.add_argument("--instance", required=True, metavar="TYPE",
                    help="the instance one model replica runs on (what its capacity was measured on)")
    co.add_argument("--shared-instance", metavar="TYPE",
                    help="instance type the inference components share (default: the cheapest one with the same "
                         "accelerator at N models)")
    co.add_argument("--adapters", action="store_true",
                    help="the models are LoRA adapters of one base: price one endpoint serving them all")
    over = co.add_mutually_exclusive_group()
    over.add_argument("--adapter-bench", metavar="FILE",
                      help="the measured adapter overhead: the JSON of `python -m options.bench --adapters a1,...,a8 "
                           "--json FILE` (its adapters.throughput_ratio)")
    over.add_argument("--adapter-ratio", type=float, metavar="R",
                      help="output tok/s with adapters mixed / the base alone, given by hand (default 1: no overhead)")
    co.add_argument("--mix", metavar="IN:OUT", help="input:output tokens (default chat 3:1)")
    co.add_argument("--hours-per-day", type=float, default=24.0, metavar="H", help="active hours a day (default 24)")
    co.add_argument("--min-replicas", type=int, default=1, metavar="N",
                    help="replicas (copies) each model keeps at all times (default 1)")
    co.add_argument("--min-copies", type=int, metavar="N",
                    help="copies each model's inference component keeps when idle; 0 scales it to zero "
                         "(default: --min-replicas)")
    co.add_argument("--discount", type=float, default=0.0, metavar="PCT", help="discount on hourly prices, in [0, 100) %%")
    add_capacity_args(co, repeat=False)
    co.add_argument("--plot", metavar="FILE.png", help="draw monthly cost against the number of models")
    co.set_defaults(handler=cmd_consolidate)
    return parser


def add_pricing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="ID", help="Bedrock model id (e.g. qwen.qwen3-32b-v1:0; us./eu./global. profiles accepted)")
    p.add_argument("--instance", metavar="TYPE", help="instance type, ml.g6e.xlarge or g6e.xlarge")
    p.add_argument("--mix", metavar="IN:OUT", help="input:output tokens, e.g. 3:1, or summarization, rag, chat, balanced, generation (default chat 3:1)")
    p.add_argument("--discount", type=float, default=0.0, metavar="PCT",
                   help="discount on the hourly price (savings plan, reserved), in [0, 100) %%")
    p.add_argument("--tier", choices=("on_demand", "batch", "flex", "priority"), default="on_demand",
                   help="Bedrock service tier (default on_demand)")


def add_traffic_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("traffic (input + output tokens)")
    g.add_argument("--avg", type=float, metavar="TOK_S", help="average tokens/s while active")
    g.add_argument("--peak", type=float, metavar="TOK_S", help="peak tokens/s (default: the average)")
    g.add_argument("--tokens-per-month", type=float, metavar="N", help="monthly tokens instead of --avg")
    g.add_argument("--hours-per-day", type=float, default=24.0, metavar="H", help="active hours a day, in (0, 24] (default 24)")
    g.add_argument("--min-replicas", type=int, default=1, metavar="N", help="replicas kept running at all times (default 1)")
    g.add_argument("--eks-extended-support", action="store_true", help="price the EKS control plane on extended support")


def add_capacity_args(p: argparse.ArgumentParser, repeat: bool) -> None:
    g = p.add_mutually_exclusive_group() if not repeat else p
    g.add_argument("--capacity", type=float, metavar="TOK_S",
                   help="output tokens/s one replica sustains at your latency target")
    g.add_argument("--bench", metavar="FILE", action="append" if repeat else "store",
                   help="bench JSON from `python -m options.bench --json FILE`: its measured output tok/s is the capacity"
                        + (" (repeatable: each applies to the level it measured)" if repeat else ""))


# --- subcommands --------------------------------------------------------------------------------

def table_from(args) -> "Any":
    from cost.prices import load_prices
    return load_prices(args.prices)


def cmd_prices(args):
    from cost import render
    from cost.prices import UnknownName, as_dict

    table = table_from(args)
    if args.refresh:
        return refresh_table(args, table)
    rows = {"bedrock": table.bedrock_models(), "instances": table.instances(), "eks": table.eks_fees()}
    keep = {"all": ("bedrock", "instances", "eks"), "bedrock": ("bedrock",), "instance": ("instances",),
            "eks": ("eks",)}[args.kind]
    rows = {k: v for k, v in rows.items() if k in keep}
    if args.filter:
        needle = args.filter.lower()
        rows = {k: [r for r in v if needle in " ".join(str(getattr(r, a, "")) for a in
                                                       ("model_id", "name", "gpu_type")).lower()]
                for k, v in rows.items()}
    if args.gpu:
        gpus = sorted({i.gpu_type for i in table.instances()})
        if args.gpu.lower() not in (g.lower() for g in gpus):
            raise BadInput(f"no instance has GPU {args.gpu!r}: known GPU types: {', '.join(gpus)}")
        rows = {k: [r for r in v if getattr(r, "gpu_type", "").lower() == args.gpu.lower()] for k, v in rows.items()
                if k == "instances"}
    if args.min_gpu_memory is not None:
        rows = {k: [r for r in v if r.total_gpu_memory_gb >= args.min_gpu_memory] for k, v in rows.items()
                if k == "instances"}
    if not any(rows.values()):
        if args.filter:
            known = [r.model_id for r in table.bedrock_models()] + [i.name for i in table.instances()]
            raise UnknownName("name", args.filter, known)
        largest = max(table.instances(), key=lambda i: i.total_gpu_memory_gb)
        raise BadInput(f"no instance{' with GPU ' + args.gpu if args.gpu else ''} has {args.min_gpu_memory:g} GB of "
                       f"GPU memory or more: the largest is {largest.name} with {largest.total_gpu_memory_gb:g} GB")
    data = {"as_of": table.as_of, "region": table.region, "path": str(table.path),
            **{k: [as_dict(r) for r in v] for k, v in rows.items()}}
    return data, render.prices


def refresh_table(args, table):
    import boto3

    from cost import refresh, render
    client = boto3.client("pricing", region_name=refresh.PRICING_ENDPOINT_REGION)
    progress = None if args.json else (lambda message: print(f"  reading {message} ...", file=sys.stderr))
    doc, report = refresh.refresh(client, table, region=args.region, progress=progress)
    refresh.write(doc, report, args.out)
    return {"refresh": report.to_json()}, render.refresh


def resolve_capacity(args, mix=None):
    """(default Capacity or None, {level: Capacity}) from --capacity and --bench, or else from
    --hf-model and the instance's specs (at the traffic's ``mix``)."""
    from cost.bench import load_bench
    from cost.breakeven import check_capacity
    from cost.fleet import SELF_HOSTED_LEVELS
    from cost.hardware.cli import throughput_from_spec_args

    measured = args.capacity is not None or bool(args.bench)
    if measured and getattr(args, "spec_model", None):
        raise BadInput(f"give --hf-model {args.spec_model} (capacity from specs) or --capacity/--bench (measured), "
                       "not both: each is the capacity of one replica")
    if getattr(args, "prefix_cache_hit_rate", None) and not getattr(args, "spec_model", None):
        raise BadInput(f"--prefix-cache-hit-rate {args.prefix_cache_hit_rate:g} changes a capacity model built from "
                       "specs (--hf-model M with --instance); here the capacity is "
                       + ("a measured throughput (--capacity/--bench), a figure that already holds whatever reuse "
                          "its traffic had" if measured else "not given")
                       + ": drop the flag, or give --hf-model (`python -m cost simulate` also applies it to a "
                         "bench's capacity model)")
    if not measured and getattr(args, "spec_model", None):
        if not args.instance:
            raise BadInput(f"--hf-model {args.spec_model} needs --instance: the capacity comes from its GPUs")
        return throughput_from_spec_args(args, mix), {}
    default = check_capacity(args.capacity) if args.capacity is not None else None
    by_level = {}
    benches = args.bench if isinstance(args.bench, list) else ([args.bench] if args.bench else [])
    for path in benches:
        cap = load_bench(path)
        level = cap.measured_at.get("level")
        if level is not None and level not in SELF_HOSTED_LEVELS:
            raise BadInput(f"{cap.origin} measured level {level!r}: only a bench of a self-hosted rung (level 2-6) "
                           f"gives an instance's capacity (Bedrock's throughput is not one)")
        key = level if level is not None else "unlevelled"  # recorded without --level: applies to every rung
        if key in by_level:
            raise BadInput(f"two bench files for {'level ' + str(level) if level else 'no level'}: "
                           f"give one per level (record it with `python -m options.bench --level N`)")
        by_level[key] = cap
        if default is None:
            default = cap
    by_level.pop("unlevelled", None)
    return default, by_level


def capacity_notes(cap, mix) -> list[str]:
    notes = [f"capacity: {cap.describe()}"]
    m = cap.measured_at
    if m:
        if m.get("target") in ("local", "emulator"):
            notes.append(f"the bench ran on target {m.get('target')!r}, not on the priced instance: "
                         f"rerun it against the real endpoint before trusting the answer")
        if mix is None:
            notes.append("raw form: the measured output tok/s is compared as is with the break-even tokens/s")
        else:
            notes.append("measured output tok/s is converted to input+output tok/s at the traffic's mix, "
                         "assuming decoding limits the replica")
            measured = m.get("measured_mix")
            if measured:
                ratio = float(measured.split(":")[0]) / (mix.input / mix.output)
                if ratio > 2 or ratio < 0.5:
                    notes.append(f"the bench ran at {measured} input:output but the traffic is {mix.label}: "
                                 f"capacity may differ at the real mix")
    return notes


def cmd_breakeven(args):
    from cost import render
    from cost.breakeven import (BreakEven, apply_discount, blended_price, check_price, check_utilization,
                                parse_mix)

    u = check_utilization(args.utilization)
    assumptions: list[str] = []
    inputs: dict[str, Any] = {}
    if args.model and args.token_price is not None:
        raise BadInput("give either --model (a Bedrock model's prices) or --token-price, not both")
    if args.instance and args.instance_price is not None:
        raise BadInput("give either --instance (its listed hourly price) or --instance-price, not both")
    if not (args.model or args.token_price is not None) or not (args.instance or args.instance_price is not None):
        raise BadInput("breakeven needs a per-token price and an hourly price: raw form --instance-price USD_PER_HOUR "
                       "--token-price USD_PER_1M, or full form --model ID --instance TYPE")
    table = table_from(args) if (args.model or args.instance) else None
    mix = None
    if args.model:
        mix = parse_mix(args.mix)
        price = table.bedrock(args.model)
        p_in, p_out = price.per_million(args.tier)
        blended = blended_price(p_in, p_out, mix)
        inputs.update(model_id=price.model_id, tier=args.tier, input_per_million=p_in, output_per_million=p_out)
        assumptions.append(f"Bedrock {price.model_id} ({args.tier}): ${p_in:g} input / ${p_out:g} output per 1M tokens "
                           f"(as of {price.as_of}; {price.source})")
        assumptions.append(f"mix {mix.label} input:output tokens -> blended ${blended:.6g} per 1M tokens")
    else:
        if args.mix:
            raise BadInput("--mix needs --model: a single --token-price has no input/output split")
        blended = check_price("token price", args.token_price, 1000.0)
        inputs["token_price_per_million"] = blended
        assumptions.append(f"${blended:g} per 1M tokens applies to every token (the raw form prices input tokens only)")
    if args.instance:
        inst = table.instance(args.instance)
        listed = inst.hourly(args.platform)
        name = inst.sagemaker_name if args.platform == "sagemaker" else inst.name
        inputs.update(instance_type=name, platform=args.platform, listed_hourly=listed)
        assumptions.append(f"{name} on {args.platform}: ${listed:g}/h on-demand (as of {inst.as_of}; {inst.source})")
    else:
        listed = check_price("instance price", args.instance_price, 1000.0)
        inputs["instance_price_per_hour"] = listed
        assumptions.append(f"${listed:g} per hour for the replica")
    hourly = apply_discount(listed, args.discount)
    if args.discount:
        assumptions.append(f"discount {args.discount:g} % -> ${hourly:.6g}/h")
    inputs.update(utilization=u, discount_pct=args.discount)
    assumptions.append(f"utilisation {u:.0%}: the share of each hour the replica serves at full throughput")
    assumptions.append("one replica on one instance, no autoscaling floor; storage, data transfer, load balancers "
                       "and engineering time are not counted")
    default, _ = resolve_capacity(args, mix)
    if default is not None:
        assumptions += capacity_notes(default, mix)
    result = BreakEven(hourly, blended, u, mix, default, assumptions, inputs)
    return result.to_json(), render.breakeven


def fleet_inputs(args, need_capacity: bool = True):
    """(table, price, traffic, fleets, assumptions) for compare and recommend."""
    from cost.breakeven import check_discount, parse_mix
    from cost.fleet import build_fleets, make_traffic
    from infra.eks.cluster import fixed_hourly as eks_fixed_hourly

    if not args.model or not args.instance:
        raise BadInput("give --model (the Bedrock model to compare against) and --instance (the instance a "
                       "self-hosted replica runs on)")
    table = table_from(args)
    price = table.bedrock(args.model)
    price.per_million(args.tier)
    inst = table.instance(args.instance)
    check_discount(args.discount)
    mix = parse_mix(args.mix)
    traffic, notes = make_traffic(mix, args.avg, args.peak, args.tokens_per_month, args.hours_per_day)
    default, by_level = resolve_capacity(args, mix)
    if default is None:
        raise BadInput("give the capacity of one replica: --capacity OUTPUT_TOK_S, --bench FILE "
                       "(from `python -m options.bench --json FILE`) or --hf-model M (from the model's config "
                       "and the instance's specs)")
    eks_fee = "control_plane_extended_support" if args.eks_extended_support else "control_plane"
    eks = eks_fixed_hourly(table, eks_fee)
    fleets = build_fleets(table, inst, by_level, default, args.min_replicas, args.discount,
                          eks_fixed_hourly=eks["hourly"])
    assumptions = [
        f"Bedrock {price.model_id} ({args.tier}), prices as of {price.as_of}; {price.source}",
        f"traffic: {traffic.avg_tokens_per_second:,.1f} tok/s average, {traffic.peak_tokens_per_second:,.1f} peak, "
        f"{traffic.hours_per_day:g} h/day -> {traffic.tokens_per_month:,.0f} tokens/month at mix {mix.label}",
        *notes,
        f"{inst.name}: SageMaker {_hourly(inst.sagemaker_hourly)} (rungs 2-5), EC2 {_hourly(inst.ec2_hourly)} "
        f"(rung 6), as of {inst.as_of}" + (f", less {args.discount:g} %" if args.discount else ""),
        f"one replica = one instance; replicas = max({args.min_replicas}, ceil(peak / capacity)) while active, "
        f"{args.min_replicas} the rest of the day",
        f"rung 6 adds the EKS control plane (${eks['control_plane_hourly']:g}/h) and the cluster's system node group "
        f"({eks['system_nodes']}, ${eks['system_nodes_hourly']:g}/h) whatever the traffic; load balancers, storage, "
        f"data transfer and engineering time are not counted on any rung",
        "rungs 2-5 bill the same SageMaker instance-hours; they differ in what you build and run, and in "
        "capacity only where a bench per level says so",
    ]
    for level in sorted(by_level):
        assumptions += [f"rung {level} " + n for n in capacity_notes(by_level[level], mix)]
    if not by_level:
        assumptions += capacity_notes(default, mix)
    elif len(by_level) < 5:
        assumptions.append(f"rungs without their own bench use the capacity from {default.origin}")
    return table, price, traffic, fleets, assumptions


def _hourly(price: float | None) -> str:
    return "not in the price table, so those rungs are left out" if price is None else f"${price:g}/h"


def cmd_compare(args):
    from cost import render
    from cost.fleet import compare

    _, price, traffic, fleets, assumptions = fleet_inputs(args)
    data = compare(traffic, price, fleets, args.tier)
    if args.plot:
        from cost.plot import plot_compare
        data["plot"] = str(plot_compare(args.plot, traffic, price, fleets, args.tier))
    data["assumptions"] = assumptions
    return data, render.compare


def cmd_simulate(args):
    from cost.simulate.cli import command
    from infra.eks.cluster import fixed_hourly as eks_fixed_hourly
    return command(args, table_from, eks_fixed_hourly)


def cmd_recommend(args):
    from cost import render
    from cost.breakeven import check_range
    from cost.recommend import REQUIREMENTS, Requirements, recommend

    check_range("min savings", args.min_savings, 0.0, 100.0, unit=" %")
    req = Requirements({dest: getattr(args, dest) for dest, _, _ in REQUIREMENTS})
    if args.trace:   # simulate every rung on the trace (cost.simulate), then answer from it
        from cost.recommend import check_trace_flags, recommend_from_simulation, render_trace
        from cost.simulate.cli import simulate
        from infra.eks.cluster import fixed_hourly as eks_fixed_hourly

        check_trace_flags(args)
        found = None
        if args.spec_model and (args.instances or not args.instance):
            found = search_deployment(args)
        elif args.instances or args.dtypes or args.search_plot:
            raise BadInput("--instances, --dtypes and --search-plot steer the deployment search: give --trace, "
                           "--hf-model and no --instance")
        sim = simulate(args, table_from, eks_fixed_hourly)
        data = recommend_from_simulation(req, sim, args.min_savings, table_from(args).instance(args.instance),
                                         args.model)
        data["assumptions"] = list(sim.get("assumptions", []))
        if found is not None:
            from cost.search import deploy_options, render_search
            chosen = found["best"] or found["closest"]
            data["search"] = found
            extra = ["--model", args.spec_model, *deploy_options(chosen, args.max_num_seqs or 256)]
            if data["deploy"].get("argv") and data["level"] in (3, 4, 5):
                data["deploy"]["argv"] += extra
                data["deploy"]["command"] += " " + " ".join(shlex_quote(a) for a in extra)
                data["deploy"]["plan_command"] += " " + " ".join(shlex_quote(a) for a in extra)
            elif data["level"] == 2:
                # JumpStart chooses its own serving configuration: the searched one is rung 3's.
                from cost.recommend import deploy_command
                rows = {r["level"]: r for r in sim["rungs"]}
                if 3 in rows:
                    lmi = deploy_command(3, rows[3]["policy"], table_from(args).instance(args.instance),
                                         args.model)
                    data["deploy"]["notes"].append(
                        f"JumpStart picks its own serving configuration; the one searched (TP {chosen['tp']}, "
                        f"{chosen['dtype']}) deploys on rung 3 at the same price: " + lmi["command"] + " "
                        + " ".join(shlex_quote(a) for a in extra))
            return data, lambda d: (render_search(d["search"]), render_trace(d))
        return data, render_trace
    from cost.recommend import refuse_simulation_flags
    refuse_simulation_flags(args)
    has_traffic = any(v is not None for v in (args.avg, args.tokens_per_month))
    assumptions: list[str] = []
    if has_traffic:
        _, price, traffic, fleets, assumptions = fleet_inputs(args)
        data = recommend(req, price, traffic, fleets, args.min_savings, args.tier)
    else:
        if args.model:
            table_from(args).bedrock(args.model)  # still catch a misspelt model id
        assumptions.append("no traffic given: the answer follows the decision tree alone")
        data = recommend(req, min_savings_pct=args.min_savings)
    data["assumptions"] = assumptions
    return data, render.recommend


def search_deployment(args) -> dict:
    """The instance × TP × dtype search (cost.search); sets --instance, --tp and --dtype to its
    answer (or the closest candidate when none meets the SLO) for the recommendation that follows."""
    from cost.search import plot_search, search
    from infra.eks.cluster import fixed_hourly as eks_fixed_hourly

    if args.capacity is not None or args.bench:
        raise BadInput("the deployment search takes its capacities from --hf-model: leave out --capacity/--bench")
    found = search(args, table_from, eks_fixed_hourly)
    chosen = found["best"] or found["closest"]
    if chosen is None:
        raise BadInput("no candidate could be simulated: " + "; ".join(
            f"{r['instance']} {r['dtype']}: {r.get('why', r['status'])}" for r in found["candidates"][:5]))
    args.instance, args.tp, args.dtype = chosen["instance"], chosen["tp"], chosen["dtype"]
    args.max_num_seqs = args.max_num_seqs or 256
    if args.search_plot:
        plot_search(found, args.search_plot)
        found["plot"] = args.search_plot
    return found


def shlex_quote(text: str) -> str:
    import shlex
    return shlex.quote(text)


def cmd_agent(args):
    from cost.agent import price_task, render, task_from_bench, task_from_trace
    from infra.eks.cluster import fixed_hourly as eks_fixed_hourly

    if not args.model or not args.instance:
        raise BadInput("give --model (the Bedrock model a task would call) and --instance (the instance a "
                       "self-hosted replica runs on)")
    if args.mix:
        raise BadInput("--mix does not apply to agent tasks: the task's own input:output tokens are its mix")
    if args.bench and (args.capacity is not None or args.spec_model):
        raise BadInput("give --capacity or --hf-model with --trace only: an agent bench carries its measured "
                       "capacity")
    if args.capacity is not None and args.spec_model:
        raise BadInput(f"give --hf-model {args.spec_model} (capacity from specs) or --capacity (measured), not "
                       "both: each is the capacity of one replica")
    if args.prefix_cache_hit_rate is not None and not args.spec_model:
        raise BadInput("--prefix-cache-hit-rate changes a capacity predicted from specs: give --hf-model M (an "
                       "agent bench measured its own reuse; --capacity is a figure that holds it)")
    task = task_from_trace(args.trace) if args.trace else task_from_bench(args.bench)
    capacity_tok_s, origin = args.capacity, "--capacity"
    if args.spec_model:
        capacity_tok_s, origin = agent_capacity_from_specs(args, task)
    table = table_from(args)
    data = price_task(task, table, args.model, args.instance, tasks_per_month=args.tasks_per_month,
                      slo_p99_ms=args.slo_p99, capacity_tok_s=capacity_tok_s, hours_per_day=args.hours_per_day,
                      min_replicas=args.min_replicas, discount_pct=args.discount, tier=args.tier,
                      eks_fixed_hourly=eks_fixed_hourly(table)["hourly"], capacity_origin=origin)
    return data, render


def agent_capacity_from_specs(args, task) -> tuple[float, str]:
    """One replica's saturated output tok/s from --hf-model on --instance, at the task's mean call
    (its input and output tokens a call), with the prompts' reuse --prefix-cache-hit-rate gives."""
    from cost.hardware.cli import capacity_from_spec_args

    per_call_in, per_call_out = task.input_tokens / task.calls, max(1.0, task.output_tokens / task.calls)
    capacity, details = capacity_from_spec_args(args, per_call_in, per_call_out)
    return details["saturated_output_tok_s"], (
        f"{capacity.source}: saturated at the task's mean call, {per_call_in:,.0f} in / {per_call_out:,.0f} out; "
        f"KV cache {details['kv_cache_tokens']:,} tokens; python -m cost capacity shows every assumption")


# The gateway's package lives beside its scripts, as byo_vllm's does; read through it (its own
# config loader and store), never a copy. Imported here, in the CLI, so cost itself stays below it.
# An install carries it (spectrum_gateway); a checkout run without one finds it in this folder.
GATEWAY_DIR = Path(__file__).resolve().parents[1] / "containers" / "gateway"


def import_gateway(module: str):
    """The gateway's module, installed or from the checkout; a missing extra says which."""
    import importlib
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == "spectrum_gateway" and (GATEWAY_DIR / "spectrum_gateway").is_dir():
            sys.path.insert(0, str(GATEWAY_DIR))
            return import_gateway(module)
        raise BadInput(f"reading the gateway's config and ledger needs {exc.name}, which is not installed "
                       f"here: pip install 'spectrum[gateway]' (or give the records with --usage FILE)") from None


def gateway_config(path: str):
    config = import_gateway("spectrum_gateway.config")
    ConfigError, load_config = config.ConfigError, config.load_config
    try:
        return load_config(path)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None


def gateway_ledger(config, month) -> tuple[list[dict], str]:
    """The month's ledger records from the config's store, and where they came from."""
    import asyncio

    from cost.bill import check_record, read_usage
    if not config.uses_redis:   # the memory store appends its ledger to a file beside the server
        path = config.state_dir / "usage.jsonl"
        if not path.exists():
            raise BadInput(f"the gateway config's store is memory: its ledger is {path} on the machine the "
                           f"gateway ran on, and it is not here (the memory store keeps nothing elsewhere). "
                           f"Run bill there, or give the records with --usage FILE "
                           f"(`containers/gateway/admin --config {config.path.name} usage --json > FILE`)")
        return read_usage(path), f"memory store ledger {path}"
    GatewayError = import_gateway("spectrum_gateway.errors").GatewayError
    open_store = import_gateway("spectrum_gateway.store").open_store

    async def read():
        # Read a page at a time (the store's XRANGE ... COUNT), each page's records checked as
        # it comes. From the month's start on, with no end: an entry is written when its
        # request ends (or later, when a settle waited for Redis), so one of the month's may
        # have been written after it; the bill keeps the month's by their ts_ms.
        store, records = open_store(config), []
        try:
            async for page in store.ledger_pages(month.start_ms):
                for record in page:
                    records.append(check_record(record, f"{config.store_name} ledger entry {len(records)}"))
            return records
        finally:
            await store.close()
    try:
        records = asyncio.run(read())
    except GatewayError as exc:
        raise RuntimeError(exc.message) from None
    return records, f"{config.store_name} ledger"


def cmd_bill(args):
    from cost.bill import build_bill, parse_fleet, parse_month, parse_per_token, read_usage, render, \
        upstreams_from_config

    month = parse_month(args.month)
    if not args.config and not args.usage:
        raise BadInput("give the ledger: --usage FILE (JSON lines or `admin usage --json` output) or --config "
                       "gateway.yaml (its store's ledger)")
    table = table_from(args)
    fleets = [parse_fleet(spec, table) for spec in args.fleet]
    per_token = dict(parse_per_token(spec, table) for spec in args.per_token)
    config = gateway_config(args.config) if args.config else None
    if args.usage:
        records, source = read_usage(args.usage), f"usage file {args.usage}"
    else:
        records, source = gateway_ledger(config, month)

    def budget(tenant: str):
        limits = config.tenant(tenant) if config is not None else None
        return limits.budget_usd_month if limits is not None else None
    data = build_bill(records, month, table, upstreams=upstreams_from_config(config) if config else None,
                      fleets=fleets, per_token=per_token, budget=budget, source=source)
    if config is None:
        data["assumptions"].append("no --config: no budgets, and every upstream priced by --fleet or --per-token")
    if args.plot:
        from cost.plot import plot_bill
        data["plot"] = str(plot_bill(args.plot, data))
    return data, render


def cmd_consolidate(args):
    from cost.breakeven import apply_discount, check_range, parse_mix
    from cost.consolidate import (LEVEL, MAX_MODELS, AdapterOverhead, Plan, check_ratio, cheapest_packing,
                                  consolidate, curves, describe_overhead, load_adapter_bench, packing_for,
                                  render)
    from cost.fleet import Fleet, make_traffic

    check_range("models", args.models, 1, MAX_MODELS)
    check_range("min replicas", args.min_replicas, 1, 10000)
    min_copies = args.min_replicas if args.min_copies is None else int(check_range("min copies", args.min_copies, 0, 10000))
    if (args.adapter_bench or args.adapter_ratio is not None) and not args.adapters:
        raise BadInput("--adapter-bench/--adapter-ratio describe adapters: add --adapters (the models are LoRA "
                       "adapters of one base)")
    table = table_from(args)
    instance = table.instance(args.instance)
    hourly = apply_discount(instance.hourly("sagemaker"), args.discount)
    mix = parse_mix(args.mix)
    traffic, notes = make_traffic(mix, args.traffic_per_model, args.peak_per_model, None, args.hours_per_day)
    notes = [n.replace("--peak", "--peak-per-model") for n in notes]
    capacity, _ = resolve_capacity(args)
    if capacity is None:
        raise BadInput("give the capacity of one replica: --capacity OUTPUT_TOK_S or --bench FILE "
                       "(from `python -m options.bench --json FILE`)")
    fleet = Fleet(LEVEL, instance, "sagemaker", hourly, capacity, args.min_replicas)
    overhead = None
    if args.adapters:
        overhead = (load_adapter_bench(args.adapter_bench) if args.adapter_bench else
                    AdapterOverhead(check_ratio(args.adapter_ratio, "--adapter-ratio"), "--adapter-ratio", {})
                    if args.adapter_ratio is not None else AdapterOverhead(1.0, "no measurement", {}))
    if args.shared_instance:
        packing = packing_for(table.instance(args.shared_instance), instance, args.discount)
    else:
        packing = cheapest_packing(table, fleet, traffic, args.models, args.discount, min_copies)
    plan = Plan(fleet, traffic, overhead, packing, min_copies)
    data = consolidate(plan, args.models, shared_chosen=not args.shared_instance)
    data["assumptions"] = [
        f"SageMaker real-time prices as of {instance.as_of}" + (f", less {args.discount:g} %" if args.discount else ""),
        *notes,
        *capacity_notes(capacity, mix),
        f"every model has the same traffic; a dedicated endpoint runs max({args.min_replicas}, ceil(peak / capacity)) "
        f"replicas of {instance.sagemaker_name} while active and {args.min_replicas} the rest of the day",
        f"inference components: each model keeps as many copies as its dedicated endpoint has replicas while "
        f"active and {min_copies} the rest of the day, {packing.copies_per_instance} per {packing.instance.sagemaker_name} (a copy needs the "
        f"{instance.gpus} accelerator(s) of {instance.sagemaker_name})"
        + (" — the cheapest such instance at this N" if not args.shared_instance else ""),
        f"break-even: the fewest models (up to {MAX_MODELS}) at which a shared way costs less than dedicated endpoints",
        "storage, data transfer, load balancers and engineering time are not counted",
    ]
    if overhead is not None:
        data["assumptions"].append(
            f"adapters: one endpoint for the summed traffic (peaks taken as coincident), its capacity the base's "
            f"{describe_overhead(overhead)}"
            + ("; NOT MEASURED: measure it with `python -m options.bench --adapters a1,...,a8` and give "
               "--adapter-bench FILE" if overhead.origin == "no measurement" else ""))
    else:
        data["assumptions"].append("not adapters of one base (no --adapters): only dedicated endpoints and "
                                   "inference components are compared")
    if args.plot:
        from cost.plot import plot_consolidate
        xs, series = curves(plan, args.models)
        data["plot"] = str(plot_consolidate(
            args.plot, xs, series, args.models,
            f"{args.traffic_per_model:g} tok/s per model on {instance.sagemaker_name}, prices as of {instance.as_of}"))
    return data, render


if __name__ == "__main__":
    sys.exit(main())
