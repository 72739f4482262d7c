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
from options.sagemaker.autoscaling import NO_CAPACITY_ALARM_PERIOD_S, NO_CAPACITY_METRIC, WAKE_COOLDOWN_S, \
    Autoscaling, add_autoscaling_arguments, autoscaling_from_args

VARIANT = "AllTraffic"
ACCOUNT_PLACEHOLDER = "<account-id>"
DEFAULT_ROLE_ARN = f"arn:aws:iam::{ACCOUNT_PLACEHOLDER}:role/SageMakerExecutionRole"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
COMPONENT_SCALABLE_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
_NAME_OK = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
MAX_NAME = 63

# ----------------------------------------------------------------------------------- specs

# Where a plan needs the ARN that an earlier PutScalingPolicy returns (a CloudWatch alarm's
# action): apply fills it in, as it fills in the account id.
POLICY_ARN_PLACEHOLDER = "<policy-arn:{}>"


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
    # Many models on one endpoint (options.sagemaker.components): inference components, or a
    # CPU multi-model container over an S3 prefix with {name: TargetModel}.
    components: Any = None                         # components.InferenceComponents
    multi_model_prefix: str | None = None
    multi_model_targets: dict[str, str] | None = None
    multi_model_invoke: str | None = None


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
    from options.sagemaker.components import ADAPTER_FLAG_HELP
    group.add_argument("--adapter", action="append", default=[], metavar="NAME=S3URL",
                       help=ADAPTER_FLAG_HELP + " (levels 3–5)")
    add_autoscaling_arguments(group)


def region_of(args) -> str:
    return args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") \
        or "us-east-1"


def endpoint_basics(args, level: int, model_label: str, default_instance: str, *,
                    serves_adapters: bool = False) -> dict[str, Any]:
    """name, region, instance type (checked against the catalogue), count and role from the flags.
    A rung whose endpoint can't carry adapter components (``serves_adapters``) refuses --adapter."""
    if getattr(args, "adapter", None) and not serves_adapters:
        raise BadInput(f"--adapter {args.adapter[0]!r}: level {level} deploys one fixed model per "
                       f"endpoint; adapters run as inference components at levels 3, 4 and 5, "
                       f"e.g. python -m options.deploy --level 3 --plan --adapter {args.adapter[0]}")
    if getattr(args, "scale_to_zero", False) and not serves_adapters:
        raise BadInput(f"--scale-to-zero: level {level} deploys its model on the endpoint's variant, which "
                       f"keeps one instance or more; scaling to 0 needs an inference component, which "
                       f"levels 3, 4 and 5 deploy, e.g. python -m options.deploy --level 3 --plan "
                       f"--scale-to-zero --autoscale-max 2")
    instance_type = ml_instance(args.instance_type or default_instance)
    instance_info(instance_type)  # unknown names exit 2, naming the closest known ones
    if args.instance_count < 1:
        raise BadInput(f"--instance-count {args.instance_count} must be at least 1")
    return {"name": validate_name(args.name or default_name(level, model_label)),
            "region": region_of(args), "instance_type": instance_type,
            "instance_count": args.instance_count,
            "role_arn": getattr(args, "role_arn", None) or DEFAULT_ROLE_ARN,
            "autoscaling": autoscaling_from_args(args)}

# ----------------------------------------------------------------------------------- plan

