"""``python -m cost recommend --trace``: the simulated rungs weighed by the decision tree and the
SLO, the recommended rung's autoscaling policy, and a deploy command that sets exactly that
policy (parsed by options.deploy's own parser, planned by the rung itself)."""
from __future__ import annotations

import json
import shlex

import pytest

from cost.__main__ import main
from cost.traces import AZURE_CONV_TRACE

LLAMA = "meta.llama3-1-8b-instruct-v1:0"
BASE = ["recommend", "--trace", str(AZURE_CONV_TRACE), "--model", LLAMA, "--instance", "g5.xlarge",
        "--capacity", "1500"]
TEN_MINUTES = ["--window", "0:600", "--slo-ttft-ms", "3000", "--slo-e2e-ms", "40000"]


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def recommend_json(capsys, *args) -> dict:
    code, out, err = run(capsys, *BASE, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def deploy_args(command: str):
    """The printed command, parsed as ``python -m options.deploy`` parses it."""
    from options.deploy import parse_args

    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "options.deploy"]
    return parse_args(argv[3:])


def assert_command_sets_the_policy(data: dict) -> None:
    from options.sagemaker.autoscaling import autoscaling_from_args

    policy, level = data["policy"], data["level"]
    args = deploy_args(data["deploy"]["command"])
    assert (args.level, args.target) == (level, "aws")
    if 2 <= level <= 5:
        assert policy["kind"] == "sagemaker_target_tracking"
        assert args.instance_type == data["instance"] == "ml.g5.xlarge"
        scaling = autoscaling_from_args(args)
        assert scaling.predefined_metric == policy["metric"]
        assert scaling.scale_to_zero == (policy["scales"] == "copies") == args.scale_to_zero
        assert (scaling.min_capacity, scaling.max_capacity, scaling.target_value) == \
            (policy["min_instances"], policy["max_instances"], policy["target"])
    elif level == 6 and policy["kind"] == "ray_serve_ongoing_requests":
        from options.eks import autoscaling_given

        assert args.engine == "rayservice" and args.instance_type == data["instance"] == "g5.xlarge"
        fields = autoscaling_given(args)
        assert {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
                **dict(fields["ray_autoscaling"])} == policy["autoscaling_config"]
    elif level == 6:
        assert policy["kind"] == "hpa_keda_queue_depth" and policy["metric"] == "vllm:num_requests_waiting"
        assert args.instance_type == data["instance"] == "g5.xlarge"
        assert (args.min_replicas, args.max_replicas, args.target_waiting) == \
            (policy["min_replicas"], policy["max_replicas"], policy["target"])
        assert args.target_cpu == 0               # the simulated HPA scales on the queue alone
    plan = deploy_args(data["deploy"]["plan_command"])
    assert plan.plan and plan.level == level


def planned(command: str):
    """The rung's own plan for a printed --plan command."""
    from options.spectrum import rung_module

    args = deploy_args(command)
    module = rung_module(args.level)
    return module.plan(module.spec_from_args(args))


def test_the_shipped_trace_gets_a_rung_a_policy_and_its_deploy_command(capsys):
    args = ["--slo-ttft-ms", "2000", "--slo-e2e-ms", "30000"]
    data = recommend_json(capsys, *args)
    rows = {r["level"]: r for r in data["simulation"]["rungs"]}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    row = rows[data["level"]]
    assert data["policy"] == row["policy"]
    assert (data["monthly_usd"], data["slo_attainment"], data["meets_slo"]) == \
        (row["monthly_usd"], row["slo_attainment"], row["meets_slo"])
    # a rung meeting the SLO is recommended whenever one does
    assert data["meets_slo"] == any(r["meets_slo"] for r in rows.values())
    assert_command_sets_the_policy(data)

    code, out, _ = run(capsys, *BASE, *args)
    assert code == 0
    assert data["deploy"]["command"] in out.splitlines()[out.splitlines().index("Deploy it") + 1]
    assert f"Recommended: rung {data['level']}" in out and "Why" in out and "Cheapest meeting the SLO" in out


