"""Rate limiting at the edge.

Default: Gateway API with Envoy Gateway (GatewayClass, Gateway, HTTPRoute) and a
BackendTrafficPolicy local rate limit. Legacy: the classic ingress-nginx annotations
(limit-rps, burst multiplier, body size), kept for clusters that still run it:
ingress-nginx is retired (no fixes after March 2026).
"""
from __future__ import annotations

import math
from typing import Any

from infra.eks.spec import SERVER_PORT, ResolvedSpec

RAY_SERVE_PORT = 8000
ENVOY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"


def backend(r: ResolvedSpec) -> tuple[str, int]:
    """The Service the edge sends traffic to: ours, or the one KubeRay makes for Serve."""
    if r.engine == "rayservice":
        return f"{r.name}-serve-svc", RAY_SERVE_PORT
    return r.name, SERVER_PORT


def gateway_class(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "spectrum-envoy", "labels": r.labels("edge")},
            "spec": {"controllerName": ENVOY_CONTROLLER}}


def gateway(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels("edge")},
            "spec": {"gatewayClassName": "spectrum-envoy",
                     "listeners": [{"name": "http", "protocol": "HTTP", "port": 80,
                                    "allowedRoutes": {"namespaces": {"from": "Same"}}}]}}


def http_route(r: ResolvedSpec) -> dict[str, Any]:
    service_name, port = backend(r)
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels("edge")},
            "spec": {"parentRefs": [{"name": r.name}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                "backendRefs": [{"name": service_name, "port": port}],
                                # Streams of long generations must not be cut by the proxy.
                                "timeouts": {"request": f"{r.max_request_s}s"}}]}}


def backend_traffic_policy(r: ResolvedSpec) -> dict[str, Any]:
    # Envoy's local limit is a token bucket per Envoy replica refilled every unit: it admits
    # bursts up to `requests` within a second, so the limit is the sustained rate.
    return {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels("edge")},
            "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                     "name": r.name}],
                     "rateLimit": {"type": "Local", "local": {"rules": [
                         {"limit": {"requests": r.rate_limit_rps, "unit": "Second"}}]}}}}


def nginx_burst_multiplier(r: ResolvedSpec) -> int:
    return max(1, math.ceil(r.rate_limit_burst / r.rate_limit_rps))


def nginx_ingress(r: ResolvedSpec) -> dict[str, Any]:
    service_name, port = backend(r)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels("edge"),
                         "annotations": {
                             "spectrum.io/warning": "ingress-nginx is retired (no fixes after "
                                                    "March 2026); prefer --edge gateway",
                             "nginx.ingress.kubernetes.io/limit-rps": str(r.rate_limit_rps),
                             "nginx.ingress.kubernetes.io/limit-burst-multiplier":
                                 str(nginx_burst_multiplier(r)),
                             "nginx.ingress.kubernetes.io/proxy-body-size": r.body_size,
                             # Token streams: no buffering, and time for the longest generation.
                             "nginx.ingress.kubernetes.io/proxy-buffering": "off",
                             "nginx.ingress.kubernetes.io/proxy-read-timeout": str(r.max_request_s),
                             "nginx.ingress.kubernetes.io/proxy-send-timeout": str(r.max_request_s),
                         }},
            "spec": {"ingressClassName": "nginx",
                     "rules": [{"http": {"paths": [{
                         "path": "/", "pathType": "Prefix",
                         "backend": {"service": {"name": service_name,
                                                 "port": {"number": port}}}}]}}]}}


def edge_documents(r: ResolvedSpec) -> list[dict[str, Any]]:
    if r.edge == "nginx":
        return [nginx_ingress(r)]
    return [gateway_class(r), gateway(r), http_route(r), backend_traffic_policy(r)]
