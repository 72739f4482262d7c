"""The cluster steps: eksctl on a real account, boto3's EKS API on the emulator.

On AWS, eksctl does far more than the EKS API (VPC, IAM, OIDC, add-ons, Karpenter), so the
real cluster comes from ``eksctl create cluster -f cluster.yaml``, or from the exact command
printed when eksctl is not on PATH. On the emulator (moto), the same ClusterConfig is turned
into the EKS requests eksctl would end with (CreateCluster, CreateNodegroup) on a VPC and
roles made in the emulator, so status and teardown exercise real boto3 calls.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from typing import Any, Callable

Progress = Callable[[str], None]
TAG = "spectrum.io/cluster"
_ASSUME_ROLE = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Action": "sts:AssumeRole",
    "Principal": {"Service": ["eks.amazonaws.com", "ec2.amazonaws.com"]}}]}


def eksctl_path() -> str | None:
    return shutil.which("eksctl")


def run_eksctl(argv: list[str], progress: Progress) -> None:
    """Run eksctl, showing its progress lines as they come (cluster creation takes ~15 min)."""
    progress("$ " + " ".join(argv))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        progress("  " + line.rstrip())
    if proc.wait() != 0:
        raise RuntimeError(f"eksctl exited with code {proc.returncode}: {' '.join(argv)}")


def describe_cluster(eks, name: str) -> dict[str, Any] | None:
    try:
        return eks.describe_cluster(name=name)["cluster"]
    except eks.exceptions.ResourceNotFoundException:
        return None


def nodegroup_requests(config: dict[str, Any], subnet_ids: list[str],
                       node_role_arn: str) -> list[dict[str, Any]]:
    """CreateNodegroup parameters for the ClusterConfig's managed node groups."""
    out = []
    cluster = config["metadata"]["name"]
    for ng in config.get("managedNodeGroups", []):
        gpu = any(t.get("key") == "nvidia.com/gpu" for t in ng.get("taints", []))
        params = {
            "clusterName": cluster, "nodegroupName": ng["name"],
            "scalingConfig": {"minSize": ng["minSize"], "maxSize": ng["maxSize"],
                              "desiredSize": ng["desiredCapacity"]},
            "instanceTypes": [ng["instanceType"]],
            "subnets": subnet_ids, "nodeRole": node_role_arn,
            "amiType": "AL2023_x86_64_NVIDIA" if gpu else "AL2023_x86_64_STANDARD",
            "capacityType": "SPOT" if ng.get("spot") else "ON_DEMAND",
            "diskSize": ng.get("volumeSize", 80),
            "labels": ng.get("labels", {}),
            "tags": {TAG: cluster},
        }
        if ng.get("taints"):
            params["taints"] = [{"key": t["key"], "value": t.get("value", ""),
                                 "effect": t["effect"].replace("NoSchedule", "NO_SCHEDULE")
                                 .replace("NoExecute", "NO_EXECUTE")
                                 .replace("PreferNoSchedule", "PREFER_NO_SCHEDULE")}
                                for t in ng["taints"]]
        out.append(params)
    return out


def cluster_request(config: dict[str, Any], role_arn: str, subnet_ids: list[str]) -> dict[str, Any]:
    meta = config["metadata"]
    logging_types = config.get("cloudWatch", {}).get("clusterLogging", {}).get("enableTypes", [])
    return {"name": meta["name"], "version": meta["version"], "roleArn": role_arn,
            "resourcesVpcConfig": {"subnetIds": subnet_ids, "endpointPublicAccess": True,
                                   "endpointPrivateAccess": True},
            "logging": {"clusterLogging": [{"types": logging_types, "enabled": True}]},
            "tags": {**meta.get("tags", {}), TAG: meta["name"]}}


def _wait_active(describe: Callable[[], dict[str, Any]], what: str, progress: Progress,
                 timeout_s: float = 1800, poll_s: float = 10) -> None:
    started = time.monotonic()
    while True:
        status = describe().get("status")
        progress(f"  {what}: {status} ({time.monotonic() - started:.0f} s)")
        if status == "ACTIVE":
            return
        if status in ("FAILED", "CREATE_FAILED", "DEGRADED"):
            raise RuntimeError(f"{what} ended {status}")
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{what} not ACTIVE after {timeout_s:.0f} s (last: {status})")
        time.sleep(poll_s)


