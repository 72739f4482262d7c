"""Sending a SageMaker plan: apply, wait, roll back, status, down and invoke, for levels 2–5.

Guarantees:
- idempotent: a step whose resource already exists (same name, same content) is skipped, so
  running the same command twice creates nothing twice;
- no half-built endpoints: if any request fails, or the endpoint ends ``Failed``, everything
  this run created is deleted in reverse order and the cause (``FailureReason``) is reported.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from options.core import rung
from options.output import Progress, say
from options.plan import Deployment, Plan, Step
from options.sagemaker.components import base_component_name
from options.sagemaker.plan import ACCOUNT_PLACEHOLDER, COMPONENT_SCALABLE_DIMENSION, POLICY_ARN_PLACEHOLDER, \
    SCALABLE_DIMENSION, component_scaling_resource_id, endpoint_name_of, main_param, no_capacity_alarm_name, \
    scaling_resource_id


class DeployFailed(RuntimeError):
    """A cloud request failed or the endpoint ended Failed; what this run created was removed."""

# ----------------------------------------------------------------------------------- apply

def _filled(obj: Any, values: dict[str, str]) -> Any:
    """``obj`` with each placeholder (a key of ``values``) in its strings replaced by its value."""
    if isinstance(obj, str):
        for placeholder, value in values.items():
            obj = obj.replace(placeholder, value)
        return obj
    if isinstance(obj, dict):
        return {k: _filled(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_filled(v, values) for v in obj]
    return obj


def _resolve_account(obj: Any, account: str) -> Any:
    return _filled(obj, {ACCOUNT_PLACEHOLDER: account})


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
                raise _failed_earlier(f"endpoint {p['EndpointName']}", found)
        elif step.operation == "CreateInferenceComponent":
            _component_matches(sm().describe_inference_component(
                InferenceComponentName=p["InferenceComponentName"]), p)
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
            # Kept only when its whole configuration is this run's; else Put replaces it.
            kind = next(k for k in p if k.endswith("ScalingPolicyConfiguration"))
            return any(f["PolicyName"] == p["PolicyName"] and all(
                f.get(kind, {}).get(k) == v for k, v in p[kind].items()) for f in found)
        elif step.operation == "PutMetricAlarm":
            found = clients("cloudwatch").describe_alarms(AlarmNames=[p["AlarmName"]])["MetricAlarms"]
            return any(all(f.get(k) == v for k, v in p.items()) for f in found)
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


def _component_matches(found: dict, params: dict) -> None:
    """An existing component is kept only when it is what this run would create."""
    name = params["InferenceComponentName"]
    want, have = params["Specification"], found.get("Specification", {})
    for key, label in (("BaseInferenceComponentName", "base component"), ("ModelName", "model")):
        if want.get(key) and have.get(key) != want[key]:
            raise DeployFailed(f"inference component {name} already exists with {label} "
                               f"{have.get(key)}, and this run's is {want[key]}. Remove it first "
                               f"(--down) or choose another --name.")
    url = want.get("Container", {}).get("ArtifactUrl")
    if url and have.get("Container", {}).get("ArtifactUrl") != url:
        raise DeployFailed(f"adapter component {name} already exists with artifacts "
                           f"{have.get('Container', {}).get('ArtifactUrl')}, and this run's are {url}: "
                           f"give the new adapter another name, or remove the old one (--down)")
    if found["InferenceComponentStatus"] == "Failed":
        raise _failed_earlier(f"inference component {name}", found)


def _failed_earlier(label: str, found: dict) -> DeployFailed:
    return DeployFailed(f"{label} exists from an earlier run and is Failed "
                        f"({found.get('FailureReason', 'no reason given')}): remove it with --down, "
                        f"then run again")


def wait_in_service(sagemaker, endpoint_name: str, progress: Progress, poll_s: float,
                    timeout_s: float) -> float:
    """Poll DescribeEndpoint until InService; Failed raises with its FailureReason."""
    return _wait_until_in_service(lambda: sagemaker.describe_endpoint(EndpointName=endpoint_name),
                                  "EndpointStatus", f"endpoint {endpoint_name}", progress, poll_s,
                                  timeout_s)


def wait_component_in_service(sagemaker, name: str, progress: Progress, poll_s: float,
                              timeout_s: float) -> float:
    """Poll DescribeInferenceComponent until InService; Failed raises with its FailureReason."""
    return _wait_until_in_service(lambda: sagemaker.describe_inference_component(InferenceComponentName=name),
                                  "InferenceComponentStatus", f"inference component {name}", progress,
                                  poll_s, timeout_s)


def _wait_until_in_service(describe: Callable[[], dict], status_key: str, label: str,
                           progress: Progress, poll_s: float, timeout_s: float) -> float:
    start = time.monotonic()
    last = None
    while True:
        found = describe()
        status = found[status_key]
        elapsed = time.monotonic() - start
        if status != last or elapsed >= 60 and int(elapsed) % 60 < poll_s:
            progress(f"  {label}: {status} ({elapsed:.0f} s)")
            last = status
        if status == "InService":
            return elapsed
        if status in ("Failed", "OutOfService", "RollingBack", "Deleting"):
            raise DeployFailed(f"{label} is {status}: "
                               f"{found.get('FailureReason', 'SageMaker gave no FailureReason')}")
        if elapsed > timeout_s:
            raise DeployFailed(f"{label} still {status} after {elapsed:.0f} s "
                               f"(limit {timeout_s:.0f} s)")
        time.sleep(poll_s)


def _wait_component_deleted(sagemaker, name: str, poll_s: float, timeout_s: float = 1800) -> None:
    """SageMaker deletes a component asynchronously; the base and the endpoint wait for it."""
    start = time.monotonic()
    while True:
        try:
            found = sagemaker.describe_inference_component(InferenceComponentName=name)
        except Exception as exc:
            if _error_code(exc) == "ValidationException":  # "Could not find inference component"
                return
            raise
        if found["InferenceComponentStatus"] == "Failed":
            raise DeployFailed(f"inference component {name} failed while being deleted: "
                               f"{found.get('FailureReason', 'no reason given')}")
        if time.monotonic() - start > timeout_s:
            raise DeployFailed(f"inference component {name} still {found['InferenceComponentStatus']} "
                               f"after {timeout_s:.0f} s of deleting")
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
    if plan.extra.get("routing"):   # which component / TargetModel each invocation names
        deployment.extra["routing"] = dict(plan.extra["routing"])
    start = time.monotonic()
    policy_arns: dict[str, str] = {}     # POLICY_ARN_PLACEHOLDER of each policy put so far -> its ARN
    try:
        for step in steps:
            label = step.description or f"{step.service} {step.operation}"
            if step.service == "docker":
                _run_docker_step(step, target, progress)
                continue
            step = Step(step.service, step.operation, _filled(step.params, policy_arns), step.undo,
                        step.description)
            if _exists(clients, step):
                progress(f"= {step.operation}: {label} (already there, kept)")
                deployment.reused.append(label)
                answer = _policy_arn(clients, step) if step.operation == "PutScalingPolicy" else {}
            else:
                answer = send(clients, step)
                done.append(step)
                deployment.created.append(label)
                progress(f"+ {step.operation}: {label}")
            if step.operation == "PutScalingPolicy":
                policy_arns[POLICY_ARN_PLACEHOLDER.format(step.params["PolicyName"])] = answer["PolicyARN"]
            if step.operation == "CreateEndpoint":
                wait_in_service(clients("sagemaker"), step.params["EndpointName"], progress,
                                poll_s, timeout_s)
            elif step.operation == "CreateInferenceComponent":  # adapters need their base InService
                wait_component_in_service(clients("sagemaker"), step.params["InferenceComponentName"],
                                          progress, poll_s, timeout_s)
    except BaseException as exc:
        cause = exc if isinstance(exc, DeployFailed) else DeployFailed(_describe_error(exc))
        progress(f"! {cause}")
        _rollback(clients, done, progress, poll_s)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise cause from exc
    deployment.elapsed_s = time.monotonic() - start
    return deployment


def _policy_arn(clients: _Clients, step: Step) -> dict[str, str]:
    """A kept policy's ARN, as PutScalingPolicy would have answered it."""
    p = step.params
    (found,) = [f for f in clients("application-autoscaling").describe_scaling_policies(
        ServiceNamespace=p["ServiceNamespace"], ResourceId=p["ResourceId"],
        PolicyNames=[p["PolicyName"]])["ScalingPolicies"] if f["PolicyName"] == p["PolicyName"]]
    return {"PolicyARN": found["PolicyARN"]}


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
            elif step.undo.operation == "DeleteInferenceComponent":
                _wait_component_deleted(clients("sagemaker"), step.params["InferenceComponentName"], poll_s)
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
        out["variants"] = [{"model": v.get("ModelName"), "instance_type": v.get("InstanceType"),
                            "initial_instance_count": v.get("InitialInstanceCount")}
                           for v in config["ProductionVariants"]]
    except Exception:
        config, out["variants"] = None, []
    if config and holds_components(config):
        out["components"] = [{"name": c["InferenceComponentName"], "status": c["InferenceComponentStatus"],
                              **_component_detail(sm, c["InferenceComponentName"])}
                             for c in list_components(sm, endpoint_name)]
    scaling = target.client("application-autoscaling")
    for resource_id, scales in ((scaling_resource_id(endpoint_name), "instances"),
                                (component_scaling_resource_id(base_component_name(endpoint_name)), "copies")):
        found = scaling.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource_id])
        if found["ScalableTargets"]:
            t = found["ScalableTargets"][0]
            out["autoscaling"] = {"min": t["MinCapacity"], "max": t["MaxCapacity"], "scales": scales}
            policies = scaling.describe_scaling_policies(ServiceNamespace="sagemaker",
                                                         ResourceId=resource_id)["ScalingPolicies"]
            out["autoscaling_policies"] = [_policy_summary(p) for p in policies if p["ResourceId"] == resource_id]
    return out


