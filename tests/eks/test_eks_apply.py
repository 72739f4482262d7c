"""Apply against an in-memory Kubernetes API (kmock), cluster steps against moto's EKS,
and the level-6 CLI end to end."""
from __future__ import annotations

import json
import threading
import time

import pytest

from infra.eks import eks_api
from infra.eks.kube import ApplyFailed, KubeApi, apply_manifests, delete_manifests
from infra.eks.memory_api import InMemoryKubernetes
from infra.eks.render import render
from infra.eks.spec import EksSpec

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0"
STATUS = "/apis/apps/v1/namespaces/spectrum/deployments/llm/status"


@pytest.fixture
def cluster():
    with InMemoryKubernetes() as k8s:
        yield k8s, KubeApi.from_url(k8s.url)


def deployment_controller(api: KubeApi, statuses: list[dict], every_s: float = 0.4):
    """Plays the Deployment controller: writes each status in turn once the object exists."""
    def run():
        for status in statuses:
            for _ in range(100):
                try:
                    api.request("PATCH", STATUS, {"status": status},
                                content_type="application/merge-patch+json")
                    break
                except Exception:
                    time.sleep(0.05)
            time.sleep(every_s)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_apply_waits_for_rollout_with_progress_and_reapplies(cluster):
    k8s, api = cluster
    rendered = render(EksSpec(image=IMAGE, min_replicas=2))
    lines: list[str] = []
    deployment_controller(api, [
        {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 0},
        {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 1},
        {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}])
    result = apply_manifests(api, rendered.documents(), lines.append, poll_s=0.1, timeout_s=30)
    assert result.created == [m.ref for m in rendered.manifests]
    assert result.rollout == {"Deployment/spectrum/llm": "2/2 replicas available (2 updated)"}
    progress = [l for l in lines if "rollout" in l]
    assert any("1/2 replicas" in l for l in progress) and "2/2" in progress[-1]
    stored = api.get(rendered.documents()[4])
    assert stored["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE

    # Re-running is safe: existing objects are updated in place (server-side apply).
    changed = render(EksSpec(image=IMAGE, min_replicas=2, max_replicas=5))
    again = apply_manifests(api, changed.documents(), lines.append, wait=False)
    assert again.created == [] and len(again.updated) == len(changed.manifests)
    hpa = api.get(next(d for d in changed.documents() if d["kind"] == "HorizontalPodAutoscaler"))
    assert hpa["spec"]["maxReplicas"] == 5

    removed = delete_manifests(api, changed.documents(), lines.append)
    assert removed[0] == "ServiceMonitor/spectrum/llm" and removed[-1] == "Namespace/spectrum"
    assert all(api.get(d) is None for d in changed.documents())


def test_failed_rollout_removes_what_the_run_created(cluster):
    k8s, api = cluster
    rendered = render(EksSpec(image=IMAGE))
    deployment_controller(api, [{"conditions": [{
        "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
        "message": "ReplicaSet has timed out progressing"}]}])
    with pytest.raises(ApplyFailed) as info:
        apply_manifests(api, rendered.documents(), lambda _: None, poll_s=0.1, timeout_s=30)
    assert "progress deadline" in str(info.value) and "removed what this run created" in str(info.value)
    assert all(api.get(d) is None for d in rendered.documents())


def test_rollout_timeout_is_a_failure(cluster):
    k8s, api = cluster
    rendered = render(EksSpec(image=IMAGE))
    with pytest.raises(ApplyFailed, match="did not roll out within"):
        apply_manifests(api, rendered.documents(), lambda _: None, poll_s=0.1, timeout_s=0.5)
    assert all(api.get(d) is None for d in rendered.documents())


def test_missing_add_on_apis_are_named_and_nothing_is_applied():
    rendered = render(EksSpec(image=IMAGE))
    served = [("v1", "Namespace"), ("apps/v1", "Deployment")]     # no Karpenter, no gateway
    with InMemoryKubernetes(served=served) as k8s:
        api = KubeApi.from_url(k8s.url)
        with pytest.raises(ApplyFailed) as info:
            apply_manifests(api, rendered.documents(), lambda _: None)
        text = str(info.value)
        assert "karpenter.sh/v1 (install Karpenter" in text and "Envoy Gateway" in text
        assert "Nothing was applied" in text
        assert api.get(rendered.documents()[0]) is None


# --- cluster steps on moto's EKS ------------------------------------------------------------

def test_cluster_steps_against_moto_eks(moto_url):
    from options.aws import Target

    target = Target("emulator", "us-east-1", moto_url)
    rendered = render(EksSpec(image=IMAGE, instance_type="g5.12xlarge", gpus_per_replica=2,
                              min_replicas=3, max_replicas=8, gpu_nodes="nodegroup",
                              capacity_type="spot", cluster_name="moto-test"))
    lines: list[str] = []
    created = eks_api.create_cluster_via_api(target, rendered.cluster_config, lines.append)
    assert "cluster moto-test" in created and "nodegroup gpu-llm" in created
    eks = target.client("eks")
    cluster = eks.describe_cluster(name="moto-test")["cluster"]
    assert cluster["status"] == "ACTIVE" and cluster["version"] == rendered.resolved.kubernetes_version
    assert cluster["tags"]["spectrum.io/model"]
    gpu = eks.describe_nodegroup(clusterName="moto-test", nodegroupName="gpu-llm")["nodegroup"]
    assert gpu["scalingConfig"] == {"minSize": 2, "maxSize": 4, "desiredSize": 2}   # 2 replicas/node
    assert gpu["instanceTypes"] == ["g5.12xlarge"] and gpu["capacityType"] == "SPOT"
    assert gpu["amiType"] == "AL2023_x86_64_NVIDIA"
    assert gpu["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    assert gpu["labels"] == {"spectrum.io/gpu-pool": "llm"}
    # Re-running reuses the cluster.
    assert eks_api.create_cluster_via_api(target, rendered.cluster_config, lines.append) == []
    removed = eks_api.delete_cluster_via_api(target, "moto-test", lines.append)
    assert "cluster moto-test" in removed and any(r.startswith("vpc ") for r in removed)
    assert eks_api.describe_cluster(eks, "moto-test") is None


# --- the CLI -------------------------------------------------------------------------------

def run_cli(argv, capsys):
    from options.deploy import main

    code = main(["--level", "6", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_local_renders_and_validates(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["--json", "--out", str(out), "--min-replicas", "3",
                                    "--max-replicas", "15", "--target-cpu", "70", "--edge", "nginx",
                                    "--image", IMAGE], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["validation"]["complete"], summary["validation"]
    assert (out / "cluster.yaml").is_file() and (out / "manifests" / "40-edge.yaml").is_file()
    assert {"file": "manifests/40-edge.yaml", "resource": "Ingress/spectrum/llm"} in summary["resources"]
    assert summary["gpus"]["at_max_replicas"] == 15
    assert summary["cost"]["platform"] == "ec2" and summary["cost"]["eks_cluster_hourly"] == 0.1
    # 3 GPU nodes, the EKS control plane, and the two m6i.xlarge system nodes
    assert summary["cost"]["hourly_usd"] == pytest.approx(3 * 1.006 + 0.1 + 2 * 0.192)
    assert summary["cost"]["system_nodes"] == "2 x m6i.xlarge"
    assert any("ingress-nginx is retired" in w for w in summary["warnings"])


def test_cli_bad_spec_exits_2_before_rendering(tmp_path, capsys):
    out = tmp_path / "never"
    code, _, stderr = run_cli(["--out", str(out), "--instance-type", "g5.12xlarge",
                               "--tensor-parallel-size", "3"], capsys)
    assert code == 2 and "does not divide --gpus-per-replica 4" in stderr
    assert "Traceback" not in stderr and not out.exists()


def test_cli_plan_json_holds_every_document(capsys):
    code, stdout, _ = run_cli(["--plan", "--json", "--engine", "rayservice"], capsys)
    assert code == 0
    plan = json.loads(stdout)
    ops = [(s["service"], s["operation"]) for s in plan["steps"]]
    assert ops[0] == ("eksctl", "CreateCluster") and ("helm", "InstallChart") in ops
    kinds = [s["params"]["manifest"]["kind"] for s in plan["steps"] if s["operation"] == "Apply"]
    assert "RayService" in kinds and "NodePool" in kinds
    assert plan["steps"][-1]["operation"] == "WaitForRollout"


def test_cli_emulator_lifecycle(capsys):
    code, stdout, stderr = run_cli(["--target", "emulator", "--json", "--cluster-name", "emu"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert "cluster emu" in summary["created"] and "Deployment/spectrum/llm" in summary["created"]
    assert summary["status"]["status"] == "applied"
    assert "Namespace/spectrum" in summary["removed"] and "cluster emu" in summary["removed"]
    assert "rollout not awaited" in stderr


def test_cli_aws_without_image_is_bad_input(capsys):
    code, _, stderr = run_cli(["--target", "aws"], capsys)
    assert code == 2 and "image is missing" in stderr


def test_aws_path_preflight_and_kubeconfig_guard(moto_url, tmp_path, monkeypatch):
    """The aws target's own checks, with boto3 sent to moto: no helm → nothing created; an
    existing cluster is reused, and a kubeconfig pointing elsewhere is refused by name."""
    import options.eks as level6
    from options.aws import Target
    from options.core import BadInput

    monkeypatch.setenv("PATH", str(tmp_path))            # neither helm nor eksctl here
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")    # moto's; never real ones
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    target = Target("aws", "us-east-1", moto_url)
    spec = level6.Level6Spec(EksSpec(image=IMAGE, cluster_name="aws-path"), str(tmp_path / "out"))
    plan = level6.plan(spec)
    with pytest.raises(RuntimeError, match="helm is not on PATH.*nothing was created"):
        level6.apply(plan, target)
    assert eks_api.describe_cluster(target.client("eks"), "aws-path") is None

    eks_api.create_cluster_via_api(target, plan.extra["cluster_config"], lambda _: None)
    with InMemoryKubernetes() as k8s:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "other",
            "clusters": [{"name": "other", "cluster": {"server": k8s.url}}],
            "contexts": [{"name": "other", "context": {"cluster": "other", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t"}}]}))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        with pytest.raises(BadInput, match="aws eks update-kubeconfig --name aws-path"):
            level6.apply(plan, target)
    assert eks_api.describe_cluster(target.client("eks"), "aws-path") is not None   # kept: not ours to remove
    eks_api.delete_cluster_via_api(target, "aws-path", lambda _: None)