def test_a_sagemaker_rung_plans_the_recommended_target_tracking(capsys):
    # --custom-model rules out rungs 1-2; --rungs 3 leaves LMI alone, whatever the bills
    data = recommend_json(capsys, *TEN_MINUTES, "--custom-model", "--rungs", "3")
    assert data["level"] == 3 and data["tree_level"] == 3
    assert_command_sets_the_policy(data)
    plan = planned(data["deploy"]["plan_command"])
    register, policy = plan.steps[-2].params, plan.steps[-1].params
    assert (register["MinCapacity"], register["MaxCapacity"]) == \
        (data["policy"]["min_instances"], data["policy"]["max_instances"])
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == data["policy"]["metric"]
    assert config["TargetValue"] == data["policy"]["target"]
    assert (config["ScaleOutCooldown"], config["ScaleInCooldown"]) == \
        (data["policy"]["scale_out_cooldown_s"], data["policy"]["scale_in_cooldown_s"])


def test_scale_to_zero_plans_the_copies_autoscaling_and_the_wake_alarm_simulated(capsys):
    from cost.simulate.scaling import default
    from options.sagemaker.plan import component_scaling_resource_id

    data = recommend_json(capsys, *TEN_MINUTES, "--custom-model", "--rungs", "3", "--scale-to-zero")
    policy = data["policy"]
    assert data["level"] == 3 and policy["min_instances"] == 0 and policy["scales"] == "copies"
    assert policy["metric"].startswith("SageMakerInferenceComponent")
    assert_command_sets_the_policy(data)
    assert "--scale-to-zero" in data["deploy"]["command"] and "--autoscale-min" not in data["deploy"]["command"]
    steps = planned(data["deploy"]["plan_command"]).steps
    register, tracking, wake, alarm = (s.params for s in steps[-4:])
    component = next(s.params for s in steps if s.operation == "CreateInferenceComponent")
    assert register["ResourceId"] == component_scaling_resource_id(component["InferenceComponentName"])
    assert (register["MinCapacity"], register["MaxCapacity"]) == (0, policy["max_instances"])
    config = tracking["TargetTrackingScalingPolicyConfiguration"]
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == policy["metric"]
    assert config["TargetValue"] == policy["target"]
    assert (config["ScaleOutCooldown"], config["ScaleInCooldown"]) == \
        (policy["scale_out_cooldown_s"], policy["scale_in_cooldown_s"])
    # the way back from 0 copies: one copy added by the alarm the simulation waits for
    assert wake["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}]
    assert alarm["MetricName"] == "NoCapacityInvocationFailures"
    assert alarm["Period"] * alarm["EvaluationPeriods"] == default("sagemaker", "no_capacity_alarm_s")
    assert alarm["AlarmActions"] == [f"<policy-arn:{wake['PolicyName']}>"]
    assert component["RuntimeConfig"]["CopyCount"] == 1          # one copy to start, as simulated


def test_own_infrastructure_gets_the_hpa_the_simulation_chose(capsys):
    data = recommend_json(capsys, *TEN_MINUTES, "--own-infrastructure")
    assert data["level"] == 6 and data["tree_level"] == 6
    assert any("ruled out by the requirements: rung(s) 1, 2, 3, 4, 5" in w for w in data["why"])
    assert_command_sets_the_policy(data)
    from infra.eks.autoscaling import _quantity

    plan = planned(data["deploy"]["plan_command"])
    (hpa,) = [s.params["manifest"] for s in plan.steps
              if s.operation == "Apply" and s.params["manifest"]["kind"] == "HorizontalPodAutoscaler"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == \
        (data["policy"]["min_replicas"], data["policy"]["max_replicas"])
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "vllm_num_requests_waiting"},
        "target": {"type": "AverageValue", "averageValue": _quantity(data["policy"]["target"])}}}]


def test_own_infrastructure_on_ray_gets_the_serve_autoscaling_the_simulation_chose(capsys):
    data = recommend_json(capsys, *TEN_MINUTES, "--own-infrastructure", "--rung6-autoscaler", "ray-serve",
                          "--ray-autoscaling", "upscale_delay_s=12")
    policy = data["policy"]
    assert data["level"] == 6 and policy["kind"] == "ray_serve_ongoing_requests"
    assert policy["autoscaling_config"]["upscale_delay_s"] == 12
    assert_command_sets_the_policy(data)
    assert "--engine rayservice" in data["deploy"]["command"]
    plan = planned(data["deploy"]["plan_command"])
    (ray,) = [s.params["manifest"] for s in plan.steps
              if s.operation == "Apply" and s.params["manifest"]["kind"] == "RayService"]
    import yaml

    app = yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"][0]
    assert app["args"]["autoscaling_config"] == policy["autoscaling_config"]
    code, out, _ = run(capsys, *BASE, *TEN_MINUTES, "--own-infrastructure", "--rung6-autoscaler", "ray-serve")
    assert code == 0 and "Ray Serve's autoscaler (--engine rayservice)" in out


