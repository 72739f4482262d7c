"""Autoscaling from the deploy CLI: levels 2-5 register the endpoint's variant with Application
Auto Scaling and put a target-tracking policy on it (in the plan, applied on the embedded moto
server, removed by --down and by a rollback); level 6 sets the rendered HPA's bounds and its
vLLM waiting-requests target. Bad input exits 2 naming the value."""
from __future__ import annotations

import json

import botocore.exceptions
import pytest

from options.deploy import main
from options.sagemaker.apply import DeployFailed, apply_plan

INVOCATIONS = "SageMakerVariantInvocationsPerInstance"
CONCURRENCY = "SageMakerVariantConcurrentRequestsPerModelHighResolution"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
AUTOSCALE = ["--autoscale-metric", "concurrency", "--autoscale-min", "1", "--autoscale-max", "3",
             "--autoscale-target", "4"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def scaling_state(target, endpoint: str) -> tuple[list[dict], list[dict]]:
    """What Application Auto Scaling holds for the endpoint's variant, read back through boto3."""
    client = target.client("application-autoscaling")
    resource = f"endpoint/{endpoint}/variant/AllTraffic"
    targets = client.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource],
                                               ScalableDimension=DIMENSION)["ScalableTargets"]
    policies = [p for p in client.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)
                ["ScalingPolicies"] if p["ResourceId"] == resource]
    return targets, policies


# --- the plan -------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [2, 3, 4, 5])
def test_plan_json_ends_with_the_scalable_target_and_the_policy(capsys, level):
    extra = ["--instance-type", "ml.g5.2xlarge"] if level == 2 else []   # JumpStart offers Mistral there
    code, out, err = run(capsys, "--level", str(level), "--plan", "--json", *extra, *AUTOSCALE)
    assert code == 0, err
    steps = json.loads(out)["steps"]
    endpoint = next(s for s in steps if s["operation"] == "CreateEndpoint")["params"]["EndpointName"]
    register, policy = steps[-2], steps[-1]
    resource = {"ServiceNamespace": "sagemaker", "ResourceId": f"endpoint/{endpoint}/variant/AllTraffic",
                "ScalableDimension": DIMENSION}
    assert (register["service"], register["operation"]) == ("application-autoscaling", "RegisterScalableTarget")
    assert register["params"] == {**resource, "MinCapacity": 1, "MaxCapacity": 3}
    assert (policy["service"], policy["operation"]) == ("application-autoscaling", "PutScalingPolicy")
    assert policy["params"] == {**resource, "PolicyName": f"{endpoint}-target-tracking",
                                "PolicyType": "TargetTrackingScaling",
                                "TargetTrackingScalingPolicyConfiguration": {
                                    "TargetValue": 4.0,
                                    "PredefinedMetricSpecification": {"PredefinedMetricType": CONCURRENCY},
                                    "ScaleInCooldown": 300, "ScaleOutCooldown": 300}}


def test_the_metric_defaults_to_invocations_and_the_requests_fit_botocores_model(build):
    """Every autoscaling request is valid for botocore's service model (what AWS would check first)."""
    import botocore.session
    from botocore.validate import ParamValidator

    _, _, plan = build("--level", "3", "--plan", "--autoscale-max", "2", "--autoscale-target", "55.5")
    policy = plan.steps[-1].params["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PredefinedMetricSpecification"]["PredefinedMetricType"] == INVOCATIONS
    assert policy["TargetValue"] == 55.5
    model = botocore.session.get_session().get_service_model("application-autoscaling")
    for step in plan.steps[-2:] + [plan.steps[-2].undo, plan.steps[-1].undo]:
        report = ParamValidator().validate(step.params, model.operation_model(step.operation).input_shape)
        assert not report.has_errors(), report.generate_report()
    # the concurrency metric is one of the service model's predefined metric types too
    assert CONCURRENCY in model.shape_for("MetricType").enum


def test_without_autoscale_flags_nothing_is_registered(build):
    _, _, plan = build("--level", "5", "--plan")
    assert not any(s.service == "application-autoscaling" for s in plan.steps)


# --- on the emulator ------------------------------------------------------------------------------

