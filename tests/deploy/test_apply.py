"""apply / status / invoke / down against the embedded moto server, for levels 2–5.

What moto lacks is faked at botocore's level (a before-call hook), never in the project's code.
"""
from __future__ import annotations

import botocore.exceptions
from botocore.awsrequest import AWSResponse
import pytest

from options.contract import Request
from options.core import rung
from options.sagemaker.apply import DeployFailed, apply_plan

LEVEL_ARGS = {
    2: ["--level", "2", "--target", "emulator"],
    3: ["--level", "3", "--target", "emulator", "--instance-type", "ml.g5.12xlarge",
        "--option", "OPTION_TENSOR_PARALLEL_DEGREE=4", "--autoscale-max", "3"],
    4: ["--level", "4", "--target", "emulator"],
    5: ["--level", "5", "--target", "emulator"],
}


@pytest.mark.parametrize("level", sorted(LEVEL_ARGS))
def test_apply_status_invoke_down(level, target, build, inventory, queue_answer):
    module, spec, plan = build(*LEVEL_ARGS[level])
    quiet = []
    deployment = apply_plan(plan, target, quiet.append)
    assert deployment.endpoint_name == spec.name
    held = inventory(target)
    assert held["endpoints"] == [spec.name]
    assert len(held["models"]) == 1 and len(held["endpoint_configs"]) == 1
    assert any("InService" in line for line in quiet)

    state = module.status(spec, target)
    assert state["status"] == "InService"
    config = next(s for s in plan.steps if s.operation == "CreateEndpointConfig")
    assert state["variants"][0]["instance_type"] == config.params["ProductionVariants"][0]["InstanceType"]
    if level == 3:
        assert state["autoscaling"] == {"min": 1, "max": 3, "scales": "instances"}
        assert held["scalable_targets"] == [f"endpoint/{spec.name}/variant/AllTraffic"]
    if level == 4:
        assert held["objects"] == [f"{spec.name}/model.tar.gz"]
    if level == 5:
        assert held["repositories"] == ["spectrum-byo-vllm"]

    from options import contract
    dialect = contract.dialect(rung(level).can.dialect)
    queue_answer(dialect.result_to_wire(contract.Result(text=f"hello from level {level}",
                                                        finish_reason="stop")))
    result = module.invoke(deployment, Request(prompt="Hi", max_tokens=8))
    assert result.text == f"hello from level {level}"

    removed = module.down(spec, target)
    assert f"endpoint {spec.name}" in removed
    after = inventory(target)
    assert after["endpoints"] == [] and after["models"] == [] and after["endpoint_configs"] == []
    assert after["scalable_targets"] == []
    assert module.status(spec, target)["status"] == "absent"


@pytest.mark.parametrize("level", [3, 4])
def test_rerun_creates_nothing_twice(level, target, build, inventory):
    _, spec, plan = build(*LEVEL_ARGS[level])
    first = apply_plan(plan, target, lambda _: None)
    before = inventory(target)
    second = apply_plan(plan, target, lambda _: None)
    assert second.created == [] and len(second.reused) == len(first.created)
    assert inventory(target) == before


def test_changed_config_on_existing_endpoint_is_refused_and_leaves_it(target, build, inventory):
    _, spec, plan = build(*LEVEL_ARGS[2])
    apply_plan(plan, target, lambda _: None)
    before = inventory(target)
    _, _, bigger = build(*LEVEL_ARGS[2], "--instance-type", "ml.g5.12xlarge")
    with pytest.raises(DeployFailed, match="already exists with endpoint config"):
        apply_plan(bigger, target, lambda _: None)
    after = inventory(target)
    assert after["endpoints"] == before["endpoints"] and after["endpoint_configs"] == before["endpoint_configs"]


@pytest.mark.parametrize("failing", ["CreateEndpointConfig", "CreateEndpoint", "PutScalingPolicy"])
def test_a_failed_create_leaves_nothing(failing, target, build, inventory, botocore_events):
    def refuse(**_):
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "ResourceLimitExceeded", "Message": "quota for ml.g5.12xlarge is 0"}},
            failing)
    service = "application-autoscaling" if failing == "PutScalingPolicy" else "sagemaker"
    botocore_events(f"before-call.{service}.{failing}", refuse)
    _, _, plan = build(*LEVEL_ARGS[3])
    lines = []
    with pytest.raises(DeployFailed, match="ResourceLimitExceeded"):
        apply_plan(plan, target, lines.append)
    held = inventory(target)
    assert held["models"] == [] and held["endpoint_configs"] == [] and held["endpoints"] == []
    assert held["scalable_targets"] == []
    assert any("rolling back" in line for line in lines)


