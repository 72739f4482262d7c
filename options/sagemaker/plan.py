"""The SageMaker endpoint levels 2–5 share, as a plan: what goes into the model, the endpoint
config and the endpoint (``endpoint_steps``), optional autoscaling, uploads, names, and the
hourly cost. Pure: nothing here calls AWS (``options.sagemaker.apply`` sends the steps).

Model and endpoint-config names carry a digest of their content, so a changed configuration
gets new names rather than a silent mismatch.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from options.core import BadInput
from options.plan import Plan, Step

VARIANT = "AllTraffic"
ACCOUNT_PLACEHOLDER = "<account-id>"
DEFAULT_ROLE_ARN = f"arn:aws:iam::{ACCOUNT_PLACEHOLDER}:role/SageMakerExecutionRole"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
_NAME_OK = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
MAX_NAME = 63

# ----------------------------------------------------------------------------------- specs

@dataclass
class Autoscaling:
    min_capacity: int
    max_capacity: int
    target_invocations_per_instance: float
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60


@dataclass
class EndpointSpec:
    """What every SageMaker rung sends, once the rung has decided image, env and artifacts."""
    level: int
    name: str                          # endpoint name; model and config names derive from it
    region: str
    instance_type: str                 # "ml.g5.xlarge"
    instance_count: int
    image_uri: str
    environment: dict[str, str]
    role_arn: str = DEFAULT_ROLE_ARN
    model_data_url: str | None = None              # a model.tar.gz (unpacked to /opt/ml/model)
    model_data_source: dict[str, Any] | None = None  # an uncompressed S3 prefix, or gated artifacts
    startup_health_check_timeout_s: int | None = None
    model_data_download_timeout_s: int | None = None
    volume_size_gb: int | None = None
    autoscaling: Autoscaling | None = None
    enable_network_isolation: bool = False


def validate_name(name: str) -> str:
    if not name or len(name) > MAX_NAME - 9 or not _NAME_OK.match(name):
        raise BadInput(f"--name {name!r} is not a usable endpoint name: use letters, digits and "
                       f"single hyphens, at most {MAX_NAME - 9} characters (e.g. spectrum-l3-mistral)")
    return name


def default_name(level: int, model: str) -> str:
    """spectrum-l3-mistral-7b-instruct-v0-3: readable, stable for the same model and level."""
    stem = re.sub(r"[^a-zA-Z0-9]+", "-", model.rstrip("/").split("/")[-1]).strip("-").lower()
    return f"spectrum-l{level}-{stem}"[:MAX_NAME - 9].rstrip("-")


def ml_instance(name: str) -> str:
    return name if name.startswith("ml.") else f"ml.{name}"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]


def scaling_resource_id(endpoint_name: str) -> str:
    return f"endpoint/{endpoint_name}/variant/{VARIANT}"

# ----------------------------------------------------------------------------------- what rungs share

# What the SageMaker rungs deploy when --model is not given on a cloud target: a small, ungated
# instruction model (the built-in tiny model has random weights: fine locally, pointless on a GPU).
CLOUD_DEFAULT_MODEL = "mistralai/Mistral-7B-Instruct-v0.3"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class ModelSource:
    """Where the weights come from: a local folder, a hub id, or the built-in tiny model."""
    path: Path | None = None
    hub_id: str | None = None

    @property
    def tiny(self) -> bool:
        return self.path is None and self.hub_id is None

    @property
    def label(self) -> str:
        if self.tiny:
            return "the built-in tiny model (random weights)"
        return str(self.path) if self.path else self.hub_id

    def local_folder(self) -> Path:
        """The folder to serve from on this machine (builds the tiny model on first use)."""
        if self.path:
            return self.path
        if self.tiny:
            from options.tiny_model import tiny_model_dir
            return tiny_model_dir()
        raise BadInput(f"--model {self.hub_id!r} is a hub id; this step needs a local folder "
                       f"holding config.json and the weights")


def model_source(model: str | None, *, cloud: bool) -> ModelSource:
    """--model → ModelSource; a path that does not exist, or a folder without config.json, exits 2."""
    if model is None:
        return ModelSource(hub_id=CLOUD_DEFAULT_MODEL) if cloud else ModelSource()
    path = Path(model).expanduser()
    if path.exists() or model.startswith(("/", ".", "~")) or not _HUB_ID.match(model):
        if not path.is_dir():
            raise BadInput(f"--model {model!r}: no such folder here, and not a hub id: give a folder "
                           f"holding config.json and the weights, or a hub id such as "
                           f"{CLOUD_DEFAULT_MODEL}")
        if not (path / "config.json").is_file():
            raise BadInput(f"--model {model!r} has no config.json: give the folder a Hugging Face "
                           f"model was saved to (config.json, tokenizer, *.safetensors)")
        return ModelSource(path=path.resolve())
    return ModelSource(hub_id=model)


def model_files(folder: Path) -> list[Path]:
    """The files a model folder ships: not hidden caches, not lock files."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock"
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def upload_model_folder(name: str, region: str, folder: Path) -> tuple[list[Step], dict[str, Any]]:
    """Steps that copy a local model folder to S3, and the ModelDataSource that mounts it at /opt/ml/model."""
    bucket = default_bucket(region)
    prefix = f"{name}/model/"
    steps = upload_steps(bucket, region, [(p, prefix + p.relative_to(folder).as_posix())
                                          for p in model_files(folder)])
    source = {"S3DataSource": {"S3Uri": f"s3://{bucket}/{prefix}", "S3DataType": "S3Prefix",
                               "CompressionType": "None"}}
    return steps, source


