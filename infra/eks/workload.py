"""The model server: the byo-vllm image as a Deployment, its Service, PodDisruptionBudget,
namespace and service account.

The container is configured exactly as on SageMaker (interface 5): ``HF_MODEL_ID``,
``SM_NUM_GPUS`` and ``SM_VLLM_*`` engine arguments, plus the user's ``OPTION_*``/``SM_VLLM_*``
options; the hub token comes only from a Secret through a ``secretKeyRef``.
"""
from __future__ import annotations

import math
import shlex
from typing import Any

from infra.eks.spec import (HF_TOKEN_KEY, HF_TOKEN_SECRET, SERVER_PORT, ResolvedSpec, pinned,
                            pinned_versions)

CACHE_DIR = "/cache"
# LoRA adapters, copied from S3 by the init container and registered by the server at start.
ADAPTERS_DIR = "/adapters"
# The adapter files the server loads; nothing else (a pickled .bin) is copied.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
RUN_AS_USER = 10001
PROBE_PERIOD_S = 10
RAY_SERVE_PORT = 8000       # Ray Serve's HTTP proxy, behind the Service KubeRay makes


def namespace(r: ResolvedSpec) -> dict[str, Any]:
    # The server runs as a non-root user with no extra privileges: enforce that. KubeRay adds
    # containers of its own (the autoscaler sidecar) that the restricted profile may refuse,
    # so a RayService namespace enforces baseline and only warns about restricted.
    enforce = "restricted" if r.engine == "deployment" else "baseline"
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": r.namespace, "labels": {
                "app.kubernetes.io/part-of": "spectrum",
                "pod-security.kubernetes.io/enforce": enforce,
                "pod-security.kubernetes.io/warn": "restricted"}}}


def service_account(r: ResolvedSpec) -> dict[str, Any]:
    # With adapters, cluster.yaml's pod identity association gives this account read access to
    # their S3 prefixes (and nothing else).
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels()},
            "automountServiceAccountToken": False}


def hf_token_env() -> dict[str, Any]:
    # Optional: public models need no token, and the pod must not wait for a Secret it won't use.
    return {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY, "optional": True}}}