def test_endpoint_failed_reports_reason_and_rolls_back(target, build, inventory, botocore_events):
    created = {"endpoint": False}

    def after_create(**_):
        created["endpoint"] = True

    def failed_once(**_):
        if created["endpoint"] and created.get("reported") is None:
            created["reported"] = True
            return (AWSResponse("http://emulator", 200, {}, None),  # short-circuits the request
                    {"EndpointName": spec.name, "EndpointArn": "arn:x",
                     "EndpointConfigName": "c", "EndpointStatus": "Failed",
                     "FailureReason": "The primary container for production variant AllTraffic did "
                                      "not pass the ping health check.",
                     "CreationTime": "2026-01-01T00:00:00Z", "LastModifiedTime": "2026-01-01T00:00:00Z"})
        return None
    _, spec, plan = build(*LEVEL_ARGS[5])
    botocore_events("after-call.sagemaker.CreateEndpoint", after_create)
    botocore_events("before-call.sagemaker.DescribeEndpoint", failed_once)
    with pytest.raises(DeployFailed, match="did not pass the ping health check"):
        apply_plan(plan, target, lambda _: None)
    held = inventory(target)
    assert held == {**held, "models": [], "endpoint_configs": [], "endpoints": [], "repositories": []}


def test_down_cleans_up_what_a_broken_run_left(target, build, inventory):
    """A model and config without an endpoint (e.g. a killed run) are still found and removed."""
    module, spec, plan = build(*LEVEL_ARGS[3])
    from options.sagemaker.apply import _Clients, send
    clients = _Clients(target)
    for step in plan.steps[:2]:
        send(clients, step)
    assert len(inventory(target)["models"]) == 1
    removed = module.down(spec, target)
    assert len(removed) == 2
    assert inventory(target)["models"] == [] and inventory(target)["endpoint_configs"] == []


def test_aws_without_docker_prints_the_commands_and_leaves_nothing(emulator_url, build, inventory,
                                                                   monkeypatch, target):
    from options.aws import Target
    from options.sagemaker.apply import docker_available

    if docker_available():
        pytest.skip("a Docker daemon runs here: the image would really be built")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    aws_like = Target("aws", "us-east-1", emulator_url)  # the aws code path, sent to moto
    _, _, plan = build("--level", "5", "--target", "aws")
    with pytest.raises(DeployFailed) as failed:
        apply_plan(plan, aws_like, lambda _: None)
    message = str(failed.value)
    assert "no Docker daemon" in message and "docker push 123456789012.dkr.ecr" in message
    assert "--image-uri" in message
    assert inventory(target)["repositories"] == [] and inventory(target)["models"] == []


def _describe_as(spec_name: str, status: str) -> tuple:
    return (AWSResponse("http://emulator", 200, {}, None),
            {"EndpointName": spec_name, "EndpointArn": "arn:x", "EndpointConfigName": "c",
             "EndpointStatus": status, "CreationTime": "2026-01-01T00:00:00Z",
             "LastModifiedTime": "2026-01-01T00:00:00Z"})


def test_wait_shows_progress_with_elapsed_time(target, build, botocore_events):
    _, spec, plan = build(*LEVEL_ARGS[3])
    seen = {"created": False, "creating": 0}

    def creating_twice(**_):
        if seen["created"] and seen["creating"] < 2:
            seen["creating"] += 1
            return _describe_as(spec.name, "Creating")
        return None
    botocore_events("after-call.sagemaker.CreateEndpoint", lambda **_: seen.update(created=True))
    botocore_events("before-call.sagemaker.DescribeEndpoint", creating_twice)
    lines = []
    apply_plan(plan, target, lines.append, poll_s=0.05)
    waits = [line for line in lines if line.startswith(f"  endpoint {spec.name}: ")]
    assert [w.split(": ")[1].split(" ")[0] for w in waits] == ["Creating", "InService"]
    assert all(w.endswith(" s)") for w in waits)


def test_ctrl_c_while_waiting_removes_what_was_made(target, build, inventory, botocore_events):
    _, spec, plan = build(*LEVEL_ARGS[3])
    seen = {"created": False, "interrupted": False}

    def interrupt_once(**_):
        if seen["created"] and not seen["interrupted"]:
            seen["interrupted"] = True
            raise KeyboardInterrupt
        return None
    botocore_events("after-call.sagemaker.CreateEndpoint", lambda **_: seen.update(created=True))
    botocore_events("before-call.sagemaker.DescribeEndpoint", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        apply_plan(plan, target, lambda _: None, poll_s=0.05)
    held = inventory(target)
    assert held["endpoints"] == [] and held["models"] == [] and held["endpoint_configs"] == []
