"""The KubeRay alternative (``--engine rayservice``): a RayService whose Serve application is,
by default (``--serve-app byo``), the bring-your-own server's own (``byo_vllm.ray_serve``: the
same engine, settings, routes and dialects as the Deployment, on the project's image), or
(``--serve-app ray-llm``) ``ray.serve.llm:build_openai_app`` on Ray's LLM image.

Ray Serve autoscales the LLM replicas and KubeRay's autoscaler adds GPU worker pods for them,
so this engine needs no HPA. For ray-llm, ``SM_VLLM_*`` options become vLLM ``engine_kwargs``;
the byo application reads them as the server does.

Adapters (``--adapter``) go through Serve's multiplexing either way; Serve routes a request to
a replica that already holds its adapter when one is free. The byo application: each GPU worker
pod's init container copies the adapters from S3 into ``/adapters`` (as the Deployment's does),
the engine's registry registers them, and ``max_adapters_per_replica`` (``--max-cpu-loras``)
is its ``@serve.multiplexed(max_num_models_per_replica=...)``; a request names its adapter in
``model`` or the ``serve_multiplexed_model_id`` header. ray-llm: ``lora_config`` names the S3
folder the adapters sit in (``dynamic_lora_loading_path``; Ray loads ``<path>/<name>`` on the
first request for ``<model>:<name>``) and how many one replica keeps
(``max_num_adapters_per_replica``).

``--ray-proxy haproxy`` (``options.core.ray_proxy``) sets Ray's high-throughput mode in the head
and worker containers' env: HAProxy (bundled with the image's ray[serve]) answers on the Serve
port 8000 and forwards to ingress replicas that serve HTTP themselves; the byo application only
(Ray's LLM image pinned here predates the mode).
"""
from __future__ import annotations

from typing import Any

import yaml

from infra.eks.spec import ResolvedSpec, pinned
from infra.eks.workload import (ADAPTERS_DIR, adapter_fetch_container, gpu_resources,
                                gpu_toleration, hf_token_env, server_env, skip_annotations)
from options.core.ray_proxy import ray_proxy_env

# Requests one LLM replica should have in flight before Serve adds another (the KubeRay sample).
TARGET_ONGOING_REQUESTS = 64
MAX_ONGOING_REQUESTS = 128
BYO_APP = "byo_vllm.ray_serve:build_app"
OPENAI_APP = "ray.serve.llm:build_openai_app"
# What the byo application reads as server settings (the rest of the Deployment's env is the
# container's: caches, HOME, the token from its Secret).
_SERVER_SETTINGS = ("SM_VLLM_", "SM_NUM_GPUS", "OPTION_", "SPECTRUM_SERVER_", "VLLM_")


def _engine_value(text: str) -> Any:
    """``SM_VLLM_*`` values are strings in env; engine_kwargs want their real types."""
    value = yaml.safe_load(text) if text != "" else True   # empty value = bare flag, as SM_VLLM_* defines it
    return value if isinstance(value, (bool, int, float, str)) else text


def engine_kwargs(r: ResolvedSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"tensor_parallel_size": r.tensor_parallel_size}
    if r.pipeline_parallel_size > 1:
        kwargs["pipeline_parallel_size"] = r.pipeline_parallel_size
    if r.max_model_len:
        kwargs["max_model_len"] = r.max_model_len
    if r.prefix_caching_setting is not None:
        kwargs["enable_prefix_caching"] = r.prefix_caching_setting
    if r.lora:
        kwargs.update(enable_lora=True, max_loras=r.max_loras, max_lora_rank=r.max_lora_rank,
                      max_cpu_loras=r.max_cpu_loras)
    for key, value in r.options:
        if key.startswith("SM_VLLM_"):
            kwargs[key[len("SM_VLLM_"):].lower()] = _engine_value(value)
    return kwargs


def autoscaling_config(r: ResolvedSpec) -> dict[str, Any]:
    """Serve's autoscaling of the engine replicas: --min/--max-replicas, the target and what
    ``--autoscaling-from`` took from ``cost simulate`` (its target, delays and look-back)."""
    return {"min_replicas": r.min_replicas, "max_replicas": r.max_replicas,
            "target_ongoing_requests": TARGET_ONGOING_REQUESTS, **dict(r.ray_autoscaling)}


def serve_config(r: ResolvedSpec) -> dict[str, Any]:
    return byo_serve_config(r) if r.serve_app == "byo" else ray_llm_serve_config(r)


def byo_serve_config(r: ResolvedSpec) -> dict[str, Any]:
    """The bring-your-own server's application: the Deployment's server settings as its args."""
    settings = {e["name"]: e["value"] for e in server_env(r)
                if "value" in e and e["name"].startswith(_SERVER_SETTINGS)}
    args = {"model": r.model, "settings": settings,
            "autoscaling_config": autoscaling_config(r),
            "engine_num_gpus": r.gpus_per_replica, "engine_num_cpus": r.cpu_per_replica,
            "max_ongoing_requests": MAX_ONGOING_REQUESTS}
    if r.lora:      # the engine's adapter cache is what Serve's multiplexing keeps per replica
        args["max_adapters_per_replica"] = r.max_cpu_loras
    if r.ray_ingress_replicas != 1:     # the builder's default is one ingress replica
        args["ingress_replicas"] = r.ray_ingress_replicas
    return {"applications": [{"name": "llm", "route_prefix": "/", "import_path": BYO_APP,
                              "args": args}]}


