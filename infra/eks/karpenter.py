"""Karpenter GPU capacity: a NodePool (karpenter.sh/v1) and its EC2NodeClass (karpenter.k8s.aws/v1).

The pool offers exactly the spec's instance family and size, taints its nodes so only GPU
pods land there, consolidates idle or underused nodes, and caps the GPUs it may buy at what
``--max-replicas`` needs (whole nodes).
"""
from __future__ import annotations

from typing import Any

from infra.eks.cluster import GPU_TAINT
from infra.eks.spec import ResolvedSpec


def node_class_name(r: ResolvedSpec) -> str:
    return f"{r.name}-gpu"


def ec2_node_class(r: ResolvedSpec) -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": node_class_name(r), "labels": r.labels("gpu-nodes")},
        "spec": {
            # eksctl's Karpenter integration creates this node role for the cluster.
            "role": f"eksctl-KarpenterNodeRole-{r.cluster_name}",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],   # AL2023 NVIDIA variant for GPU types
            # eksctl tags what it creates with the cluster name; internal-elb marks private subnets.
            "subnetSelectorTerms": [{"tags": {"alpha.eksctl.io/cluster-name": r.cluster_name,
                                              "kubernetes.io/role/internal-elb": "1"}}],
            # The cluster security group EKS creates lets nodes reach the control plane.
            "securityGroupSelectorTerms": [{"tags": {"aws:eks:cluster-name": r.cluster_name}}],
            "blockDeviceMappings": [{
                "deviceName": "/dev/xvda",
                "ebs": {"volumeSize": "200Gi", "volumeType": "gp3", "encrypted": True,
                        "deleteOnTermination": True},   # the image and model weights live here
            }],
            "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1,
                                "httpEndpoint": "enabled"},
            "tags": {"spectrum.io/deployment": r.name},
        },
    }


def node_pool(r: ResolvedSpec) -> dict[str, Any]:
    pool_key, pool_value = r.pool_label
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": f"{r.name}-gpu", "labels": r.labels("gpu-nodes")},
        "spec": {
            "template": {
                "metadata": {"labels": {pool_key: pool_value}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                     "name": node_class_name(r)},
                    "requirements": [
                        {"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                         "values": [r.family]},
                        {"key": "karpenter.k8s.aws/instance-size", "operator": "In",
                         "values": [r.size]},
                        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
                         "values": [r.karpenter_gpu_name]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In",
                         "values": [r.capacity_type]},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                    ],
                    "taints": [dict(GPU_TAINT)],
                    "expireAfter": "720h",
                },
            },
            "limits": {"nvidia.com/gpu": str(r.gpu_limit)},
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                # A GPU replica takes minutes to load: don't reshuffle on every dip in load.
                "consolidateAfter": "10m",
                "budgets": [{"nodes": "1"}],
            },
        },
    }
