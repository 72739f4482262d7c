"""Level 1, Bedrock: AWS runs the model; you send prompts and pay per token.

Nothing is created, so ``apply`` only points a deployment at the model and ``down`` has
nothing to remove. The plan is the Converse request itself and its price per call.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from typing import Any, Iterator

from options.contract import BedrockConverse, Request, Result, StreamEvent
from options.core import BadInput, rung
from options.plan import Deployment, Plan, Step
from options.spectrum import check_target

LEVEL = 1
DEFAULT_MODEL = "amazon.nova-micro-v1:0"
DEFAULT_REGION = "us-east-1"
EXAMPLE_PROMPT = "Explain in one sentence what Amazon Bedrock is."
# Converse counts tokens per model; ~4 characters per token is the usual English estimate.
CHARS_PER_TOKEN = 4


@dataclass
class BedrockSpec:
    model_id: str = DEFAULT_MODEL
    region: str = DEFAULT_REGION
    system: str | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    max_tokens: int = 256
    temperature: float | None = None
    prompt: str = EXAMPLE_PROMPT
    stream: bool = False

    def request(self, prompt: str | None = None) -> Request:
        return Request(prompt=prompt or self.prompt, system=self.system, max_tokens=self.max_tokens,
                       temperature=self.temperature, top_p=self.top_p, stop=self.stop,
                       stream=self.stream, model=self.model_id)


# --- RungModule ---------------------------------------------------------------------------------

def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--system", help="level 1: system prompt sent with every request")
    group.add_argument("--top-p", type=float, dest="top_p",
                       help="level 1: nucleus sampling, in (0, 1]")
    group.add_argument("--stop", action="append", metavar="TEXT",
                       help="level 1: a stop sequence (repeat for several)")


def spec_from_args(args: argparse.Namespace) -> BedrockSpec:
    from options.bedrock.client import check_model_region

    get = lambda name, default=None: (getattr(args, name, None)  # noqa: E731
                                      if getattr(args, name, None) is not None else default)
    invoke = get("invoke")
    spec = BedrockSpec(model_id=get("model", DEFAULT_MODEL).strip(), region=get("region", DEFAULT_REGION),
                       system=get("system"), top_p=get("top_p"), stop=get("stop"),
                       max_tokens=get("max_tokens", 256), temperature=get("temperature"),
                       prompt=invoke if isinstance(invoke, str) and invoke else EXAMPLE_PROMPT,
                       stream=bool(get("stream", False)))
    if not spec.model_id:
        raise BadInput(f"--model is empty: give a Bedrock model id such as {DEFAULT_MODEL}")
    spec.request()                       # the contract checks the sampling values
    check_model_region(spec.model_id, spec.region)
    return spec


def estimate_tokens(text: str | None) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


def cost_estimate(spec: BedrockSpec, table: Any = None) -> dict[str, Any]:
    """Per 1M tokens, and per call of this request at most (input estimated, output = max_tokens)."""
    from cost.prices import UnknownName, load_prices

    est_in = estimate_tokens(spec.prompt) + estimate_tokens(spec.system)
    line: dict[str, Any] = {"billed": "per token", "model_id": spec.model_id, "idle_hourly_usd": 0.0,
                            "estimated_input_tokens": est_in, "max_output_tokens": spec.max_tokens}
    try:
        price = (table or load_prices()).bedrock(spec.model_id)
    except UnknownName as exc:
        line["note"] = f"no price known: {exc}"
        return line
    line.update({
        "input_per_million_usd": price.input_per_million,
        "output_per_million_usd": price.output_per_million,
        "per_call_max_usd": round(price.cost(est_in, spec.max_tokens), 8),
        "price_as_of": price.as_of, "source": price.source,
    })
    return line


def plan(spec: BedrockSpec) -> Plan:
    body = BedrockConverse().to_wire(spec.request())
    operation = "ConverseStream" if spec.stream else "Converse"
    return Plan(LEVEL, [Step("bedrock-runtime", operation, body,
                             description=f"one request to {spec.model_id} in {spec.region}")],
                cost=cost_estimate(spec),
                notes=["Bedrock creates nothing: no endpoint, no instance, nothing to tear down; "
                       "you pay only for the tokens of each call.",
                       f"Input tokens are estimated at {CHARS_PER_TOKEN} characters per token; "
                       "the per-call figure assumes the answer uses all of --max-tokens."],
                extra={"region": spec.region, "spec": spec})


def run_local(spec: BedrockSpec, args: argparse.Namespace) -> int:
    p = plan(spec)
    if getattr(args, "json", False):
        print(json.dumps({**p.to_json(), "needs_cloud": True}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Level 1 (Bedrock): {spec.model_id} in {spec.region}", show_header=False)
    step = p.steps[0]
    table.add_row("request", f"bedrock-runtime {step.operation}")
    table.add_row("body", json.dumps(step.params))
    c = p.cost
    if "input_per_million_usd" in c:
        table.add_row("price per 1M tokens", f"${c['input_per_million_usd']} input / "
                      f"${c['output_per_million_usd']} output (as of {c['price_as_of']})")
        table.add_row("this call, at most", f"${c['per_call_max_usd']:.6f} "
                      f"(~{c['estimated_input_tokens']} in + {c['max_output_tokens']} out)")
    else:
        table.add_row("price", c.get("note", "unknown"))
    table.add_row("idle cost", "$0/h: nothing runs while you send nothing")
    console.print(table)
    console.print("Level 1 needs the cloud: Bedrock runs only in AWS. Send this request with "
                  "[bold]--target aws --invoke \"...\"[/bold] (credentials from the usual chain).")
    return 0


def apply(plan: Plan, target: Any) -> Deployment:
    """Nothing to create: the deployment is where requests go (the model, in the region)."""
    spec: BedrockSpec = plan.extra["spec"]
    check_target(LEVEL, target.kind)
    region = getattr(target, "region", None) or spec.region
    if region != spec.region:
        spec = replace(spec, region=region)
    return Deployment(LEVEL, spec.model_id, target, rung(LEVEL).can.dialect,
                      extra={"spec": spec})


def _runtime_client(target: Any):
    from options.bedrock.client import retry_config
    return target.client("bedrock-runtime", config=retry_config())


def invoke(deployment: Deployment, request: Request) -> Result | Iterator[StreamEvent]:
    """Send ``request``; the deployment's model, system prompt, top-p and stops fill what it leaves out."""
    from options.bedrock.client import BedrockClient

    spec = deployment.extra["spec"]
    request = replace(request, model=request.model or spec.model_id,
                      system=request.system if request.system is not None else spec.system,
                      top_p=request.top_p if request.top_p is not None else spec.top_p,
                      stop=request.stop if request.stop is not None else spec.stop)
    return BedrockClient(_runtime_client(deployment.target)).invoke(request)


