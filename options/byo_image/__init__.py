"""Level 5: your own serving image (containers/byo-vllm) behind a SageMaker endpoint.

The image is the project's bring-your-own vLLM server: ``/ping`` and ``/invocations`` on 8080.
On the cloud: an ECR repository, the image built and pushed there (when a Docker daemon runs
here; otherwise the exact commands are printed and ``--image-uri`` continues from an image you
pushed), then a SageMaker model from that image. Locally: the same server, started from its
own entrypoint script, with the same environment the image gets.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from options.sagemaker import components, is_cloud_run, plan as sm
from options.core import BadInput, mask_secrets
from options.plan import Plan, Step
# apply / invoke / status / down are the same for every SageMaker endpoint rung.
from options.sagemaker.apply import rung_apply as apply, rung_down as down, rung_invoke as invoke, \
    rung_status as status  # noqa: F401

LEVEL = 5
DEFAULT_INSTANCE = "ml.g5.xlarge"
REPOSITORY = "spectrum-byo-vllm"
BUILD_CONTEXT = Path(__file__).resolve().parents[2] / "containers" / "byo-vllm"
# Env the server reads as-is; anything else given with --option becomes an SM_VLLM_* engine flag.
PASS_THROUGH = ("SM_VLLM_", "OPTION_", "HF_", "SM_NUM_GPUS", "VLLM_", "SPECTRUM_")


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--image-uri", metavar="URI",
                       help="an image already in ECR: skip the build and push, e.g. "
                            "--image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0")
    group.add_argument("--image-tag", default=_project_version(), metavar="TAG",
                       help=f"tag to build and push (default {_project_version()}), e.g. --image-tag dev")
    group.add_argument("--multi-model", metavar="S3_PREFIX",
                       help="a CPU multi-model endpoint (Mode MultiModel) over the model archives "
                            "under this S3 prefix; --adapter NAME picks TargetModel NAME.tar.gz there. "
                            "CPU instances only: GPU multi-model endpoints need AWS's Triton image, so "
                            "on GPUs use --adapter NAME=s3://... (inference components). "
                            "e.g. --multi-model s3://my-bucket/models/ --instance-type ml.m6i.xlarge")
    sm.add_endpoint_arguments(group)


def _project_version() -> str:
    try:
        from importlib.metadata import version
        return version("spectrum")
    except Exception:
        return "0.1.0"


def server_env(options: list[str]) -> dict[str, str]:
    """``--option`` values → the server's env: SM_VLLM_*/OPTION_*/HF_* as given, else SM_VLLM_<KEY>."""
    env: dict[str, str] = {}
    for pair in options or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"--option {pair!r} is not KEY=VALUE: e.g. --option max_model_len=4096 "
                           f"(a vLLM engine argument) or --option SM_VLLM_MAX_MODEL_LEN=4096")
        if key.upper().startswith(PASS_THROUGH):
            env[key] = value.strip()
        else:
            env["SM_VLLM_" + key.upper().replace("-", "_")] = value.strip()
    return env


@dataclass
class ByoImageSpec:
    name: str
    source: sm.ModelSource
    env: dict[str, str]
    endpoint: sm.EndpointSpec | None = None
    pre_steps: list[Step] = field(default_factory=list)   # ECR, build/push, uploads


def build_and_push_steps(region: str, tag: str) -> tuple[list[Step], str]:
    if not (BUILD_CONTEXT / "Dockerfile").is_file():
        # An installed wheel carries the server's package (byo_vllm) but not its Dockerfile: a
        # plan naming a build folder that is not there would fail only when run.
        raise BadInput(f"level 5 builds its image from a Spectrum checkout's containers/byo-vllm, and "
                       f"{BUILD_CONTEXT} is not one (this is an installed copy): run the command from "
                       f"a checkout of the repository, or pass --image-uri URI of the image you built "
                       f"and pushed from one")
    registry = f"{sm.ACCOUNT_PLACEHOLDER}.dkr.ecr.{region}.amazonaws.com"
    image = f"{registry}/{REPOSITORY}:{tag}"
    commands = [
        f"docker build -t {REPOSITORY}:{tag} {BUILD_CONTEXT}",
        f"aws ecr get-login-password --region {region} | docker login --username AWS --password-stdin {registry}",
        f"docker tag {REPOSITORY}:{tag} {image}",
        f"docker push {image}",
    ]
    steps = [Step("ecr", "CreateRepository",
                  {"repositoryName": REPOSITORY, "imageScanningConfiguration": {"scanOnPush": True},
                   "imageTagMutability": "MUTABLE"},
                  undo=Step("ecr", "DeleteRepository", {"repositoryName": REPOSITORY, "force": True}),
                  description=f"ECR repository {REPOSITORY}")]
    steps.append(Step("docker", "BuildAndPush", {"command": " && ".join(commands), "all_commands": commands},
                      description=f"build {BUILD_CONTEXT.name} and push {image}"))
    return steps, image


