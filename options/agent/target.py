"""Where the agent's calls go: Bedrock (level 1), a SageMaker endpoint (levels 2-5 on the emulator
or AWS), a server you reach (``--url``), or the bring-your-own server started here with the
rung's configuration (levels 3-5, ``--target local``)."""
from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Iterator

from options.agent.run import Model
from options.core import BEDROCK, BadInput, rung

SELF_HOSTED_BASIS = "instance time: e2e × the instance's hourly price (one call at a time; shared under load)"


def _hourly(args: argparse.Namespace, level: int) -> tuple[float | None, str]:
    """The instance's price per hour for self-hosted calls (--instance), and how cost is reckoned."""
    if not args.instance:
        return None, "not priced: give --instance TYPE to price each call's instance time"
    from cost.prices import load_prices
    platform = "ec2" if level == 6 else "sagemaker"
    return load_prices().instance(args.instance).hourly(platform), f"{SELF_HOSTED_BASIS}; {args.instance} on {platform}"


@contextlib.contextmanager
def open_model(args: argparse.Namespace, say) -> Iterator[Model]:
    from options.contract import invoke_http, invoke_sagemaker
    from options.spectrum import check_target

    level = args.level
    r = rung(level)                       # UnknownLevel: bad input naming the rungs
    dialect = args.dialect or r.can.dialect
    if args.url:
        hourly, basis = _hourly(args, level)
        yield Model(lambda req: invoke_http(args.url, req, dialect, timeout_s=args.timeout),
                    f"{args.url.rstrip('/')} ({dialect})", args.model, hourly, basis)
        return
    if r.can.dialect == BEDROCK:
        if args.target == "local":
            raise BadInput(f"level {level} ({r.name}) does not serve on this machine: {r.can.reason('serves_locally')}. "
                           "Run the agent with --target aws")
        from options.aws import Target
        from options.bedrock import DEFAULT_MODEL
        from options.bedrock.client import BedrockClient, retry_config
        client = BedrockClient(Target(args.target, args.region, args.endpoint_url).client(
            "bedrock-runtime", config=retry_config()))
        model = args.model or DEFAULT_MODEL
        yield Model(client.converse_stream, f"bedrock-runtime {client.region} {model}", model,
                    cost_basis="Bedrock usage × the price table (on-demand)")
        return
    check_target(level, args.target)
    if args.target in ("aws", "emulator"):
        if not args.endpoint:
            raise BadInput(f"--target {args.target} calls a SageMaker endpoint: give --endpoint NAME (from "
                           f"python -m options.deploy --level {level} --target {args.target}), or --url for a "
                           "server you reach directly")
        from options.aws import Target
        client = Target(args.target, args.region, args.endpoint_url).client("sagemaker-runtime")
        hourly, basis = _hourly(args, level)
        yield Model(lambda req: invoke_sagemaker(client, args.endpoint, req, dialect),
                    f"sagemaker:{args.endpoint} ({dialect})", args.model, hourly, basis)
        return
    if not r.can.serves_locally:
        raise BadInput(f"level {level} ({r.name}) does not serve on this machine: {r.can.reason('serves_locally')}. "
                       "Give the --url of a server you reach (e.g. through kubectl port-forward), or --target aws")
    with local_server(args, say) as url:
        hourly, basis = _hourly(args, level)
        yield Model(lambda req: invoke_http(url, req, dialect, path="/invocations", timeout_s=args.timeout),
                    f"{url}/invocations ({dialect})", None, hourly,
                    basis if args.instance else "this machine: no AWS bill (give --instance TYPE to price "
                    "the rung's instance time)")


@contextlib.contextmanager
def local_server(args: argparse.Namespace, say) -> Iterator[str]:
    """Rung ``args.level``'s server on this machine, as ``python -m options.deploy --level N``
    starts it (its configuration mapped onto the bring-your-own server), stopped at the end."""
    from options.deploy import parse_args
    from options.local_server import LocalServer
    from options.spectrum import rung_module

    module = rung_module(args.level)
    deploy_args = parse_args(["--level", str(args.level), "--target", "local"]
                             + (["--model", args.model] if args.model else [])
                             + [f"--option={o}" for o in args.option])
    logs = os.path.join(os.environ.get("SPECTRUM_CACHE", os.path.expanduser("~/.cache/spectrum")), "logs")
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.join(logs, f"agent-level{args.level}-{int(time.time())}.log")
    with module.local_server(module.spec_from_args(deploy_args)) as (env, what), \
            LocalServer(env, log_path=log_path) as server:
        say(f"starting level {args.level}'s server here: {what} (log: {log_path})")
        server.wait_ready(600)
        say(f"ready at {server.url}")
        yield server.url
