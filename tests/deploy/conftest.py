"""An embedded moto server for the whole module, reset between tests, and botocore-level fault hooks."""
from __future__ import annotations

import json
import urllib.request

import pytest

from options.aws import Target, emulator


@pytest.fixture(scope="session")
def emulator_url():
    with emulator() as url:
        yield url


@pytest.fixture
def target(emulator_url, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECTRUM_CACHE", str(tmp_path / "cache"))
    urllib.request.urlopen(urllib.request.Request(emulator_url + "/moto-api/reset", method="POST")).read()
    return Target("emulator", "us-east-1", emulator_url)


@pytest.fixture
def inventory():
    return _inventory


def _inventory(target) -> dict[str, list[str]]:
    """Everything SageMaker, S3, ECR and autoscaling hold on the emulator."""
    sm = target.client("sagemaker")
    s3 = target.client("s3")
    buckets = [b["Name"] for b in s3.list_buckets().get("Buckets", [])]
    return {
        "models": [m["ModelName"] for m in sm.list_models()["Models"]],
        "endpoint_configs": [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]],
        "endpoints": [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]],
        "buckets": buckets,
        "objects": [o["Key"] for b in buckets for o in s3.list_objects_v2(Bucket=b).get("Contents", [])],
        "repositories": [r["repositoryName"] for r in target.client("ecr").describe_repositories()["repositories"]],
        "scalable_targets": [t["ResourceId"] for t in target.client("application-autoscaling")
                             .describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]],
        "alarms": [a["AlarmName"] for a in target.client("cloudwatch").describe_alarms()["MetricAlarms"]],
    }


@pytest.fixture
def queue_answer(target):
    """moto's sagemaker-runtime answers InvokeEndpoint from a queue filled through its API."""
    from options.aws import queue_emulator_result

    def queue(body: dict) -> None:
        queue_emulator_result(target.endpoint_url, target.region, json.dumps(body))
    return queue


@pytest.fixture
def build():
    """(module, spec, plan) for a command line, parsed by the real CLI parser."""
    from options.deploy import parse_args
    from options.spectrum import rung_module

    def make(*argv: str):
        args = parse_args(list(argv))
        module = rung_module(args.level)
        spec = module.spec_from_args(args)
        return module, spec, module.plan(spec)
    return make
