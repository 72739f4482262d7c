"""python -m options.deploy --level N: take a model to a working endpoint at any rung.

    python -m options.deploy --level 3                       # serve locally (tiny model), one sample
    python -m options.deploy --level 3 --plan --json          # the exact AWS requests; nothing sent
    python -m options.deploy --level 3 --target emulator      # whole lifecycle against a local AWS
    python -m options.deploy --level 3 --target aws --instance-type ml.g5.12xlarge \\
        --model mistralai/Mistral-7B-Instruct-v0.3 --option OPTION_TENSOR_PARALLEL_DEGREE=4

Flags every rung shares are defined here; each rung adds its own (``add_arguments``), and the
CLI runs the same verbs for every rung (options.spectrum.RungModule). Exit codes: 0 ok,
2 bad input, 1 failure. What the CLI prints lives in options.output, the local target in
options.local_target; heavy modules load only when a command needs them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from options.core import BadInput, exit_code, mask_secrets
from options.core.rungs import BEDROCK, EC2, SAGEMAKER
from options.local_target import DEFAULT_PROMPT, sample_request
from options.output import Console, emit, format_answer, print_plan
from options.plan import Plan
from options.output import progress_to_stderr
from options.spectrum import RUNGS, check_target, rung, rung_module
EXAMPLES = """examples:
  python -m options.deploy --level 3                          serve the tiny model locally, one sample
  python -m options.deploy --level 3 --plan                   what --target aws would send (nothing sent)
  python -m options.deploy --level 3 --plan --json            the same as JSON: {"level", "steps", "cost"}
  python -m options.deploy --level 3 --target emulator        create, wait, invoke, tear down on a local AWS
  python -m options.deploy --level 3 --target aws --instance-type ml.g5.12xlarge \\
      --model mistralai/Mistral-7B-Instruct-v0.3 --option OPTION_TENSOR_PARALLEL_DEGREE=4
  python -m options.deploy --level 3 --target aws --status    is it there, is it InService
  python -m options.deploy --level 3 --target aws --down      remove endpoint, config, model, autoscaling
  python -m options.deploy --level 3 --target aws --autoscale-metric concurrency \
      --autoscale-min 1 --autoscale-max 4 --autoscale-target 8   target tracking on the endpoint's variant
  python -m options.deploy --level 6 --min-replicas 1 --max-replicas 4 --target-waiting 2 --target-cpu 0
                                                              the HPA on vLLM's waiting requests per pod
  python -m options.deploy --level 6 --engine rayservice --plan --autoscaling-from sim.json
                                                              Serve's autoscaling as cost simulate chose it
  python -m options.deploy --level 1 --gateway                the gateway's config and IAM policy for this rung
