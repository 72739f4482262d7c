"""Level 2: a JumpStart model: AWS's image, AWS's artifacts, your account's endpoint.

A JumpStart model id resolves — through the SageMaker Python SDK (v2, imported only here) —
to the image URI, environment, artifact location and default instance type JumpStart
publishes for it. The SDK reads the live JumpStart manifest for ``--target aws``; plans and
the emulator read the small copy shipped in ``specs/`` (``--specs`` chooses). Gated models
(those with a licence to accept) need ``--accept-eula``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from options.sagemaker import plan as sm
from options.core import BadInput
from options.plan import Plan
# apply / invoke / status / down are the same for every SageMaker endpoint rung.
from options.sagemaker.apply import rung_apply as apply, rung_down as down, rung_invoke as invoke, \
    rung_status as status  # noqa: F401

LEVEL = 2
DEFAULT_MODEL = "huggingface-llm-mistral-7b-instruct"
SPECS_DIR = Path(__file__).with_name("specs")
SDK_CONFIG = Path(__file__).with_name("sdk-config.yaml")
MANIFEST_ENV = "AWS_JUMPSTART_MANIFEST_LOCAL_ROOT_DIR_OVERRIDE"
SPECS_ENV = "AWS_JUMPSTART_SPECS_LOCAL_ROOT_DIR_OVERRIDE"


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--accept-eula", action="store_true",
                       help="accept the licence of a gated model (e.g. Llama); required for them, "
                            "e.g. --model meta-textgeneration-llama-3-8b-instruct --accept-eula")
    group.add_argument("--model-version", default="*", metavar="V",
                       help="JumpStart model version (default: the newest), e.g. --model-version 3.0.0")
    group.add_argument("--specs", choices=("bundled", "live"),
                       help="where JumpStart specs come from: the copy shipped with Spectrum "
                            "(default for --plan and the emulator; works offline) or JumpStart's "
                            "live manifest (default for --target aws), e.g. --specs live")
    sm.add_endpoint_arguments(group)


@dataclass
class JumpStartSpec:
    name: str
    model_id: str
    model_version: str
    specs_from: str
    endpoint: sm.EndpointSpec
    eula_url: str | None = None


def _use_specs(source: str) -> None:
    """Point the SDK at the bundled specs (or not), and opt out of its telemetry, before import."""
    os.environ.setdefault("SAGEMAKER_USER_CONFIG_OVERRIDE", str(SDK_CONFIG))
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    if source == "bundled":
        os.environ[MANIFEST_ENV] = os.environ[SPECS_ENV] = str(SPECS_DIR)
    for name in ("sagemaker.config", "sagemaker.jumpstart", "sagemaker"):
        logging.getLogger(name).setLevel(logging.ERROR)


def bundled_model_ids() -> list[str]:
    return sorted({m["model_id"] for m in json.loads((SPECS_DIR / "models_manifest.json").read_text())})


def resolve(model_id: str, version: str, region: str, instance_type: str | None,
            specs_from: str) -> dict[str, Any]:
    """Image, env, artifacts and instance type for a JumpStart model, through the SDK."""
    _use_specs(specs_from)
    if specs_from == "bundled" and model_id not in bundled_model_ids():
        raise BadInput(f"JumpStart model {model_id!r} is not in the bundled specs: choose one of "
                       f"{', '.join(bundled_model_ids())}, or use --specs live (needs network)")
    try:
        import boto3
        import sagemaker
        from sagemaker import environment_variables, image_uris, instance_types, model_uris
        from sagemaker.jumpstart.enums import JumpStartScriptScope
        from sagemaker.jumpstart.utils import verify_model_region_and_return_specs
    except ImportError as exc:
        raise BadInput("level 2 needs the SageMaker Python SDK v2: pip install 'spectrum[sdk]'") from exc

    session = sagemaker.Session(boto_session=boto3.Session(region_name=region))
    common = {"region": region, "model_id": model_id, "model_version": version,
              "sagemaker_session": session}
    try:
        specs = verify_model_region_and_return_specs(scope="inference", version=version, **{
            k: v for k, v in common.items() if k != "model_version"})
        instance = sm.ml_instance(instance_type) if instance_type else \
            instance_types.retrieve_default(scope="inference", **common)
        supported = specs.supported_inference_instance_types or []
        if supported and instance not in supported:
            raise BadInput(f"--instance-type {instance} is not one JumpStart supports for {model_id}: "
                           f"choose one of {', '.join(supported)}")
        return {
            "specs": specs, "instance_type": instance,
            "image_uri": image_uris.retrieve(framework=None, image_scope="inference",
                                             instance_type=instance, **common),
            "artifacts": model_uris.retrieve(model_scope="inference", instance_type=instance, **common),
            "environment": environment_variables.retrieve_default(
                instance_type=instance, script=JumpStartScriptScope.INFERENCE, **common),
        }
    except BadInput:
        raise
    except (KeyError, ValueError) as exc:
        known = f" Bundled: {', '.join(bundled_model_ids())}." if specs_from == "bundled" else ""
        raise BadInput(f"JumpStart can't resolve model {model_id!r} version {version!r} in "
                       f"{region}: {exc}.{known}") from exc


def spec_from_args(args: argparse.Namespace) -> JumpStartSpec:
    specs_from = args.specs or ("live" if args.target == "aws" and not args.plan else "bundled")
    model_id = args.model or DEFAULT_MODEL
    region = sm.region_of(args)
    found = resolve(model_id, args.model_version, region, args.instance_type, specs_from)
    specs = found["specs"]
    args.instance_type = found["instance_type"]
    basics = sm.endpoint_basics(args, LEVEL, model_id, found["instance_type"])

    eula_url = None
    artifacts = found["artifacts"]
    data_source: dict[str, Any] | None = None
    data_url: str | None = None
    if artifacts.endswith("/"):
        data_source = {"S3DataSource": {"S3Uri": artifacts, "S3DataType": "S3Prefix",
                                        "CompressionType": "None"}}
    else:
        data_url = artifacts
    if specs.hosting_eula_key:
        eula_url = (f"https://jumpstart-cache-prod-{region}.s3.{region}.amazonaws.com/"
                    f"{specs.hosting_eula_key}")
        if not args.accept_eula:
            raise BadInput(f"{model_id} is a gated model: read its licence at {eula_url} and, if you "
                           f"accept it, add --accept-eula")
        if data_source is None:
            raise BadInput(f"{model_id}: gated artifacts must be an S3 prefix, got {artifacts}")
        data_source["S3DataSource"]["ModelAccessConfig"] = {"AcceptEula": True}
    deploy_kwargs = specs.deploy_kwargs or {}
    endpoint = sm.EndpointSpec(
        level=LEVEL, image_uri=found["image_uri"], environment=dict(found["environment"]),
        model_data_url=data_url, model_data_source=data_source,
        startup_health_check_timeout_s=deploy_kwargs.get("container_startup_health_check_timeout"),
        model_data_download_timeout_s=deploy_kwargs.get("model_data_download_timeout"),
        enable_network_isolation=bool(specs.inference_enable_network_isolation), **basics)
    return JumpStartSpec(basics["name"], model_id, specs.version, specs_from, endpoint, eula_url)


def plan(spec: JumpStartSpec) -> Plan:
    e = spec.endpoint
    notes = [f"JumpStart model {spec.model_id} version {spec.model_version} "
             f"(specs: {'bundled copy, ' + str(SPECS_DIR) if spec.specs_from == 'bundled' else 'live manifest'})"]
    if spec.eula_url:
        notes.append(f"gated model: licence accepted with --accept-eula ({spec.eula_url})")
    return Plan(LEVEL, sm.endpoint_steps(e), cost=sm.cost_line(e.instance_type, e.instance_count),
                notes=notes)


def run_local(spec: JumpStartSpec, args: argparse.Namespace) -> int:
    """JumpStart runs AWS's image on AWS's GPUs: locally there is only the plan to show."""
    from options.local_target import print_local_only

    return print_local_only(plan(spec), args,
                            "JumpStart serves AWS's own image and artifacts on SageMaker; nothing of it "
                            "runs on this machine. Deploy with --target aws, or try the whole "
                            "lifecycle on a local AWS with --target emulator.")
