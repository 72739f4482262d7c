"""One spec for the EKS stack, checked before anything is rendered.

``EksSpec`` is what the user asks for; ``resolve(spec)`` checks every field at once (a single
``BadInput`` lists each problem, naming the value, why it is wrong and what would be right)
and returns a ``ResolvedSpec``: the spec with its defaults filled in from the instance
catalogue in ``cost/`` (GPUs, GPU type, vCPUs, memory) plus the sizes every renderer shares
(replicas per node, nodes at min and max, per-replica CPU and memory).
"""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from options.core import BadInput, is_secret_name
from options.core.ray_proxy import RAY_PROXIES

DATA_DIR = Path(__file__).resolve().parent / "data"

ENGINES = ("deployment", "rayservice")
SERVE_APPS = ("byo", "ray-llm")          # --engine rayservice's Serve application
GPU_NODE_MODES = ("karpenter", "nodegroup")
CAPACITY_TYPES = ("on-demand", "spot")
EDGES = ("gateway", "nginx")

DEFAULT_MODEL = "Qwen/Qwen2.5-7B-Instruct"
DEFAULT_INSTANCE_TYPE = "g5.xlarge"
# The image the server builder's Dockerfile tags locally; a cluster needs a registry URI.
LOCAL_IMAGE = "spectrum-byo-vllm:0.1.0"
SERVER_PORT = 8080          # the SageMaker container contract the image follows
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
# The gateway image containers/gateway builds locally; a cluster needs a registry URI.
LOCAL_GATEWAY_IMAGE = "spectrum-gateway:0.1.0"
# vLLM's --max-lora-rank choices (vllm 0.32 EngineArgs).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# An adapter's name: what clients send as "model" (the byo server's own rule, and no ':', which
# Ray Serve LLM uses between the base model and the adapter).
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# s3://bucket/prefix with a bucket name S3 accepts and a prefix of safe characters.
_S3_PREFIX = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>[A-Za-z0-9!_.*'()/=+-]+?)/?$")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CLUSTER_NAME = re.compile(r"^[a-zA-Z][-a-zA-Z0-9]*$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Env the server understands (interface 5): engine args and LMI-style options.
_ENV_PREFIXES = ("OPTION_", "SM_VLLM_", "VLLM_")
# Set by the renderer from the spec's own fields; giving them as --option would fight them.
_RESERVED_ENV = {"HF_MODEL_ID", "SM_NUM_GPUS", "SM_VLLM_TENSOR_PARALLEL_SIZE",
                 "SM_VLLM_PIPELINE_PARALLEL_SIZE", "SM_VLLM_MAX_MODEL_LEN", "SAGEMAKER_BIND_TO_PORT"}


@lru_cache(maxsize=1)
def pinned_versions() -> dict[str, Any]:
    """Versions and Helm charts the stack pins (infra/eks/data/versions.json, dated rows)."""
    doc = json.loads((DATA_DIR / "versions.json").read_text())
    return {"versions": {row["name"]: row["value"] for row in doc["versions"]},
            "charts": doc["charts"]}


def pinned(name: str) -> str:
    return pinned_versions()["versions"][name]


@dataclass(frozen=True)
class EksSpec:
    image: str = ""
    name: str = "llm"
    model: str = DEFAULT_MODEL
    instance_type: str | None = None       # "g5.xlarge" or "ml.g5.xlarge"; default from gpu_type
    gpu_type: str | None = None            # "A10G", "L40S", ...; default from instance_type
    gpus_per_replica: int | None = None    # default: every GPU of one node
    tensor_parallel_size: int | None = None  # default: gpus_per_replica
    max_model_len: int | None = None       # default: the model's own maximum
    min_replicas: int = 1
    max_replicas: int = 3
    target_cpu: int = 70                   # HPA CPU utilisation %, 0 = off
    target_waiting: float = 5.0            # HPA waiting requests per pod, 0 = off
    rate_limit_rps: int = 50
    rate_limit_burst: int | None = None    # default: 5 x rps (the classic nginx multiplier)
    namespace: str = "spectrum"
    region: str = "us-east-1"
    cluster_name: str = "spectrum"
    engine: str = "deployment"
    serve_app: str = "byo"
    ray_ingress_replicas: int = 1          # the byo Serve app's ingress replicas; 0: engine as ingress
    ray_proxy: str = "serve"               # options.core.ray_proxy: Serve's proxy or HAProxy
    gpu_nodes: str = "karpenter"
    capacity_type: str = "on-demand"
    edge: str = "gateway"
    max_request_s: int = 300               # longest generation a client may wait for
    startup_timeout_s: int = 1800          # model download + load (LMI's default loading timeout)
    body_size: str = "8m"                  # request body limit at the edge (classic: 8m)
    options: tuple[tuple[str, str], ...] = ()  # extra server env: OPTION_* / SM_VLLM_* / VLLM_*
    # LoRA adapters: (name, s3://bucket/prefix) each, fetched at pod start (Deployment) or by Ray
    # Serve LLM on first use (RayService). Slots default from the adapter count.
    adapters: tuple[tuple[str, str], ...] = ()
    max_loras: int | None = None           # adapters in one batch (GPU slots)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None       # adapters cached in host memory per replica
    prefix_caching: bool = True            # vLLM's automatic prefix caching (agent programs)
    gateway: bool = False                  # containers/gateway + Redis in front of the servers
    gateway_image: str = LOCAL_GATEWAY_IMAGE
    gateway_replicas: int = 2
    # --engine rayservice: Ray Serve autoscaling_config settings beside min/max replicas and
    # target_ongoing_requests (from cost simulate --rung6-autoscaler ray-serve: its delays, ...).
    ray_autoscaling: tuple[tuple[str, Any], ...] = ()
    kubernetes_version: str = field(default_factory=lambda: pinned("kubernetes"))


@dataclass(frozen=True)
class ResolvedSpec:
    """A checked spec with every default filled in, and the sizes the renderers share."""
    spec: EksSpec
    instance: Any                          # cost.prices.InstanceType
    warnings: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:  # spec fields read through, e.g. r.namespace
        if name in ("spec", "instance", "warnings") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.spec, name)

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus

    @property
    def replicas_per_node(self) -> int:
        return self.instance.gpus // self.spec.gpus_per_replica

    def nodes_for(self, replicas: int) -> int:
        return math.ceil(replicas / self.replicas_per_node)

    @property
    def pipeline_parallel_size(self) -> int:
        return self.spec.gpus_per_replica // self.spec.tensor_parallel_size

    @property
    def gpu_limit(self) -> int:
        """GPUs the node pool may hold at max replicas (whole nodes)."""
        return self.nodes_for(self.spec.max_replicas) * self.instance.gpus

    @property
    def cpu_per_replica(self) -> int:
        # ~15 % of a node goes to kubelet, system reserve and daemon sets.
        return max(1, math.floor(self.instance.vcpus * 0.85 / self.replicas_per_node))

    @property
    def memory_gib_per_replica(self) -> int:
        return max(2, math.floor(self.instance.memory_gib * 0.8 / self.replicas_per_node))

    @property
    def shm_gib(self) -> int:
        # NCCL and vLLM's workers share tensors through /dev/shm; it counts against memory.
        return max(1, min(16, self.memory_gib_per_replica // 4))

    @property
    def karpenter_gpu_name(self) -> str:
        return self.instance.gpu_type.split()[0].lower()    # "A10G" -> "a10g" (Karpenter label)

    @property
    def ray_accelerator_type(self) -> str:
        return self.instance.gpu_type.split()[0].upper()

    @property
    def family(self) -> str:
        return self.instance.name.split(".")[0]

    @property
    def size(self) -> str:
        return self.instance.name.split(".", 1)[1]

    @property
    def served_model_name(self) -> str:
        return self.spec.model

    def labels(self, component: str = "server") -> dict[str, str]:
        return {"app.kubernetes.io/name": self.spec.name,
                "app.kubernetes.io/component": component,
                "app.kubernetes.io/part-of": "spectrum",
                "app.kubernetes.io/managed-by": "spectrum"}

    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.spec.name,
                "app.kubernetes.io/component": "server"}

    @property
    def prefix_caching_setting(self) -> bool | None:
        """vLLM's enable_prefix_caching as rendered: on by default, off when asked; left to vLLM
        (None) for a pooling model, where vLLM turns it on only if the pooling supports it."""
        runner = dict(self.spec.options).get("SM_VLLM_RUNNER", "").strip().lower()
        if self.spec.prefix_caching and runner == "pooling":
            return None
        return self.spec.prefix_caching

    @property
    def lora(self) -> bool:
        return bool(self.spec.adapters)

    def adapter_prefixes(self) -> dict[str, str]:
        """Adapter name -> its s3://bucket/prefix, without a trailing slash."""
        return {name: uri.rstrip("/") for name, uri in self.spec.adapters}

    @property
    def adapter_root(self) -> str | None:
        """The s3:// prefix every adapter sits directly under (Ray Serve LLM loads
        ``<root>/<name>``), or None when they do not share one."""
        parents = {uri.rsplit("/", 1)[0] for uri in self.adapter_prefixes().values()}
        ok = all(uri.rsplit("/", 1)[1] == name for name, uri in self.adapter_prefixes().items())
        return parents.pop() if ok and len(parents) == 1 else None

    @property
    def pool_label(self) -> tuple[str, str]:
        """The node label GPU nodes carry (NodePool template or node group), and pods select."""
        return ("spectrum.io/gpu-pool", self.spec.name)


def _closest(value: str, known: list[str]) -> str:
    close = difflib.get_close_matches(value.upper(), [k.upper() for k in known], n=3, cutoff=0.3)
    names = [k for k in known if k.upper() in close] or known
    return ", ".join(names)


def _check_choice(problems: list[str], flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        problems.append(f"{flag} {value!r} is not one of {', '.join(choices)}")


def _check_image(problems: list[str], image: str, flag: str = "--image") -> None:
    if flag != "--image" and (not image or not image.strip()):
        problems.append(f"{flag} is empty: give the registry URI of the image, pinned by tag or digest")
        return
    if not image or not image.strip():
        problems.append("image is missing: give --image, the registry URI of the byo-vllm image "
                        "(e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0; "
                        "level 5 builds and pushes it)")
        return
    if any(c.isspace() for c in image):
        problems.append(f"{flag} {image!r} contains whitespace")
        return
    last = image.rsplit("/", 1)[-1]
    if "@sha256:" in image:
        return
    if ":" not in last:
        problems.append(f"{flag} {image!r} has no tag: pin a tag or a digest (repo:1.2.3 or "
                        "repo@sha256:...), or replicas may run different builds")
    elif last.rsplit(":", 1)[1] == "latest":
        problems.append(f"{flag} {image!r} uses the rolling tag 'latest': pin a version tag or a digest")


def _gpu_instances(table) -> list:
    return [i for i in table.instances() if i.gpus >= 1 and i.gpu_type.lower() != "inferentia2"]


def _resolve_instance(spec: EksSpec, table, problems: list[str]):
    """The instance type from the spec, or the smallest one with the asked GPU type and count."""
    from cost.prices import UnknownName

    gpu_instances = _gpu_instances(table)
    gpu_types = sorted({i.gpu_type for i in gpu_instances})
    if spec.gpu_type is not None and spec.gpu_type.upper() not in {g.upper() for g in gpu_types}:
        problems.append(f"GPU type {spec.gpu_type!r} is not known: closest known: "
                        f"{_closest(spec.gpu_type, gpu_types)} (known: {', '.join(gpu_types)})")
        return None
    if spec.instance_type:
        try:
            inst = table.instance(spec.instance_type)
        except UnknownName as exc:
            problems.append(str(exc))
            return None
        if inst.gpus < 1 or inst.gpu_type.lower() == "inferentia2":
            problems.append(f"instance type {spec.instance_type!r} has no NVIDIA GPU "
                            f"({inst.gpu_type}); the byo-vllm image needs CUDA: choose a g5, g6, "
                            "g6e, p4d or p5 type")
            return None
        if spec.gpu_type and spec.gpu_type.upper() != inst.gpu_type.upper():
            problems.append(f"GPU type {spec.gpu_type!r} does not match instance type {inst.name} "
                            f"({inst.gpu_type}): drop one of the two, or pick a "
                            f"{spec.gpu_type} instance")
            return None
        return inst
    wanted = spec.gpus_per_replica or 1
    pool = [i for i in gpu_instances
            if (spec.gpu_type is None and i.name == DEFAULT_INSTANCE_TYPE)
            or (spec.gpu_type and i.gpu_type.upper() == spec.gpu_type.upper() and i.gpus >= wanted)]
    if not pool:
        problems.append(f"no known instance has {wanted} x {spec.gpu_type or 'GPU'}: "
                        f"the most is {max(i.gpus for i in gpu_instances)} per node")
        return None
    return min(pool, key=lambda i: (i.ec2_hourly or math.inf, i.name))


def resolve(spec: EksSpec, table=None) -> ResolvedSpec:
    """Check ``spec`` completely; return it resolved, or raise one BadInput naming each problem."""
    from cost.prices import load_prices

    problems: list[str] = []
    warnings: list[str] = []
    if spec.engine != "rayservice" or spec.serve_app != "ray-llm":   # ray-llm: Ray's image
        _check_image(problems, spec.image)
    if not spec.model or not spec.model.strip():
        problems.append("model is missing: give --model, a Hugging Face id such as "
                        f"{DEFAULT_MODEL} (or an s3:// prefix the image can read)")
    for flag, value, limit in (("--name", spec.name, 40), ("--namespace", spec.namespace, 63)):
        if not _DNS_LABEL.match(value or "") or len(value) > limit:
            problems.append(f"{flag} {value!r} is not a valid Kubernetes name: lower-case letters, "
                            f"digits and '-', starting and ending with a letter or digit, at most "
                            f"{limit} characters")
    if not _CLUSTER_NAME.match(spec.cluster_name or "") or len(spec.cluster_name) > 100:
        problems.append(f"--cluster-name {spec.cluster_name!r} is not a valid EKS cluster name: "
                        "a letter, then letters, digits and '-' (at most 100)")
    if not _REGION.match(spec.region or ""):
        problems.append(f"--region {spec.region!r} is not an AWS region name such as us-east-1")
    _check_choice(problems, "--engine", spec.engine, ENGINES)
    _check_choice(problems, "--serve-app", spec.serve_app, SERVE_APPS)
    if spec.serve_app != "byo" and spec.engine != "rayservice":
        problems.append(f"--serve-app {spec.serve_app} applies to --engine rayservice only: add "
                        "--engine rayservice, or drop --serve-app")
    problems += _ray_ingress_problems(spec)
    _check_choice(problems, "--ray-proxy", spec.ray_proxy, RAY_PROXIES)
    if spec.ray_proxy != "serve" and spec.engine != "rayservice":
        problems.append(f"--ray-proxy {spec.ray_proxy} sets what fronts Ray Serve's ingress: it "
                        "needs --engine rayservice; drop it otherwise")
    elif spec.ray_proxy == "haproxy" and spec.serve_app != "byo":
        problems.append(f"--ray-proxy haproxy needs Ray 2.56 or later; --serve-app {spec.serve_app}"
                        f" runs Ray {pinned('ray')} ({pinned('ray_llm_image')}): use --serve-app "
                        "byo (Ray " + pinned("ray_serve") + "), or drop --ray-proxy")
    _check_choice(problems, "--gpu-nodes", spec.gpu_nodes, GPU_NODE_MODES)
    _check_choice(problems, "--capacity-type", spec.capacity_type, CAPACITY_TYPES)
    _check_choice(problems, "--edge", spec.edge, EDGES)

    table = table or load_prices()
    inst = _resolve_instance(spec, table, problems)
    gpus = spec.gpus_per_replica
    if gpus is not None and (not isinstance(gpus, int) or gpus < 1):
        problems.append(f"--gpus-per-replica {gpus!r} must be a whole number >= 1")
        gpus = None
    if inst is not None:
        gpus = gpus or inst.gpus
        if gpus > inst.gpus:
            bigger = sorted({i.name for i in _gpu_instances(table)
                             if i.gpu_type == inst.gpu_type and i.gpus >= gpus})
            problems.append(f"--gpus-per-replica {gpus} does not fit on {inst.name}, which has "
                            f"{inst.gpus} GPU{'s' if inst.gpus > 1 else ''}: a replica runs on one "
                            f"node; use {', '.join(bigger) or 'a bigger instance type'}")
    tp = spec.tensor_parallel_size
    if tp is not None and (not isinstance(tp, int) or tp < 1):
        problems.append(f"--tensor-parallel-size {tp!r} must be a whole number >= 1")
    elif gpus is not None:
        tp = tp or gpus
        if tp > gpus:
            problems.append(f"--tensor-parallel-size {tp} is larger than --gpus-per-replica {gpus}: "
                            f"tensor parallelism splits one replica over its own GPUs; use at most "
                            f"{gpus}, or raise --gpus-per-replica")
        elif gpus % tp:
            ok = [d for d in range(1, gpus + 1) if gpus % d == 0]
            problems.append(f"--tensor-parallel-size {tp} does not divide --gpus-per-replica {gpus}: "
                            f"the GPUs of a replica are tensor x pipeline parallel; use one of "
                            f"{', '.join(map(str, ok))}")
    if spec.max_model_len is not None and (not isinstance(spec.max_model_len, int)
                                           or not 16 <= spec.max_model_len <= 10_485_760):
        problems.append(f"--max-model-len {spec.max_model_len!r} must be a whole number of tokens "
                        "between 16 and 10485760 (or left out for the model's own maximum)")
    mn, mx = spec.min_replicas, spec.max_replicas
    if not isinstance(mn, int) or mn < 1:
        problems.append(f"--min-replicas {mn!r} must be >= 1 (the HPA cannot scale a Deployment to 0)")
    if not isinstance(mx, int) or mx < 1 or mx > 1000:
        problems.append(f"--max-replicas {mx!r} must be between 1 and 1000")
    if isinstance(mn, int) and isinstance(mx, int) and mn > mx:
        problems.append(f"--min-replicas {mn} is greater than --max-replicas {mx}: "
                        f"raise --max-replicas to at least {mn}, or lower --min-replicas")
    if not isinstance(spec.target_cpu, int) or not 0 <= spec.target_cpu <= 100:
        problems.append(f"--target-cpu {spec.target_cpu!r} must be a percentage 1-100 (0 turns it off)")
    if not isinstance(spec.target_waiting, (int, float)) or spec.target_waiting < 0:
        problems.append(f"--target-waiting {spec.target_waiting!r} must be >= 0 waiting requests "
                        "per pod (0 turns it off)")
    elif spec.target_cpu == 0 and spec.target_waiting == 0 and spec.engine == "deployment":
        problems.append("--target-cpu 0 and --target-waiting 0 leave the autoscaler nothing to "
                        "scale on: keep at least one")
    if not isinstance(spec.rate_limit_rps, int) or spec.rate_limit_rps < 1:
        problems.append(f"--rate-limit-rps {spec.rate_limit_rps!r} must be a whole number >= 1")
    elif spec.rate_limit_burst is not None and (not isinstance(spec.rate_limit_burst, int)
                                                or spec.rate_limit_burst < spec.rate_limit_rps):
        problems.append(f"--rate-limit-burst {spec.rate_limit_burst!r} must be >= --rate-limit-rps "
                        f"{spec.rate_limit_rps} (it is the most requests accepted at once)")
    if not re.match(r"^\d+[kmg]?$", spec.body_size or ""):
        problems.append(f"body size {spec.body_size!r} must look like 8m, 512k or 1g")
    if not isinstance(spec.max_request_s, int) or not 1 <= spec.max_request_s <= 3600:
        problems.append(f"longest request {spec.max_request_s!r} s must be between 1 and 3600")
    if not isinstance(spec.startup_timeout_s, int) or not 60 <= spec.startup_timeout_s <= 7200:
        problems.append(f"start-up timeout {spec.startup_timeout_s!r} s must be between 60 and 7200")
    for key, _value in spec.options:
        if is_secret_name(key):
            problems.append(f"--option {key}=... would put a secret in the manifest: store it in "
                            f"the Secret {HF_TOKEN_SECRET!r} (kubectl -n {spec.namespace} create "
                            f"secret generic {HF_TOKEN_SECRET} --from-literal={HF_TOKEN_KEY}=...); "
                            "the server reads it through a secretKeyRef")
        elif not _ENV_NAME.match(key) or not key.startswith(_ENV_PREFIXES):
            problems.append(f"--option {key!r} is not server configuration: use OPTION_*, "
                            "SM_VLLM_* or VLLM_* names (e.g. SM_VLLM_GPU_MEMORY_UTILIZATION=0.9)")
        elif key in _RESERVED_ENV:
            problems.append(f"--option {key} is set from its own flag; use that flag instead")
    _check_adapters(problems, spec)
    _check_gateway(problems, spec)
    if not re.match(r"^1\.\d+$", spec.kubernetes_version or ""):
        problems.append(f"Kubernetes version {spec.kubernetes_version!r} must look like 1.34")
    if problems:
        raise BadInput("the EKS spec has " + (f"{len(problems)} problems" if len(problems) > 1
                                              else "a problem") + ":\n  - " + "\n  - ".join(problems))
    if inst.gpus % gpus:
        warnings.append(f"{inst.name} has {inst.gpus} GPUs and each replica takes {gpus}: "
                        f"{inst.gpus % gpus} GPU(s) per node stay idle")
    if spec.engine == "rayservice" and spec.serve_app == "ray-llm" and spec.image:
        warnings.append(f"--image is not used by --engine rayservice: the RayService runs "
                        f"{pinned('ray_llm_image')}")
    if spec.edge == "nginx":
        warnings.append("ingress-nginx is retired (no fixes after March 2026): --edge nginx is kept "
                        "only for the legacy nginx annotations; prefer --edge gateway")
    if spec.gpu_nodes == "nodegroup":
        warnings.append("a managed GPU node group does not grow by itself: pods the HPA adds beyond "
                        "its desired size stay Pending unless cluster-autoscaler runs; Karpenter "
                        "(the default) provisions nodes for them")
    if spec.capacity_type == "spot":
        warnings.append("spot GPU nodes can be reclaimed with 2 minutes' notice: keep "
                        "--min-replicas >= 2 for a service that must stay up")
    if spec.gateway and spec.engine == "deployment" and spec.gateway_replicas < 2:
        warnings.append("--gateway-replicas 1: every request passes the gateway, so one replica "
                        "is a single point of failure; keep 2 or more")
    max_loras, max_cpu_loras = (lora_sizes(len(spec.adapters), spec.max_loras, spec.max_cpu_loras)
                                if spec.adapters else (None, None))
    resolved_spec = replace(spec, instance_type=inst.name, gpu_type=inst.gpu_type,
                            gpus_per_replica=gpus, tensor_parallel_size=tp,
                            rate_limit_burst=spec.rate_limit_burst or 5 * spec.rate_limit_rps,
                            max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    return ResolvedSpec(resolved_spec, inst, tuple(warnings))


def lora_sizes(adapters: int, max_loras: int | None, max_cpu_loras: int | None) -> tuple[int, int]:
    """(--max-loras, --max-cpu-loras) for ``adapters`` adapters where not given: every adapter
    in one batch up to 4, and every adapter (at least a batch's) cached in host memory."""
    max_loras = max_loras or min(adapters, 4)
    return max_loras, max_cpu_loras or max(adapters, max_loras)


def parse_adapter(text: str) -> tuple[str, str]:
    """``NAME=s3://bucket/prefix`` -> (name, uri); BadInput naming the value otherwise."""
    name, sep, uri = (text or "").partition("=")
    if not sep or not name.strip() or not uri.strip():
        raise BadInput(f"--adapter {text!r} must look like NAME=s3://bucket/prefix, e.g. "
                       "--adapter support=s3://my-bucket/adapters/support")
    return name.strip(), uri.strip()


def _check_adapters(problems: list[str], spec: EksSpec) -> None:
    """Adapter names and sources, and the LoRA sizes they need."""
    seen: set[str] = set()
    for name, uri in spec.adapters:
        if not ADAPTER_NAME.match(name):
            problems.append(f"--adapter {name}={uri}: the name {name!r} is what clients send as "
                            "'model': letters, digits, '.', '_' and '-', starting with a letter or "
                            "digit, at most 128 characters")
        elif name in seen:
            problems.append(f"--adapter {name} is given twice: each adapter needs its own name")
        elif name in (spec.model, spec.model.rsplit("/", 1)[-1]):
            problems.append(f"--adapter {name} is named as the base model {spec.model!r}: requests "
                            "for it would be ambiguous; choose another name")
        seen.add(name)
        if not _S3_PREFIX.match(uri):
            problems.append(f"--adapter {name}={uri}: {uri!r} is not an s3://bucket/prefix (a "
                            "valid bucket name, then the folder holding adapter_config.json and "
                            "adapter_model.safetensors), e.g. s3://my-bucket/adapters/" + name)
    if (spec.adapters and spec.engine == "rayservice" and spec.serve_app == "ray-llm"
            and not problems):
        parents = {uri.rstrip("/").rsplit("/", 1)[0] for _, uri in spec.adapters}
        misnamed = [f"{n}={u}" for n, u in spec.adapters if u.rstrip("/").rsplit("/", 1)[1] != n]
        if len(parents) > 1 or misnamed:
            problems.append(
                "--serve-app ray-llm loads every adapter from one S3 folder, as "
                "<dynamic_lora_loading_path>/<name>: put each adapter in a folder named as the "
                "adapter under one common prefix (e.g. s3://bucket/adapters/a1 and "
                "s3://bucket/adapters/a2); got " + ", ".join(
                    misnamed or [f"{n}={u}" for n, u in spec.adapters]))
    if spec.max_lora_rank not in LORA_RANKS:
        problems.append(f"--max-lora-rank {spec.max_lora_rank!r} must be one of "
                        f"{', '.join(map(str, LORA_RANKS))} (vLLM's choices), at least the "
                        "largest adapter's rank r")
    for flag, value in (("--max-loras", spec.max_loras), ("--max-cpu-loras", spec.max_cpu_loras)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= 256):
            problems.append(f"{flag} {value!r} must be a whole number between 1 and 256")
        elif value is not None and not spec.adapters:
            problems.append(f"{flag} {value} needs at least one --adapter NAME=s3://bucket/prefix "
                            "(without adapters LoRA stays off)")
    if (isinstance(spec.max_loras, int) and isinstance(spec.max_cpu_loras, int)
            and spec.max_cpu_loras < spec.max_loras):
        problems.append(f"--max-cpu-loras {spec.max_cpu_loras} is below --max-loras "
                        f"{spec.max_loras}: every adapter in a batch is also cached in host memory "
                        f"(vLLM refuses it); raise --max-cpu-loras to at least {spec.max_loras}")
    for key, _value in spec.options:
        if spec.adapters and key in ("SM_VLLM_ENABLE_LORA", "SM_VLLM_MAX_LORAS",
                                     "SM_VLLM_MAX_LORA_RANK", "SM_VLLM_MAX_CPU_LORAS",
                                     "OPTION_ENABLE_LORA", "OPTION_MAX_LORAS",
                                     "OPTION_MAX_CPU_LORAS"):
            problems.append(f"--option {key} fights the LoRA settings --adapter renders: use "
                            "--max-loras, --max-cpu-loras and --max-lora-rank instead")
        if key in ("SM_VLLM_ENABLE_PREFIX_CACHING", "OPTION_ENABLE_PREFIX_CACHING"):
            problems.append(f"--option {key} is set from its own flag: prefix caching is on by "
                            "default; --no-prefix-caching turns it off")


def _check_gateway(problems: list[str], spec: EksSpec) -> None:
    if not spec.gateway:
        return
    _check_image(problems, spec.gateway_image, "--gateway-image")
    if (not isinstance(spec.gateway_replicas, int) or isinstance(spec.gateway_replicas, bool)
            or not 1 <= spec.gateway_replicas <= 100):
        problems.append(f"--gateway-replicas {spec.gateway_replicas!r} must be a whole number "
                        "between 1 and 100")


def _ray_ingress_problems(spec: EksSpec) -> list[str]:
    """--ray-ingress-replicas: the byo Serve application's ingress replicas (0: the engine
    deployment takes HTTP itself, one hop less, which cannot route adapters by body)."""
    n = spec.ray_ingress_replicas
    if n == 1:
        return []
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return [f"--ray-ingress-replicas {n!r} must be a whole number >= 0 (0: the engine "
                "deployment as the ingress)"]
    if spec.engine != "rayservice" or spec.serve_app != "byo":
        return [f"--ray-ingress-replicas {n} sizes the byo Serve application's ingress: it needs "
                "--engine rayservice with --serve-app byo (the default); drop it otherwise"]
    if n == 0 and spec.adapters:
        return ["--ray-ingress-replicas 0 with --adapter: the ingress is what names each request's "
                "adapter for Serve's multiplexing; keep an ingress (1 or more), or drop --adapter"]
    return []