"""


# ----------------------------------------------------------------------------------- arguments

def _shared_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("what and where")
    g.add_argument("--level", type=int, metavar="N", required=True,
                   help="rung of the spectrum: " + "; ".join(f"{r.level} = {r.name}" for r in RUNGS)
                        + ". e.g. --level 3")
    g.add_argument("--target", choices=("local", "emulator", "aws"), default="local",
                   help="local (default): this machine, no cloud; emulator: a local AWS (moto) started "
                        "for this command; aws: your account. e.g. --target emulator")
    g.add_argument("--model", metavar="M",
                   help="a local folder (config.json + weights) or a hub id; default: a built-in tiny "
                        "model locally (random weights), a small open model on the cloud. "
                        "e.g. --model mistralai/Mistral-7B-Instruct-v0.3")
    g.add_argument("--instance-type", metavar="T",
                   help="SageMaker/EC2 instance type, checked against the price catalogue, "
                        "e.g. --instance-type ml.g5.12xlarge")
    g.add_argument("--instance-count", type=int, default=1, metavar="K",
                   help="instances behind the endpoint (default 1), e.g. --instance-count 2")
    g.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="engine option, repeatable; LMI options in env or properties form: "
                        "--option OPTION_TENSOR_PARALLEL_DEGREE=4 or --option tensor_parallel_degree=4; "
                        "secrets such as HF_TOKEN=... are masked in all output")
    g.add_argument("--name", metavar="NAME",
                   help="endpoint name (default spectrum-l<level>-<model>), e.g. --name my-llm")
    g.add_argument("--region", metavar="R",
                   help="AWS region (default $AWS_REGION, else us-east-1), e.g. --region eu-west-1")
    g.add_argument("--endpoint-url", metavar="URL",
                   help="send AWS requests to an emulator already running there (for separate "
                        "--status/--down runs), e.g. --endpoint-url http://127.0.0.1:5000")

    a = parser.add_argument_group("what to do (default: deploy, invoke once, keep it running)")
    a.add_argument("--plan", action="store_true",
                   help="print the requests --target aws would send, with the hourly cost; send nothing")
    a.add_argument("--status", action="store_true", help="show the deployment's state, e.g. --status")
    a.add_argument("--down", action="store_true",
                   help="remove the endpoint, its config, model and autoscaling registration")
    a.add_argument("--gateway", action="store_true",
                   help="the API gateway (containers/gateway) in front of this rung: levels 1-5 print "
                        "its config, IAM policy and commands; level 6 renders it with Redis")
    a.add_argument("--json", action="store_true",
                   help="machine-readable output on stdout (progress goes to stderr)")
    a.add_argument("--once", action="store_true",
                   help="local target: stop after the sample request instead of serving until Ctrl-C")
    a.add_argument("--port", type=int, metavar="P",
                   help="local target: port for the server (default: a free one), e.g. --port 8080")

    r = parser.add_argument_group("the sample request")
    r.add_argument("--invoke", metavar="TEXT",
                   help=f"prompt to send once deployed (default: {DEFAULT_PROMPT!r}), "
                        f"e.g. --invoke 'What is SageMaker?'")
    r.add_argument("--max-tokens", type=int, default=64, metavar="N",
                   help="most tokens to generate (default 64), e.g. --max-tokens 128")
    r.add_argument("--temperature", type=float, metavar="T",
                   help="sampling temperature 0–2 (default: the server's), e.g. --temperature 0.7")
    r.add_argument("--stream", action="store_true",
                   help="print the answer as it is generated")


def build_parser(level: int | None, prog: str = "python -m options.deploy") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Deploy an LLM at one rung of the AWS spectrum.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        # Without --level, --help lists every rung's flags; flags several rungs share
        # (--role-arn, --lmi-version) are then shown once, under the last rung that has them.
        conflict_handler="error" if level is not None else "resolve")
    _shared_arguments(parser)
    for r in RUNGS if level is None else [rung(level)]:
        try:
            module = rung_module(r.level)
        except ImportError as exc:
            if level is not None:
                raise RuntimeError(f"level {r.level} ({r.name}) is not available here: {exc}") from exc
            continue
        module.add_arguments(parser.add_argument_group(f"level {r.level}: {r.name}"))
    return parser


# Who scales each platform's replicas, and with which flags: an autoscaling flag of another
# platform is refused with the reason and the right flags, not argparse's bare "unrecognized".
AUTOSCALING_FLAGS = {
    SAGEMAKER: ("--autoscale-min", "--autoscale-max", "--autoscale-metric", "--autoscale-target",
                "--scale-to-zero"),
    EC2: ("--min-replicas", "--max-replicas", "--target-waiting", "--target-cpu", "--autoscaling-from",
          "--ray-autoscaling"),
}
HOW_IT_SCALES = {
    BEDROCK: "AWS runs the model and bills per token: there are no instances to scale; its limits are "
             "quotas (tokens and requests per minute), raised through Service Quotas",
    SAGEMAKER: "Application Auto Scaling tracks a target on the endpoint's variant: use --autoscale-min N "
               "--autoscale-max M --autoscale-target X [--autoscale-metric invocations|concurrency]",
    EC2: "a HorizontalPodAutoscaler scales the pods: use --min-replicas N --max-replicas M "
         "--target-waiting X (vLLM requests waiting per pod) [--target-cpu PCT], or --autoscaling-from FILE "
         "(cost simulate's --json; with --engine rayservice, Ray Serve's autoscaling_config), or with "
         "--engine rayservice --ray-autoscaling KEY=VALUE",
}


def refuse_other_platforms_autoscaling(level: int, argv: list[str]) -> None:
    r = rung(level)
    given = sorted({a.split("=")[0] for a in argv} & {flag for platform, flags in AUTOSCALING_FLAGS.items()
                                                      if platform != r.platform for flag in flags})
    if given:
        raise BadInput(f"{' '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to level {level} ({r.name}): "
                       f"{HOW_IT_SCALES[r.platform]}")


# ----------------------------------------------------------------------------------- targets

# What a command line chose: --plan, --status, --down and (levels 1-5) --gateway act instead of the
# --target; at level 6, --target local with --engine rayservice serves on a local Ray instead of
# rendering. docs/deploy/index.md has the table of what each does at each level.
RAY_HERE = "--target local --engine rayservice"
SERVES_HERE = ("--target local at levels 3-5 (the server on this machine) and at level 6 with "
               "--engine rayservice (a local Ray)")
AWS_CALLS = "--target emulator, --target aws, --status and --down (the targets that send AWS requests)"
LEVEL6_STACK = ("level 6's rendered stack: --target local with --engine deployment (renders and "
                "validates into --out), --plan, --target emulator, --target aws, --status and --down")


def chosen_target(level: int, args: argparse.Namespace) -> str:
    for verb in ("plan", "status", "down"):
        if getattr(args, verb):
            return f"--{verb}"
    if args.gateway and rung(level).platform != EC2:
        return "--gateway"
    if args.target == "local" and getattr(args, "engine", None) == "rayservice":
        return RAY_HERE
    return f"--target {args.target}"


def what_it_does(level: int, chosen: str) -> str:
    r = rung(level)
    if chosen == "--target local":
        return ("serves here" if r.serves_locally else
                "renders and validates the EKS stack into --out" if r.platform == EC2 else
                "prints the plan and its cost, as the rung runs only in AWS")
    return {RAY_HERE: "serves on a local Ray and writes no files",
            "--plan": "prints the requests and their cost; nothing is sent, started or written",
            "--status": "reports the deployment's state", "--down": "removes the deployment",
            "--gateway": "prints the gateway's config, IAM policy and commands",
            "--target emulator": "runs the AWS requests against a local AWS",
            "--target aws": "deploys to your account"}[chosen]


def _serves_here(level: int, chosen: str) -> bool:
    return chosen == RAY_HERE or (chosen == "--target local" and rung(level).serves_locally)


# flag → (does the chosen target at this level use it?, the targets that do)
TARGET_FLAGS: dict[str, tuple[Any, str]] = {
    "--once": (_serves_here, SERVES_HERE),
    "--port": (_serves_here, SERVES_HERE),
    "--endpoint-url": (lambda level, chosen: chosen in ("--target emulator", "--target aws", "--status",
                                                        "--down"), AWS_CALLS),
}


def _level6_stack_flag(level: int, chosen: str) -> bool:
    return chosen != RAY_HERE


def flags_given(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The flags ``argv`` gives (however abbreviated), each by its first option string: a parse
    with every default suppressed leaves only what was given."""
    defaults = {action: action.default for action in parser._actions}
    try:
        for action in defaults:
            action.default = argparse.SUPPRESS
        given = vars(parser.parse_args(argv))
    finally:
        for action, default in defaults.items():
            action.default = default
    return {a.option_strings[0] for a in parser._actions if a.option_strings and a.dest in given}


