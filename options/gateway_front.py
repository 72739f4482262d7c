"""``python -m options.deploy --level N --gateway``: how to put the gateway (containers/gateway)
in front of a managed rung.

Levels 1-5 answer on AWS's APIs (Bedrock's Converse, SageMaker's InvokeEndpoint), which the
gateway calls through boto3 as a ``bedrock:`` or ``sagemaker:`` upstream. This module writes
the gateway config for the rung as planned (the same model id, endpoint name, region and wire
dialect the deploy command uses), the least IAM policy the gateway's role needs, and the
commands that start it and mint a key. Level 6 renders the gateway's manifests itself.
"""
from __future__ import annotations

import re
from typing import Any

from options.core.rungs import rung

GATEWAY_MODEL = "chat"          # the name clients send as "model"
BEDROCK_INVOKE = ("bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream")
SAGEMAKER_INVOKE = ("sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream")
# Cross-region inference profiles ("us.amazon.nova-lite-v1:0") route to the model in any of
# their regions, so the policy must allow the profile and the model everywhere it may land.
PROFILE_PREFIX = re.compile(r"^(us|eu|apac|us-gov|ca|jp|au|global)\.")


def bedrock_upstream(model_id: str, region: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The gateway upstream for a Bedrock model and the IAM statements it needs."""
    from cost.prices import UnknownName, load_prices

    upstream: dict[str, Any] = {"name": "bedrock", "weight": 100,
                                "bedrock": {"model_id": model_id, "region": region}}
    try:
        price = load_prices().bedrock(model_id)
        upstream["usd_per_mtok_input"] = price.input_per_million
        upstream["usd_per_mtok_output"] = price.output_per_million
    except UnknownName:
        pass  # the gateway meters tokens without dollars; `python -m cost bill` prices them later
    base = PROFILE_PREFIX.sub("", model_id)
    resources = [f"arn:aws:bedrock:{region}::foundation-model/{model_id}"]
    if base != model_id:
        resources = [f"arn:aws:bedrock:{region}:*:inference-profile/{model_id}",
                     f"arn:aws:bedrock:*::foundation-model/{base}"]
    return upstream, [{"Effect": "Allow", "Action": list(BEDROCK_INVOKE), "Resource": resources}]


def sagemaker_upstream(endpoint: str, dialect: str, region: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The gateway upstream for a SageMaker endpoint and the IAM statements it needs."""
    upstream = {"name": "sagemaker", "weight": 100,
                "sagemaker": {"endpoint": endpoint, "dialect": dialect, "region": region}}
    # SageMaker's endpoint ARNs are lower case whatever the name's case.
    arn = f"arn:aws:sagemaker:{region}:*:endpoint/{endpoint.lower()}"
    return upstream, [{"Effect": "Allow", "Action": list(SAGEMAKER_INVOKE), "Resource": [arn]}]


def gateway_front(level: int, upstream: dict[str, Any], statements: list[dict[str, Any]]) -> dict[str, Any]:
    """The config, policy and commands for a gateway whose one model is this rung."""
    config = {
        "store": "memory",
        "tenants": {"default": {"rpm": 60, "tpm": 20000, "max_concurrency": 4,
                                "models": [GATEWAY_MODEL]}},
        "models": {GATEWAY_MODEL: {"upstreams": [upstream]}},
    }
    return {
        "level": level,
        "rung": rung(level).name,
        "config": config,
        "iam_policy": {"Version": "2012-10-17", "Statement": statements},
        "commands": [
            "containers/gateway/serve --config gateway.yaml --port 8000",
            "containers/gateway/admin --config gateway.yaml keys create --tenant team-a --json",
            "curl http://127.0.0.1:8000/v1/chat/completions -H \"Authorization: Bearer $KEY\" "
            "-H 'content-type: application/json' "
            f"-d '{{\"model\": \"{GATEWAY_MODEL}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'",
        ],
        "notes": [
            "Save `config` as gateway.yaml; serve checks it and names any bad line.",
            "The gateway calls AWS with boto3's usual credentials: give its role `iam_policy`.",
            "One process keeps state in memory; for several workers or replicas set "
            "store: redis://HOST:6379/0 (more than one without Redis is refused at start-up).",
            "Add tenants with their rpm/tpm/max_concurrency/budget_usd_month, and a second "
            "upstream with a weight for a canary (docs/gateway.md).",
        ],
    }


def front_for(level: int, module: Any, spec: Any, args: Any) -> dict[str, Any]:
    """The gateway for the rung exactly as ``--plan`` would deploy it."""
    if level == 1:
        upstream, statements = bedrock_upstream(spec.model_id, spec.region)
    else:
        from options.sagemaker.plan import endpoint_name_of, region_of

        upstream, statements = sagemaker_upstream(endpoint_name_of(module.plan(spec)),
                                                  rung(level).can.dialect, region_of(args))
    return gateway_front(level, upstream, statements)


def render_text(front: dict[str, Any]) -> str:
    import json

    import yaml

    lines = [f"Gateway in front of level {front['level']} ({front['rung']})", "",
             "gateway.yaml:", yaml.safe_dump(front["config"], sort_keys=False).rstrip(), "",
             "IAM policy for the gateway's role:", json.dumps(front["iam_policy"], indent=2), "",
             "then:"]
    lines += [f"  {c}" for c in front["commands"]]
    lines += [""] + [f"- {n}" for n in front["notes"]]
    return "\n".join(lines)
