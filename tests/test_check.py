"""`spectrum check`: each need of a level is asked of AWS (moto here; what moto lacks, Service
Quotas' lists and Bedrock's model catalogue, answered by botocore's Stubber), and a missing one
comes with its fix and exit 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import moto
import pytest
from botocore.stub import Stubber

from options.check import main

REPO = Path(__file__).resolve().parents[1]
ACCOUNT = "123456789012"
QUOTA = "ml.g5.xlarge for endpoint usage"


def trust(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


@pytest.fixture
def aws(monkeypatch):
    """moto for IAM and STS, with test credentials and a region in the environment."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("SAGEMAKER_ROLE_ARN", raising=False)
    with moto.mock_aws():
        yield boto3.client("iam", region_name="us-east-1")


def stub(botocore_events, service: str) -> Stubber:
    """botocore's Stubber answering ``service`` for every client boto3's default session makes."""
    stubber = Stubber(boto3.client(service, region_name="us-east-1", aws_access_key_id="testing",
                                   aws_secret_access_key="testing"))
    botocore_events(f"before-parameter-build.{service}.*", stubber._assert_expected_params)
    botocore_events(f"before-call.{service}.*", stubber._get_response_handler)
    return stubber


@pytest.fixture
def quotas(botocore_events):
    """Service Quotas (moto has no ListServiceQuotas): ``answer(applied, default)`` queues both lists."""
    stubber = stub(botocore_events, "service-quotas")

    def answer(applied: float | None, default: float | None = None) -> None:
        for operation, value in (("list_service_quotas", applied), ("list_aws_default_service_quotas", default)):
            quotas = [] if value is None else [{"QuotaName": QUOTA, "QuotaCode": "L-1216C47A", "Value": value}]
            stubber.add_response(operation, {"Quotas": quotas}, {"ServiceCode": "sagemaker"})
            if value is not None:
                return
    return answer


def check(capsys, *argv: str) -> tuple[int, dict[str, dict]]:
    code = main([*argv, "--json"])
    return code, {c["check"]: c for c in json.loads(capsys.readouterr().out)}


def test_level_3_is_ready_with_a_role_sagemaker_may_assume_and_a_quota(aws, quotas, capsys):
    aws.create_role(RoleName="SageMakerExecutionRole", AssumeRolePolicyDocument=trust("sagemaker.amazonaws.com"))
    quotas(applied=2)
    code, checks = check(capsys, "--level", "3")
    assert checks["AWS credentials"]["ok"] and ACCOUNT in checks["AWS credentials"]["detail"]
    role = checks["SageMaker execution role"]
    assert role["ok"] and f"arn:aws:iam::{ACCOUNT}:role/SageMakerExecutionRole" in role["detail"]
    assert checks[f"quota: {QUOTA}"] == {"check": f"quota: {QUOTA}", "ok": True, "needed": True,
                                         "detail": "2 (applied), 1 needed", "fix": ""}
    assert checks["extra [sdk]"]["ok"]
    assert code == 0


def test_a_missing_role_fails_with_the_commands_that_create_it(aws, quotas, capsys):
    quotas(applied=2)
    code, checks = check(capsys, "--level", "3")
    role = checks["SageMaker execution role"]
    assert role["ok"] is False and "does not exist" in role["detail"]
    assert "aws iam create-role --role-name SageMakerExecutionRole" in role["fix"]
    assert "sagemaker.amazonaws.com" in role["fix"] and "--role-arn" in role["fix"]
    assert code == 1


def test_a_role_only_ec2_may_assume_fails_with_the_trust_policy_fix(aws, quotas, capsys):
    aws.create_role(RoleName="mine", Path="/service-role/", AssumeRolePolicyDocument=trust("ec2.amazonaws.com"))
    quotas(applied=1)
    code, checks = check(capsys, "--level", "5", "--role-arn", f"arn:aws:iam::{ACCOUNT}:role/service-role/mine")
    role = checks["SageMaker execution role"]
    assert role["ok"] is False and "trusts ec2.amazonaws.com, not sagemaker.amazonaws.com" in role["detail"]
    assert role["fix"].startswith("aws iam update-assume-role-policy --role-name mine ")
    assert code == 1


