"""Monitoring: Prometheus Operator monitors for the servers' ``/metrics`` (vLLM's ``vllm:*``)."""
from __future__ import annotations

from typing import Any

from infra.eks.spec import ResolvedSpec

RAY_METRICS_PORT = 8080


def service_monitor(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": r.name, "namespace": r.namespace,
                         # kube-prometheus-stack selects monitors by its release label.
                         "labels": {**r.labels("monitoring"), "release": "kube-prometheus-stack"}},
            "spec": {"selector": {"matchLabels": r.selector()},
                     "namespaceSelector": {"matchNames": [r.namespace]},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s",
                                    "scrapeTimeout": "10s"}]}}


def ray_pod_monitor(r: ResolvedSpec) -> dict[str, Any]:
    # Ray exports vLLM's metrics (prefixed ray_vllm:) from every node on its metrics port.
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": r.name, "namespace": r.namespace,
                         "labels": {**r.labels("monitoring"), "release": "kube-prometheus-stack"}},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": r.name,
                                                  "app.kubernetes.io/component": "ray"}},
                     "namespaceSelector": {"matchNames": [r.namespace]},
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics",
                                              "interval": "15s"}]}}


def monitoring_documents(r: ResolvedSpec) -> list[dict[str, Any]]:
    return [ray_pod_monitor(r) if r.engine == "rayservice" else service_monitor(r)]
