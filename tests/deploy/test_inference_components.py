"""Many models on one SageMaker endpoint: inference components (levels 3–5) and a CPU
multi-model endpoint (level 5).

Every request a plan holds is checked against botocore's own service model: its ParamValidator
on the operation's input shape, plus the patterns and enums it leaves unchecked.

Where the lifecycle runs: moto 5.2.5 has no CreateInferenceComponent / Describe / Delete /
ListInferenceComponents, and its CreateEndpointConfig fails on a variant without ModelName, so
the SageMaker control plane of an endpoint of components is botocore's Stubber (ordered, exact
expected requests, with AWS's Creating → InService and a Failed component; responses validated
against the output shapes). Everything else goes to the embedded moto server: STS (the account
id), application-autoscaling, and sagemaker-runtime's InvokeEndpoint, which accepts
InferenceComponentName and TargetModel. The multi-model endpoint runs whole on moto. The
emulator target adds components to its moto (options.aws.moto_serves_inference_components);
one CLI run shows that path, and asserts only what the CLI does with it.
"""
from __future__ import annotations

import datetime as dt
import json

import boto3
import botocore.session
import pytest
import regex   # AWS patterns use Java classes such as \p{L}, which re can't read
from botocore.stub import Stubber
from botocore.validate import ParamValidator

from options.contract import Request, Result
from options.deploy import main
from options.sagemaker.apply import DeployFailed, apply_plan, resolve_plan

ACCOUNT = "123456789012"   # moto's STS account
ADAPTERS = ["--adapter", "support=s3://adapters-bucket/support/", "--adapter", "legal=s3://adapters-bucket/legal/"]
L3_IC = ["--level", "3", "--plan", "--instance-type", "ml.g5.12xlarge", *ADAPTERS]
NOW = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)


# ----------------------------------------------------------------------------------- the service model

def _service(name: str):
    return botocore.session.get_session().get_service_model(name)


def _patterns_and_enums(value, shape, where: str) -> list[str]:
    """What ParamValidator does not check: string patterns and enums, everywhere in a request."""
    bad = []
    if shape.type_name == "structure":
        for key, member in shape.members.items():
            if key in value:
                bad += _patterns_and_enums(value[key], member, f"{where}.{key}")
    elif shape.type_name == "list":
        for i, item in enumerate(value):
            bad += _patterns_and_enums(item, shape.member, f"{where}[{i}]")
    elif shape.type_name == "map":
        for k, v in value.items():
            bad += _patterns_and_enums(v, shape.value, f"{where}[{k}]")
    elif shape.type_name == "string":
        if shape.enum and value not in shape.enum:
            bad.append(f"{where}={value!r} not in {shape.enum}")
        pattern = shape.metadata.get("pattern")
        if pattern and not regex.fullmatch(pattern, value):
            bad.append(f"{where}={value!r} does not match {pattern}")
    return bad


def assert_valid(service: str, operation: str, params: dict) -> None:
    shape = _service(service).operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    assert not report.has_errors(), f"{operation}: {report.generate_report()}"
    assert not _patterns_and_enums(params, shape, operation)


def resolved(steps):
    return json.loads(json.dumps([(s.service, s.operation, s.params) for s in steps])
                      .replace("<account-id>", ACCOUNT))


def assert_plan_valid(plan) -> None:
    for service, operation, params in resolved(plan.steps):
        if service != "docker":
            assert_valid(service, operation, params)
    for step in plan.steps:
        if step.undo:
            assert_valid(step.undo.service, step.undo.operation, resolved([step.undo])[0][2])


# ----------------------------------------------------------------------------------- plans

def components_of(plan):
    return [s for s in plan.steps if s.operation == "CreateInferenceComponent"]