def server_env(r: ResolvedSpec) -> list[dict[str, Any]]:
    env = [
        {"name": "HF_MODEL_ID", "value": r.model},
        {"name": "SM_NUM_GPUS", "value": str(r.gpus_per_replica)},
        {"name": "SM_VLLM_TENSOR_PARALLEL_SIZE", "value": str(r.tensor_parallel_size)},
    ]
    if r.pipeline_parallel_size > 1:
        env.append({"name": "SM_VLLM_PIPELINE_PARALLEL_SIZE", "value": str(r.pipeline_parallel_size)})
    if r.max_model_len:
        env.append({"name": "SM_VLLM_MAX_MODEL_LEN", "value": str(r.max_model_len)})
    # Agent programs resend a growing prefix: keep its KV cache (off with --no-prefix-caching).
    if r.prefix_caching_setting is not None:
        env.append({"name": "SM_VLLM_ENABLE_PREFIX_CACHING",
                    "value": "true" if r.prefix_caching_setting else "false"})
    if r.lora:
        env += [{"name": k, "value": v} for k, v in
                lora_env(r.max_loras, r.max_lora_rank, r.max_cpu_loras, ADAPTERS_DIR).items()]
    env += [{"name": key, "value": value} for key, value in r.options]
    # The root filesystem is read-only: every cache goes to the writable cache volume.
    env += [{"name": "HOME", "value": f"{CACHE_DIR}/home"},
            {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
            {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
            {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{CACHE_DIR}/torchinductor"},
            # The pod's user has no passwd entry: getpass.getuser() (torch caches) reads $USER.
            {"name": "USER", "value": "spectrum"},
            hf_token_env()]
    return env


def lora_env(max_loras: int, max_lora_rank: int, max_cpu_loras: int, adapters_dir: str) -> dict[str, str]:
    """The server settings that turn LoRA on with these sizes; the server registers each
    ``<name>/`` folder in ``adapters_dir``, as vLLM's --lora-modules would."""
    return {"SM_VLLM_ENABLE_LORA": "true", "SM_VLLM_MAX_LORAS": str(max_loras),
            "SM_VLLM_MAX_LORA_RANK": str(max_lora_rank), "SM_VLLM_MAX_CPU_LORAS": str(max_cpu_loras),
            "SPECTRUM_SERVER_ADAPTERS_DIR": adapters_dir}


def restricted_container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def spread(selector: dict[str, str]) -> list[dict[str, Any]]:
    """Replicas over nodes and zones where possible (never left Pending for it)."""
    return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector}}
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")]


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def gpu_resources(r: ResolvedSpec) -> dict[str, Any]:
    # Quantities as strings: the Kubernetes client rejects integer quantities.
    amounts = {"cpu": str(r.cpu_per_replica), "memory": f"{r.memory_gib_per_replica}Gi",
               "nvidia.com/gpu": str(r.gpus_per_replica)}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def gpu_toleration() -> dict[str, Any]:
    return {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def checkov_skips(r: ResolvedSpec) -> dict[str, str]:
    """Checkov checks this workload deliberately does not meet, each with its reason."""
    skips = {
        "CKV_K8S_35": "the server reads the hub token from HF_TOKEN (huggingface_hub's convention); "
                      "its value comes only from a secretKeyRef, never from the manifest",
    }
    if "@sha256:" not in r.image:
        skips["CKV_K8S_43"] = ("the image is pinned by a version tag (latest is refused); "
                               "pass --image repo@sha256:... to pin a digest")
    elif r.lora:
        skips["CKV_K8S_43"] = ("the adapter init container's AWS CLI image is pinned by a release "
                               "tag (infra/eks/data/versions.json)")
    return skips


def adapter_fetch_script(r: ResolvedSpec) -> str:
    """Copy each adapter's config and safetensors from S3 into ADAPTERS_DIR/<name>; stop
    with a message naming the adapter when its folder holds no adapter_config.json."""
    lines = ["set -eu"]
    include = " ".join(f"--include {f}" for f in ADAPTER_FILES)
    for name, uri in r.adapter_prefixes().items():
        dest = f"{ADAPTERS_DIR}/{name}"
        lines.append(f"aws s3 sync --only-show-errors --exclude '*' {include} "
                     f"{shlex.quote(uri + '/')} {shlex.quote(dest)}")
        lines.append(f"test -f {shlex.quote(dest + '/' + ADAPTER_FILES[0])} || "
                     f"{{ echo {shlex.quote(f'adapter {name}: no {ADAPTER_FILES[0]} under {uri}/')} >&2; exit 1; }}")
    lines.append(f"echo 'adapters ready: {' '.join(r.adapter_prefixes())}'")
    return "\n".join(lines) + "\n"


def adapter_fetch_container(r: ResolvedSpec) -> dict[str, Any]:
    """The init container: AWS CLI with the pod's identity (EKS Pod Identity, see cluster.yaml)."""
    return {
        "name": "fetch-adapters",
        "image": pinned("aws_cli_image"),
        "imagePullPolicy": "Always",
        "command": ["/bin/sh", "-c", adapter_fetch_script(r)],
        "env": [{"name": "HOME", "value": "/tmp/home"},
                {"name": "AWS_DEFAULT_REGION", "value": r.region}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                      "limits": {"cpu": "1", "memory": "512Mi"}},
        "securityContext": restricted_container_security(),
        "volumeMounts": [{"name": "adapters", "mountPath": ADAPTERS_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }


def skip_annotations(skips: dict[str, str]) -> dict[str, str]:
    return {f"checkov.io/skip{i}": f"{check}={why}"
            for i, (check, why) in enumerate(sorted(skips.items()), start=1)}


def deployment(r: ResolvedSpec) -> dict[str, Any]:
    startup_failures = math.ceil(r.startup_timeout_s / PROBE_PERIOD_S)
    pool_key, pool_value = r.pool_label
    container = {
        "name": "server",
        "image": r.image,
        "imagePullPolicy": "Always",
        "args": ["serve"],     # the SageMaker contract: the image's entrypoint accepts `serve`
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": server_env(r),
        "resources": gpu_resources(r),
        # /ping answers 200 only once the model is loaded: allow the whole download + load.
        "startupProbe": {"httpGet": {"path": "/ping", "port": "http"},
                         "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 2,
                         "failureThreshold": startup_failures},
        "readinessProbe": {"httpGet": {"path": "/ping", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3},
        # /ping stays fast during long generations; restart only after a minute of silence.
        "livenessProbe": {"httpGet": {"path": "/ping", "port": "http"},
                          "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4},
        # Keep serving while endpoints drop this pod, then SIGTERM lets requests finish.
        "lifecycle": {"preStop": {"sleep": {"seconds": 10}}},
        "securityContext": restricted_container_security(),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "cache", "mountPath": CACHE_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec = {
        "serviceAccountName": r.name,
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        # Longer than the longest request plus the preStop pause, so none is cut off.
        "terminationGracePeriodSeconds": r.max_request_s + 30,
        "nodeSelector": {pool_key: pool_value},
        "tolerations": [gpu_toleration()],
        "topologySpreadConstraints": spread(r.selector()),
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{r.shm_gib}Gi"}},
            {"name": "cache", "emptyDir": {"sizeLimit": "150Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "10Gi"}},
        ],
    }
    if r.lora:
        pod_spec["initContainers"] = [adapter_fetch_container(r)]
        pod_spec["volumes"].append({"name": "adapters", "emptyDir": {"sizeLimit": "20Gi"}})
        container["volumeMounts"].append({"name": "adapters", "mountPath": ADAPTERS_DIR,
                                          "readOnly": True})
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels(),
                     "annotations": skip_annotations(checkov_skips(r))},
        "spec": {
            "replicas": r.min_replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": r.selector()},
            # A new GPU pod must be Ready before an old one goes: never drop below capacity.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": r.startup_timeout_s + 600,
            "template": {"metadata": {"labels": r.labels()}, "spec": pod_spec},
        },
    }


def service(r: ResolvedSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels()},
            "spec": {"type": "ClusterIP", "selector": r.selector(),
                     "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http",
                                "protocol": "TCP"}]}}


def pod_disruption_budget(r: ResolvedSpec) -> dict[str, Any]:
    # maxUnavailable (not minAvailable): with one replica a node drain can still proceed.
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels()},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": r.selector()}}}


def _chart_namespace(chart: str) -> str:
    return next(c["namespace"] for c in pinned_versions()["charts"] if c["name"] == chart)


def model_service(r: ResolvedSpec) -> tuple[str, int]:
    """The Service the model answers on: ours, or the one KubeRay makes for Serve."""
    if r.engine == "rayservice":
        return f"{r.name}-serve-svc", RAY_SERVE_PORT
    return r.name, SERVER_PORT


def server_pods(r: ResolvedSpec) -> dict[str, str]:
    """The labels of the pods that run the model: the server's, or every Ray pod's."""
    component = "server" if r.engine == "deployment" else "ray"
    return {"app.kubernetes.io/name": r.name, "app.kubernetes.io/component": component}


def namespace_peer(chart: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": _chart_namespace(chart)}}}


def edge_chart(r: ResolvedSpec) -> str:
    return "envoy-gateway" if r.edge == "gateway" else "ingress-nginx"


def network_policy(r: ResolvedSpec) -> dict[str, Any]:
    """Only the edge proxy (or, with --gateway, only the gateway) and Prometheus reach the
    servers; they reach DNS and HTTPS (hub, S3)."""
    pods = server_pods(r)
    front = ({"podSelector": {"matchLabels": {"app.kubernetes.io/name": r.name,
                                              "app.kubernetes.io/component": "gateway"}}}
             if r.gateway else namespace_peer(edge_chart(r)))
    from_peers = [front, namespace_peer("kube-prometheus-stack")]
    if r.engine == "rayservice":   # the operator reaches the head's dashboard to deploy Serve
        from_peers.append(namespace_peer("kuberay-operator"))
    ingress: list[dict[str, Any]] = [{"from": from_peers}]
    if r.engine == "rayservice":   # Ray's head and workers talk to each other on many ports
        ingress.append({"from": [{"podSelector": {"matchLabels": pods}}]})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels()},
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": [
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"ports": [{"protocol": "TCP", "port": 443}]},      # model hub, S3, ECR
                {"to": [{"podSelector": {"matchLabels": pods}}]},
            ],
        },
    }
