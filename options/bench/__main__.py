"""python -m options.bench: the same load, measured the same way, on any rung.

    python -m options.bench --level 5                          # starts the local server (tiny model)
    python -m options.bench --url http://127.0.0.1:8080 --level 5 --concurrency 16 --json out.json
    python -m options.bench --level 3 --target aws --endpoint my-endpoint --request-rate 4
    python -m options.bench --level 1 --target aws --model us.amazon.nova-micro-v1:0 --requests 20
    python -m options.bench --adapters a1,a2,a3,a4,a5,a6,a7,a8 --adapter-mix zipf:1.1 --concurrency 8,32
    python -m options.bench --profile agent --priority compare --programs 32 --concurrency 8
    python -m options.bench --profile capacity --json capacity.json     # engine steps → the simulator
    python -m options.bench --level 5 --replay trace.csv --load 0.7 --capacity bench.json --json replay.json
    python -m options.bench --level 6 --target local --concurrency 1,8,32 --rounds 3   # the Ray hop's cost

Exit codes: 0 ok, 2 bad input, 1 failure (the target did not answer, or every request failed).
"""
from __future__ import annotations

import argparse
import sys

from options.core import BadInput, exit_code
from options.core.wire import DIALECTS

EXAMPLES = __doc__.split("\n\n")[1]
# What --profile runs: independent requests, agent programs (program.py), a capacity profile (capacity.py).
PROFILES = ("requests", "agent", "capacity")
TARGETS = ("local", "emulator", "aws")


def build_parser(prog: str = "python -m options.bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                epilog="examples:\n" + EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_argument_group("what to measure")
    where.add_argument("--level", type=int, help="the rung (1-6) being measured; recorded in the JSON")
    where.add_argument("--target", choices=TARGETS, default="local")
    where.add_argument("--url", help="base URL of a running server (OpenAI routes or /invocations)")
    where.add_argument("--path", help="request path on --url (default: the dialect's, e.g. /v1/completions)")
    where.add_argument("--endpoint", help="SageMaker endpoint name (levels 2-5 on emulator or aws)")
    where.add_argument("--model", help="model name the server expects, or the Bedrock model id; "
                       "with --target local and no --url: the model the started server loads "
                       "(default: the built-in tiny model)")
    where.add_argument("--dialect", choices=[d for d in DIALECTS if d != "bedrock"],
                       help="request body dialect (default: the rung's own, e.g. tgi for levels "
                            "2-4; openai-completions without --level)")
    where.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="with --target local and --level 3-5: the rung's engine option, as "
                            "python -m options.deploy takes it, e.g. --level 3 --option "
                            "OPTION_MAX_ROLLING_BATCH_SIZE=16 (the server runs that LMI configuration)")
    where.add_argument("--region", default="us-east-1")
    where.add_argument("--endpoint-url", help="AWS endpoint override (an emulator's URL)")
    load = p.add_argument_group("traffic profile")
    load.add_argument("--requests", type=int, default=64, help="number of measured requests (64)")
    load.add_argument("--prompt-tokens", default="128", metavar="DIST",
                      help="N, fixed:N, uniform:LOW:HIGH or jsonl:FILE (rows with prompt_tokens or prompt)")
    load.add_argument("--output-tokens", default="128", metavar="DIST",
                      help="N, fixed:N, uniform:LOW:HIGH or jsonl:FILE (rows with output_tokens or max_tokens)")
    load.add_argument("--concurrency", type=concurrency_list, metavar="N[,N...]",
                      help="requests in flight at once (default 8; with --request-rate: no cap unless "
                           "given); with --adapters several, e.g. 8,32")
    load.add_argument("--request-rate", type=float, help="mean arrivals per second (gamma inter-arrivals)")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of the arrivals: 1 = Poisson, <1 burstier, >1 steadier")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--ignore-eos", action="store_true",
                      help="ask for exactly the output length (servers that support it; not Bedrock)")
    load.add_argument("--temperature", type=float)
    load.add_argument("--warmup", type=int, default=1, help="unmeasured requests sent first (1)")
    load.add_argument("--no-calibrate", action="store_true",
                      help="take one word as one token instead of measuring the target's tokenizer "
                           "(two unmeasured one-token requests)")
    load.add_argument("--timeout", type=float, default=600, help="per-request timeout in seconds")
    load.add_argument("--profile", choices=PROFILES, default="requests",
                      help="requests: independent requests (default); agent: closed-loop programs of "
                           "--steps serial calls whose prompts grow by each previous answer; capacity: "
                           "engine step times (prefill, decode by batch and KV) fitted to the "
                           "simulator's capacity model; with --replay TRACE, also the server "
                           "saturated with that trace's request mix")
    from options.bench.adapters import add_arguments as add_adapter_arguments
    from options.bench.program import add_arguments as add_program_arguments
    add_program_arguments(p)
    add_adapter_arguments(p)
    from options.bench.replay import add_arguments as add_replay_arguments
    add_replay_arguments(p)
    from options.bench.capacity import add_arguments as add_capacity_arguments
    add_capacity_arguments(p)
    from options.bench.ray_hop import add_arguments as add_ray_hop_arguments
    add_ray_hop_arguments(p)
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the spectrum.bench/1 JSON here ('-' = stdout)")
    out.add_argument("--no-progress", action="store_true")
    return p