def add_endpoint_arguments(group) -> None:
    """Flags every SageMaker rung takes (beyond the shared ones in options/deploy.py)."""
    group.add_argument("--role-arn", metavar="ARN", default=os.environ.get("SAGEMAKER_ROLE_ARN"),
                       help="IAM role SageMaker assumes to pull the image and artifacts "
                            "(default: $SAGEMAKER_ROLE_ARN, else "
                            "arn:aws:iam::<your account>:role/SageMakerExecutionRole), e.g. "
                            "--role-arn arn:aws:iam::123456789012:role/MySageMakerRole")


def is_cloud_run(args) -> bool:
    return bool(args.plan or args.status or args.down or args.target != "local")


def region_of(args) -> str:
    return args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") \
        or "us-east-1"


def endpoint_basics(args, level: int, model_label: str, default_instance: str) -> dict[str, Any]:
    """name, region, instance type (checked against the catalogue), count and role from the flags."""
    instance_type = ml_instance(args.instance_type or default_instance)
    instance_info(instance_type)  # unknown names exit 2, naming the closest known ones
    if args.instance_count < 1:
        raise BadInput(f"--instance-count {args.instance_count} must be at least 1")
    return {"name": validate_name(args.name or default_name(level, model_label)),
            "region": region_of(args), "instance_type": instance_type,
            "instance_count": args.instance_count,
            "role_arn": getattr(args, "role_arn", None) or DEFAULT_ROLE_ARN}

# ----------------------------------------------------------------------------------- plan

def endpoint_steps(spec: EndpointSpec) -> list[Step]:
    """CreateModel → CreateEndpointConfig → CreateEndpoint (→ autoscaling), each with its undo."""
    container: dict[str, Any] = {"Image": spec.image_uri, "Environment": dict(spec.environment)}
    if spec.model_data_url:
        container["ModelDataUrl"] = spec.model_data_url
    if spec.model_data_source:
        container["ModelDataSource"] = spec.model_data_source
    model_name = f"{spec.name}-{_digest(container)}"
    model_params: dict[str, Any] = {"ModelName": model_name, "PrimaryContainer": container,
                                    "ExecutionRoleArn": spec.role_arn,
                                    "Tags": [{"Key": "spectrum:level", "Value": str(spec.level)},
                                             {"Key": "spectrum:endpoint", "Value": spec.name}]}
    if spec.enable_network_isolation:
        model_params["EnableNetworkIsolation"] = True

    variant: dict[str, Any] = {"VariantName": VARIANT, "ModelName": model_name,
                               "InstanceType": ml_instance(spec.instance_type),
                               "InitialInstanceCount": spec.instance_count}
    if spec.startup_health_check_timeout_s:
        variant["ContainerStartupHealthCheckTimeoutInSeconds"] = spec.startup_health_check_timeout_s
    if spec.model_data_download_timeout_s:
        variant["ModelDataDownloadTimeoutInSeconds"] = spec.model_data_download_timeout_s
    if spec.volume_size_gb:
        variant["VolumeSizeInGB"] = spec.volume_size_gb
    config_name = f"{spec.name}-{_digest(variant)}"

    steps = [
        Step("sagemaker", "CreateModel", model_params,
             undo=Step("sagemaker", "DeleteModel", {"ModelName": model_name}),
             description=f"model {model_name}: the image, its environment and artifacts"),
        Step("sagemaker", "CreateEndpointConfig",
             {"EndpointConfigName": config_name, "ProductionVariants": [variant]},
             undo=Step("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": config_name}),
             description=f"endpoint config {config_name}: {spec.instance_count} × "
                         f"{ml_instance(spec.instance_type)}"),
        Step("sagemaker", "CreateEndpoint",
             {"EndpointName": spec.name, "EndpointConfigName": config_name},
             undo=Step("sagemaker", "DeleteEndpoint", {"EndpointName": spec.name}),
             description=f"endpoint {spec.name} (waits for InService)"),
    ]
    if spec.autoscaling:
        steps += autoscaling_steps(spec.name, spec.autoscaling)
    return steps


