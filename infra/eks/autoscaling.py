"""Autoscaling: an autoscaling/v2 HPA on vLLM's queue (custom metrics API) with CPU as fallback.

vLLM exports ``vllm:num_requests_waiting``; prometheus-adapter serves it to the HPA as
``vllm_num_requests_waiting`` (a metric name in the custom metrics API cannot hold ':').
The adapter rule that does that rename is rendered beside the manifests as Helm values.
"""
from __future__ import annotations

from typing import Any

from infra.eks.spec import ResolvedSpec

WAITING_METRIC = "vllm_num_requests_waiting"


def horizontal_pod_autoscaler(r: ResolvedSpec) -> dict[str, Any]:
    metrics: list[dict[str, Any]] = []
    if r.target_waiting:
        metrics.append({"type": "Pods", "pods": {
            "metric": {"name": WAITING_METRIC},
            "target": {"type": "AverageValue", "averageValue": _quantity(r.target_waiting)}}})
    if r.target_cpu:
        metrics.append({"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": r.target_cpu}}})
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels()},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": r.name},
            "minReplicas": r.min_replicas,
            "maxReplicas": r.max_replicas,
            "metrics": metrics,
            "behavior": {
                # Queues build fast: add a replica at once; a GPU pod takes minutes to be ready.
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
                # Losing a loaded replica is expensive: wait out short dips before removing one.
                "scaleDown": {"stabilizationWindowSeconds": 600, "selectPolicy": "Min",
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
            },
        },
    }


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{int(round(value * 1000))}m"


def prometheus_adapter_values(r: ResolvedSpec) -> dict[str, Any]:
    """Helm values for prometheus-adapter exposing the waiting-requests gauge per pod."""
    return {"rules": {"default": False, "custom": [{
        "seriesQuery": 'vllm:num_requests_waiting{namespace!="",pod!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"},
                                    "pod": {"resource": "pod"}}},
        "name": {"matches": "^vllm:num_requests_waiting$", "as": WAITING_METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }]}}
