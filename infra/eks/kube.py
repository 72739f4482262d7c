"""Apply rendered manifests with the Kubernetes client, wait for rollout, and remove them.

Every kind Spectrum renders has a known REST path (no discovery round trips). An object that
is absent is created (POST); one that exists is updated with server-side apply. A failed run
deletes what it created, in reverse order. Custom kinds are applied only when the cluster
serves their API; otherwise the error names the Helm chart that provides it.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

FIELD_MANAGER = "spectrum"

# kind -> (apiVersion, plural, namespaced) for every kind the renderers emit (and Secret).
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("v1", "namespaces", False), "ServiceAccount": ("v1", "serviceaccounts", True),
    "Secret": ("v1", "secrets", True), "Service": ("v1", "services", True),
    "Deployment": ("apps/v1", "deployments", True),
    "StatefulSet": ("apps/v1", "statefulsets", True),
    "ConfigMap": ("v1", "configmaps", True),
    "StorageClass": ("storage.k8s.io/v1", "storageclasses", False),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets", True),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies", True),
    "HorizontalPodAutoscaler": ("autoscaling/v2", "horizontalpodautoscalers", True),
    "Ingress": ("networking.k8s.io/v1", "ingresses", True),
    "GatewayClass": ("gateway.networking.k8s.io/v1", "gatewayclasses", False),
    "Gateway": ("gateway.networking.k8s.io/v1", "gateways", True),
    "HTTPRoute": ("gateway.networking.k8s.io/v1", "httproutes", True),
    "BackendTrafficPolicy": ("gateway.envoyproxy.io/v1alpha1", "backendtrafficpolicies", True),
    "ServiceMonitor": ("monitoring.coreos.com/v1", "servicemonitors", True),
    "PodMonitor": ("monitoring.coreos.com/v1", "podmonitors", True),
    "NodePool": ("karpenter.sh/v1", "nodepools", False),
    "EC2NodeClass": ("karpenter.k8s.aws/v1", "ec2nodeclasses", False),
    "RayService": ("ray.io/v1", "rayservices", True),
}
# API group -> the add-on that serves it (what to install when the cluster lacks it).
GROUP_PROVIDERS = {
    "karpenter.sh": "Karpenter (eksctl installs it: ClusterConfig `karpenter`)",
    "karpenter.k8s.aws": "Karpenter (eksctl installs it: ClusterConfig `karpenter`)",
    "gateway.networking.k8s.io": "Envoy Gateway (Helm chart envoy-gateway; it installs the Gateway API CRDs)",
    "gateway.envoyproxy.io": "Envoy Gateway (Helm chart envoy-gateway)",
    "monitoring.coreos.com": "kube-prometheus-stack (Helm chart)",
    "ray.io": "the KubeRay operator (Helm chart kuberay-operator)",
}
BUILTIN_GROUPS = {"", "apps", "policy", "autoscaling", "networking.k8s.io", "storage.k8s.io"}


class ApplyFailed(RuntimeError):
    """Applying or rolling out failed; what this run created has been removed."""


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def ref(doc: dict[str, Any]) -> str:
    meta = doc["metadata"]
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{doc['kind']}/{ns}{meta['name']}"


def _group_version(api_version: str) -> tuple[str, str]:
    return tuple(api_version.split("/", 1)) if "/" in api_version else ("", api_version)


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    if kind not in KINDS:
        raise ValueError(f"no REST mapping for kind {kind!r}")
    _, plural, namespaced = KINDS[kind]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespaced else f"{base}/{plural}"


def object_path(doc: dict[str, Any]) -> str:
    meta = doc["metadata"]
    return collection_path(doc["apiVersion"], doc["kind"], meta.get("namespace")) + f"/{meta['name']}"


class KubeApi:
    """A thin JSON layer over the Kubernetes client's ApiClient (kubeconfig or a URL)."""

    def __init__(self, api_client):
        self.client = api_client

    @classmethod
    def from_kubeconfig(cls, context: str | None = None) -> "KubeApi":
        import os

        from kubernetes import config

        # The client reads $KUBECONFIG once, at import: read it now, as kubectl does.
        return cls(config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"),
                                                 context=context))

    @classmethod
    def from_url(cls, url: str) -> "KubeApi":
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = url.rstrip("/")
        return cls(client.ApiClient(configuration))

    @property
    def host(self) -> str:
        return self.client.configuration.host

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json",
                query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        serialized = self.client.param_serialize(
            method, path, query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        try:
            response = self.client.call_api(*serialized, _request_timeout=30)
            response.read()
            if not 200 <= response.status <= 299:
                self.client.response_deserialize(response, {})
        except ApiException as exc:
            raise KubeError(exc.status or 0, _status_message(exc.body) or str(exc.reason)) from None
        return json.loads(response.data or b"{}")

    def get(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.request("GET", object_path(doc))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def serves(self, api_version: str) -> bool:
        if api_version == "v1":
            return True
        try:
            self.request("GET", f"/apis/{api_version}")
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        meta = doc["metadata"]
        return self.request("POST", collection_path(doc["apiVersion"], doc["kind"],
                                                    meta.get("namespace")), doc)

    def server_side_apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", object_path(doc), doc,
                            content_type="application/apply-patch+yaml",
                            query=[("fieldManager", FIELD_MANAGER), ("force", "true")])

    def delete(self, doc: dict[str, Any]) -> bool:
        try:
            self.request("DELETE", object_path(doc),
                         query=[("propagationPolicy", "Foreground")])
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise


def _status_message(body: Any) -> str:
    try:
        return json.loads(body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return str(body or "")[:300]


Progress = Callable[[str], None]


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    rollout: dict[str, str] = field(default_factory=dict)    # ref -> final state
    elapsed_s: float = 0.0


def missing_apis(api: KubeApi, docs: list[dict[str, Any]]) -> dict[str, str]:
    """apiVersion -> add-on that provides it, for custom APIs the cluster does not serve."""
    out = {}
    for api_version in dict.fromkeys(d["apiVersion"] for d in docs):
        group, _ = _group_version(api_version)
        if group in BUILTIN_GROUPS:
            continue
        if not api.serves(api_version):
            out[api_version] = GROUP_PROVIDERS.get(group, "its operator")
    return out


def apply_manifests(api: KubeApi, docs: list[dict[str, Any]], progress: Progress = print, *,
                    wait: bool = True, timeout_s: float = 2700, poll_s: float = 5.0) -> ApplyResult:
    """Create or update every document in order; wait for rollout; on failure undo creations."""
    started = time.monotonic()
    result = ApplyResult()
    missing = missing_apis(api, docs)
    if missing:
        raise ApplyFailed("the cluster does not serve " + "; ".join(
            f"{v} (install {p})" for v, p in missing.items()) + ". Nothing was applied.")
    created_docs: list[dict[str, Any]] = []
    try:
        for doc in docs:
            if api.get(doc) is None:
                api.create(doc)
                created_docs.append(doc)
                result.created.append(ref(doc))
                progress(f"  created {ref(doc)}")
            else:
                api.server_side_apply(doc)
                result.updated.append(ref(doc))
                progress(f"  updated {ref(doc)}")
        if wait:
            for doc in docs:
                if doc["kind"] in ROLLOUT_CHECKS:
                    result.rollout[ref(doc)] = wait_for_rollout(
                        api, doc, progress, timeout_s - (time.monotonic() - started), poll_s)
    except Exception as exc:
        removed = remove_created(api, created_docs, progress)
        raise ApplyFailed(f"{exc}; removed what this run created"
                          + (f" ({', '.join(removed)})" if removed else " (nothing)")) from exc
    result.elapsed_s = time.monotonic() - started
    return result


def remove_created(api: KubeApi, docs: list[dict[str, Any]], progress: Progress) -> list[str]:
    removed = []
    for doc in reversed(docs):
        try:
            if api.delete(doc):
                removed.append(ref(doc))
                progress(f"  removed {ref(doc)}")
        except KubeError as exc:
            progress(f"  could not remove {ref(doc)}: {exc}")
    return removed


def delete_manifests(api: KubeApi, docs: list[dict[str, Any]], progress: Progress = print) -> list[str]:
    """Remove every document, last applied first; absent ones are skipped."""
    return remove_created(api, docs, progress)


# --- rollout -------------------------------------------------------------------------------

def deployment_rollout(obj: dict[str, Any]) -> tuple[bool, str]:
    """(done, what to show): the conditions `kubectl rollout status` waits for."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = spec.get("replicas", 1)
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            raise RuntimeError(f"{ref(obj)} exceeded its progress deadline: {cond.get('message', '')}")
    generation = obj.get("metadata", {}).get("generation", 0)
    if status.get("observedGeneration", 0) < generation:
        return False, "waiting for the controller to see the new spec"
    updated = status.get("updatedReplicas", 0)
    available = status.get("availableReplicas", 0)
    total = status.get("replicas", 0)
    text = f"{available}/{want} replicas available ({updated} updated)"
    return updated >= want and total == updated and available >= updated, text


def rayservice_rollout(obj: dict[str, Any]) -> tuple[bool, str]:
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True", f"Ready={cond.get('status')} ({cond.get('reason', '')})"
    state = status.get("serviceStatus") or "no status yet"
    return state == "Running", f"serviceStatus {state}"


ROLLOUT_CHECKS = {"Deployment": deployment_rollout, "RayService": rayservice_rollout}


def wait_for_rollout(api: KubeApi, doc: dict[str, Any], progress: Progress, timeout_s: float,
                     poll_s: float = 5.0) -> str:
    started = time.monotonic()
    last = None
    while True:
        obj = api.get(doc)
        if obj is None:
            raise RuntimeError(f"{ref(doc)} disappeared while rolling out")
        done, text = ROLLOUT_CHECKS[doc["kind"]](obj)
        elapsed = time.monotonic() - started
        if text != last:
            progress(f"  rollout {ref(doc)}: {text} ({elapsed:.0f} s)")
            last = text
        if done:
            return text
        if elapsed >= timeout_s:
            raise RuntimeError(f"{ref(doc)} did not roll out within {timeout_s:.0f} s: {text} "
                               "(GPU nodes take minutes to join, and the model minutes to load)")
        time.sleep(poll_s)