def create_cluster_via_api(target, config: dict[str, Any], progress: Progress) -> list[str]:
    """Emulator: network and roles, then the EKS requests eksctl would make. Returns what was
    created (empty when the cluster already existed); removes its own creations on failure."""
    name = config["metadata"]["name"]
    eks, ec2, iam = target.client("eks"), target.client("ec2"), target.client("iam")
    if describe_cluster(eks, name) is not None:
        progress(f"  cluster {name} exists: reused")
        return []
    created: list[str] = []
    try:
        tags = [{"Key": TAG, "Value": name}]
        vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16", TagSpecifications=[
            {"ResourceType": "vpc", "Tags": tags}])["Vpc"]["VpcId"]
        created.append(f"vpc {vpc}")
        zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
        subnets = []
        for i, zone in enumerate(zones):
            subnets.append(ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{i * 64}.0/18",
                                             AvailabilityZone=zone, TagSpecifications=[
                                                 {"ResourceType": "subnet", "Tags": tags}])
                           ["Subnet"]["SubnetId"])
            created.append(f"subnet {subnets[-1]}")
        roles = {}
        for kind in ("cluster", "nodes"):
            role_name = f"spectrum-{name}-{kind}"[:64]
            roles[kind] = iam.create_role(RoleName=role_name, Tags=tags,
                                          AssumeRolePolicyDocument=json.dumps(_ASSUME_ROLE))["Role"]["Arn"]
            created.append(f"role {role_name}")
        eks.create_cluster(**cluster_request(config, roles["cluster"], subnets))
        created.append(f"cluster {name}")
        progress(f"  eks.CreateCluster {name} (Kubernetes {config['metadata']['version']})")
        _wait_active(lambda: eks.describe_cluster(name=name)["cluster"], f"cluster {name}", progress,
                     poll_s=2)
        for params in nodegroup_requests(config, subnets, roles["nodes"]):
            eks.create_nodegroup(**params)
            created.append(f"nodegroup {params['nodegroupName']}")
            progress(f"  eks.CreateNodegroup {params['nodegroupName']}: "
                     f"{params['scalingConfig']['desiredSize']} x {params['instanceTypes'][0]}")
            _wait_active(lambda: eks.describe_nodegroup(
                clusterName=name, nodegroupName=params["nodegroupName"])["nodegroup"],
                f"node group {params['nodegroupName']}", progress, poll_s=2)
    except Exception:
        delete_cluster_via_api(target, name, progress)
        raise
    return created


def delete_cluster_via_api(target, name: str, progress: Progress) -> list[str]:
    """Remove the node groups, cluster, roles, subnets and VPC that carry this cluster's tag."""
    eks, ec2, iam = target.client("eks"), target.client("ec2"), target.client("iam")
    removed: list[str] = []
    if describe_cluster(eks, name) is not None:
        for ng in eks.list_nodegroups(clusterName=name).get("nodegroups", []):
            eks.delete_nodegroup(clusterName=name, nodegroupName=ng)
            removed.append(f"nodegroup {ng}")
        eks.delete_cluster(name=name)
        removed.append(f"cluster {name}")
    for kind in ("cluster", "nodes"):
        role_name = f"spectrum-{name}-{kind}"[:64]
        try:
            iam.delete_role(RoleName=role_name)
            removed.append(f"role {role_name}")
        except iam.exceptions.NoSuchEntityException:
            pass
    filters = [{"Name": f"tag:{TAG}", "Values": [name]}]
    for subnet in ec2.describe_subnets(Filters=filters)["Subnets"]:
        ec2.delete_subnet(SubnetId=subnet["SubnetId"])
        removed.append(f"subnet {subnet['SubnetId']}")
    for vpc in ec2.describe_vpcs(Filters=filters)["Vpcs"]:
        ec2.delete_vpc(VpcId=vpc["VpcId"])
        removed.append(f"vpc {vpc['VpcId']}")
    for item in removed:
        progress(f"  removed {item}")
    return removed