def _and(flags: list[str]) -> str:
    return ", ".join(flags[:-1]) + " and " + flags[-1] if len(flags) > 1 else flags[0]


def refuse_flags_the_target_does_not_use(level: int, args: argparse.Namespace, given: set[str]) -> None:
    """A flag the chosen target ignores is refused before anything starts or is written: exit 2
    naming the flag, the target chosen and the targets that use it."""
    chosen = chosen_target(level, args)
    rules = dict(TARGET_FLAGS)
    if level == 6:
        from options.eks import LOCAL_RAY_IGNORES
        rules.update({flag: (_level6_stack_flag, LEVEL6_STACK) for flag in LOCAL_RAY_IGNORES})
    unused = sorted(flag for flag in given if flag in rules and not rules[flag][0](level, chosen))
    if not unused:
        return
    by_users: dict[str, list[str]] = {}
    for flag in unused:
        by_users.setdefault(rules[flag][1], []).append(flag)
    one = len(unused) == 1
    raise BadInput(f"{_and(unused)} {'is' if one else 'are'} not used by {chosen} at level {level} "
                   f"({what_it_does(level, chosen)}); "
                   + "; ".join(f"{_and(flags)} {'is' if len(flags) == 1 else 'are'} for {users}"
                               for users, flags in by_users.items())
                   + f". Drop {'it' if one else 'them'}, or choose a target that uses {'it' if one else 'them'}")


