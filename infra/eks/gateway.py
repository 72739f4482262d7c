"""The API gateway in front of the model servers (``--gateway``): containers/gateway as a
Deployment with its config in a ConfigMap and its API-key HMAC secret in a Secret, a Redis
StatefulSet for keys, quotas and the usage ledger, and NetworkPolicies that let only the
gateway reach the servers and Redis.

The edge then sends clients to the gateway instead of the servers (edge.backend). The
Secret's value never appears in these manifests: ``--target aws`` creates it (from
``$SPECTRUM_GATEWAY_SECRET``, else random) when the cluster lacks it.
"""
from __future__ import annotations

import hashlib
from typing import Any

import yaml

from infra.eks.spec import ResolvedSpec, pinned
from infra.eks.workload import (edge_chart, model_service, namespace_peer, pod_security,
                                restricted_container_security, server_pods, skip_annotations,
                                spread)

GATEWAY_PORT = 8000
REDIS_PORT = 6379
CONFIG_DIR = "/etc/spectrum-gateway"
CONFIG_FILE = "gateway.yaml"
SECRET_DIR = "/var/run/spectrum-gateway"
SECRET_KEY = "secret"
STORAGE_CLASS = "spectrum-gp3"
WORKERS = 2                               # uvicorn workers per pod (Redis makes limits exact)


def names(r: ResolvedSpec) -> dict[str, str]:
    return {"gateway": f"{r.name}-gateway", "secret": f"{r.name}-gateway-secret",
            "redis": f"{r.name}-redis"}


def gateway_labels(r: ResolvedSpec) -> dict[str, str]:
    return r.labels("gateway")


def gateway_selector(r: ResolvedSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": r.name, "app.kubernetes.io/component": "gateway"}


def redis_selector(r: ResolvedSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": r.name, "app.kubernetes.io/component": "redis"}


def gateway_config(r: ResolvedSpec) -> dict[str, Any]:
    """The gateway's config (docs/gateway.md): the base model and each adapter
    as a model, all answered by the in-cluster servers; a default tenant whose limits each
    key's tenant gets until the operator lists it."""
    service, port = model_service(r)
    url = f"http://{service}.{r.namespace}.svc.cluster.local:{port}"

    def model(upstream_model: str | None) -> dict[str, Any]:
        u: dict[str, Any] = {"name": r.name, "url": url, "weight": 1}
        if upstream_model:
            u["model"] = upstream_model
        return {"upstreams": [u]}

    models = {r.served_model_name: model(None)}
    for name in r.adapter_prefixes():
        # Ray Serve LLM names an adapter <base model id>:<adapter>; the byo server by its name.
        models[name] = model(f"{r.served_model_name}:{name}"
                             if r.engine == "rayservice" and r.serve_app == "ray-llm" else None)
    return {
        "store": f"redis://{names(r)['redis']}.{r.namespace}.svc.cluster.local:{REDIS_PORT}/0",
        "state_dir": "/tmp/spectrum-gateway",
        "secret_file": f"{SECRET_DIR}/{SECRET_KEY}",
        "upstream_timeout_s": r.max_request_s,
        "tenants": {"default": {"rpm": r.rate_limit_rps * 60, "max_concurrency": 64,
                                "models": ["*"]}},
        "models": models,
    }


def config_text(r: ResolvedSpec) -> str:
    return yaml.safe_dump(gateway_config(r), sort_keys=False)


def config_map(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": names(r)["gateway"], "namespace": r.namespace,
                         "labels": gateway_labels(r)},
            "data": {CONFIG_FILE: config_text(r)}}


def service_account(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": names(r)["gateway"], "namespace": r.namespace,
                         "labels": gateway_labels(r)},
            "automountServiceAccountToken": False}


def deployment(r: ResolvedSpec) -> dict[str, Any]:
    n = names(r)
    container = {
        "name": "gateway",
        "image": r.gateway_image,
        "imagePullPolicy": "Always",
        "args": ["serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--port", str(GATEWAY_PORT),
                 "--workers", str(WORKERS)],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"},
                      "limits": {"cpu": "2", "memory": "1Gi"}},
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                         "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 30},
        # /readyz answers 503 while Redis is unreachable: the pod leaves the Service meanwhile.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                          "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "securityContext": restricted_container_security(),
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "secret", "mountPath": SECRET_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec = {
        "serviceAccountName": n["gateway"],
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": r.max_request_s + 15,   # streams in flight finish
        "topologySpreadConstraints": spread(gateway_selector(r)),
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": n["gateway"]}},
            # A file, not an env var: it never shows in `kubectl describe` or the process env.
            {"name": "secret", "secret": {"secretName": n["secret"], "defaultMode": 0o440}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        ],
    }
    skips = {}
    if "@sha256:" not in r.gateway_image:
        skips["CKV_K8S_43"] = ("the gateway image is pinned by a version tag (latest is refused); "
                               "pass --gateway-image repo@sha256:... to pin a digest")
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": n["gateway"], "namespace": r.namespace, "labels": gateway_labels(r),
                     **({"annotations": skip_annotations(skips)} if skips else {})},
        "spec": {
            "replicas": r.gateway_replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": gateway_selector(r)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": gateway_labels(r), "annotations": {
                    # A changed config rolls the pods (they read it once, at start).
                    "spectrum.io/config-sha256":
                        hashlib.sha256(config_text(r).encode()).hexdigest()}},
                "spec": pod_spec},
        },
    }