def test_a_quota_of_0_fails_with_the_increase_request(aws, quotas, capsys):
    aws.create_role(RoleName="SageMakerExecutionRole", AssumeRolePolicyDocument=trust("sagemaker.amazonaws.com"))
    quotas(applied=None, default=0)          # never raised: AWS's default applies
    code, checks = check(capsys, "--level", "4")
    quota = checks[f"quota: {QUOTA}"]
    assert quota["ok"] is False and quota["detail"].startswith("0 (default)")
    assert "request-service-quota-increase --service-code sagemaker --quota-code L-1216C47A " \
           "--desired-value 1" in quota["fix"]
    assert code == 1


def test_bedrock_access_is_asked_of_bedrock(aws, botocore_events, capsys):
    bedrock = stub(botocore_events, "bedrock")
    model = "amazon.nova-micro-v1:0"
    for authorization in ("AUTHORIZED", "NOT_AUTHORIZED"):
        bedrock.add_response("get_foundation_model", {"modelDetails": {
            "modelArn": f"arn:aws:bedrock:us-east-1::foundation-model/{model}", "modelId": model}},
            {"modelIdentifier": model})
        bedrock.add_response("get_foundation_model_availability", {
            "modelId": model, "agreementAvailability": {"status": "AVAILABLE"},
            "authorizationStatus": authorization, "entitlementAvailability": "AVAILABLE",
            "regionAvailability": "AVAILABLE"}, {"modelId": model})
    code, checks = check(capsys, "--level", "1")
    assert checks[f"Bedrock model access: {model}"]["ok"] and code == 0
    code, checks = check(capsys, "--level", "1")
    access = checks[f"Bedrock model access: {model}"]
    assert access["ok"] is False and access["detail"] == "authorization NOT_AUTHORIZED"
    assert "Model access" in access["fix"] and code == 1


def test_tools_not_on_path_fail_with_the_install_hint(aws, quotas, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, checks = check(capsys, "--level", "6")
    for tool, hint in (("kubectl", "kubernetes.io"), ("eksctl", "eksctl.io"), ("helm", "helm.sh")):
        assert checks[f"on PATH: {tool}"]["ok"] is False and hint in checks[f"on PATH: {tool}"]["fix"]
    assert code == 1
    quotas(applied=1)
    _, checks = check(capsys, "--level", "5")
    assert "podman" in checks["on PATH: podman or docker"]["fix"]


def test_without_credentials_it_says_so_plainly_and_skips_the_cloud_checks(tmp_path):
    (tmp_path / "empty").write_text("")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "empty"), "AWS_CONFIG_FILE": str(tmp_path / "empty"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "containers" / "byo-vllm")])}
    done = subprocess.run([sys.executable, "-m", "options.check", "--level", "3"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    text = " ".join(done.stdout.split())      # the table wraps long cells
    assert "AWS credentials" in text and "none found" in text and "aws configure" in text
    assert text.count("skipped: no credentials") == 2        # the role and the quota


def test_the_table_marks_each_check(aws, quotas, capsys):
    quotas(applied=1)
    assert main(["--level", "2"]) == 1
    out = capsys.readouterr().out
    assert "✓" in out and "✗" in out and "1 missing: SageMaker execution role" in out


@pytest.mark.parametrize("argv", [["--level", "9"], ["--level", "1", "--target", "emulator"]])
def test_bad_input_exits_2_naming_the_value(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"level {argv[1]}" in err and ("1, 2, 3, 4, 5, 6" in err or "no emulator" in err)


def test_the_embedded_emulator_answers_the_same_requests(monkeypatch, capsys):
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    code, checks = check(capsys, "--level", "3", "--target", "emulator", "--region", "eu-west-1")
    assert checks["AWS credentials"]["ok"] and ACCOUNT in checks["AWS credentials"]["detail"]
    assert checks["region"] == {"check": "region", "ok": True, "detail": "eu-west-1 (from --region)",
                                "fix": "", "needed": False}
    assert checks["SageMaker execution role"]["ok"] is False        # a fresh emulator has none,
    assert checks["SageMaker execution role"]["needed"] is False    # and moto does not check it
    assert checks[f"quota: {QUOTA}"]["ok"] is None and "moto" in checks[f"quota: {QUOTA}"]["detail"]
    assert code == 0