def test_level3_plan_has_a_config_without_model_a_base_and_one_component_per_adapter(build):
    _, spec, plan = build(*L3_IC, "--option", "OPTION_TENSOR_PARALLEL_DEGREE=4")
    assert [s.operation for s in plan.steps] == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint",
                                                 "CreateInferenceComponent", "CreateInferenceComponent",
                                                 "CreateInferenceComponent"]
    assert_plan_valid(plan)
    model, config = plan.steps[0].params, plan.steps[1].params
    variant = config["ProductionVariants"][0]
    assert "ModelName" not in variant and "ContainerStartupHealthCheckTimeoutInSeconds" not in variant
    assert config["ExecutionRoleArn"] == model["ExecutionRoleArn"]
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 1}
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert model["PrimaryContainer"]["Environment"]["OPTION_ENABLE_LORA"] == "true"

    base, support, legal = (s.params for s in components_of(plan))
    assert base["InferenceComponentName"] == f"{spec.name}-base"
    assert base["Specification"]["ModelName"] == model["ModelName"]
    # ml.g5.12xlarge: 4 GPUs, 48 vCPUs, 192 GiB; tensor parallel 4 → one copy holding all four.
    assert base["Specification"]["ComputeResourceRequirements"] == {
        "NumberOfAcceleratorDevicesRequired": 4.0, "NumberOfCpuCoresRequired": 46.0,
        "MinMemoryRequiredInMb": 147456}
    assert base["RuntimeConfig"] == {"CopyCount": 1}
    assert base["Specification"]["StartupParameters"]["ContainerStartupHealthCheckTimeoutInSeconds"] >= 600
    assert support["InferenceComponentName"] == f"{spec.name}-support"
    assert support["Specification"] == {"BaseInferenceComponentName": base["InferenceComponentName"],
                                        "Container": {"ArtifactUrl": "s3://adapters-bucket/support/"}}
    assert "RuntimeConfig" not in support   # adapters share the base's copies and compute
    assert legal["Specification"]["Container"]["ArtifactUrl"] == "s3://adapters-bucket/legal/"
    assert plan.extra["routing"] == {"InferenceComponentName": f"{spec.name}-base"}
    assert plan.cost["hourly_usd"] > 0


def test_one_gpu_per_copy_packs_copies_and_autoscaling_bounds_the_instances(build):
    _, _, plan = build(*L3_IC, "--option", "OPTION_TENSOR_PARALLEL_DEGREE=1", "--instance-count", "2",
                       "--autoscale-max", "5")
    base = components_of(plan)[0].params
    assert base["Specification"]["ComputeResourceRequirements"] == {
        "NumberOfAcceleratorDevicesRequired": 1.0, "NumberOfCpuCoresRequired": 11.5,
        "MinMemoryRequiredInMb": 36864}
    assert base["RuntimeConfig"] == {"CopyCount": 8}      # 4 copies on each of 2 instances
    scaling = plan.steps[1].params["ProductionVariants"][0]["ManagedInstanceScaling"]
    assert (scaling["MinInstanceCount"], scaling["MaxInstanceCount"]) == (2, 5)
    # variant autoscaling does not apply to an endpoint of components
    assert not any(s.service == "application-autoscaling" for s in plan.steps)
    assert_plan_valid(plan)


def test_adding_an_adapter_keeps_the_model_config_and_base(build):
    _, _, one = build("--level", "3", "--plan", ADAPTERS[0], ADAPTERS[1])
    _, _, two = build("--level", "3", "--plan", *ADAPTERS)
    assert [s.params for s in one.steps[:4]] == [s.params for s in two.steps[:4]]