def _policy_summary(policy: dict) -> dict[str, Any]:
    if policy.get("PolicyType") == "StepScaling":
        config = policy.get("StepScalingPolicyConfiguration", {})
        return {"name": policy["PolicyName"], "type": "StepScaling",
                "steps": [s.get("ScalingAdjustment") for s in config.get("StepAdjustments", [])],
                "cooldown_s": config.get("Cooldown"),
                "alarms": [a["AlarmName"] for a in policy.get("Alarms", [])]}
    config = policy.get("TargetTrackingScalingPolicyConfiguration", {})
    return {"name": policy["PolicyName"], "type": policy.get("PolicyType"),
            "metric": config.get("PredefinedMetricSpecification", {}).get("PredefinedMetricType"),
            "target": config.get("TargetValue"), "scale_in_cooldown_s": config.get("ScaleInCooldown"),
            "scale_out_cooldown_s": config.get("ScaleOutCooldown")}


def holds_components(config: dict) -> bool:
    """An endpoint config whose variants name no model serves inference components."""
    return any("ModelName" not in v for v in config["ProductionVariants"])


def _config_holds_components(sm, config_name: str) -> bool:
    try:
        return holds_components(sm.describe_endpoint_config(EndpointConfigName=config_name))
    except Exception as exc:   # the config went first (by hand): the components go with the endpoint
        if _error_code(exc) != "ValidationException":
            raise
        return False


