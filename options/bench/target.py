"""What the bench measures, reached: a URL, a SageMaker endpoint, Bedrock, or the
bring-your-own server started on this machine for the run (``--target local`` without
``--url``), and the model name each request carries.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import urllib.request
from typing import Any, Iterator

from options.core import BEDROCK, OPENAI_COMPLETIONS, BadInput, rung


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


def request_model(args: argparse.Namespace) -> str | None:
    """The model name each request carries: Bedrock needs one; a server started here needs none."""
    if _is_bedrock(args.level) and not args.url:
        from options.bedrock import DEFAULT_MODEL
        return args.model or DEFAULT_MODEL
    if args.url or args.target != "local":
        return args.model
    return None