def parse_args(argv: list[str], prog: str = "python -m options.deploy") -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--level", type=int)
    known, _ = pre.parse_known_args(argv)
    if known.level is not None:
        rung(known.level)  # UnknownLevel: exit 2 naming the rungs
        refuse_other_platforms_autoscaling(known.level, argv)
    elif not {"-h", "--help"} & set(argv):
        raise BadInput("--level N is required: " + "; ".join(f"{r.level} = {r.name}" for r in RUNGS)
                       + f". e.g. {prog} --level 3 (see --help)")
    parser = build_parser(known.level, prog)
    args = parser.parse_args(argv)
    if known.level is not None:
        refuse_flags_the_target_does_not_use(known.level, args, flags_given(parser, argv))
    return args


def local_server_env(level: int, model: str | None = None, options: list[str] | tuple[str, ...] = ()):
    """Rung ``level``'s server on this machine as ``--target local`` starts it (its configuration
    mapped onto the bring-your-own server): a context giving ``(env, what it runs)``, for the
    other CLIs (bench, agent) to start with ``options.local_server.serve_here``."""
    module = rung_module(level)
    args = parse_args(["--level", str(level), "--target", "local"] + (["--model", model] if model else [])
                      + [f"--option={o}" for o in options])
    return module.local_server(module.spec_from_args(args))


# ----------------------------------------------------------------------------------- cloud targets

def _target(args, endpoint_url: str | None = None):
    from options.aws import Target
    from options.sagemaker.plan import region_of

    kind = args.target
    url = endpoint_url or args.endpoint_url
    if kind == "local" and url:
        kind = "emulator"  # --status/--down against a running emulator
    if kind == "local":
        raise BadInput("--status and --down act on a cloud deployment: add --target aws, or "
                       "--endpoint-url URL of a running emulator")
    return Target(kind, region_of(args), url)


def run_cloud(module, spec, args, say: Console, target) -> dict[str, Any]:
    """apply → InService → one invocation (→ teardown when the emulator ends with the command)."""
    summary: dict[str, Any] = {"level": args.level, "target": target.kind, "region": target.region}
    plan = module.plan(spec)
    say(f"Level {args.level} — {rung(args.level).name}, on {target.describe()}")
    say(f"applying {len(plan.steps)} step(s)")
    deployment = module.apply(plan, target)
    summary.update(endpoint=deployment.endpoint_name, created=deployment.created,
                   reused=deployment.reused)
    say(f"InService: {summary['endpoint']} ({deployment.elapsed_s:.1f} s)")

    request = sample_request(args)
    if target.kind == "emulator":
        if request.stream:  # moto 5.2.5 lacks InvokeEndpointWithResponseStream
            say("  (the emulator can't stream responses: invoking without --stream)")
            request.stream = False
        _queue_emulator_answer(target, deployment, request)
    if target.kind == "emulator" or args.invoke:
        from options.contract import collect
        t0 = time.perf_counter()
        result = module.invoke(deployment, request)
        if not hasattr(result, "text"):
            result = collect(list(result), t0)
        where = "the emulator replays a canned body: no model runs there" if target.kind == "emulator" \
            else summary["endpoint"]
        summary["answer"] = format_answer(result, say, where)
    summary["status"] = module.status(spec, target)
    say(f"status: {summary['status'].get('status')}")
    if plan.cost and "hourly_usd" in plan.cost:
        summary["hourly_usd"] = plan.cost["hourly_usd"]
    if target.kind == "aws":
        _print_next_steps(args, summary, plan, say)
    return summary


