"""Plans for every SageMaker level: the exact requests in order and their key parameters."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ops(plan):
    return [(s.service, s.operation) for s in plan.steps]


ENDPOINT = [("sagemaker", "CreateModel"), ("sagemaker", "CreateEndpointConfig"),
            ("sagemaker", "CreateEndpoint")]


def test_level3_classic_example_plans_cleanly(build):
    _, spec, plan = build("--level", "3", "--plan", "--instance-type", "ml.g5.12xlarge",
                          "--option", "OPTION_TENSOR_PARALLEL_DEGREE=4",
                          "--option", "OPTION_SERVING_LOADER=vllm",
                          "--option", "OPTION_MAX_ROLLING_BATCH_SIZE=128")
    assert ops(plan) == ENDPOINT
    container = plan.steps[0].params["PrimaryContainer"]
    assert container["Image"] == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.38.0-lmi29.0.0-cu130"
    assert container["Environment"] == {
        "HF_MODEL_ID": "mistralai/Mistral-7B-Instruct-v0.3", "OPTION_ENABLE_PREFIX_CACHING": "true",
        "OPTION_MAX_ROLLING_BATCH_SIZE": "128", "OPTION_SERVING_LOADER": "vllm",
        "OPTION_TENSOR_PARALLEL_DEGREE": "4"}
    variant = plan.steps[1].params["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.g5.12xlarge" and variant["InitialInstanceCount"] == 1
    assert variant["ModelName"] == plan.steps[0].params["ModelName"]
    # 7.25e9 parameters × 2 bytes = 13.5 GiB → 600 s + 8 s/GiB
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 708
    assert plan.steps[2].params == {"EndpointName": spec.name,
                                    "EndpointConfigName": plan.steps[1].params["EndpointConfigName"]}
    assert plan.cost["hourly_usd"] == pytest.approx(7.09) and plan.cost["instance_type"] == "ml.g5.12xlarge"
    assert "option.tensor_parallel_degree=4" in plan.extra["serving_properties"]
    assert [s.undo.operation for s in plan.steps] == ["DeleteModel", "DeleteEndpointConfig", "DeleteEndpoint"]


def test_level3_properties_form_equals_env_form(build):
    _, _, by_env = build("--level", "3", "--plan", "--option", "OPTION_MAX_MODEL_LEN=4096")
    _, _, by_prop = build("--level", "3", "--plan", "--option", "max_model_len=4096")
    assert by_env.to_json() == by_prop.to_json()


def test_level3_autoscaling_steps(build):
    _, spec, plan = build("--level", "3", "--plan", "--autoscale-min", "1", "--autoscale-max", "4",
                          "--autoscale-target", "60")
    assert ops(plan) == ENDPOINT + [("application-autoscaling", "RegisterScalableTarget"),
                                    ("application-autoscaling", "PutScalingPolicy")]
    register, policy = plan.steps[3].params, plan.steps[4].params
    assert register == {"ServiceNamespace": "sagemaker",
                        "ResourceId": f"endpoint/{spec.name}/variant/AllTraffic",
                        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
                        "MinCapacity": 1, "MaxCapacity": 4}
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert config["TargetValue"] == 60.0
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == \
        "SageMakerVariantInvocationsPerInstance"


def test_level3_local_folder_is_uploaded_and_mounted(build, tiny_model):
    _, spec, plan = build("--level", "3", "--plan", "--model", str(tiny_model))
    services = ops(plan)
    assert services[0] == ("s3", "CreateBucket") and services[-3:] == ENDPOINT
    keys = [s.params["Key"] for s in plan.steps if s.operation == "PutObject"]
    assert f"{spec.name}/model/config.json" in keys
    container = plan.steps[-3].params["PrimaryContainer"]
    assert container["Environment"]["HF_MODEL_ID"] == "/opt/ml/model"
    assert container["ModelDataSource"]["S3DataSource"]["S3Uri"] == \
        f"s3://spectrum-artifacts-us-east-1-<account-id>/{spec.name}/model/"


def test_level3_secret_is_masked_in_plan_json(build):
    _, _, plan = build("--level", "3", "--plan", "--option", "HF_TOKEN=hf_abcdef123")
    text = json.dumps(plan.to_json())
    assert "hf_abcdef123" not in text and '"HF_TOKEN": "****"' in text


def test_level2_jumpstart_plan_from_bundled_specs(build):
    _, spec, plan = build("--level", "2", "--plan")
    assert ops(plan) == ENDPOINT
    container = plan.steps[0].params["PrimaryContainer"]
    assert container["Image"].endswith("huggingface-pytorch-tgi-inference:2.7.0-tgi3.3.6-gpu-py311-cu124-ubuntu22.04")
    assert container["ModelDataSource"]["S3DataSource"]["S3Uri"].startswith(
        "s3://jumpstart-cache-prod-us-east-1/huggingface-llm/huggingface-llm-mistral-7b-instruct/")
    assert container["Environment"]["SM_NUM_GPUS"] == "1"
    assert plan.steps[0].params["EnableNetworkIsolation"] is True
    variant = plan.steps[1].params["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.g5.2xlarge"  # JumpStart's default for the model
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 1200


def test_level2_instance_type_changes_image_env(build):
    _, _, plan = build("--level", "2", "--plan", "--instance-type", "ml.g5.12xlarge")
    assert plan.steps[0].params["PrimaryContainer"]["Environment"]["SM_NUM_GPUS"] == "4"


def test_level2_gated_model_with_eula(build):
    _, _, plan = build("--level", "2", "--plan", "--model", "meta-textgeneration-llama-3-8b-instruct",
                       "--accept-eula")
    source = plan.steps[0].params["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]
    assert source["ModelAccessConfig"] == {"AcceptEula": True}
    assert source["S3Uri"].startswith("s3://jumpstart-private-cache-prod-us-east-1/")


def test_level4_plan_uploads_the_archive(build):
    _, spec, plan = build("--level", "4", "--plan")
    assert ops(plan) == [("s3", "CreateBucket"), ("s3", "PutObject")] + ENDPOINT
    put = plan.steps[1].params
    assert put["Key"] == f"{spec.name}/model.tar.gz"
    assert Path(put["Body"][len("file://"):]).is_file()
    container = plan.steps[2].params["PrimaryContainer"]
    assert container["ModelDataUrl"] == f"s3://{put['Bucket']}/{put['Key']}"
    assert "djl-inference" in container["Image"]
    assert "option.entryPoint=model.py" in plan.extra["serving_properties"]


def test_level5_plan_builds_pushes_then_deploys(build):
    _, _, plan = build("--level", "5", "--plan", "--option", "max_model_len=4096")
    assert ops(plan) == [("ecr", "CreateRepository"), ("docker", "BuildAndPush")] + ENDPOINT
    container = plan.steps[2].params["PrimaryContainer"]
    assert container["Image"] == \
        "<account-id>.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:" + container["Image"].rsplit(":", 1)[1]
    assert container["Environment"] == {"SM_VLLM_MAX_MODEL_LEN": "4096", "SM_NUM_GPUS": "1",
                                        "HF_MODEL_ID": "mistralai/Mistral-7B-Instruct-v0.3"}
    assert "docker push" in plan.steps[1].params["command"]


def test_level5_given_image_skips_the_build(build):
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:dev"
    _, _, plan = build("--level", "5", "--plan", "--image-uri", uri)
    assert ops(plan) == ENDPOINT
    assert plan.steps[0].params["PrimaryContainer"]["Image"] == uri


def _cli(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "options.deploy", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# What made `--plan` take seconds instead of a fraction of one: none of it may load for a plan.
HEAVY_MODULES = ("torch", "vllm", "transformers", "sagemaker", "matplotlib", "moto", "numpy",
                 "boto3", "botocore", "kubernetes")


def test_plan_json_shape_and_that_it_loads_nothing_heavy():
    """Start-up speed checked by what is imported, not by a clock on a shared machine."""
    probe = ("import contextlib, io, json, sys\n"
             "from options.deploy import main\n"
             "out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out):\n"
             "    code = main(['--level', '3', '--plan', '--json'])\n"
             f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]\n"
             "print(json.dumps({'code': code, 'heavy': heavy, 'plan': json.loads(out.getvalue())}))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == 0 and result["heavy"] == []
    doc = result["plan"]
    assert set(doc) >= {"level", "steps", "cost"} and doc["level"] == 3
    assert [s["operation"] for s in doc["steps"]] == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint"]


def test_local_level2_prints_plan_and_says_it_needs_the_cloud():
    done = _cli("--level", "2")
    assert done.returncode == 0, done.stderr
    assert "needs the cloud" in done.stdout and "CreateEndpoint" in done.stdout and "$" in done.stdout


def test_uploads_skip_hidden_caches_and_locks(tmp_path, tiny_model):
    from options.sagemaker.plan import model_files
    import shutil
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "junk.bin").write_bytes(b"x")
    (folder / "config.json.lock").write_text("")
    names = [p.relative_to(folder).as_posix() for p in model_files(folder)]
    assert "config.json" in names and not any(n.startswith(".") or n.endswith(".lock") for n in names)