def ray_llm_serve_config(r: ResolvedSpec) -> dict[str, Any]:
    env_vars = {k: v for k, v in r.options if not k.startswith("SM_VLLM_")}
    llm_config: dict[str, Any] = {
        "model_loading_config": {"model_id": r.served_model_name, "model_source": r.model},
        "accelerator_type": r.ray_accelerator_type,
        "engine_kwargs": engine_kwargs(r),
        "deployment_config": {
            "autoscaling_config": autoscaling_config(r),
            "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        },
    }
    if r.lora:
        llm_config["lora_config"] = {"dynamic_lora_loading_path": r.adapter_root,
                                     "max_num_adapters_per_replica": r.max_cpu_loras}
    if env_vars:
        llm_config["runtime_env"] = {"env_vars": env_vars}
    return {"applications": [{"name": "llm", "route_prefix": "/",
                              "import_path": OPENAI_APP,
                              "args": {"llm_configs": [llm_config]}}]}


def _ray_container(r: ResolvedSpec, name: str, ports: list[tuple[str, int]],
                   resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": ray_image(r), "imagePullPolicy": "Always",
            "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
            "env": [hf_token_env()] + [{"name": k, "value": v}
                                       for k, v in ray_proxy_env(r.ray_proxy).items()],
            "resources": resources,
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "runAsNonRoot": True, "runAsUser": 1000,   # the image's `ray` user
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}


def ray_image(r: ResolvedSpec) -> str:
    """The byo application runs on the project's image (with Ray); ray-llm on Ray's."""
    return r.image if r.serve_app == "byo" else pinned("ray_llm_image")


def ray_version(r: ResolvedSpec) -> str:
    return pinned("ray_serve" if r.serve_app == "byo" else "ray")


# Checkov checks the Ray pods the validator derives from this RayService's templates; these
# are the ones they deliberately do not meet.
RAY_POD_SKIPS = {
    "CKV_K8S_8": "KubeRay adds its own liveness probes to Ray containers",
    "CKV_K8S_9": "KubeRay adds its own readiness probes to Ray containers",
    "CKV_K8S_22": "Ray writes session files and caches under /tmp/ray and its home directory",
    "CKV_K8S_35": "Ray's vLLM reads the hub token from HF_TOKEN; the value comes only from a "
                  "secretKeyRef, never from the manifest",
    "CKV_K8S_40": "the ray-llm image's user is uid 1000, which owns its home directory",
    "CKV_K8S_43": "a pinned release tag of Ray's image (infra/eks/data/versions.json)",
}
HEAD_SKIPS = {**RAY_POD_SKIPS, "CKV_K8S_38": "the KubeRay autoscaler sidecar in the head pod "
                                             "calls the Kubernetes API with the pod's token"}


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 100,
            "seccompProfile": {"type": "RuntimeDefault"}}


def ray_service(r: ResolvedSpec) -> dict[str, Any]:
    pool_key, pool_value = r.pool_label
    # The head schedules no model work (num-gpus 0): it fits on a system node.
    head_resources = {"requests": {"cpu": "1", "memory": "4Gi"},
                      "limits": {"cpu": "1", "memory": "4Gi"}}
    pod_labels = r.labels("ray")
    head = {
        "rayStartParams": {"num-gpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {"metadata": {"labels": pod_labels,
                                  "annotations": skip_annotations(HEAD_SKIPS)}, "spec": {
            "securityContext": _pod_security(),
            "containers": [_ray_container(r, "ray-head", [
                ("gcs", 6379), ("dashboard", 8265), ("client", 10001), ("serve", 8000),
                ("metrics", 8080)], head_resources)],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        }},
    }
    worker = {
        "groupName": "gpu",
        "replicas": r.min_replicas, "minReplicas": r.min_replicas, "maxReplicas": r.max_replicas,
        "numOfHosts": 1,
        "rayStartParams": {},
        "template": {"metadata": {"labels": pod_labels,
                                  "annotations": skip_annotations(RAY_POD_SKIPS)}, "spec": {
            "securityContext": _pod_security(),
            "automountServiceAccountToken": False,
            **({"serviceAccountName": r.name} if r.lora else {}),   # S3 read: cluster.yaml
            "nodeSelector": {pool_key: pool_value},
            "tolerations": [gpu_toleration()],
            "terminationGracePeriodSeconds": r.max_request_s + 30,
            "containers": [_ray_container(r, "ray-worker", [("metrics", 8080)], gpu_resources(r))],
            "volumes": [{"name": "dshm",
                         "emptyDir": {"medium": "Memory", "sizeLimit": f"{r.shm_gib}Gi"}}],
        }},
    }
    if r.lora and r.serve_app == "byo":     # the adapters' files, before Ray starts
        spec = worker["template"]["spec"]
        spec["initContainers"] = [adapter_fetch_container(r)]
        spec["volumes"] += [{"name": "adapters", "emptyDir": {"sizeLimit": "20Gi"}},
                            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
        spec["containers"][0]["volumeMounts"].append(
            {"name": "adapters", "mountPath": ADAPTERS_DIR, "readOnly": True})
    return {
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": r.name, "namespace": r.namespace, "labels": r.labels("ray")},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config(r), sort_keys=False),
            "rayClusterConfig": {
                "rayVersion": ray_version(r),
                "enableInTreeAutoscaling": True,
                "headGroupSpec": head,
                "workerGroupSpecs": [worker],
            },
        },
    }