def _queue_emulator_answer(target, deployment, request) -> None:
    from options import contract
    from options.aws import queue_emulator_result

    dialect = contract.dialect(deployment.dialect)
    canned = contract.Result(text=f"(emulator) canned answer to: {request.prompt}", finish_reason="stop",
                             usage=contract.Usage(input_tokens=8, output_tokens=8))
    queue_emulator_result(target.endpoint_url, target.region, json.dumps(dialect.result_to_wire(canned)))


def _print_next_steps(args, summary: dict, plan: Plan, say: Console) -> None:
    name = summary["endpoint"]
    base = f"python -m options.deploy --level {args.level} --target aws --name {name} --region {args.region or summary['region']}"
    say(f"endpoint: {name} (region {summary['region']})")
    if "hourly_usd" in summary:
        from cost.prices import HOURS_PER_MONTH
        say(f"cost while it runs: ${summary['hourly_usd']:,.3f}/hour "
            f"(${summary['hourly_usd'] * HOURS_PER_MONTH:,.0f}/month)")
    say(f"invoke:   {base} --invoke 'Hello'")
    say(f"status:   {base} --status")
    r = rung(args.level)
    if not r.can.creates_resources:      # nothing was created: nothing runs up a bill
        say(f"billing:  {r.billed}, per call; there is nothing to remove")
    else:
        say(f"remove:   {base} --down     (it bills by the hour until you do)")


def _finish(summary: dict, say: Console) -> int:
    if say.json_mode:
        print(json.dumps(mask_secrets(summary), indent=2, default=str))
    return 0


def run_emulator(module, spec, args, say: Console) -> int:
    from options.aws import emulator, emulator_reachable

    if args.endpoint_url:
        if not emulator_reachable(args.endpoint_url):
            raise BadInput(f"--endpoint-url {args.endpoint_url}: nothing answers there; start an "
                           f"emulator (python -m moto.server -p 5000) or drop --endpoint-url")
        return _finish(run_cloud(module, spec, args, say, _target(args)), say)
    with emulator() as url:
        say(f"local AWS emulator (moto) started at {url}; it stops when this command ends")
        target = _target(args, url)
        summary: dict[str, Any] = {}
        try:
            summary = run_cloud(module, spec, args, say, target)
        finally:
            say("teardown:")
            summary["removed"] = module.down(spec, target)
        return _finish(summary, say)


def print_gateway_front(module, args, say: Console) -> int:
    """Levels 1-5: how to put the gateway in front of the rung as its --plan deploys it."""
    from options.gateway_front import front_for, render_text

    if getattr(args, "adapter", None) or getattr(args, "multi_model", None):
        raise BadInput("--gateway with --adapter/--multi-model: the gateway's sagemaker upstream "
                       "invokes the endpoint without an InferenceComponentName or TargetModel; "
                       "drop --gateway, or front the base endpoint without adapters")
    args.plan = True          # the endpoint the gateway calls is the one the plan names
    front = front_for(args.level, module, module.spec_from_args(args), args)
    print(json.dumps(front, indent=2) if args.json else render_text(front))
    return 0


# ----------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None, prog: str = "python -m options.deploy") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in argv
    say = Console(json_mode)
    progress_to_stderr(json_mode)
    try:
        args = parse_args(argv, prog)
        module = rung_module(args.level)
        if args.gateway and rung(args.level).platform != EC2:
            return print_gateway_front(module, args, say)
        spec = module.spec_from_args(args)
        if args.plan:
            plan = module.plan(spec)
            if args.json:
                print(json.dumps(plan.to_json(), indent=2, default=str))
            else:
                print_plan(plan, say, rung(args.level).name)
            return 0
        if args.status:
            emit(module.status(spec, _target(args)), say, "status:")
            return 0
        if args.down:
            removed = module.down(spec, _target(args))
            if args.json:
                print(json.dumps({"removed": removed}, indent=2))
            return 0
        if args.target == "local":
            return module.run_local(spec, args)
        if args.target == "emulator":
            check_target(args.level, args.target)
            return run_emulator(module, spec, args, say)
        return _finish(run_cloud(module, spec, args, say, _target(args)), say)
    except BaseException as exc:  # noqa: BLE001 - exit_code re-raises what is not ours
        return exit_code(exc, lambda line: print(line, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