def spec_from_args(args: argparse.Namespace) -> ByoImageSpec:
    cloud = is_cloud_run(args)
    source = sm.model_source(args.model, cloud=cloud)
    env = server_env(args.option)
    if not cloud:
        components.refuse_locally(args)
        return ByoImageSpec(args.name or "local", source, env)
    basics = sm.endpoint_basics(args, LEVEL, source.hub_id or str(source.path), DEFAULT_INSTANCE,
                                serves_adapters=True)
    instance = sm.instance_info(basics["instance_type"])
    gpus = instance.gpus
    many = components.endpoint_fields(args, basics["name"], instance)
    if many.get("components") and many["components"].adapters or many.get("multi_model_prefix"):
        env.setdefault("SM_VLLM_ENABLE_LORA", "true")   # adapters reach vLLM as LoRA
    if many.get("multi_model_prefix") and source.path:
        raise BadInput(f"--model {str(source.path)!r} with --multi-model: a multi-model container "
                       f"reads only the archives under {many['multi_model_prefix']}, so the base "
                       f"model comes from a hub id (HF_MODEL_ID), e.g. --model {sm.CLOUD_DEFAULT_MODEL}")
    pre: list[Step] = []
    if args.image_uri:
        image = args.image_uri
    else:
        pre, image = build_and_push_steps(basics["region"], args.image_tag)
    env = {**env, "SM_NUM_GPUS": str(gpus)}
    data_source = None
    if source.path:
        uploads, data_source = sm.upload_model_folder(basics["name"], basics["region"], source.path)
        pre += uploads
    else:
        env["HF_MODEL_ID"] = source.hub_id
    from options.lmi.config import model_shape, startup_timeout_s
    shape = model_shape(source.hub_id or "", source.path, {})
    weights = shape.weights(2, None)
    endpoint = sm.EndpointSpec(level=LEVEL, image_uri=image, environment=env,
                               model_data_source=data_source,
                               startup_health_check_timeout_s=startup_timeout_s(
                                   weights / 1024 ** 3 if weights else None), **basics, **many)
    return ByoImageSpec(basics["name"], source, env, endpoint, pre)


def plan(spec: ByoImageSpec) -> Plan:
    e = spec.endpoint
    notes = [f"model: {spec.source.label}"]
    if any(s.service == "docker" for s in spec.pre_steps):
        notes.append("the image is built here and pushed when a Docker daemon runs; otherwise the "
                     "commands are printed and --image-uri continues from an image you pushed")
    return sm.endpoint_plan(LEVEL, spec.pre_steps, e, notes)


@contextmanager
def local_server(spec: ByoImageSpec) -> Iterator[tuple[dict[str, str], str]]:
    """The image's own server environment, and what it is."""
    env = dict(spec.env)
    if spec.source.hub_id:
        env["HF_MODEL_ID"] = spec.source.hub_id
    else:
        env["SM_VLLM_MODEL"] = str(spec.source.local_folder())
    shown = " ".join(f"{k}={v}" for k, v in mask_secrets(env).items() if k != "SM_VLLM_MODEL") \
        or "(defaults)"
    yield env, f"the image's own server with {shown}"


def run_local(spec: ByoImageSpec, args: argparse.Namespace) -> int:
    from options.local_target import serve_rung_locally
    return serve_rung_locally(LEVEL, local_server(spec), args, spec.source)