def autoscaling_steps(endpoint_name: str, scaling: Autoscaling) -> list[Step]:
    """Target tracking on invocations per instance, through application-autoscaling."""
    target = {"ServiceNamespace": "sagemaker", "ResourceId": scaling_resource_id(endpoint_name),
              "ScalableDimension": SCALABLE_DIMENSION}
    policy_name = f"{endpoint_name}-invocations-per-instance"
    return [
        Step("application-autoscaling", "RegisterScalableTarget",
             {**target, "MinCapacity": scaling.min_capacity, "MaxCapacity": scaling.max_capacity},
             undo=Step("application-autoscaling", "DeregisterScalableTarget", dict(target)),
             description=f"autoscaling between {scaling.min_capacity} and {scaling.max_capacity} instances"),
        Step("application-autoscaling", "PutScalingPolicy",
             {**target, "PolicyName": policy_name, "PolicyType": "TargetTrackingScaling",
              "TargetTrackingScalingPolicyConfiguration": {
                  "TargetValue": float(scaling.target_invocations_per_instance),
                  "PredefinedMetricSpecification": {
                      "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
                  "ScaleInCooldown": scaling.scale_in_cooldown_s,
                  "ScaleOutCooldown": scaling.scale_out_cooldown_s}},
             undo=Step("application-autoscaling", "DeleteScalingPolicy",
                       {**target, "PolicyName": policy_name}),
             description=f"target {scaling.target_invocations_per_instance:g} invocations "
                         f"per instance per minute"),
    ]


def upload_steps(bucket: str, region: str, files: list[tuple[Path, str]]) -> list[Step]:
    """CreateBucket (if missing) and one PutObject per file; Body is ``file://`` + local path."""
    create: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
        create["CreateBucketConfiguration"] = {"LocationConstraint": region}
    steps = [Step("s3", "CreateBucket", create, undo=Step("s3", "DeleteBucket", {"Bucket": bucket}),
                  description=f"bucket {bucket} for the model artifacts")]
    for path, key in files:
        steps.append(Step("s3", "PutObject", {"Bucket": bucket, "Key": key, "Body": f"file://{path}"},
                          undo=Step("s3", "DeleteObject", {"Bucket": bucket, "Key": key}),
                          description=f"upload {path.name}"))
    return steps


def default_bucket(region: str) -> str:
    return f"spectrum-artifacts-{region}-{ACCOUNT_PLACEHOLDER}"


def cost_line(instance_type: str, count: int) -> dict[str, Any]:
    """The hourly cost line from cost/ (SageMaker price of the instance type)."""
    import cost

    return cost.hourly_cost_line(ml_instance(instance_type), count=count, platform="sagemaker")


def instance_info(instance_type: str):
    """The instance catalogue row (GPUs, GPU memory, prices); unknown names exit 2 naming near ones."""
    from cost.prices import load_prices

    return load_prices().instance(ml_instance(instance_type))


def endpoint_name_of(plan: Plan) -> str:
    for step in plan.steps:
        if step.operation == "CreateEndpoint":
            return step.params["EndpointName"]
    raise ValueError("plan has no CreateEndpoint step")

def main_param(step: Step) -> str:
    """The name of what a request acts on, for one-line progress and tables."""
    for key in ("EndpointName", "EndpointConfigName", "ModelName", "repositoryName", "Key",
                "Bucket", "PolicyName", "ResourceId"):
        if key in step.params:
            return str(step.params[key])
    return ""