def concurrency_list(text: str) -> list[int]:
    """``8`` or ``8,32``: argparse's type for --concurrency (bad values: exit 2 naming them)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers >= 1, e.g. 8 or 8,32")
    return [int(p) for p in parts]


def main(argv: list[str] | None = None, prog: str = "python -m options.bench") -> int:
    args = build_parser(prog).parse_args(argv)
    from rich.console import Console

    console = Console(stderr=args.json == "-")     # stdout belongs to the JSON then
    say = console.print
    try:
        if args.level == 6 and args.target == "local" and not args.url:
            from options.bench.ray_hop import bench_ray_hop     # the Ray hop: ray_hop.py
            return bench_ray_hop(args, console)
        for flag, given in ((f"--ray-ingress-replicas {args.ray_ingress_replicas}",
                             args.ray_ingress_replicas != 1),
                            (f"--ray-proxy {args.ray_proxy}", args.ray_proxy != "serve")):
            if given:
                raise BadInput(f"{flag}: only the Ray hop (--level 6 --target local) starts a "
                               "Ray application; leave it out")
        from options.bench.replay import ReplayPlan     # open-loop trace replay (--replay)
        # None without --replay; bad input before any server. A capacity profile takes --replay's
        # trace as the mix it saturates the server with (options/bench/capacity.py).
        replay_plan = None if args.profile == "capacity" else ReplayPlan.from_args(args)
        from options.bench.profile import profile_from_args
        profile = None if args.profile in ("agent", "capacity") or replay_plan is not None \
            else profile_from_args(args)
        saturation_mix = None
        if args.profile == "capacity":
            from options.bench.capacity import check_args
            from options.bench.capacity import saturation_mix as read_mix
            check_args(args)                            # bad input before any server starts
            saturation_mix = read_mix(args)
        plan_adapters = None
        if args.adapters:
            from options.bench.adapters import AdapterPlan
            if args.profile == "agent":
                raise BadInput("--adapters runs requests, not agent programs: leave out "
                               "--profile agent")
            plan_adapters = AdapterPlan.from_args(args, args.concurrency or [8])
        from options.bench.target import open_target, request_model
        from options.contract import Request
        template = Request(prompt="-", model=request_model(args), ignore_eos=args.ignore_eos,
                           temperature=args.temperature, stream=True)
        with open_target(args, say) as (send, details):
            if replay_plan is not None:      # a trace, open loop: options/bench/replay.py
                from options.bench.replay import bench_replay
                return bench_replay(args, replay_plan, template, send, details, console)
            if args.profile == "capacity":   # engine step times → the simulator's model: capacity.py
                from options.bench.capacity import bench_capacity
                return bench_capacity(args, template, send, details, console, saturation_mix)
            if args.profile == "agent":      # programs of serial steps: options/bench/program.py
                from options.bench.program import bench_programs
                return bench_programs(args, template, send, details, console)
            if plan_adapters is not None:    # adapters mixed vs the base: options/bench/adapters.py
                from options.bench.adapters import bench_adapters
                return bench_adapters(args, plan_adapters, template, send, details, console)
            from options.bench.independent import bench_requests   # the default: independent.py
            return bench_requests(args, profile, template, send, details, console)
    except BaseException as exc:  # noqa: BLE001 - exit_code re-raises what is not ours
        return exit_code(exc, console.print)


if __name__ == "__main__":
    sys.exit(main())