def test_level3_on_the_emulator_registers_the_target_and_policy_and_down_removes_them(target, build, inventory):
    module, spec, plan = build("--level", "3", "--target", "emulator", *AUTOSCALE)
    lines: list[str] = []
    apply_plan(plan, target, lines.append)
    targets, policies = scaling_state(target, spec.name)
    assert [(t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [(1, 3)]
    (policy,) = policies
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == CONCURRENCY
    assert (config["TargetValue"], config["ScaleInCooldown"], config["ScaleOutCooldown"]) == (4.0, 300, 300)
    state = module.status(spec, target)
    assert state["autoscaling"] == {"min": 1, "max": 3, "scales": "instances"}
    assert [(p["metric"], p["target"]) for p in state["autoscaling_policies"]] == [(CONCURRENCY, 4.0)]

    removed = module.down(spec, target)
    # the registration goes first: SageMaker refuses to delete a variant still registered
    assert removed.index(f"autoscaling target endpoint/{spec.name}/variant/AllTraffic") \
        < removed.index(f"endpoint {spec.name}")
    assert scaling_state(target, spec.name) == ([], [])
    assert inventory(target)["endpoints"] == []


def test_the_cli_applies_and_down_removes_on_a_running_emulator(capsys, emulator_url, target):
    base = ["--level", "3", "--target", "emulator", "--endpoint-url", emulator_url, "--name", "autoscaled"]
    code, out, err = run(capsys, *base, *AUTOSCALE, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["status"]["autoscaling"] == {"min": 1, "max": 3, "scales": "instances"}
    targets, policies = scaling_state(target, "autoscaled")
    assert len(targets) == 1 and len(policies) == 1
    code, out, err = run(capsys, *base, "--down", "--json")
    assert code == 0, err
    assert "autoscaling target endpoint/autoscaled/variant/AllTraffic" in json.loads(out)["removed"]
    assert scaling_state(target, "autoscaled") == ([], [])


def test_rerun_with_another_target_updates_the_one_policy(target, build):
    _, spec, plan = build("--level", "3", "--target", "emulator", *AUTOSCALE)
    apply_plan(plan, target, lambda _: None)
    again = apply_plan(plan, target, lambda _: None)
    assert again.created == []                       # same metric, target and bounds: kept
    _, _, changed = build("--level", "3", "--target", "emulator", "--autoscale-min", "2", "--autoscale-max", "5",
                          "--autoscale-metric", "invocations", "--autoscale-target", "120")
    apply_plan(changed, target, lambda _: None)
    targets, policies = scaling_state(target, spec.name)
    assert [(t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [(2, 5)]
    assert [(p["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"]["PredefinedMetricType"],
             p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]) for p in policies] == [(INVOCATIONS, 120.0)]


def rolled_back(target, plan, botocore_events, service: str, operation: str, code: str, message: str) -> list[str]:
    """Apply ``plan`` with AWS refusing ``operation`` (at botocore's level): DeployFailed naming the
    refusal; returns the progress lines (the rollback's among them)."""
    def refuse(**_):
        raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": message}}, operation)
    botocore_events(f"before-call.{service}.{operation}", refuse)
    lines: list[str] = []
    with pytest.raises(DeployFailed, match=message):
        apply_plan(plan, target, lines.append)
    return lines


def test_a_refused_policy_rolls_back_the_target_and_the_endpoint(target, build, inventory, botocore_events):
    _, spec, plan = build("--level", "5", "--target", "emulator", *AUTOSCALE)
    lines = rolled_back(target, plan, botocore_events, "application-autoscaling", "PutScalingPolicy",
                        "ValidationException", "unsupported metric")
    assert any("DeregisterScalableTarget" in line for line in lines)
    held = inventory(target)
    assert held["scalable_targets"] == [] and held["endpoints"] == [] and held["models"] == []


# --- scale to zero: an inference component's copies -----------------------------------------------

COPY_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
TO_ZERO = ["--scale-to-zero", "--autoscale-max", "2", "--autoscale-metric", "concurrency", "--autoscale-target", "4"]


@pytest.mark.parametrize("level", [3, 4, 5])
def test_scale_to_zero_plans_a_component_its_copies_autoscaling_and_the_wake_alarm(build, level):
    import botocore.session
    from botocore.validate import ParamValidator

    _, spec, plan = build("--level", str(level), "--plan", *TO_ZERO)
    ops = [(s.service, s.operation) for s in plan.steps]
    assert ops[-6:] == [("sagemaker", "CreateEndpoint"), ("sagemaker", "CreateInferenceComponent"),
                        ("application-autoscaling", "RegisterScalableTarget"),
                        ("application-autoscaling", "PutScalingPolicy"),
                        ("application-autoscaling", "PutScalingPolicy"), ("cloudwatch", "PutMetricAlarm")]
    config = next(s.params for s in plan.steps if s.operation == "CreateEndpointConfig")
    (variant,) = config["ProductionVariants"]
    assert "ModelName" not in variant and variant["InitialInstanceCount"] == 1
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 2}
    component, register, tracking, wake, alarm = (s.params for s in plan.steps[-5:])
    assert component["RuntimeConfig"] == {"CopyCount": 1}
    resource = {"ServiceNamespace": "sagemaker", "ScalableDimension": COPY_DIMENSION,
                "ResourceId": f"inference-component/{component['InferenceComponentName']}"}
    assert register == {**resource, "MinCapacity": 0, "MaxCapacity": 2}
    assert tracking["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}
    assert {k: wake[k] for k in resource} == resource and wake["PolicyType"] == "StepScaling"
    assert alarm["Dimensions"] == [{"Name": "InferenceComponentName", "Value": component["InferenceComponentName"]}]
    assert alarm["AlarmActions"] == [f"<policy-arn:{wake['PolicyName']}>"]
    # every request, and every undo, is valid for botocore's service models
    for step in plan.steps[-4:]:
        for request in (step, step.undo):
            model = botocore.session.get_session().get_service_model(request.service)
            report = ParamValidator().validate(request.params, model.operation_model(request.operation).input_shape)
            assert not report.has_errors(), report.generate_report()
    assert "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution" in \
        botocore.session.get_session().get_service_model("application-autoscaling").shape_for("MetricType").enum
    assert any("scale to zero: no instance, and no bill" in n for n in plan.notes)


def test_scale_to_zero_on_the_emulator_applies_keeps_on_rerun_and_down_removes_it(target, build, inventory):
    module, spec, plan = build("--level", "3", "--target", "emulator", *TO_ZERO)
    apply_plan(plan, target, lambda _: None)
    component = f"{spec.name}-base"
    scaling = target.client("application-autoscaling")
    (registered,) = scaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ScalableDimension=COPY_DIMENSION)["ScalableTargets"]
    assert (registered["ResourceId"], registered["MinCapacity"], registered["MaxCapacity"]) == \
        (f"inference-component/{component}", 0, 2)
    policies = {p["PolicyName"]: p for p in scaling.describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=registered["ResourceId"])["ScalingPolicies"]}
    assert {p["PolicyType"] for p in policies.values()} == {"TargetTrackingScaling", "StepScaling"}
    (alarm,) = target.client("cloudwatch").describe_alarms()["MetricAlarms"]
    # the alarm runs the step policy: its ARN, as PutScalingPolicy answered it, filled in by apply
    assert alarm["AlarmActions"] == [policies[f"{spec.name}-wake-from-zero"]["PolicyARN"]]
    state = module.status(spec, target)
    assert state["autoscaling"] == {"min": 0, "max": 2, "scales": "copies"}
    assert sorted(p["type"] for p in state["autoscaling_policies"]) == ["StepScaling", "TargetTrackingScaling"]

    again = apply_plan(plan, target, lambda _: None)
    assert again.created == []                       # same component, bounds, policies and alarm: kept

    removed = module.down(spec, target)
    assert removed.index(f"alarm {component}-no-capacity") < removed.index(
        f"autoscaling target inference-component/{component}") < removed.index(f"inference component {component}")
    held = inventory(target)
    assert held["alarms"] == [] and held["scalable_targets"] == [] and held["endpoints"] == []


def test_a_refused_alarm_rolls_back_the_policies_the_target_and_the_endpoint(target, build, inventory,
                                                                              botocore_events):
    _, _, plan = build("--level", "3", "--target", "emulator", *TO_ZERO)
    lines = rolled_back(target, plan, botocore_events, "cloudwatch", "PutMetricAlarm", "LimitExceeded",
                        "too many alarms")
    assert any("DeleteScalingPolicy" in line for line in lines)
    held = inventory(target)
    assert held["scalable_targets"] == [] and held["endpoints"] == [] and held["alarms"] == []


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["--level", "3", "--plan", "--autoscale-min", "4", "--autoscale-max", "2"],
     ["--autoscale-max 2 is below --autoscale-min 4"]),
    (["--level", "3", "--plan", "--autoscale-max", "2", "--autoscale-target", "0"],
     ["--autoscale-target 0 must be above 0"]),
    (["--level", "4", "--plan", "--autoscale-max", "2", "--autoscale-metric", "concurrency",
      "--autoscale-target", "-3"], ["--autoscale-target -3 must be above 0 concurrent requests"]),
    (["--level", "5", "--plan", "--autoscale-max", "2", "--autoscale-metric", "concurrency"],
     ["--autoscale-metric concurrency needs --autoscale-target"]),
    (["--level", "3", "--plan", "--autoscale-min", "0", "--autoscale-max", "2"], ["--autoscale-min 0 must be at least 1"]),
    (["--level", "3", "--plan", "--autoscale-target", "50"], ["--autoscale-target needs --autoscale-max"]),
    (["--level", "1", "--plan", "--autoscale-max", "3"], ["--autoscale-max does not apply to level 1", "per token"]),
    (["--level", "3", "--autoscale-max", "3"], ["--autoscale-max: nothing is autoscaled on --target local"]),
    (["--level", "2", "--autoscale-max", "3"], ["nothing is autoscaled on --target local"]),
    (["--level", "6", "--plan", "--autoscale-max", "3"], ["does not apply to level 6", "--max-replicas"]),
    (["--level", "3", "--plan", "--max-replicas", "3"], ["--max-replicas does not apply to level 3", "--autoscale-max"]),
    (["--level", "3", "--plan", "--autoscale-max", "3", "--autoscale-metric", "concurrency", "--autoscale-target", "4",
      "--adapter", "support=s3://bucket/adapters/support/"], ["--autoscale-metric concurrency --autoscale-target 4 with --adapter"]),
    (["--level", "6", "--plan", "--min-replicas", "5", "--max-replicas", "2"],
     ["--min-replicas 5 is greater than --max-replicas 2"]),
    (["--level", "6", "--plan", "--target-waiting", "-1"], ["--target-waiting -1.0 must be >= 0"]),
    (["--level", "3", "--plan", "--scale-to-zero"], ["--scale-to-zero need", "--autoscale-max"]),
    (["--level", "3", "--plan", "--scale-to-zero", "--autoscale-min", "1", "--autoscale-max", "2"],
     ["--autoscale-min 1 with --scale-to-zero"]),
    (["--level", "2", "--plan", "--scale-to-zero", "--autoscale-max", "2"],
     ["--scale-to-zero: level 2 deploys its model on the endpoint's variant", "levels 3, 4 and 5"]),
    (["--level", "5", "--plan", "--instance-type", "ml.m6i.xlarge", "--scale-to-zero", "--autoscale-max", "2",
      "--multi-model", "s3://bucket/models/"], ["--scale-to-zero with --multi-model"]),
    (["--level", "3", "--scale-to-zero", "--autoscale-max", "2"], ["nothing is autoscaled on --target local"]),
], ids=["min-above-max", "target-zero", "target-negative", "concurrency-needs-target", "min-zero", "target-alone",
        "level-1", "local", "level-2-local", "level-6-sagemaker-flags", "level-3-hpa-flags", "adapters",
        "level-6-min-above-max", "level-6-negative-waiting", "zero-needs-max", "zero-with-min", "zero-level-2",
        "zero-multi-model", "zero-local"])
