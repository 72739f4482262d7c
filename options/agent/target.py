"""Where the agent's calls go: Bedrock (level 1), a SageMaker endpoint (levels 2-5 on the emulator
or AWS), a server you reach (``--url``), or the bring-your-own server started here with the
rung's configuration (levels 3-5, ``--target local``)."""
from __future__ import annotations

import argparse
import contextlib
from typing import Iterator
from urllib.parse import urlsplit

from options.agent.retrieval import EndpointEmbeddings, ServedEmbeddings
from options.agent.run import AgentFailed, Model
from options.core import BEDROCK, OPENAI_CHAT, BadInput, rung

BYO_IMAGE_RUNG = "options.byo_image"     # the rung whose endpoint runs containers/byo-vllm
SELF_HOSTED_BASIS = "instance time: e2e × the instance's hourly price (one call at a time; shared under load)"


def _hourly(args: argparse.Namespace, level: int) -> tuple[float | None, str]:
    """The instance's price per hour for self-hosted calls (--instance), and how cost is reckoned."""
    if not args.instance:
        return None, "not priced: give --instance TYPE to price each call's instance time"
    from cost.prices import load_prices
    platform = "ec2" if level == 6 else "sagemaker"
    return load_prices().instance(args.instance).hourly(platform), f"{SELF_HOSTED_BASIS}; {args.instance} on {platform}"


def _origin(url: str) -> str:
    """``http://host:port`` of a URL that may name a path: the embeddings route hangs off the server."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return f"{parts.scheme}://{parts.netloc}"


@contextlib.contextmanager
def open_model(args: argparse.Namespace, say) -> Iterator[Model]:
    from options.contract import InvokeError, invoke_http, invoke_sagemaker
    from options.spectrum import check_target

    level = args.level
    r = rung(level)                       # UnknownLevel: bad input naming the rungs
    dialect = args.dialect or r.can.dialect
    if args.url:
        hourly, basis = _hourly(args, level)
        yield Model(lambda req: invoke_http(args.url, req, dialect, timeout_s=args.timeout),
                    f"{args.url.rstrip('/')} ({dialect})", args.model, hourly, basis,
                    embedder=ServedEmbeddings(_origin(args.url), args.model, args.timeout),
                    tool_calls=dialect == OPENAI_CHAT)
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
                    cost_basis="Bedrock usage × the price table (on-demand)",
                    no_embeddings="Bedrock's Converse API serves no embeddings (embedding models are "
                                  "separate model ids the agent does not call)")
        return
    check_target(level, args.target)
    if args.target in ("aws", "emulator"):
        if not args.endpoint:
            raise BadInput(f"--target {args.target} calls a SageMaker endpoint: give --endpoint NAME (from "
                           f"python -m options.deploy --level {level} --target {args.target}), or --url for a "
                           "server you reach directly")
        from options.aws import Target
        if args.target == "emulator" and not args.endpoint_url:
            raise BadInput("--target emulator calls an endpoint on a running emulator: give its --endpoint-url "
                           "(e.g. python -m moto.server -p 5000, then python -m options.deploy --level "
                           f"{level} --target emulator --endpoint-url http://127.0.0.1:5000 creates the endpoint)")
        client = Target(args.target, args.region, args.endpoint_url).client("sagemaker-runtime")
        hourly, basis = _hourly(args, level)
        streams = args.target == "aws"
        if not streams:      # moto 5.2.5 lacks InvokeEndpointWithResponseStream
            say("the emulator cannot stream: each call is one InvokeEndpoint, so its TTFT is not measured")

        def send(req):
            try:
                return invoke_sagemaker(client, args.endpoint, req, dialect)
            except InvokeError as exc:
                if args.target == "emulator" and exc.kind == "bad_response":
                    raise AgentFailed(f"{exc}. The emulator runs no model: it replays the answers queued at "
                                      "/moto-api/static/sagemaker/endpoint-results (options.aws."
                                      "queue_emulator_result), one per call; queue one for each call") from None
                raise
        # The bring-your-own image embeds on /invocations (when its engine pools); LMI would generate.
        byo = r.module == BYO_IMAGE_RUNG
        yield Model(send,
                    f"sagemaker:{args.endpoint} ({dialect})", args.model, hourly, basis, streams=streams,
                    embedder=EndpointEmbeddings(client, args.endpoint) if byo else None,
                    no_embeddings=f"level {level}'s endpoint ({r.name}) serves no embeddings on /invocations")
        return
    if not r.can.serves_locally:
        raise BadInput(f"level {level} ({r.name}) does not serve on this machine: {r.can.reason('serves_locally')}. "
                       "Give the --url of a server you reach (e.g. through kubectl port-forward), or --target aws")
    from options.deploy import local_server_env
    from options.local_server import serve_here

    with local_server_env(level, args.model, args.option) as (env, what), \
            serve_here(_with_tool_parser(env, dialect), f"level {level}'s server: {what}", say,
                       log_name=f"agent-level{level}") as url:
        hourly, basis = _hourly(args, level)
        yield Model(lambda req: invoke_http(url, req, dialect, path="/invocations", timeout_s=args.timeout),
                    f"{url}/invocations ({dialect})", None, hourly,
                    basis if args.instance else "this machine: no AWS bill (give --instance TYPE to price "
                    "the rung's instance time)", embedder=ServedEmbeddings(url, None, args.timeout),
                    tool_calls=dialect == OPENAI_CHAT and "OPTION_ENTRYPOINT" not in env)


# The tool-call parser the local server gets when the agent speaks OpenAI chat: pythonic needs no
# special tokens in the model's vocabulary, so it works with any model, the tiny one included.
LOCAL_TOOL_PARSER = {"SM_VLLM_TOOL_CALL_PARSER": "pythonic", "SM_VLLM_ENABLE_AUTO_TOOL_CHOICE": "true"}


def _with_tool_parser(env: dict[str, str], dialect: str) -> dict[str, str]:
    """The server's environment, with a tool-call parser unless the user chose one (either
    spelling) or the agent's dialect carries no tools."""
    chosen = any(k.endswith(("TOOL_CALL_PARSER", "ENABLE_AUTO_TOOL_CHOICE")) for k in env)
    return env if dialect != OPENAI_CHAT or chosen else {**env, **LOCAL_TOOL_PARSER}
