"""Rate limiting at the edge.

Default: Gateway API with Envoy Gateway (GatewayClass, Gateway, HTTPRoute) and a
BackendTrafficPolicy local rate limit. Legacy: the classic ingress-nginx annotations
(limit-rps, burst multiplier, body size), kept for clusters that still run it:
ingress-nginx is retired (no fixes after March 2026).

Only inference paths are routed (exact matches): the servers' other routes — the byo
server's SageMaker multi-model ``/models`` (load, unload), ``/metrics``, ``/ping``; the
gateway's ``/metrics``, ``/healthz``, ``/readyz`` — get the proxy's 404 and stay reachable only
inside the cluster, where the NetworkPolicies decide who may call them.

Session affinity: requests carrying ``x-session-id`` are hashed on it to one backend pod
(Envoy's consistent hash, or nginx's ``upstream-hash-by``), so an agent program's growing
prefix meets its own KV cache on every step; requests without it are balanced as usual.
"""
from __future__ import annotations

import math
from typing import Any

from infra.eks.gateway import GATEWAY_PORT, names
from infra.eks.spec import ResolvedSpec
from infra.eks.workload import model_service

ENVOY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
SESSION_HEADER = "x-session-id"
# OpenAI's inference routes, which the byo server, Ray Serve LLM and the gateway all answer
# (GET /v1/models lists the base model and the adapters a client may name).
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models")
# SageMaker's inference route, which only the byo server answers.
SAGEMAKER_PATHS = ("/invocations",)


def backend(r: ResolvedSpec) -> tuple[str, int]:
    """The Service the edge sends traffic to: the gateway's, or the model's."""
    if r.gateway:
        return names(r)["gateway"], GATEWAY_PORT
    return model_service(r)


def inference_paths(r: ResolvedSpec) -> tuple[str, ...]:
    """The only paths the edge routes."""
    if r.gateway or r.engine == "rayservice":
        return OPENAI_PATHS
    return OPENAI_PATHS + SAGEMAKER_PATHS


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
                     "rules": [{"matches": [{"path": {"type": "Exact", "value": path}}
                                            for path in inference_paths(r)],
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
                         {"limit": {"requests": r.rate_limit_rps, "unit": "Second"}}]}},
                     # Envoy sends each pod's endpoints its own share of the hash ring.
                     "loadBalancer": {"type": "ConsistentHash", "consistentHash": {
                         "type": "Header", "header": {"name": SESSION_HEADER}}}}}


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
                             # Consistent hash on the session header (nginx variable spelling).
                             "nginx.ingress.kubernetes.io/upstream-hash-by":
                                 "$http_" + SESSION_HEADER.replace("-", "_"),
                         }},
            "spec": {"ingressClassName": "nginx",
                     "rules": [{"http": {"paths": [{
                         "path": path, "pathType": "Exact",
                         "backend": {"service": {"name": service_name,
                                                 "port": {"number": port}}}}
                         for path in inference_paths(r)]}}]}}


def edge_documents(r: ResolvedSpec) -> list[dict[str, Any]]:
    if r.edge == "nginx":
        return [nginx_ingress(r)]
    return [gateway_class(r), gateway(r), http_route(r), backend_traffic_policy(r)]
