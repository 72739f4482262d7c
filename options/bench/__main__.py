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
import contextlib
import json
import sys
import urllib.request
from typing import Any, Iterator

from options.core import BEDROCK, OPENAI_COMPLETIONS, BadInput, exit_code, rung
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


def one_concurrency(args: argparse.Namespace) -> int | None:
    """The single --concurrency of a plain or agent run; several are for --adapters runs."""
    if args.concurrency is None:
        return None
    if len(args.concurrency) > 1 and not args.adapters:
        raise BadInput(f"--concurrency {','.join(map(str, args.concurrency))}: several values are "
                       "for --adapters runs (each measured in turn); give one here")
    return args.concurrency[0]


def profile_from_args(args: argparse.Namespace):
    from options.bench.profile import Profile, parse_lengths

    concurrency = one_concurrency(args)
    if concurrency is None and args.request_rate is None:
        concurrency = 8
    return Profile(requests=args.requests,
                   prompt_tokens=parse_lengths(args.prompt_tokens, "--prompt-tokens", ("prompt_tokens",)),
                   output_tokens=parse_lengths(args.output_tokens, "--output-tokens",
                                               ("output_tokens", "max_tokens")),
                   concurrency=concurrency, request_rate=args.request_rate,
                   burstiness=args.burstiness, seed=args.seed)