def service(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names(r)["gateway"], "namespace": r.namespace,
                         "labels": gateway_labels(r)},
            "spec": {"type": "ClusterIP", "selector": gateway_selector(r),
                     "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": "http",
                                "protocol": "TCP"}]}}


def pod_disruption_budget(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": names(r)["gateway"], "namespace": r.namespace,
                         "labels": gateway_labels(r)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": gateway_selector(r)}}}


def storage_class(r: ResolvedSpec) -> dict[str, Any]:
    # Retain: the usage ledger is what tenants are billed from; deleting the stack keeps it.
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "labels": r.labels("redis")},
            "provisioner": "ebs.csi.aws.com",
            "parameters": {"type": "gp3", "encrypted": "true"},
            "reclaimPolicy": "Retain", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True}


def redis_stateful_set(r: ResolvedSpec) -> dict[str, Any]:
    n = names(r)
    probe = {"exec": {"command": ["redis-cli", "ping"]}, "timeoutSeconds": 2}
    container = {
        "name": "redis",
        "image": pinned("redis_image"),
        "imagePullPolicy": "Always",
        # Append-only file: keys, quotas and the ledger survive a restart.
        "args": ["redis-server", "--appendonly", "yes", "--dir", "/data",
                 "--protected-mode", "no", "--port", str(REDIS_PORT)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                      "limits": {"cpu": "1", "memory": "1Gi"}},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        # Any uid works: redis-server needs no passwd entry, and fsGroup makes /data writable.
        "securityContext": restricted_container_security(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": n["redis"], "namespace": r.namespace, "labels": r.labels("redis"),
                     "annotations": skip_annotations({
                         "CKV_K8S_43": "the Redis image is pinned by a release tag "
                                       "(infra/eks/data/versions.json)"})},
        "spec": {
            "serviceName": n["redis"],
            "replicas": 1,
            "selector": {"matchLabels": redis_selector(r)},
            "template": {"metadata": {"labels": r.labels("redis")}, "spec": {
                "automountServiceAccountToken": False,
                "securityContext": pod_security(),
                "containers": [container],
            }},
            "volumeClaimTemplates": [{
                "metadata": {"name": "data", "labels": r.labels("redis")},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                         "resources": {"requests": {"storage": "10Gi"}}}}],
        },
    }


def redis_service(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names(r)["redis"], "namespace": r.namespace,
                         "labels": r.labels("redis")},
            "spec": {"type": "ClusterIP", "selector": redis_selector(r),
                     "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis",
                                "protocol": "TCP"}]}}


def gateway_network_policy(r: ResolvedSpec) -> dict[str, Any]:
    """The gateway takes traffic from the edge proxy and Prometheus; it calls the servers,
    Redis, DNS and HTTPS (a JWKS URL, managed fallbacks)."""
    _, port = model_service(r)
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": names(r)["gateway"], "namespace": r.namespace,
                     "labels": gateway_labels(r)},
        "spec": {
            "podSelector": {"matchLabels": gateway_selector(r)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [namespace_peer(edge_chart(r)),
                                  namespace_peer("kube-prometheus-stack")],
                         "ports": [{"protocol": "TCP", "port": GATEWAY_PORT}]}],
            "egress": [
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"podSelector": {"matchLabels": server_pods(r)}}],
                 "ports": [{"protocol": "TCP", "port": port}]},
                {"to": [{"podSelector": {"matchLabels": redis_selector(r)}}],
                 "ports": [{"protocol": "TCP", "port": REDIS_PORT}]},
                {"ports": [{"protocol": "TCP", "port": 443}]},
            ],
        },
    }


def redis_network_policy(r: ResolvedSpec) -> dict[str, Any]:
    """Only the gateway reaches Redis, and Redis reaches nothing."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": names(r)["redis"], "namespace": r.namespace,
                     "labels": r.labels("redis")},
        "spec": {
            "podSelector": {"matchLabels": redis_selector(r)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": gateway_selector(r)}}],
                         "ports": [{"protocol": "TCP", "port": REDIS_PORT}]}],
            "egress": [],
        },
    }


def gateway_documents(r: ResolvedSpec) -> list[dict[str, Any]]:
    """In apply order: Redis first, so the gateway is ready as soon as it starts."""
    return [storage_class(r), redis_stateful_set(r), redis_service(r), redis_network_policy(r),
            config_map(r), service_account(r), deployment(r), service(r),
            pod_disruption_budget(r), gateway_network_policy(r)]
