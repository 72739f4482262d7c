"""The SageMaker endpoint machinery levels 2–5 share: plan steps, apply, wait, roll back, status, down.

A SageMaker real-time endpoint is three resources made in order — a model (image + env +
artifacts), an endpoint config (instance type and count) and the endpoint — plus, optionally,
an application-autoscaling target and policy on its variant. Each rung only decides *what*
goes into the model; this module turns that into requests (``endpoint_steps``), sends them
(``apply_plan``), and removes them (``down``).

Guarantees:
- idempotent: a step whose resource already exists (same name, same content) is skipped, so
  running the same command twice creates nothing twice. Model and endpoint-config names carry
  a digest of their content, so a changed configuration gets new names rather than a silent
  mismatch.
- no half-built endpoints: if any request fails, or the endpoint ends ``Failed``, everything
  this run created is deleted in reverse order and the cause (``FailureReason``) is reported.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from options.core import BadInput, rung
from options.plan import Deployment, Plan, Step

VARIANT = "AllTraffic"
ACCOUNT_PLACEHOLDER = "<account-id>"
DEFAULT_ROLE_ARN = f"arn:aws:iam::{ACCOUNT_PLACEHOLDER}:role/SageMakerExecutionRole"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
_NAME_OK = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
MAX_NAME = 63

Progress = Callable[[str], None]
# Progress goes to stdout, or to stderr when --json owns stdout. A flag, not a stream object:
# the stream is looked up at each print, so a replaced sys.stdout/stderr is always honoured.
_progress_to_stderr = False


def progress_to_stderr(on: bool) -> None:
    global _progress_to_stderr
    _progress_to_stderr = on


def say(text: str) -> None:
    import sys
    print(text, file=sys.stderr if _progress_to_stderr else sys.stdout, flush=True)


class DeployFailed(RuntimeError):
    """A cloud request failed or the endpoint ended Failed; what this run created was removed."""


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


# ----------------------------------------------------------------------------------- apply

def _resolve_account(obj: Any, account: str) -> Any:
    if isinstance(obj, str):
        return obj.replace(ACCOUNT_PLACEHOLDER, account)
    if isinstance(obj, dict):
        return {k: _resolve_account(v, account) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve_account(v, account) for v in obj]
    return obj


def resolve_plan(plan: Plan, target) -> list[Step]:
    """The plan's steps with ``<account-id>`` filled in from the target's STS identity."""
    if not any(ACCOUNT_PLACEHOLDER in json.dumps(s.params) for s in plan.steps):
        return list(plan.steps)
    account = target.account_id()

    def fill(step: Step | None) -> Step | None:
        if step is None:
            return None
        return Step(step.service, step.operation, _resolve_account(step.params, account),
                    fill(step.undo), _resolve_account(step.description, account))
    return [fill(s) for s in plan.steps]


def _error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""


class _Clients:
    def __init__(self, target):
        self.target = target
        self._made: dict[str, Any] = {}

    def __call__(self, service: str):
        if service not in self._made:
            self._made[service] = self.target.client(service)
        return self._made[service]


def send(clients: _Clients, step: Step) -> dict:
    """Send one step through boto3 (operation names as AWS spells them)."""
    from botocore import xform_name

    params = dict(step.params)
    if step.operation == "PutObject" and str(params.get("Body", "")).startswith("file://"):
        with open(params["Body"][len("file://"):], "rb") as body:
            params["Body"] = body
            return clients(step.service).put_object(**params)
    return getattr(clients(step.service), xform_name(step.operation))(**params)


def _exists(clients: _Clients, step: Step) -> bool:
    """Does the resource this step would create already exist with this content?"""
    p = step.params
    sm = lambda: clients("sagemaker")  # noqa: E731
    try:
        if step.operation == "CreateModel":
            sm().describe_model(ModelName=p["ModelName"])
        elif step.operation == "CreateEndpointConfig":
            sm().describe_endpoint_config(EndpointConfigName=p["EndpointConfigName"])
        elif step.operation == "CreateEndpoint":
            found = sm().describe_endpoint(EndpointName=p["EndpointName"])
            if found["EndpointConfigName"] != p["EndpointConfigName"]:
                raise DeployFailed(
                    f"endpoint {p['EndpointName']} already exists with endpoint config "
                    f"{found['EndpointConfigName']}, and this run's configuration differs "
                    f"({p['EndpointConfigName']}). Remove it first (--down) or choose another --name.")
            if found["EndpointStatus"] == "Failed":
                raise DeployFailed(f"endpoint {p['EndpointName']} exists from an earlier run and is "
                                   f"Failed ({found.get('FailureReason', 'no reason given')}): "
                                   f"remove it with --down, then run again")
        elif step.operation == "CreateBucket":
            clients("s3").head_bucket(Bucket=p["Bucket"])
        elif step.operation == "PutObject":
            head = clients("s3").head_object(Bucket=p["Bucket"], Key=p["Key"])
            local = Path(p["Body"][len("file://"):])
            return head["ETag"].strip('"') == hashlib.md5(local.read_bytes()).hexdigest()
        elif step.operation == "CreateRepository":
            clients("ecr").describe_repositories(repositoryNames=[p["repositoryName"]])
        elif step.operation == "RegisterScalableTarget":
            found = clients("application-autoscaling").describe_scalable_targets(
                ServiceNamespace=p["ServiceNamespace"], ResourceIds=[p["ResourceId"]],
                ScalableDimension=p["ScalableDimension"])["ScalableTargets"]
            return any(t["MinCapacity"] == p["MinCapacity"] and t["MaxCapacity"] == p["MaxCapacity"]
                       for t in found)
        elif step.operation == "PutScalingPolicy":
            found = clients("application-autoscaling").describe_scaling_policies(
                ServiceNamespace=p["ServiceNamespace"], ResourceId=p["ResourceId"],
                PolicyNames=[p["PolicyName"]])["ScalingPolicies"]
            want = p["TargetTrackingScalingPolicyConfiguration"]
            return any(f.get("TargetTrackingScalingPolicyConfiguration", {}).get("TargetValue")
                       == want["TargetValue"] for f in found)
        else:
            return False
        return True
    except DeployFailed:
        raise
    except Exception as exc:  # botocore ClientError: not found (codes differ per service)
        code = _error_code(exc)
        if code and ("NotFound" in code or code in ("404", "NoSuchBucket", "NoSuchKey",
                                                     "ValidationException")):
            return False
        raise


def wait_in_service(sagemaker, endpoint_name: str, progress: Progress, poll_s: float,
                    timeout_s: float) -> float:
    """Poll DescribeEndpoint until InService; Failed raises with its FailureReason."""
    start = time.monotonic()
    last = None
    while True:
        found = sagemaker.describe_endpoint(EndpointName=endpoint_name)
        status = found["EndpointStatus"]
        elapsed = time.monotonic() - start
        if status != last or elapsed >= 60 and int(elapsed) % 60 < poll_s:
            progress(f"  endpoint {endpoint_name}: {status} ({elapsed:.0f} s)")
            last = status
        if status == "InService":
            return elapsed
        if status in ("Failed", "OutOfService", "RollingBack"):
            raise DeployFailed(f"endpoint {endpoint_name} is {status}: "
                               f"{found.get('FailureReason', 'SageMaker gave no FailureReason')}")
        if elapsed > timeout_s:
            raise DeployFailed(f"endpoint {endpoint_name} still {status} after {elapsed:.0f} s "
                               f"(limit {timeout_s:.0f} s)")
        time.sleep(poll_s)


def _wait_deleted(sagemaker, endpoint_name: str, poll_s: float, timeout_s: float = 1800) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            status = sagemaker.describe_endpoint(EndpointName=endpoint_name)["EndpointStatus"]
        except Exception as exc:
            if _error_code(exc) == "ValidationException":  # "Could not find endpoint"
                return
            raise
        if status == "Failed":
            return
        time.sleep(poll_s)


def docker_available() -> bool:
    import shutil

    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def apply_plan(plan: Plan, target, progress: Progress = say, *, poll_s: float | None = None,
               timeout_s: float = 3600) -> Deployment:
    """Send the plan's steps in order; on any failure remove what this run created, newest first."""
    clients = _Clients(target)
    steps = resolve_plan(plan, target)
    poll_s = poll_s if poll_s is not None else (15.0 if target.kind == "aws" else 0.2)
    done: list[Step] = []
    deployment = Deployment(plan.level, endpoint_name_of(plan), target, rung(plan.level).can.dialect)
    start = time.monotonic()
    try:
        for step in steps:
            label = step.description or f"{step.service} {step.operation}"
            if step.service == "docker":
                _run_docker_step(step, target, progress)
                continue
            if _exists(clients, step):
                progress(f"= {step.operation}: {label} (already there, kept)")
                deployment.reused.append(label)
            else:
                send(clients, step)
                done.append(step)
                deployment.created.append(label)
                progress(f"+ {step.operation}: {label}")
            if step.operation == "CreateEndpoint":
                wait_in_service(clients("sagemaker"), step.params["EndpointName"], progress,
                                poll_s, timeout_s)
    except BaseException as exc:
        cause = exc if isinstance(exc, DeployFailed) else DeployFailed(_describe_error(exc))
        progress(f"! {cause}")
        _rollback(clients, done, progress, poll_s)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise cause from exc
    deployment.elapsed_s = time.monotonic() - start
    return deployment


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    code = _error_code(exc)
    return f"{code}: {exc}" if code else f"{type(exc).__name__}: {exc}"