@pytest.mark.parametrize("level, extra", [(4, []), (5, ["--image-uri", f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/x:1"]),
                                          (5, ["--instance-type", "ml.g6e.12xlarge"])])
def test_levels_4_and_5_carry_components_too(build, level, extra):
    _, spec, plan = build("--level", str(level), "--plan", *ADAPTERS, *extra)
    assert_plan_valid(plan)
    names = [s.params["InferenceComponentName"] for s in components_of(plan)]
    assert names == [f"{spec.name}-base", f"{spec.name}-support", f"{spec.name}-legal"]
    assert "ModelName" not in plan.steps[[s.operation for s in plan.steps].index(
        "CreateEndpointConfig")].params["ProductionVariants"][0]
    if level == 5:
        env = next(s for s in plan.steps if s.operation == "CreateModel").params["PrimaryContainer"]["Environment"]
        assert env["SM_VLLM_ENABLE_LORA"] == "true"


def test_level5_cpu_multi_model_endpoint(build):
    _, _, plan = build("--level", "5", "--plan", "--instance-type", "ml.m6i.xlarge",
                       "--multi-model", "s3://models-bucket/models/",
                       "--adapter", "support=s3://models-bucket/models/support.tar.gz",
                       "--invoke", "hi", "--adapter", "support")
    assert_plan_valid(plan)
    container = next(s for s in plan.steps if s.operation == "CreateModel").params["PrimaryContainer"]
    assert container["Mode"] == "MultiModel" and container["ModelDataUrl"] == "s3://models-bucket/models/"
    assert not components_of(plan)
    assert plan.extra["routing"] == {"TargetModel": "support.tar.gz"}
    assert any("only with its NVIDIA Triton container" in n for n in plan.notes)
    assert "SageMaker price" in plan.cost["unknown"]     # the table prices GPU instances only


# ----------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, expected", [
    (["--level", "3", "--plan", "--adapter", "support"], ["'support' has no URL", "support=s3://"]),
    (["--level", "3", "--plan", "--adapter", "support=/data/support"], ["not an S3 location", "aws s3 cp"]),
    (["--level", "3", "--plan", "--adapter", "a=s3://b/a/", "--adapter", "a=s3://b/other/"],
     ["'a' is given twice", "a=s3://b/a/"]),
    (["--level", "3", "--plan", "--adapter", "my_adapter=s3://b/a/"],
     ["'my_adapter' can't name an inference component", "[a-zA-Z0-9]([\\-a-zA-Z0-9]*[a-zA-Z0-9])?"]),
    (["--level", "3", "--plan", "--adapter", "x" * 30 + "=s3://b/a/"], ["at most 26 characters"]),
    (["--level", "3", "--plan", "--adapter", "base=s3://b/a/"], ["names the base model's component"]),
    (["--level", "2", "--plan", "--adapter", "a=s3://b/a/"], ["level 2 deploys one fixed model", "levels 3, 4 and 5"]),
    (["--level", "3", "--adapter", "a=s3://b/a/"], ["add --plan", "--target aws"]),
    (["--level", "5", "--plan", "--multi-model", "s3://b/models/"], ["only with its NVIDIA Triton", "--instance-type ml.m6i.xlarge"]),
    (["--level", "5", "--plan", "--multi-model", "models/", "--instance-type", "ml.m6i.xlarge"],
     ["is not an S3 prefix"]),
    (["--level", "5", "--plan", "--multi-model", "s3://b/models/", "--instance-type", "ml.m6i.xlarge",
      "--adapter", "a=s3://elsewhere/a.tar.gz"], ["lives under --multi-model s3://b/models/"]),
    (["--level", "3", "--plan", "--invoke", "hi", "--adapter", "a", "--adapter", "b"],
     ["already goes to adapter 'a'"]),
], ids=["no-url", "not-s3", "duplicate", "bad-name", "too-long", "reserved", "level2", "local",
        "gpu-mme", "mme-prefix", "mme-outside", "two-targets"])
def test_bad_adapter_input_exits_2_naming_the_value_and_the_fix(capsys, argv, expected):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    for text in expected:
        assert text in err