def list_components(sm, endpoint_name: str) -> list[dict]:
    """ListInferenceComponents for one endpoint, every page."""
    found, kw = [], {"EndpointNameEquals": endpoint_name}
    while True:
        page = sm.list_inference_components(**kw)
        found += page["InferenceComponents"]
        if not page.get("NextToken"):
            return found
        kw["NextToken"] = page["NextToken"]


def _component_detail(sm, name: str) -> dict[str, Any]:
    spec = sm.describe_inference_component(InferenceComponentName=name).get("Specification", {})
    if spec.get("BaseInferenceComponentName"):
        return {"adapter_of": spec["BaseInferenceComponentName"],
                "artifacts": spec.get("Container", {}).get("ArtifactUrl")}
    return {"model": spec.get("ModelName")}


def _down_components(sm, endpoint_name: str, progress: Progress, poll_s: float) -> list[str]:
    """Adapter components first (SageMaker refuses to delete a base that still carries
    adapters), each deletion waited for, then the base components."""
    found = list_components(sm, endpoint_name)
    adapters, bases = [], []
    for c in found:
        name = c["InferenceComponentName"]
        (adapters if "adapter_of" in _component_detail(sm, name) else bases).append(name)
    removed = []
    for name in adapters + bases:
        if any(c["InferenceComponentName"] == name and c["InferenceComponentStatus"] != "Deleting"
               for c in found):
            sm.delete_inference_component(InferenceComponentName=name)
        _wait_component_deleted(sm, name, poll_s)
        removed.append(f"inference component {name}")
        progress(f"- inference component {name}")
    return removed