def endpoint_steps(spec: EndpointSpec) -> list[Step]:
    """CreateModel → CreateEndpointConfig → CreateEndpoint (→ autoscaling), each with its undo;
    with inference components, the config names no model and the components follow."""
    container: dict[str, Any] = {"Image": spec.image_uri, "Environment": dict(spec.environment)}
    if spec.multi_model_prefix:
        container["Mode"] = "MultiModel"
        container["ModelDataUrl"] = spec.multi_model_prefix
    elif spec.model_data_url:
        container["ModelDataUrl"] = spec.model_data_url
    if spec.model_data_source:
        container["ModelDataSource"] = spec.model_data_source
    model_name = f"{spec.name}-{_digest(container)}"
    tags = [{"Key": "spectrum:level", "Value": str(spec.level)},
            {"Key": "spectrum:endpoint", "Value": spec.name}]
    model_params: dict[str, Any] = {"ModelName": model_name, "PrimaryContainer": container,
                                    "ExecutionRoleArn": spec.role_arn, "Tags": tags}
    if spec.enable_network_isolation:
        model_params["EnableNetworkIsolation"] = True

    ic = spec.components
    variant: dict[str, Any] = {"VariantName": VARIANT, "InstanceType": ml_instance(spec.instance_type),
                               "InitialInstanceCount": spec.instance_count}
    startup: dict[str, int] = {}
    if spec.startup_health_check_timeout_s:
        startup["ContainerStartupHealthCheckTimeoutInSeconds"] = spec.startup_health_check_timeout_s
    if spec.model_data_download_timeout_s:
        startup["ModelDataDownloadTimeoutInSeconds"] = spec.model_data_download_timeout_s
    config_params: dict[str, Any] = {"ProductionVariants": [variant]}
    if ic is None:
        variant["ModelName"] = model_name
        variant.update(startup)   # with components, start-up limits belong to each component
    else:
        from options.sagemaker.components import ROUTING_STRATEGY
        variant["ManagedInstanceScaling"] = {"Status": "ENABLED", "MinInstanceCount": ic.min_instances,
                                             "MaxInstanceCount": ic.max_instances}
        variant["RoutingConfig"] = {"RoutingStrategy": ROUTING_STRATEGY}
        config_params["ExecutionRoleArn"] = spec.role_arn   # no model on the variant to carry it
    if spec.volume_size_gb:
        variant["VolumeSizeInGB"] = spec.volume_size_gb
    # Without components the name digests the variant alone, as it always has: same config, same name.
    config_name = f"{spec.name}-{_digest(variant if ic is None else config_params)}"
    config_params = {"EndpointConfigName": config_name, **config_params}

    steps = [
        Step("sagemaker", "CreateModel", model_params,
             undo=Step("sagemaker", "DeleteModel", {"ModelName": model_name}),
             description=f"model {model_name}: the image, its environment and artifacts"
                         + (" (multi-model)" if spec.multi_model_prefix else "")),
        Step("sagemaker", "CreateEndpointConfig", config_params,
             undo=Step("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": config_name}),
             description=f"endpoint config {config_name}: {spec.instance_count} × "
                         f"{ml_instance(spec.instance_type)}"
                         + (f" (up to {ic.max_instances}), no model: inference components" if ic else "")),
        Step("sagemaker", "CreateEndpoint",
             {"EndpointName": spec.name, "EndpointConfigName": config_name},
             undo=Step("sagemaker", "DeleteEndpoint", {"EndpointName": spec.name}),
             description=f"endpoint {spec.name} (waits for InService)"),
    ]
    if ic is not None:
        from options.sagemaker.components import base_component_name, component_steps
        steps += component_steps(spec.name, VARIANT, model_name, ic, startup, tags)
        if spec.autoscaling and spec.autoscaling.scale_to_zero:
            steps += scale_to_zero_steps(spec.name, base_component_name(spec.name), spec.autoscaling)
    elif spec.autoscaling:
        steps += autoscaling_steps(spec.name, spec.autoscaling)
    return steps


def routing_of(spec: EndpointSpec) -> dict[str, str]:
    """What each InvokeEndpoint adds to address a model on this endpoint: an inference
    component, a multi-model TargetModel, or nothing (the endpoint's one model)."""
    from options.sagemaker import components

    if spec.components is not None:
        return components.routing(spec.name, spec.components)
    if spec.multi_model_prefix and spec.multi_model_invoke:
        return {"TargetModel": components.multi_model_target(spec.multi_model_invoke,
                                                             spec.multi_model_targets or {})}
    return {}


def endpoint_plan(level: int, pre_steps: list[Step], spec: EndpointSpec, notes: list[str],
                  extra: dict[str, Any] | None = None) -> Plan:
    """The Plan every SageMaker rung returns: its own steps, the endpoint's, the hourly cost,
    and (where many models share the endpoint) what invocations name and why."""
    from options.sagemaker import components

    notes = list(notes)
    if spec.components is not None:
        notes += components.plan_notes(spec.name, instance_info(spec.instance_type), spec.components)
    if spec.multi_model_prefix:
        notes += components.multi_model_notes(spec.multi_model_prefix, spec.multi_model_targets or {},
                                              spec.multi_model_invoke)
    extra = dict(extra or {})
    if routing_of(spec):
        extra["routing"] = routing_of(spec)
    try:
        cost = cost_line(spec.instance_type, spec.instance_count)
    except BadInput as exc:
        if not spec.multi_model_prefix:
            raise
        # The price table carries SageMaker prices for GPU instances only; a CPU multi-model
        # plan is still worth reading, with the gap said where the cost would be.
        ec2 = instance_info(spec.instance_type).ec2_hourly
        cost = {"instance_type": ml_instance(spec.instance_type), "count": spec.instance_count,
                "platform": "sagemaker",
                "unknown": f"the price table has no SageMaker price for {ml_instance(spec.instance_type)}"
                           + (f"; on EC2 it is ${ec2:g}/hour, and SageMaker adds 15–40 %" if ec2 else "")}
    return Plan(level, pre_steps + endpoint_steps(spec), cost=cost, notes=notes, extra=extra)


