"""Schemas the project writes itself, for documents whose upstream schema is not at hand offline.

- Gateway API (GatewayClass, Gateway, HTTPRoute: gateway.networking.k8s.io/v1), Envoy Gateway's
  BackendTrafficPolicy (gateway.envoyproxy.io/v1alpha1) and the Prometheus Operator's
  ServiceMonitor / PodMonitor (monitoring.coreos.com/v1): their CRDs are not in
  shared/k8s-schemas, so these schemas cover exactly the fields Spectrum emits, strictly
  (an unknown or misspelt field is an error), with the types and enums of the upstream APIs.
- Ray Serve's deploy schema (what RayService ``serveConfigV2`` holds) and the parts of
  ``ray.serve.llm``'s LLMConfig that ``build_openai_app`` reads: a model of the upstream
  pydantic classes (``ServeDeploySchema``, ``ServeApplicationSchema``, ``LLMConfig``).
"""
from __future__ import annotations

from typing import Any

from infra.eks.spec import LORA_RANKS

STRING = {"type": "string"}
NAME = {"type": "string", "minLength": 1, "maxLength": 253,
        "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}   # Gateway API Duration
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}


def obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


def array(items: dict[str, Any], min_items: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": min_items}


METADATA = obj({"name": NAME, "namespace": NAME, "labels": LABELS,
                "annotations": LABELS}, ("name",))


def resource(api_version: str, kind: str, spec: dict[str, Any], namespaced: bool = True):
    meta = METADATA if not namespaced else {**METADATA, "required": ["name", "namespace"]}
    return obj({"apiVersion": {"const": api_version}, "kind": {"const": kind},
                "metadata": meta, "spec": spec}, ("apiVersion", "kind", "metadata", "spec"))


PARENT_REF = obj({"group": STRING, "kind": STRING, "namespace": NAME, "name": NAME,
                  "sectionName": NAME, "port": PORT}, ("name",))
LABEL_SELECTOR = obj({"matchLabels": LABELS, "matchExpressions": array(obj({
    "key": STRING, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
    "values": array(STRING)}, ("key", "operator")))})

GATEWAY_CLASS = resource("gateway.networking.k8s.io/v1", "GatewayClass", obj({
    "controllerName": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$"},
    "description": STRING}, ("controllerName",)), namespaced=False)

GATEWAY = resource("gateway.networking.k8s.io/v1", "Gateway", obj({
    "gatewayClassName": NAME,
    "listeners": array(obj({
        "name": NAME, "hostname": STRING, "port": PORT,
        "protocol": {"enum": ["HTTP", "HTTPS", "TLS", "TCP", "UDP"]},
        "allowedRoutes": obj({"namespaces": obj({
            "from": {"enum": ["All", "Same", "Selector"]}, "selector": LABEL_SELECTOR})}),
    }, ("name", "port", "protocol")), 1)}, ("gatewayClassName", "listeners")))

HTTP_ROUTE = resource("gateway.networking.k8s.io/v1", "HTTPRoute", obj({
    "parentRefs": array(PARENT_REF, 1),
    "hostnames": array(STRING),
    "rules": array(obj({
        "matches": array(obj({"path": obj({
            "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
            "value": {"type": "string", "pattern": "^/"}}, ("type", "value"))})),
        "backendRefs": array(obj({"group": STRING, "kind": STRING, "name": NAME,
                                  "namespace": NAME, "port": PORT,
                                  "weight": {"type": "integer", "minimum": 0}}, ("name", "port")), 1),
        "timeouts": obj({"request": DURATION, "backendRequest": DURATION}),
    }), 1)}, ("parentRefs", "rules")))

RATE_LIMIT_VALUE = obj({"requests": {"type": "integer", "minimum": 1},
                        "unit": {"enum": ["Second", "Minute", "Hour", "Day", "Month", "Year"]}},
                       ("requests", "unit"))
# Envoy Gateway's LoadBalancer (api/v1alpha1/loadbalancer_types.go), with its CEL unions
# (consistentHash exactly when type is ConsistentHash; header exactly when its type is Header).
CONSISTENT_HASH = {**obj({
    "type": {"enum": ["SourceIP", "Header", "Cookie"]},
    "header": obj({"name": {"type": "string", "minLength": 1}}, ("name",)),
    "cookie": obj({"name": {"type": "string", "minLength": 1}, "ttl": DURATION,
                   "attributes": LABELS}, ("name",)),
    "tableSize": {"type": "integer", "minimum": 2, "maximum": 5000011},
}, ("type",)), "allOf": [
    {"if": {"properties": {"type": {"const": "Header"}}}, "then": {"required": ["header"]},
     "else": {"not": {"required": ["header"]}}},
    {"if": {"properties": {"type": {"const": "Cookie"}}}, "then": {"required": ["cookie"]},
     "else": {"not": {"required": ["cookie"]}}}]}
LOAD_BALANCER = {**obj({
    "type": {"enum": ["ConsistentHash", "LeastRequest", "Random", "RoundRobin"]},
    "consistentHash": CONSISTENT_HASH,
    "slowStart": obj({"window": DURATION}, ("window",)),
}, ("type",)), "allOf": [
    {"if": {"properties": {"type": {"const": "ConsistentHash"}}},
     "then": {"required": ["consistentHash"]}, "else": {"not": {"required": ["consistentHash"]}}}]}
BACKEND_TRAFFIC_POLICY = resource("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy", obj({
    "targetRefs": array(obj({"group": {"const": "gateway.networking.k8s.io"},
                             "kind": {"enum": ["Gateway", "HTTPRoute", "GRPCRoute"]},
                             "name": NAME}, ("group", "kind", "name")), 1),
    "rateLimit": obj({
        "type": {"enum": ["Local", "Global"]},
        "local": obj({"rules": array(obj({"limit": RATE_LIMIT_VALUE}, ("limit",)), 1)}),
    }, ("type",)),
    "loadBalancer": LOAD_BALANCER,
}, ("targetRefs",)))

SERVICE_MONITOR = resource("monitoring.coreos.com/v1", "ServiceMonitor", obj({
    "selector": LABEL_SELECTOR,
    "namespaceSelector": obj({"any": {"type": "boolean"}, "matchNames": array(NAME)}),
    "endpoints": array(obj({"port": NAME, "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "scrapeTimeout": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]}}), 1),
}, ("selector", "endpoints")))

POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", obj({
    "selector": LABEL_SELECTOR,
    "namespaceSelector": obj({"any": {"type": "boolean"}, "matchNames": array(NAME)}),
    "podMetricsEndpoints": array(obj({"port": NAME, "path": {"type": "string", "pattern": "^/"},
                                      "interval": STRING, "scrapeTimeout": STRING}), 1),
}, ("selector", "podMetricsEndpoints")))

# (apiVersion, kind) -> schema, for the kinds validated with a project-written schema.
PROJECT_KINDS: dict[tuple[str, str], dict[str, Any]] = {
    ("gateway.networking.k8s.io/v1", "GatewayClass"): GATEWAY_CLASS,
    ("gateway.networking.k8s.io/v1", "Gateway"): GATEWAY,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
    ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"): BACKEND_TRAFFIC_POLICY,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
}

# --- Ray Serve ---------------------------------------------------------------------------
POSITIVE_INT = {"type": "integer", "minimum": 1}
NON_NEGATIVE_INT = {"type": "integer", "minimum": 0}
NUMBER_GE0 = {"type": "number", "minimum": 0}
RUNTIME_ENV = obj({"env_vars": {"type": "object", "additionalProperties": {"type": "string"}},
                   "pip": {"type": ["array", "object"]}, "working_dir": STRING,
                   "py_modules": array(STRING)})
AUTOSCALING_CONFIG = obj({
    "min_replicas": NON_NEGATIVE_INT, "initial_replicas": NON_NEGATIVE_INT,
    "max_replicas": POSITIVE_INT, "target_ongoing_requests": {"type": "number", "exclusiveMinimum": 0},
    "upscale_delay_s": NUMBER_GE0, "downscale_delay_s": NUMBER_GE0,
    "upscaling_factor": {"type": "number", "exclusiveMinimum": 0},
    "downscaling_factor": {"type": "number", "exclusiveMinimum": 0},
    "metrics_interval_s": {"type": "number", "exclusiveMinimum": 0},
    "look_back_period_s": {"type": "number", "exclusiveMinimum": 0}})
LLM_DEPLOYMENT_CONFIG = obj({
    "autoscaling_config": AUTOSCALING_CONFIG, "num_replicas": POSITIVE_INT,
    "max_ongoing_requests": POSITIVE_INT, "max_queued_requests": {"type": "integer", "minimum": -1},
    "graceful_shutdown_timeout_s": NUMBER_GE0, "health_check_period_s": NUMBER_GE0,
    "health_check_timeout_s": NUMBER_GE0, "ray_actor_options": {"type": "object"}})
# vLLM engine arguments the project sets or accepts from SM_VLLM_* options (values typed).
ENGINE_KWARGS = {"type": "object", "properties": {
    "tensor_parallel_size": POSITIVE_INT, "pipeline_parallel_size": POSITIVE_INT,
    "max_model_len": {"type": "integer", "minimum": 16},
    "gpu_memory_utilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "max_num_seqs": POSITIVE_INT, "max_num_batched_tokens": POSITIVE_INT,
    "enable_prefix_caching": {"type": "boolean"}, "dtype": STRING, "quantization": STRING,
    "enable_lora": {"type": "boolean"}, "max_loras": POSITIVE_INT, "max_cpu_loras": POSITIVE_INT,
    "max_lora_rank": {"enum": list(LORA_RANKS)}},
    "additionalProperties": {"type": ["string", "integer", "number", "boolean"]}}
# ray.serve.llm.LoraConfig: adapters load from <dynamic_lora_loading_path>/<adapter> on first use.
LORA_CONFIG = obj({
    "dynamic_lora_loading_path": {"type": ["string", "null"],
                                  "pattern": r"^(s3|gs|abfss|azure)://[^/\s]+(/[^\s]*)?$"},
    "max_num_adapters_per_replica": POSITIVE_INT,
    "download_timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "max_download_tries": POSITIVE_INT,
})
LLM_CONFIG = obj({
    "model_loading_config": obj({"model_id": {"type": "string", "minLength": 1},
                                 "model_source": {"type": ["string", "object"]}}, ("model_id",)),
    "llm_engine": {"enum": ["vLLM"]},
    "engine_kwargs": ENGINE_KWARGS,
    "accelerator_type": {"enum": ["A10G", "L4", "L40S", "A100", "A100-40G", "A100-80G", "H100",
                                  "H200", "T4", "V100", "B200"]},
    "deployment_config": LLM_DEPLOYMENT_CONFIG,
    "runtime_env": RUNTIME_ENV,
    "lora_config": LORA_CONFIG,
    "log_engine_metrics": {"type": "boolean"},
    "placement_group_config": {"type": "object"},
}, ("model_loading_config",))
SERVE_APPLICATION = obj({
    "name": {"type": "string", "minLength": 1},
    "route_prefix": {"type": ["string", "null"], "pattern": r"^/([^{}]*[^/{}])?$"},
    "import_path": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$"},
    "runtime_env": RUNTIME_ENV,
    "deployments": array({"type": "object", "required": ["name"]}),
    "args": {"type": "object"},
    "external_scaler_enabled": {"type": "boolean"},
    "logging_config": {"type": "object"},
}, ("import_path",))
SERVE_DEPLOY = obj({
    "proxy_location": {"enum": ["Disabled", "HeadOnly", "EveryNode"]},
    "http_options": obj({"host": STRING, "port": PORT, "root_path": STRING,
                         "request_timeout_s": {"type": "number"},
                         "keep_alive_timeout_s": {"type": "number"}}),
    "grpc_options": obj({"port": PORT, "grpc_servicer_functions": array(STRING)}),
    "logging_config": {"type": "object"},
    "target_capacity": {"type": ["number", "null"], "minimum": 0, "maximum": 100},
    "applications": array(SERVE_APPLICATION, 1),
}, ("applications",))
# What build_openai_app takes as its args (LLMServingArgs).
OPENAI_APP_ARGS = obj({"llm_configs": array(LLM_CONFIG, 1),
                       "ingress_deployment_config": {"type": "object"}}, ("llm_configs",))