def _down_scaling(scaling, resource_id: str, dimension: str, progress: Progress) -> list[str]:
    """Deregister one scalable target, its policies first; [] when it is not registered."""
    if not scaling.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource_id],
                                             ScalableDimension=dimension)["ScalableTargets"]:
        return []
    for policy in scaling.describe_scaling_policies(ServiceNamespace="sagemaker",
                                                    ResourceId=resource_id)["ScalingPolicies"]:
        if policy["ResourceId"] == resource_id:
            scaling.delete_scaling_policy(PolicyName=policy["PolicyName"], ServiceNamespace="sagemaker",
                                          ResourceId=resource_id, ScalableDimension=dimension)
    scaling.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource_id,
                                       ScalableDimension=dimension)
    progress(f"- autoscaling target {resource_id}")
    return [f"autoscaling target {resource_id}"]


def down(endpoint_name: str, target, progress: Progress = say, poll_s: float | None = None) -> list[str]:
    """Remove the autoscaling registration, endpoint, its configs and models; returns what went."""
    poll_s = poll_s if poll_s is not None else (10.0 if target.kind == "aws" else 0.2)
    sm = target.client("sagemaker")
    removed: list[str] = []
    config_names: set[str] = set()
    model_names: set[str] = set()

    # Autoscaling first (SageMaker refuses to delete what is still registered): the variant's,
    # and the base component's with its wake-from-zero alarm (--scale-to-zero).
    base = base_component_name(endpoint_name)
    alarm = no_capacity_alarm_name(base)
    cloudwatch = target.client("cloudwatch")
    if cloudwatch.describe_alarms(AlarmNames=[alarm])["MetricAlarms"]:
        cloudwatch.delete_alarms(AlarmNames=[alarm])
        removed.append(f"alarm {alarm}")
        progress(f"- alarm {alarm}")
    scaling = target.client("application-autoscaling")
    for resource_id, dimension in ((scaling_resource_id(endpoint_name), SCALABLE_DIMENSION),
                                   (component_scaling_resource_id(base), COMPONENT_SCALABLE_DIMENSION)):
        removed += _down_scaling(scaling, resource_id, dimension, progress)

    try:
        found = sm.describe_endpoint(EndpointName=endpoint_name)
        config_names.add(found["EndpointConfigName"])
        _wait_settled(sm, endpoint_name, poll_s)
        if _config_holds_components(sm, found["EndpointConfigName"]):
            removed += _down_components(sm, endpoint_name, progress, poll_s)
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
            model_names.update(v["ModelName"] for v in config["ProductionVariants"] if "ModelName" in v)
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
    routing = deployment.extra.get("routing")
    if routing:
        # Which inference component (or multi-model TargetModel) the call addresses is SageMaker
        # routing, not dialect: added to whichever runtime operation contract.py sends, before
        # botocore validates it against the service model.
        runtime.meta.events.register("before-parameter-build.sagemaker-runtime.*",
                                     lambda params, **_: params.update(routing))
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
