"""The eksctl ClusterConfig: the control plane, a small system node group, and GPU capacity.

GPU nodes come from Karpenter by default (eksctl installs it with its IAM and interruption
queue); ``--gpu-nodes nodegroup`` adds a tainted GPU managed node group instead.
"""
from __future__ import annotations

from typing import Any

from infra.eks.spec import ResolvedSpec, pinned

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
SYSTEM_NODES = 2


def system_instance_type() -> str:
    """The instance type of the system node group (CoreDNS, Karpenter, monitoring, the Ray
    head): paid for whatever the GPU count."""
    return pinned("system_instance_type")


def fixed_hourly(table, eks_fee: str = "control_plane") -> dict[str, Any]:
    """What the cluster costs per hour whatever its GPU count: the control plane and the system
    node group, priced from ``table`` (a ``cost.prices.PriceTable``)."""
    system = table.instance(system_instance_type())
    control_plane = table.eks_fee(eks_fee).hourly
    system_hourly = SYSTEM_NODES * system.ec2_hourly
    return {"control_plane_hourly": control_plane, "system_nodes": f"{SYSTEM_NODES} x {system.name}",
            "system_nodes_hourly": round(system_hourly, 6),
            "hourly": round(control_plane + system_hourly, 6)}


def cluster_config(r: ResolvedSpec) -> dict[str, Any]:
    pool_key, pool_value = r.pool_label
    system_group = {
        "name": "system",
        "instanceType": system_instance_type(),
        "amiFamily": "AmazonLinux2023",
        "minSize": SYSTEM_NODES, "maxSize": SYSTEM_NODES + 1, "desiredCapacity": SYSTEM_NODES,
        "privateNetworking": True,
        "volumeSize": 50, "volumeEncrypted": True,
        "labels": {"spectrum.io/role": "system"},
    }
    doc: dict[str, Any] = {
        "apiVersion": "eksctl.io/v1alpha5",
        "kind": "ClusterConfig",
        "metadata": {
            "name": r.cluster_name, "region": r.region, "version": r.kubernetes_version,
            "tags": {"spectrum.io/model": r.model.replace("/", "_")[:250],
                     "karpenter.sh/discovery": r.cluster_name},
        },
        "iam": {"withOIDC": True},
        "addons": [{"name": "vpc-cni"}, {"name": "coredns"}, {"name": "kube-proxy"},
                   {"name": "eks-pod-identity-agent"}],
        "cloudWatch": {"clusterLogging": {"enableTypes": ["api", "audit", "authenticator"]}},
        "managedNodeGroups": [system_group],
    }
    if r.gateway:   # Redis's volume (the gateway's keys and ledger) is an EBS volume
        doc["addons"].append({"name": "aws-ebs-csi-driver",
                              "useDefaultPodIdentityAssociations": True})
    if r.lora:
        doc["iam"]["podIdentityAssociations"] = [adapter_reader_association(r)]
    if r.gpu_nodes == "karpenter":
        doc["karpenter"] = {"version": pinned("karpenter"), "createServiceAccount": True,
                            "withSpotInterruptionQueue": True}
    else:
        doc["managedNodeGroups"].append({
            "name": f"gpu-{r.name}"[:63],
            "instanceType": r.instance.name,
            "amiFamily": "AmazonLinux2023",   # eksctl picks the NVIDIA variant for GPU types
            "minSize": r.nodes_for(r.min_replicas),
            "maxSize": r.nodes_for(r.max_replicas),
            "desiredCapacity": r.nodes_for(r.min_replicas),
            "spot": r.capacity_type == "spot",
            "privateNetworking": True,
            "volumeSize": 200, "volumeType": "gp3", "volumeEncrypted": True,  # image + weights
            "labels": {pool_key: pool_value},
            "taints": [dict(GPU_TAINT)],
        })
    return doc


def adapter_read_policy(r: ResolvedSpec) -> dict[str, Any]:
    """Read access to the adapters' S3 prefixes and nothing else."""
    objects, listing = [], {}
    for uri in r.adapter_prefixes().values():
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        objects.append(f"arn:aws:s3:::{bucket}/{prefix}/*")
        listing.setdefault(bucket, []).extend([prefix, f"{prefix}/*"])
    statements: list[dict[str, Any]] = [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": sorted(set(objects))}]
    statements += [{"Effect": "Allow", "Action": ["s3:ListBucket"],
                    "Resource": [f"arn:aws:s3:::{bucket}"],
                    "Condition": {"StringLike": {"s3:prefix": sorted(set(prefixes))}}}
                   for bucket, prefixes in sorted(listing.items())]
    return {"Version": "2012-10-17", "Statement": statements}


def adapter_reader_association(r: ResolvedSpec) -> dict[str, Any]:
    """EKS Pod Identity for the pods that fetch adapters: the server's service account (its
    init container), or the Ray GPU workers' (Ray Serve LLM downloads them)."""
    return {"namespace": r.namespace, "serviceAccountName": r.name,
            "createServiceAccount": False,      # the manifests create it
            "permissionPolicy": adapter_read_policy(r)}


def eksctl_create_command(config_path: str) -> list[str]:
    return ["eksctl", "create", "cluster", "-f", config_path]


def eksctl_delete_command(config_path: str) -> list[str]:
    return ["eksctl", "delete", "cluster", "-f", config_path, "--wait"]