@contextlib.contextmanager
def open_target(args: argparse.Namespace, say) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The send function for the chosen target, and how it was reached (for the JSON's details)."""
    from options.bench import runner

    from options.spectrum import check_target

    level = args.level
    if level is not None:
        rung(level)                      # UnknownLevel (bad input) names the rungs
    dialect = args.dialect or (rung(level).can.dialect if level else OPENAI_COMPLETIONS)
    if args.url:
        yield runner.http_target(args.url, dialect, args.path, args.timeout), \
            {"url": args.url, "path": args.path, "dialect": dialect, "served_model": served_model(args.url)}
        return
    if level is not None and args.target == "local" and not rung(level).can.serves_locally:
        raise BadInput(f"level {level} ({rung(level).name}) does not serve on this machine: "
                       f"{rung(level).can.reason('serves_locally')}. Measure it with --target aws, "
                       "or give the --url of a server you reach (e.g. an EKS service through "
                       "kubectl port-forward)")
    if level is not None:
        check_target(level, args.target)
    if _is_bedrock(level):
        from options.aws import Target
        from options.bedrock.client import retry_config
        client = Target(args.target, args.region, args.endpoint_url).client(
            "bedrock-runtime", config=retry_config())
        yield runner.bedrock_target(client), {"service": "bedrock-runtime", "region": args.region}
        return
    if args.target in ("aws", "emulator"):
        if not args.endpoint:
            raise BadInput(f"--target {args.target} measures a SageMaker endpoint: give --endpoint NAME "
                           "(or --url for a server you reach directly, such as an EKS service)")
        from options.aws import Target
        client = Target(args.target, args.region, args.endpoint_url).client("sagemaker-runtime")
        yield runner.sagemaker_target(client, args.endpoint, dialect), \
            {"endpoint": args.endpoint, "region": args.region, "dialect": dialect}
        return
    with _local_server(args, say) as url:
        yield runner.http_target(url, dialect, args.path, args.timeout), \
            {"url": url, "dialect": dialect, "server": "started by the bench (containers/byo-vllm)",
             "served_model": served_model(url)}


def served_model(base_url: str) -> str | None:
    """The model an OpenAI-style server serves (GET /v1/models), for the report; None if unknown."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=5) as r:
            return json.load(r)["data"][0]["id"]
    except Exception:  # not every server lists its models; the report just says less
        return None


def _is_bedrock(level: int | None) -> bool:
    return level is not None and rung(level).can.dialect == BEDROCK


@contextlib.contextmanager
def _server_env(args: argparse.Namespace) -> Iterator[tuple[dict[str, str], str]]:
    """The local server's environment: with --level N, what rung N runs here (level 3: its LMI
    configuration; 4: model.py; 5: the image's own server); without it, the plain server."""
    if args.level is None:
        if args.option:
            raise BadInput("--option configures a rung's server: give --level 3, 4 or 5 with it")
        from options.tiny_model import tiny_model_dir
        model = args.model or str(tiny_model_dir())
        yield {"HF_MODEL_ID": model}, f"the bring-your-own server with {model}"
        return
    from options.deploy import local_server_env

    with local_server_env(args.level, args.model, args.option) as served:
        yield served


@contextlib.contextmanager
def _local_server(args: argparse.Namespace, say) -> Iterator[str]:
    """Start the bring-your-own server on this machine for the run, and stop it after."""
    from options.local_server import serve_here

    # --adapters: LoRA on, and a model folder that holds the adapters (before _server_env reads it)
    extra_env = _local_adapters(args) if args.adapters else {}
    if args.profile == "agent" and args.priority != "off":     # vLLM honours priorities only so
        extra_env["SM_VLLM_SCHEDULING_POLICY"] = "priority"

    with _server_env(args) as (env, what), \
            serve_here({**env, **extra_env}, what, say, log_name="bench-server") as url:
        args.server_env = {**env, **extra_env}      # --profile capacity reads the engine limits set
        yield url


def _local_adapters(args: argparse.Namespace) -> dict[str, str]:
    """For --adapters on a server the bench starts: point --model at a folder with the base
    model and adapters/<name>/ for each name, and the server's LoRA settings."""
    from pathlib import Path

    from options.bench import adapters

    if args.level not in (None, 3, 5):
        raise BadInput(f"--adapters with --level {args.level} on this machine: the bench starts "
                       "servers with adapters for --level 3 and 5 (or none); give the --url of "
                       "a server that serves them")
    names = adapters.parse_adapters(args.adapters)
    env = adapters.local_server_env(args)
    from options.tiny_model import cache_root, tiny_model_dir

    base = tiny_model_dir() if args.model is None else Path(args.model)
    args.model = str(adapters.model_with_adapters(base, names, cache_root()))
    return env


def warm_up_and_calibrate(args, send, template, console, seed: int, texts: bool = False):
    """``--warmup`` unmeasured requests, then the prompt calibration (unless --no-calibrate or
    the prompts are given as ``texts``). (False, None) when the target is unusable."""
    from dataclasses import replace

    from options.bench import runner
    from options.contract import collect

    for i in range(args.warmup):
        try:
            collect(send(replace(template, prompt=f"warm-up {i}", max_tokens=8)))
        except BadInput:
            raise
        except Exception as exc:  # the target is unusable: say why, measure nothing
            console.print(f"[red]the target did not answer the warm-up request:[/red] {exc}")
            return False, None
    if args.no_calibrate or texts:
        return True, None
    try:
        tokens = runner.calibrate(send, template, seed)
    except Exception as exc:
        console.print(f"[red]calibrating prompt lengths failed:[/red] {exc}")
        return False, None
    if tokens is None:
        console.print("the target reports no prompt token counts: prompts are sized at one "
                      "word per token (counts.input_tokens stays 0)")
    return True, tokens


def request_model(args: argparse.Namespace) -> str | None:
    """The model name each request carries: Bedrock needs one; a server started here needs none."""
    if _is_bedrock(args.level) and not args.url:
        from options.bedrock import DEFAULT_MODEL
        return args.model or DEFAULT_MODEL
    if args.url or args.target != "local":
        return args.model
    return None


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
            return _bench(args, profile, template, send, details, console)
    except BaseException as exc:  # noqa: BLE001 - exit_code re-raises what is not ours
        return exit_code(exc, console.print)


def _bench(args, profile, template, send, details, console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from options.bench import report, runner
    from options.bench.metrics import summarize

    ready, tokens = warm_up_and_calibrate(args, send, template, console, profile.seed,
                                          texts=bool(profile.prompt_tokens.texts))
    if not ready:
        return 1
    errors = 0
    with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(),
                  console=console, disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("requests", total=profile.requests, errors=0)

        def on_done(n, rec):
            nonlocal errors
            errors += 0 if rec.ok else 1
            bar.update(task, completed=n, errors=errors)

        result = runner.run(profile, send, template, on_done, tokens)
    summary = summarize(result.records, result.duration_s)
    details = {**details, "ignore_eos": args.ignore_eos, "warmup_requests": args.warmup,
               "prompt_calibration": tokens.to_json() if tokens else None}
    doc = report.bench_json(summary, profile, level=args.level, target=args.target,
                            model=template.model or args.model or details.get("served_model"),
                            started_at=result.started_at, details=details)
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(report.render_table(doc))
    if summary.completed == 0:
        console.print(f"[red]every request failed:[/red] {summary.errors}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