def test_a_requirement_removes_the_rungs_below_it(capsys):
    data = recommend_json(capsys, *TEN_MINUTES, "--bedrock-tpm", "10000000", "--own-account")
    assert data["level"] >= 2 and data["tree_level"] == 2
    assert any("ruled out by the requirements: rung(s) 1" in w for w in data["why"])
    assert any("the model must run in your own AWS account" in w for w in data["why"])
    assert any(f.startswith("without --own-account") for f in data["flip"])
    assert_command_sets_the_policy(data)


def test_without_a_savings_threshold_the_answer_is_the_cheapest_rung_meeting_the_slo(capsys):
    data = recommend_json(capsys, *TEN_MINUTES, "--bedrock-tpm", "10000000", "--min-savings", "0")
    sim = data["simulation"]
    meeting = [r for r in sim["rungs"] if r["meets_slo"]]
    if not meeting:
        pytest.skip("no rung meets this SLO on this simulator's numbers")
    assert data["meets_slo"]
    cheapest = min(r["monthly_usd"] for r in meeting)
    assert data["monthly_usd"] == cheapest
    assert data["level"] == min(r["level"] for r in meeting if r["monthly_usd"] == cheapest)


def test_rung_1_is_answered_in_its_cheapest_form_that_meets_the_slo(capsys):
    pt = ["--bedrock-pt-unit-tpm", "100000", "--bedrock-pt-unit-usd-hour", "20"]
    # A TTFT SLO the default on-demand quota misses and batch cannot meet: Provisioned Throughput.
    data = recommend_json(capsys, "--rungs", "1", "--window", "0:600", "--slo-ttft-ms", "2000",
                          "--bedrock-batch", *pt)
    options = {o["option"]: o for o in data["simulation"]["rungs"][0]["options"]}
    assert "excluded" in options["batch"] and options["provisioned_throughput"]["meets_slo"]
    assert data["level"] == 1 and data["bedrock_form"] == "provisioned_throughput" and data["meets_slo"]
    units = options["provisioned_throughput"]["model_units"]
    assert data["policy"]["model_units"] == units
    assert data["monthly_usd"] == options["provisioned_throughput"]["monthly_usd"]
    assert data["deploy"]["command"] is None
    assert f"--model-units {units}" in data["deploy"]["notes"][0]
    # No latency bound: batch serves everything at half the on-demand price, and is the answer.
    data = recommend_json(capsys, "--rungs", "1", "--window", "0:600", "--bedrock-batch")
    on_demand = data["simulation"]["rungs"][0]
    assert data["bedrock_form"] == "batch" and data["policy"]["kind"] == "bedrock_batch"
    assert data["monthly_usd"] < on_demand["monthly_usd"]
    assert "create-model-invocation-job" in data["deploy"]["notes"][0]


def test_without_a_trace_recommend_answers_as_before(capsys):
    code, out, err = run(capsys, "recommend", "--own-account", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["level"] == 2 and "deploy" not in data and "simulation" not in data


@pytest.mark.parametrize("args, message", [
    (["--avg", "500"], "--avg describes a traffic profile"),
    (["--mix", "3:1"], "--mix 3:1 does not apply with --trace"),
    (["--min-replicas", "2"], "--min-instances 2"),
    (["--own-infrastructure", "--rungs", "1,2"], "add rungs 6-6 to --rungs"),
    (["--bench", "a.json", "--bench", "b.json"], "--bench given 2 times"),
    (["--slo-attainment", "2"], "--slo-attainment 2"),
])
def test_bad_input_with_a_trace_exits_2_naming_it(capsys, args, message):
    base = BASE if "--bench" not in args else [a for a in BASE if a not in ("--capacity", "1500")]
    code, _, err = run(capsys, *base, "--window", "0:60", *args)
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_simulation_flags_without_a_trace_are_refused(capsys):
    code, _, err = run(capsys, "recommend", "--own-account", "--slo-ttft-ms", "500", "--rungs", "2,3")
    assert code == 2
    assert "--rungs, --slo-ttft-ms" in err and "add --trace FILE" in err