def autoscaling_steps(endpoint_name: str, scaling: Autoscaling) -> list[Step]:
    """Register the variant as a scalable target, then one target-tracking policy on it.

    One policy name per endpoint, whatever the metric: re-applying with another metric or
    target updates that policy (PutScalingPolicy creates or replaces) instead of adding a
    second one that would scale the same variant on its own."""
    target = {"ServiceNamespace": "sagemaker", "ResourceId": scaling_resource_id(endpoint_name),
              "ScalableDimension": SCALABLE_DIMENSION}
    return [_register_step(target, scaling, "instances"),
            _target_tracking_step(target, scaling_policy_name(endpoint_name), scaling)]


def scale_to_zero_steps(endpoint_name: str, component: str, scaling: Autoscaling) -> list[Step]:
    """The component's copies as a scalable target (0 to max), target tracking per copy, and the
    way back from 0: a step-scaling policy adding one copy, run by a CloudWatch alarm on the
    component's NoCapacityInvocationFailures (whose action is that policy's ARN)."""
    target = {"ServiceNamespace": "sagemaker", "ResourceId": component_scaling_resource_id(component),
              "ScalableDimension": COMPONENT_SCALABLE_DIMENSION}
    wake, alarm = wake_policy_name(endpoint_name), no_capacity_alarm_name(component)
    return [
        _register_step(target, scaling, "copies"),
        _target_tracking_step(target, scaling_policy_name(endpoint_name), scaling),
        Step("application-autoscaling", "PutScalingPolicy",
             {**target, "PolicyName": wake, "PolicyType": "StepScaling",
              "StepScalingPolicyConfiguration": {
                  "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum",
                  "Cooldown": WAKE_COOLDOWN_S,
                  "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}]}},
             undo=Step("application-autoscaling", "DeleteScalingPolicy", {**target, "PolicyName": wake}),
             description="step scaling: one copy when a request finds none"),
        Step("cloudwatch", "PutMetricAlarm",
             {"AlarmName": alarm, "Namespace": "AWS/SageMaker", "MetricName": NO_CAPACITY_METRIC,
              "Dimensions": [{"Name": "InferenceComponentName", "Value": component}],
              "Statistic": "Maximum", "Period": NO_CAPACITY_ALARM_PERIOD_S, "EvaluationPeriods": 1,
              "DatapointsToAlarm": 1, "Threshold": 1.0,
              "ComparisonOperator": "GreaterThanOrEqualToThreshold", "TreatMissingData": "missing",
              "AlarmActions": [POLICY_ARN_PLACEHOLDER.format(wake)]},
             undo=Step("cloudwatch", "DeleteAlarms", {"AlarmNames": [alarm]}),
             description=f"alarm {alarm}: {NO_CAPACITY_METRIC} ≥ 1 in {NO_CAPACITY_ALARM_PERIOD_S} s "
                         f"runs {wake}"),
    ]


def _register_step(target: dict[str, str], scaling: Autoscaling, what: str) -> Step:
    return Step("application-autoscaling", "RegisterScalableTarget",
                {**target, "MinCapacity": scaling.min_capacity, "MaxCapacity": scaling.max_capacity},
                undo=Step("application-autoscaling", "DeregisterScalableTarget", dict(target)),
                description=f"autoscaling between {scaling.min_capacity} and {scaling.max_capacity} {what}")


def _target_tracking_step(target: dict[str, str], policy_name: str, scaling: Autoscaling) -> Step:
    return Step("application-autoscaling", "PutScalingPolicy",
                {**target, "PolicyName": policy_name, "PolicyType": "TargetTrackingScaling",
                 "TargetTrackingScalingPolicyConfiguration": {
                     "TargetValue": float(scaling.target_value),
                     "PredefinedMetricSpecification": {"PredefinedMetricType": scaling.predefined_metric},
                     "ScaleInCooldown": scaling.scale_in_cooldown_s,
                     "ScaleOutCooldown": scaling.scale_out_cooldown_s}},
                undo=Step("application-autoscaling", "DeleteScalingPolicy",
                          {**target, "PolicyName": policy_name}),
                description=f"target tracking: {scaling.target_value:g} {scaling.units} "
                            f"({scaling.predefined_metric})")


def scaling_policy_name(endpoint_name: str) -> str:
    return f"{endpoint_name}-target-tracking"


def wake_policy_name(endpoint_name: str) -> str:
    return f"{endpoint_name}-wake-from-zero"


def component_scaling_resource_id(component: str) -> str:
    return f"inference-component/{component}"


def no_capacity_alarm_name(component: str) -> str:
    return f"{component}-no-capacity"


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
    for key in ("InferenceComponentName", "EndpointName", "EndpointConfigName", "ModelName", "repositoryName", "Key",
                "Bucket", "PolicyName", "AlarmName", "ResourceId"):
        if key in step.params:
            return str(step.params[key])
    if "AlarmNames" in step.params:
        return ", ".join(step.params["AlarmNames"])
    return ""