def test_plan_json_from_the_cli(capsys):
    assert main([*L3_IC, "--json", "--invoke", "hi", "--adapter", "legal"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ops = [s["operation"] for s in doc["steps"]]
    assert ops.count("CreateInferenceComponent") == 3 and doc["cost"]["hourly_usd"] > 0
    assert any("InferenceComponentName=spectrum-l3-mistral-7b-instruct-v0-3-legal" in n for n in doc["notes"])
    for step in doc["steps"]:
        assert_valid(step["service"], step["operation"], json.loads(json.dumps(step["params"]).replace(
            "<account-id>", ACCOUNT)))


# ----------------------------------------------------------------------------------- lifecycle

@pytest.fixture
def sagemaker_stub(botocore_events):
    """botocore's Stubber, answering every SageMaker control-plane call of the clients Target
    makes (its handlers on boto3's default session reach each new client); other services
    (STS, autoscaling, sagemaker-runtime) still go to moto."""
    template = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="testing",
                            aws_secret_access_key="testing")
    stub = Stubber(template)
    botocore_events("before-parameter-build.sagemaker.*", stub._assert_expected_params)
    botocore_events("before-call.sagemaker.*", stub._get_response_handler)
    yield stub
    stub.assert_no_pending_responses()


class Script:
    """The SageMaker answers, in the order the lifecycle asks; each request checked exactly."""

    def __init__(self, stub: Stubber, endpoint: str):
        self.stub, self.endpoint = stub, endpoint

    def ok(self, operation: str, response: dict, params: dict | None = None) -> None:
        self.stub.add_response(operation, response, params)

    def missing(self, operation: str, params: dict) -> None:
        self.stub.add_client_error(operation, "ValidationException", "Could not find it",
                                   http_status_code=400, expected_params=params)

    def endpoint_status(self, status: str, config: str) -> None:
        self.ok("describe_endpoint", {"EndpointName": self.endpoint, "EndpointArn": self.arn("endpoint", self.endpoint),
                                      "EndpointConfigName": config, "EndpointStatus": status,
                                      "CreationTime": NOW, "LastModifiedTime": NOW},
                {"EndpointName": self.endpoint})

    def component(self, params: dict, status: str) -> None:
        name = params["InferenceComponentName"]
        self.ok("describe_inference_component",
                {"InferenceComponentName": name, "InferenceComponentArn": self.arn("inference-component", name),
                 "EndpointName": self.endpoint, "EndpointArn": self.arn("endpoint", self.endpoint),
                 "Specification": params.get("Specification", {}), "CreationTime": NOW,
                 "LastModifiedTime": NOW, "InferenceComponentStatus": status},
                {"InferenceComponentName": name})

    def config(self, params: dict) -> None:
        self.ok("describe_endpoint_config",
                {"EndpointConfigName": params["EndpointConfigName"],
                 "EndpointConfigArn": self.arn("endpoint-config", params["EndpointConfigName"]),
                 "ProductionVariants": params["ProductionVariants"], "CreationTime": NOW},
                {"EndpointConfigName": params["EndpointConfigName"]})

    def listing(self, components: list[dict], status: str = "InService") -> None:
        self.ok("list_inference_components", {"InferenceComponents": [
            {"InferenceComponentName": c["InferenceComponentName"],
             "InferenceComponentArn": self.arn("inference-component", c["InferenceComponentName"]),
             "EndpointName": self.endpoint, "EndpointArn": self.arn("endpoint", self.endpoint),
             "VariantName": "AllTraffic", "CreationTime": NOW, "LastModifiedTime": NOW,
             "InferenceComponentStatus": status}
            for c in components]}, {"EndpointNameEquals": self.endpoint})

    @staticmethod
    def arn(kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:{kind}/{name}"


def script_apply(s: Script, steps, fail_component: str | None = None, creating: bool = True) -> None:
    """What apply_plan asks for a fresh endpoint of components, in order (``creating``: each
    resource answers Creating once before InService, so every wait polls)."""
    by_op = {st.operation: st.params for st in steps if st.operation != "CreateInferenceComponent"}
    s.missing("describe_model", {"ModelName": by_op["CreateModel"]["ModelName"]})
    s.ok("create_model", {"ModelArn": s.arn("model", by_op["CreateModel"]["ModelName"])}, by_op["CreateModel"])
    config = by_op["CreateEndpointConfig"]
    s.missing("describe_endpoint_config", {"EndpointConfigName": config["EndpointConfigName"]})
    s.ok("create_endpoint_config", {"EndpointConfigArn": s.arn("endpoint-config", config["EndpointConfigName"])}, config)
    s.missing("describe_endpoint", {"EndpointName": s.endpoint})
    s.ok("create_endpoint", {"EndpointArn": s.arn("endpoint", s.endpoint)}, by_op["CreateEndpoint"])
    if creating:
        s.endpoint_status("Creating", config["EndpointConfigName"])
    s.endpoint_status("InService", config["EndpointConfigName"])
    for st in steps:
        if st.operation != "CreateInferenceComponent":
            continue
        name = st.params["InferenceComponentName"]
        s.missing("describe_inference_component", {"InferenceComponentName": name})
        s.ok("create_inference_component", {"InferenceComponentArn": s.arn("inference-component", name)}, st.params)
        if creating:
            s.component(st.params, "Creating")
        if name == fail_component:
            s.stub.add_response("describe_inference_component", {
                "InferenceComponentName": name, "InferenceComponentArn": s.arn("inference-component", name),
                "EndpointName": s.endpoint, "EndpointArn": s.arn("endpoint", s.endpoint),
                "FailureReason": "adapter_config.json not found under the ArtifactUrl",
                "CreationTime": NOW, "LastModifiedTime": NOW, "InferenceComponentStatus": "Failed"},
                {"InferenceComponentName": name})
            return
        s.component(st.params, "InService")


def script_delete_components(s: Script, components: list[dict]) -> None:
    """Adapters before the base, each deletion waited for until DescribeInferenceComponent says gone."""
    for params in components:
        name = params["InferenceComponentName"]
        s.ok("delete_inference_component", {}, {"InferenceComponentName": name})
        s.component(params, "Deleting")
        s.missing("describe_inference_component", {"InferenceComponentName": name})


def script_delete_endpoint_config_model(s: Script, config: dict, model: str) -> None:
    s.ok("delete_endpoint", {}, {"EndpointName": s.endpoint})
    s.missing("describe_endpoint", {"EndpointName": s.endpoint})
    s.ok("list_endpoint_configs", {"EndpointConfigs": [
        {"EndpointConfigName": config["EndpointConfigName"],
         "EndpointConfigArn": s.arn("endpoint-config", config["EndpointConfigName"]), "CreationTime": NOW}]},
        {"NameContains": s.endpoint})
    s.config(config)
    s.ok("delete_endpoint_config", {}, {"EndpointConfigName": config["EndpointConfigName"]})
    s.ok("list_models", {"Models": [{"ModelName": model, "ModelArn": s.arn("model", model), "CreationTime": NOW}]},
         {"NameContains": s.endpoint})
    s.ok("delete_model", {}, {"ModelName": model})


def _wire(level: int, text: str) -> dict:
    from options import contract
    from options.core import rung
    return contract.dialect(rung(level).can.dialect).result_to_wire(Result(text=text, finish_reason="stop"))


def test_lifecycle_apply_status_invoke_down(target, build, sagemaker_stub, botocore_events, queue_answer):
    module, spec, plan = build(*L3_IC)
    steps = resolve_plan(plan, target)     # <account-id> from moto's STS
    s = Script(sagemaker_stub, spec.name)
    config = next(st.params for st in steps if st.operation == "CreateEndpointConfig")
    model = next(st.params for st in steps if st.operation == "CreateModel")["ModelName"]
    base, support, legal = (st.params for st in steps if st.operation == "CreateInferenceComponent")

    script_apply(s, steps)
    progress: list[str] = []
    deployment = apply_plan(plan, target, progress.append)
    assert [line.split(":")[0] for line in progress if line.startswith("+")] == \
        ["+ CreateModel", "+ CreateEndpointConfig", "+ CreateEndpoint"] + ["+ CreateInferenceComponent"] * 3
    assert f"  inference component {legal['InferenceComponentName']}: InService (0 s)" in progress
    assert deployment.extra["routing"] == {"InferenceComponentName": base["InferenceComponentName"]}

    # --status: the endpoint, then its components and what each one is
    s.endpoint_status("InService", config["EndpointConfigName"])
    s.config(config)
    s.listing([base, support, legal])
    for params in (base, support, legal):
        s.component(params, "InService")
    state = module.status(spec, target)
    assert state["variants"] == [{"model": None, "instance_type": "ml.g5.12xlarge", "initial_instance_count": 1}]
    assert state["components"] == [
        {"name": base["InferenceComponentName"], "status": "InService", "model": model},
        {"name": support["InferenceComponentName"], "status": "InService",
         "adapter_of": base["InferenceComponentName"], "artifacts": "s3://adapters-bucket/support/"},
        {"name": legal["InferenceComponentName"], "status": "InService",
         "adapter_of": base["InferenceComponentName"], "artifacts": "s3://adapters-bucket/legal/"}]

    # --invoke --adapter legal: moto's sagemaker-runtime, the component named on the wire
    sent = []
    botocore_events("before-send.sagemaker-runtime.InvokeEndpoint", lambda request, **_: sent.append(request))
    queue_answer(_wire(3, "from the legal adapter"))
    deployment.extra["routing"] = {"InferenceComponentName": legal["InferenceComponentName"]}
    result = module.invoke(deployment, Request(prompt="Hi", max_tokens=8))
    assert result.text == "from the legal adapter"
    assert sent[0].headers["X-Amzn-SageMaker-Inference-Component"].decode() == legal["InferenceComponentName"]

    # --down: adapters, then the base, then endpoint, config, model
    s.endpoint_status("InService", config["EndpointConfigName"])
    s.endpoint_status("InService", config["EndpointConfigName"])   # settled?
    s.config(config)
    s.listing([base, support, legal])
    for params in (base, support, legal):
        s.component(params, "InService")
    script_delete_components(s, [support, legal, base])
    script_delete_endpoint_config_model(s, config, model)
    removed = module.down(spec, target)
    assert removed[:3] == [f"inference component {c['InferenceComponentName']}" for c in (support, legal, base)]
    assert removed[3:] == [f"endpoint {spec.name}", f"endpoint config {config['EndpointConfigName']}",
                           f"model {model}"]


def test_a_failed_adapter_rolls_everything_back_newest_first(target, build, sagemaker_stub):
    _, spec, plan = build(*L3_IC)
    steps = resolve_plan(plan, target)
    s = Script(sagemaker_stub, spec.name)
    config = next(st.params for st in steps if st.operation == "CreateEndpointConfig")
    model = next(st.params for st in steps if st.operation == "CreateModel")["ModelName"]
    base, support, _ = (st.params for st in steps if st.operation == "CreateInferenceComponent")
    script_apply(s, steps, fail_component=support["InferenceComponentName"])
    # rollback: the failed adapter, the base (each waited for), endpoint, config, model
    script_delete_components(s, [support, base])
    s.endpoint_status("InService", config["EndpointConfigName"])    # settled before deleting
    s.ok("delete_endpoint", {}, {"EndpointName": spec.name})
    s.missing("describe_endpoint", {"EndpointName": spec.name})
    s.ok("delete_endpoint_config", {}, {"EndpointConfigName": config["EndpointConfigName"]})
    s.ok("delete_model", {}, {"ModelName": model})
    progress: list[str] = []
    with pytest.raises(DeployFailed, match="adapter_config.json not found under the ArtifactUrl"):
        apply_plan(plan, target, progress.append)
    assert [line for line in progress if line.startswith("- ")] == [
        f"- DeleteInferenceComponent {support['InferenceComponentName']}",
        f"- DeleteInferenceComponent {base['InferenceComponentName']}",
        f"- DeleteEndpoint {spec.name}", f"- DeleteEndpointConfig {config['EndpointConfigName']}",
        f"- DeleteModel {model}"]


def test_rerun_reuses_components_and_refuses_a_changed_adapter(target, build, sagemaker_stub):
    _, spec, plan = build(*L3_IC)
    steps = resolve_plan(plan, target)
    s = Script(sagemaker_stub, spec.name)
    by_op = {st.operation: st.params for st in steps if st.operation != "CreateInferenceComponent"}
    base, support, legal = (st.params for st in steps if st.operation == "CreateInferenceComponent")
    s.ok("describe_model", {"ModelName": by_op["CreateModel"]["ModelName"], "CreationTime": NOW,
                            "ModelArn": s.arn("model", by_op["CreateModel"]["ModelName"])},
         {"ModelName": by_op["CreateModel"]["ModelName"]})
    s.config(by_op["CreateEndpointConfig"])
    s.endpoint_status("InService", by_op["CreateEndpointConfig"]["EndpointConfigName"])
    s.endpoint_status("InService", by_op["CreateEndpointConfig"]["EndpointConfigName"])
    s.component(base, "InService")
    s.component(base, "InService")
    s.component(support, "InService")
    s.component(support, "InService")
    s.component({**legal, "Specification": {**legal["Specification"],
                                            "Container": {"ArtifactUrl": "s3://adapters-bucket/legal-v1/"}}},
                "InService")
    with pytest.raises(DeployFailed, match="legal already exists with artifacts s3://adapters-bucket/legal-v1/"):
        apply_plan(plan, target, lambda _: None)   # nothing created, so nothing rolled back


def test_multi_model_endpoint_on_moto_invokes_by_target_model(target, build, inventory, queue_answer,
                                                              botocore_events):
    module, spec, plan = build("--level", "5", "--target", "emulator", "--instance-type", "ml.m6i.xlarge",
                               "--image-uri", f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:cpu",
                               "--multi-model", "s3://models-bucket/models/",
                               "--adapter", "support=s3://models-bucket/models/support.tar.gz")
    deployment = apply_plan(plan, target, lambda _: None)
    held = target.client("sagemaker").describe_model(ModelName=inventory(target)["models"][0])
    assert held["PrimaryContainer"]["Mode"] == "MultiModel"
    sent = []
    botocore_events("before-send.sagemaker-runtime.InvokeEndpoint", lambda request, **_: sent.append(request))
    queue_answer(_wire(5, "hi"))
    assert module.invoke(deployment, Request(prompt="Hi", max_tokens=8)).text == "hi"
    assert sent[0].headers["X-Amzn-SageMaker-Target-Model"].decode() == "support.tar.gz"
    assert f"endpoint {spec.name}" in module.down(spec, target)


def test_cli_deploys_then_invokes_the_named_adapter(emulator_url, target, build, sagemaker_stub,
                                                     botocore_events, queue_answer, capsys, monkeypatch):
    """The --target aws code path end to end (requests to moto through --endpoint-url, SageMaker's
    control plane through the Stubber): apply, --invoke … --adapter legal, status."""
    argv = ["--level", "3", "--target", "aws", "--endpoint-url", emulator_url, "--region", "us-east-1",
            "--instance-type", "ml.g5.12xlarge", *ADAPTERS, "--invoke", "Hi", "--adapter", "legal"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    _, spec, plan = build(*argv)
    steps = resolve_plan(plan, target)
    s = Script(sagemaker_stub, spec.name)
    config = next(st.params for st in steps if st.operation == "CreateEndpointConfig")
    components = [st.params for st in steps if st.operation == "CreateInferenceComponent"]
    script_apply(s, steps, creating=False)   # the aws target polls every 15 s: already InService
    s.endpoint_status("InService", config["EndpointConfigName"])
    s.config(config)
    s.listing(components)
    for params in components:
        s.component(params, "InService")
    sent = []
    botocore_events("before-send.sagemaker-runtime.InvokeEndpoint", lambda request, **_: sent.append(request))
    queue_answer(_wire(3, "legal says hi"))
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["answer"]["text"] == "legal says hi"
    assert sent[0].headers["X-Amzn-SageMaker-Inference-Component"].decode() == f"{spec.name}-legal"
    assert [c["name"] for c in summary["status"]["components"]] == [c["InferenceComponentName"] for c in components]


def test_emulator_target_runs_an_endpoint_of_components_in_one_command(capsys):
    # moto replays a cached answer to a body it has seen: a prompt no other test sends
    assert main(["--level", "3", "--target", "emulator", "--json", *ADAPTERS,
                 "--invoke", "Which adapter answers in the emulator?", "--adapter", "legal"]) == 0
    summary = json.loads(capsys.readouterr().out)
    name = summary["endpoint"]
    assert summary["answer"]["text"].startswith("(emulator) canned answer")
    assert [(c["name"], c.get("adapter_of")) for c in summary["status"]["components"]] == [
        (f"{name}-base", None), (f"{name}-support", f"{name}-base"), (f"{name}-legal", f"{name}-base")]
    assert summary["removed"][:4] == [f"inference component {name}-support", f"inference component {name}-legal",
                                      f"inference component {name}-base", f"endpoint {name}"]


def test_streamed_invocation_names_the_component(target, build, botocore_events):
    """InvokeEndpointWithResponseStream carries InferenceComponentName too (real event-stream
    bytes from a before-send hook: moto has no streaming invocations)."""
    from botocore.awsrequest import AWSResponse
    from test_stream import WORDS, _answer_stream, _Raw

    from options import contract
    from options.core import rung

    module, spec, plan = build("--level", "3", "--target", "emulator", *ADAPTERS, "--invoke", "Hi",
                               "--adapter", "support")
    deployment = apply_plan(plan, target, lambda _: None)
    seen = []

    def answer(request, **_):
        seen.append(request.headers.get("X-Amzn-SageMaker-Inference-Component", b"").decode())
        return AWSResponse(request.url, 200, {"Content-Type": "application/vnd.amazon.eventstream"},
                           _Raw(_answer_stream(rung(3).can.dialect), chunk=13))
    botocore_events("before-send.sagemaker-runtime.InvokeEndpointWithResponseStream", answer)
    events = list(module.invoke(deployment, Request(prompt="Why GPUs?", stream=True)))
    assert contract.collect(events).text == "".join(WORDS)
    assert seen == [f"{spec.name}-support"]
    module.down(spec, target)