def test_bad_autoscaling_input_exits_2_naming_the_value(capsys, argv, expected):
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err


# --- level 6: the HPA ---------------------------------------------------------------------------

def test_level6_renders_the_hpa_bounds_and_waiting_target_and_they_validate(capsys, tmp_path):
    from infra.eks.validate import schema_dir, validate_rendered
    from options.deploy import parse_args
    from options.eks import plan, spec_from_args

    argv = ["--level", "6", "--plan", "--min-replicas", "2", "--max-replicas", "7", "--target-waiting", "0.5",
            "--target-cpu", "0"]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    (hpa,) = [s["params"]["manifest"] for s in json.loads(out)["steps"]
              if s["operation"] == "Apply" and s["params"]["manifest"]["kind"] == "HorizontalPodAutoscaler"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 7)
    # vLLM's vllm:num_requests_waiting, renamed by prometheus-adapter for the custom metrics API; the
    # CPU fallback off, so the HPA scales on the queue alone
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "vllm_num_requests_waiting"}, "target": {"type": "AverageValue", "averageValue": "500m"}}}]

    rendered = plan(spec_from_args(parse_args(argv))).extra["rendered"]
    rule = rendered.helm_values["prometheus-adapter"]["rules"]["custom"][0]
    assert rule["seriesQuery"].startswith("vllm:num_requests_waiting")
    if schema_dir() is None:
        pytest.fail("the upstream schema folder is missing: the offline validators cannot run")
    rendered.write(tmp_path)
    report = validate_rendered(rendered, tmp_path, run_checkov=False)
    assert report.ok and report.complete, report.findings()