def status(spec: BedrockSpec, target: Any) -> dict[str, Any]:
    from options.bedrock.client import explain, split_profile

    out: dict[str, Any] = {"level": LEVEL, "model_id": spec.model_id, "region": spec.region,
                           "resources": [], "cost": cost_estimate(spec)}
    if not getattr(target, "is_cloud", False):
        out["status"] = "nothing deployed (Bedrock runs only in AWS; nothing bills while idle)"
        return out
    prefix, base = split_profile(spec.model_id)
    bedrock = target.client("bedrock")
    try:
        if prefix:
            info = bedrock.get_inference_profile(inferenceProfileIdentifier=spec.model_id)
            out["status"] = info.get("status", "unknown")
        else:
            details = bedrock.get_foundation_model(modelIdentifier=base)["modelDetails"]
            out["status"] = (details.get("modelLifecycle") or {}).get("status", "unknown")
            out["streaming"] = details.get("responseStreamingSupported")
            out["inference_types"] = details.get("inferenceTypesSupported")
    except Exception as exc:  # status reports; it never fails the command over a lookup
        out["status"] = "unknown"
        out["error"] = str(explain(exc, spec.model_id, spec.region))
    return out


def down(spec: BedrockSpec, target: Any) -> list[str]:
    """Nothing to remove: level 1 creates no resources."""
    return []
