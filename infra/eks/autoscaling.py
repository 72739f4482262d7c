"""Autoscaling: an autoscaling/v2 HPA on vLLM's queue (custom metrics API) with CPU as fallback.

vLLM exports ``vllm:num_requests_waiting``; prometheus-adapter serves it to the HPA as
``vllm_num_requests_waiting`` (a metric name in the custom metrics API cannot hold ':').
The adapter rule that does that rename is rendered beside the manifests as Helm values.
"""
from __future__ import annotations

from typing import Any

from infra.eks.spec import ResolvedSpec
from options.core.autoscaling import HPA_BEHAVIOUR

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
    b = HPA_BEHAVIOUR
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels()},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": r.name},
            "minReplicas": r.min_replicas,
            "maxReplicas": r.max_replicas,
            "metrics": metrics,
            # The same behaviour the simulator gives rung 6 (options/core/autoscaling.py says why).
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                            "policies": [{"type": "Pods", "value": b.scale_up_pods,
                                          "periodSeconds": b.scale_up_period_s}]},
                "scaleDown": {"stabilizationWindowSeconds": b.scale_down_stabilization_s, "selectPolicy": "Min",
                              "policies": [{"type": "Pods", "value": b.scale_down_pods,
                                            "periodSeconds": b.scale_down_period_s}]},
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