def _rollback(clients: _Clients, done: list[Step], progress: Progress, poll_s: float) -> None:
    if not done:
        progress("  nothing was created by this run")
        return
    progress(f"  rolling back the {len(done)} resource(s) this run created, newest first")
    for step in reversed(done):
        if step.undo is None:
            continue
        try:
            if step.undo.operation == "DeleteEndpoint":
                _wait_settled(clients("sagemaker"), step.params["EndpointName"], poll_s)
            send(clients, step.undo)
            if step.undo.operation == "DeleteEndpoint":
                _wait_deleted(clients("sagemaker"), step.params["EndpointName"], poll_s)
            progress(f"- {step.undo.operation} {main_param(step.undo)}")
        except Exception as exc:  # keep going: remove as much as possible, say what is left
            progress(f"  could not {step.undo.operation} {main_param(step.undo)}: "
                     f"{_describe_error(exc)} — remove it with --down")


def _wait_settled(sagemaker, endpoint_name: str, poll_s: float, timeout_s: float = 1800) -> None:
    """SageMaker refuses to delete an endpoint while it is Creating/Updating."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            status = sagemaker.describe_endpoint(EndpointName=endpoint_name)["EndpointStatus"]
        except Exception:
            return
        if status not in ("Creating", "Updating", "SystemUpdating"):
            return
        time.sleep(poll_s)


def main_param(step: Step) -> str:
    """The name of what a request acts on, for one-line progress and tables."""
    for key in ("EndpointName", "EndpointConfigName", "ModelName", "repositoryName", "Key",
                "Bucket", "PolicyName", "ResourceId"):
        if key in step.params:
            return str(step.params[key])
    return ""


def _run_docker_step(step: Step, target, progress: Progress) -> None:
    command = step.params["command"]
    if docker_available():
        progress(f"$ {command}")
        if subprocess.run(command, shell=True).returncode != 0:
            raise DeployFailed(f"this command failed: {command}")
        return
    if target.kind == "emulator":
        progress(f"  skipped (no Docker daemon here; the emulator does not check images): {command}")
        return
    raise DeployFailed("no Docker daemon is running here, so the image can't be built and pushed. "
                       "Run on a machine with Docker:\n    " + "\n    ".join(
                           step.params.get("all_commands", [command]))
                       + "\nthen re-run this command with --image-uri URI")


# ----------------------------------------------------------------------------------- status / down

def status(endpoint_name: str, target) -> dict[str, Any]:
    sm = target.client("sagemaker")
    try:
        found = sm.describe_endpoint(EndpointName=endpoint_name)
    except Exception as exc:
        if _error_code(exc) == "ValidationException":
            return {"endpoint": endpoint_name, "status": "absent", "target": target.describe()}
        raise
    out: dict[str, Any] = {"endpoint": endpoint_name, "status": found["EndpointStatus"],
                           "endpoint_config": found["EndpointConfigName"],
                           "created": str(found.get("CreationTime", "")),
                           "target": target.describe()}
    if found.get("FailureReason"):
        out["failure_reason"] = found["FailureReason"]
    try:
        config = sm.describe_endpoint_config(EndpointConfigName=found["EndpointConfigName"])
        out["variants"] = [{"model": v["ModelName"], "instance_type": v.get("InstanceType"),
                            "initial_instance_count": v.get("InitialInstanceCount")}
                           for v in config["ProductionVariants"]]
    except Exception:
        out["variants"] = []
    scaling = target.client("application-autoscaling").describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[scaling_resource_id(endpoint_name)])
    if scaling["ScalableTargets"]:
        t = scaling["ScalableTargets"][0]
        out["autoscaling"] = {"min": t["MinCapacity"], "max": t["MaxCapacity"]}
    return out


def down(endpoint_name: str, target, progress: Progress = say, poll_s: float | None = None) -> list[str]:
    """Remove the autoscaling registration, endpoint, its configs and models; returns what went."""
    poll_s = poll_s if poll_s is not None else (10.0 if target.kind == "aws" else 0.2)
    sm = target.client("sagemaker")
    removed: list[str] = []
    config_names: set[str] = set()
    model_names: set[str] = set()

    scaling = target.client("application-autoscaling")
    resource_id = scaling_resource_id(endpoint_name)
    if scaling.describe_scalable_targets(ServiceNamespace="sagemaker",
                                         ResourceIds=[resource_id])["ScalableTargets"]:
        for policy in scaling.describe_scaling_policies(ServiceNamespace="sagemaker",
                                                        ResourceId=resource_id)["ScalingPolicies"]:
            scaling.delete_scaling_policy(PolicyName=policy["PolicyName"], ServiceNamespace="sagemaker",
                                          ResourceId=resource_id, ScalableDimension=SCALABLE_DIMENSION)
        scaling.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource_id,
                                           ScalableDimension=SCALABLE_DIMENSION)
        removed.append(f"autoscaling target {resource_id}")
        progress(f"- autoscaling target {resource_id}")

    try:
        found = sm.describe_endpoint(EndpointName=endpoint_name)
        config_names.add(found["EndpointConfigName"])
        _wait_settled(sm, endpoint_name, poll_s)
        sm.delete_endpoint(EndpointName=endpoint_name)
        _wait_deleted(sm, endpoint_name, poll_s)
        removed.append(f"endpoint {endpoint_name}")
        progress(f"- endpoint {endpoint_name}")
    except Exception as exc:
        if _error_code(exc) != "ValidationException":
            raise

    # Configs and models of this endpoint, including ones a half-finished run left behind.
    prefix = endpoint_name + "-"
    for page in sm.get_paginator("list_endpoint_configs").paginate(NameContains=endpoint_name):
        config_names.update(c["EndpointConfigName"] for c in page["EndpointConfigs"]
                            if c["EndpointConfigName"].startswith(prefix))
    def remove(label: str, delete: Callable[[], Any]) -> None:
        try:
            delete()
        except Exception as exc:  # already gone is fine: --down is safe to repeat
            if _error_code(exc) != "ValidationException":
                raise
            return
        removed.append(label)
        progress(f"- {label}")

    for name in sorted(config_names):
        try:
            config = sm.describe_endpoint_config(EndpointConfigName=name)
            model_names.update(v["ModelName"] for v in config["ProductionVariants"])
        except Exception as exc:
            if _error_code(exc) != "ValidationException":
                raise
        remove(f"endpoint config {name}", lambda: sm.delete_endpoint_config(EndpointConfigName=name))
    for page in sm.get_paginator("list_models").paginate(NameContains=endpoint_name):
        model_names.update(m["ModelName"] for m in page["Models"] if m["ModelName"].startswith(prefix))
    for name in sorted(model_names):
        remove(f"model {name}", lambda: sm.delete_model(ModelName=name))
    if not removed:
        progress(f"  nothing named {endpoint_name} was found on {target.describe()}")
    return removed


def invoke(deployment: Deployment, request) -> Any:
    """One request through SageMaker runtime, in the rung's dialect (options.contract)."""
    from options import contract

    runtime = deployment.target.client("sagemaker-runtime")
    return contract.invoke_sagemaker(runtime, deployment.endpoint_name, request, deployment.dialect)


# The RungModule verbs every SageMaker endpoint rung (levels 2–5) shares; specs carry ``name``.
def rung_apply(plan: Plan, target) -> Deployment:
    return apply_plan(plan, target)


def rung_invoke(deployment: Deployment, request) -> Any:
    return invoke(deployment, request)


def rung_status(spec, target) -> dict[str, Any]:
    return status(spec.name, target)


def rung_down(spec, target) -> list[str]:
    removed = down(spec.name, target)
    say("kept: uploaded artifacts (s3://spectrum-artifacts-<region>-<account>/) and the ECR "
        "repository, if this rung made any: storage, not instance-hours")
    return removed
