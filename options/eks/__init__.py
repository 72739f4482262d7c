"""Level 6 — build your own infrastructure: EKS + Karpenter GPU nodes + the byo-vllm image.

    python -m options.deploy --level 6                               render + validate into ./out/eks-llm
    python -m options.deploy --level 6 --min-replicas 3 --max-replicas 15 --target-cpu 70 --edge nginx
    python -m options.deploy --level 6 --plan --json                 every document, nothing sent
    python -m options.deploy --level 6 --target emulator             cluster on moto's EKS, manifests
                                                                     on an in-memory Kubernetes API
    python -m options.deploy --level 6 --target aws --image URI      eksctl + kubeconfig, waits for rollout
    python -m options.deploy --level 6 --engine rayservice           the byo server as a Ray Serve
                                                                     application, on a local Ray

The stack itself (render, validate, apply) lives in ``infra/eks``; this module maps the CLI
onto it through the RungModule verbs.
"""
from __future__ import annotations

import argparse
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from options.core import BadInput, rung
from options.core.ray_proxy import RAY_PROXIES
from options.plan import Deployment, Plan, Step

LEVEL = 6
DEFAULT_OUT = "out"
DEFAULT_NAME = "llm"


@dataclass(frozen=True)
class Level6Spec:
    eks: Any                      # infra.eks.spec.EksSpec
    out_dir: str
    notes: tuple[str, ...] = ()   # things the CLI filled in for the user
    # --engine rayservice --target local: (model source, options, LocalAdapters or None) served
    # on a local Ray.
    ray_here: Any = None


@dataclass(frozen=True)
class LocalAdapters:
    """--adapter NAME=FOLDER on a local Ray: peft folders on this machine, and the LoRA sizes the
    rendered RayService would give them (infra.eks.spec.lora_sizes)."""
    folders: tuple[tuple[str, Path], ...]
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int

    def settings(self, adapters_dir: str) -> dict[str, str]:
        """The server settings the rendered pods get (infra.eks.workload.lora_env), with
        ``adapters_dir`` holding one folder per adapter, named as it."""
        from infra.eks.workload import lora_env

        return lora_env(self.max_loras, self.max_lora_rank, self.max_cpu_loras, adapters_dir)


# ----------------------------------------------------------------------------------- flags

def add_arguments(group: argparse._ArgumentGroup) -> None:
    g = group
    g.add_argument("--image", metavar="URI",
                   help="registry URI of the byo-vllm image, pinned by tag or digest (level 5 pushes "
                        "it), e.g. --image 123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0")
    g.add_argument("--gpu-type", metavar="GPU",
                   help="GPU type instead of --instance-type; the cheapest instance with enough of "
                        "them is used, e.g. --gpu-type L40S")
    g.add_argument("--gpus-per-replica", type=int, metavar="N",
                   help="GPUs each server replica uses (default: every GPU of a node), e.g. 4")
    g.add_argument("--tensor-parallel-size", type=int, metavar="N",
                   help="tensor-parallel degree; must divide --gpus-per-replica (the rest is "
                        "pipeline parallel; default: all of them), e.g. 2")
    g.add_argument("--max-model-len", type=int, metavar="TOKENS",
                   help="longest context in tokens (default: the model's), e.g. 8192")
    g.add_argument("--min-replicas", type=int, metavar="N", help="HPA minimum (default 1), e.g. 3")
    g.add_argument("--max-replicas", type=int, metavar="N", help="HPA maximum (default 3), e.g. 15")
    g.add_argument("--autoscaling-from", metavar="FILE",
                   help="the autoscaling cost simulate chose for rung 6: its --json output (the HPA's "
                        "target, or with --engine rayservice the ray_serve_autoscaling_config of "
                        "--rung6-autoscaler ray-serve) or a Ray Serve autoscaling_config JSON, e.g. "
                        "--autoscaling-from sim.json")
    g.add_argument("--ray-autoscaling", dest="ray_settings", action="append", metavar="KEY=VALUE",
                   help="--engine rayservice: one of Ray Serve's autoscaling_config settings "
                        "(target_ongoing_requests, upscale_delay_s, downscale_delay_s, look_back_period_s, "
                        "...; min/max as --min/--max-replicas), repeatable, as cost recommend --trace "
                        "prints them, e.g. --ray-autoscaling target_ongoing_requests=8")
    g.add_argument("--target-cpu", type=int, metavar="PCT",
                   help="HPA CPU utilisation target in %% (default 70; 0 = off), e.g. 70")
    g.add_argument("--target-waiting", type=float, metavar="N",
                   help="HPA target of vLLM waiting requests per pod (default 5; 0 = off), e.g. 4")
    g.add_argument("--rate-limit-rps", type=int, metavar="RPS",
                   help="edge rate limit in requests/s (default 50), e.g. 50")
    g.add_argument("--rate-limit-burst", type=int, metavar="N",
                   help="requests accepted in a burst (default 5 x rps; nginx only), e.g. 250")
    g.add_argument("--edge", choices=("gateway", "nginx"),
                   help="gateway (default): Gateway API + Envoy Gateway rate limit; nginx: the "
                        "classic ingress-nginx annotations (retired project)")
    g.add_argument("--namespace", metavar="NS", help="Kubernetes namespace (default spectrum)")
    g.add_argument("--cluster-name", metavar="NAME", help="EKS cluster name (default spectrum)")
    g.add_argument("--engine", choices=("deployment", "rayservice"),
                   help="deployment (default): the byo-vllm image; rayservice: KubeRay + Ray Serve "
                        "(locally: the application served on a local Ray)")
    g.add_argument("--serve-app", choices=("byo", "ray-llm"),
                   help="--engine rayservice's Serve application: byo (default) the byo server's "
                        "engine and routes on the --image; ray-llm: ray.serve.llm's OpenAI app on "
                        "Ray's LLM image")
    g.add_argument("--ray-ingress-replicas", type=int, metavar="N",
                   help="--engine rayservice: replicas of the byo application's ingress deployment "
                        "(default 1); 0: the engine deployment takes HTTP from Serve's proxy itself, "
                        "one hop less (no --adapter)")
    g.add_argument("--ray-proxy", choices=RAY_PROXIES,
                   help="--engine rayservice: what fronts the application's ingress replicas: serve "
                        "(default) Serve's HTTP proxy; haproxy: Ray's high-throughput mode "
                        "(RAY_SERVE_THROUGHPUT_OPTIMIZED and RAY_SERVE_ENABLE_HA_PROXY in the Ray "
                        "pods' env: HAProxy on the Serve port, replicas serving HTTP themselves)")
    g.add_argument("--gpu-nodes", choices=("karpenter", "nodegroup"),
                   help="karpenter (default): NodePool + EC2NodeClass; nodegroup: a GPU managed node group")
    g.add_argument("--capacity-type", choices=("on-demand", "spot"),
                   help="GPU node capacity (default on-demand)")
    g.add_argument("--out", metavar="DIR",
                   help="folder for the rendered files (default ./out/eks-<name>)")
    g.add_argument("--adapter", action="append", default=[], metavar="NAME=s3://BUCKET/PREFIX",
                   help="a LoRA adapter (peft files) to serve on the base model, repeatable; "
                        "clients send NAME as the model. The pods fetch it at start (an init "
                        "container with the pod's identity), e.g. "
                        "--adapter support=s3://my-bucket/adapters/support; on a local Ray "
                        "(--engine rayservice --target local) NAME=FOLDER, a folder here")
    g.add_argument("--max-loras", type=int, metavar="N",
                   help="adapters in one batch per replica (default: the adapter count, at most 4)")
    g.add_argument("--max-lora-rank", type=int, metavar="R",
                   help="largest adapter rank r (default 16; one of 1, 8, 16, 32, 64, ...)")
    g.add_argument("--max-cpu-loras", type=int, metavar="N",
                   help="adapters each replica keeps in host memory (default: all of them)")
    g.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                   default=True, help="turn off vLLM's automatic prefix caching (on by default: "
                                      "agent programs resend a growing prefix)")
    # --gateway itself is one of the CLI's shared flags (options/deploy.py).
    g.add_argument("--gateway-image", metavar="URI",
                   help="registry URI of the gateway image, pinned by tag or digest (default: "
                        "the local build tag spectrum-gateway:0.1.0)")
    g.add_argument("--gateway-replicas", type=int, metavar="N",
                   help="gateway pods (default 2), e.g. 3")


# The flags only the rendered stack uses: --target local with --engine rayservice serves the
# application on a local Ray from --model, --option, --adapter and the replica and Serve flags,
# and refuses these (options.deploy names the targets that use them).
LOCAL_RAY_IGNORES = (
    "--instance-type", "--name", "--region", "--gateway", "--image", "--gpu-type", "--gpus-per-replica",
    "--tensor-parallel-size", "--max-model-len", "--target-cpu", "--target-waiting", "--rate-limit-rps",
    "--rate-limit-burst", "--edge", "--namespace", "--cluster-name", "--gpu-nodes", "--capacity-type",
    "--out", "--no-prefix-caching", "--gateway-image", "--gateway-replicas")


def _as_list(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _options(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadInput(f"--option {pair!r} must look like KEY=VALUE, e.g. "
                           "--option SM_VLLM_GPU_MEMORY_UTILIZATION=0.9")
        out.append((key.strip(), value))
    return tuple(out)


def spec_from_args(args: argparse.Namespace) -> Level6Spec:
    from infra.eks.spec import DEFAULT_MODEL, LOCAL_GATEWAY_IMAGE, LOCAL_IMAGE, EksSpec, parse_adapter

    notes = []
    if getattr(args, "instance_count", 1) not in (None, 1):
        raise BadInput(f"--instance-count {args.instance_count} does not apply to level 6: the "
                       "autoscaler sizes the fleet; use --min-replicas and --max-replicas")
    if args.engine == "rayservice" and args.target == "local" and not getattr(args, "plan", False):
        return _ray_here(args)
    model = args.model or DEFAULT_MODEL
    if os.path.exists(model):
        raise BadInput(f"--model {model!r} is a local path, which pods in a cluster cannot read: "
                       "give a Hugging Face id, or an s3:// prefix the image can download")
    image = args.image
    if not image and args.target != "aws" and not (args.engine == "rayservice"
                                                   and args.serve_app == "ray-llm"):
        # Rendering, planning and the emulator pull nothing; a real cluster needs a registry URI.
        image = LOCAL_IMAGE
        notes.append(f"no --image: rendered with the local build tag {LOCAL_IMAGE}; a cluster "
                     "needs a registry URI (level 5 pushes the image to ECR)")
    if getattr(args, "gateway", False) and not args.gateway_image:
        if args.target == "aws":
            raise BadInput("--gateway on --target aws needs --gateway-image URI: the registry URI "
                           "of the containers/gateway image, pinned by tag or digest")
        notes.append(f"no --gateway-image: rendered with the local build tag {LOCAL_GATEWAY_IMAGE}; "
                     "a cluster needs a registry URI")
    region = args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") \
        or "us-east-1"
    given = {
        "image": image or "", "name": args.name or DEFAULT_NAME, "model": model,
        "instance_type": args.instance_type, "gpu_type": args.gpu_type,
        "gpus_per_replica": args.gpus_per_replica,
        "tensor_parallel_size": args.tensor_parallel_size, "max_model_len": args.max_model_len,
        "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
        "target_cpu": args.target_cpu, "target_waiting": args.target_waiting,
        "rate_limit_rps": args.rate_limit_rps, "rate_limit_burst": args.rate_limit_burst,
        "namespace": args.namespace, "region": region, "cluster_name": args.cluster_name,
        "engine": args.engine, "serve_app": args.serve_app, "gpu_nodes": args.gpu_nodes, "capacity_type": args.capacity_type,
        "ray_ingress_replicas": getattr(args, "ray_ingress_replicas", None),
        "ray_proxy": getattr(args, "ray_proxy", None),
        "edge": args.edge, "options": _options(args.option),
        "adapters": tuple(parse_adapter(a) for a in _as_list(getattr(args, "adapter", None))),
        "max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank,
        "max_cpu_loras": args.max_cpu_loras, "prefix_caching": args.prefix_caching,
        "gateway": bool(getattr(args, "gateway", False)),
        "gateway_image": args.gateway_image, "gateway_replicas": args.gateway_replicas,
    }
    given.update(autoscaling_given(args))
    if args.instance_type is None and args.gpu_type is None:
        given.pop("instance_type")
    spec = EksSpec(**{k: v for k, v in given.items() if v is not None})
    out_dir = args.out or os.path.join(DEFAULT_OUT, f"eks-{spec.name}")
    return Level6Spec(spec, out_dir, tuple(notes))


def autoscaling_from(path: str, engine: str | None) -> dict[str, Any]:
    """The spec fields a ``cost simulate --json`` document (or a bare Ray Serve
    ``autoscaling_config``) sets for ``engine``: the HPA's min/max replicas and waiting target,
    or Serve's min/max replicas and the rest of its autoscaling_config (``ray_autoscaling``)."""
    import json

    from cost.simulate.scaling import ray_serve_from_config

    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"--autoscaling-from {path!r} does not exist: write it with python -m cost "
                       "simulate ... --rungs 6 --json > FILE") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"--autoscaling-from {path!r} is not JSON ({exc}): give cost simulate's --json "
                       "output or a Ray Serve autoscaling_config") from None
    if not isinstance(doc, dict):
        raise BadInput(f"--autoscaling-from {path!r} holds a {type(doc).__name__}, not cost simulate's "
                       "--json document or an autoscaling_config mapping")
    ray = engine == "rayservice"
    if "rungs" in doc:
        policy = next((r.get("policy") or {} for r in doc["rungs"] if isinstance(r, dict)
                       and r.get("level") == LEVEL), None)
        if policy is None:
            raise BadInput(f"--autoscaling-from {path!r} has no rung 6: simulate it with --rungs 6 (or "
                           "--rungs 1,...,6)")
        kind = policy.get("kind")
        if ray and kind != "ray_serve_ongoing_requests":
            raise BadInput(f"--autoscaling-from {path!r}: rung 6 was simulated with {kind} (the HPA), "
                           "and --engine rayservice is scaled by Ray Serve: simulate with "
                           "--rung6-autoscaler ray-serve, or deploy with --engine deployment")
        if not ray and kind != "hpa_keda_queue_depth":
            raise BadInput(f"--autoscaling-from {path!r}: rung 6 was simulated with {kind} (Ray Serve's "
                           "autoscaler): add --engine rayservice, or simulate with --rung6-autoscaler hpa")
        if not ray:
            return {"min_replicas": policy["min_replicas"], "max_replicas": policy["max_replicas"],
                    "target_waiting": float(policy["target"]), "target_cpu": 0}
        config = policy.get("autoscaling_config") or doc.get("ray_serve_autoscaling_config")
    elif not ray:
        raise BadInput(f"--autoscaling-from {path!r} is not cost simulate's --json document; a bare "
                       "autoscaling_config applies to --engine rayservice only")
    else:
        config = doc
    checked = ray_serve_from_config(dict(config)).autoscaling_config()    # names a bad key or value
    given = {k: v for k, v in config.items() if k in checked}
    rest = tuple((k, v) for k, v in given.items() if k not in ("min_replicas", "max_replicas"))
    out: dict[str, Any] = {"ray_autoscaling": rest}
    for key in ("min_replicas", "max_replicas"):
        if key in given:
            out[key] = given[key]
    return out


def autoscaling_given(args: argparse.Namespace) -> dict[str, Any]:
    """The spec fields --autoscaling-from's file and --ray-autoscaling's settings set together
    (a setting in both with two values refused, each checked as Ray's AutoscalingConfig would)."""
    from cost.simulate.scaling import parse_ray_autoscaling, ray_serve_from_config

    fields = (_merge_autoscaling(args, autoscaling_from(args.autoscaling_from, args.engine))
              if getattr(args, "autoscaling_from", None) else {})
    pairs = _as_list(getattr(args, "ray_settings", None))
    if not pairs:
        return fields
    if args.engine != "rayservice":
        raise BadInput(f"--ray-autoscaling {pairs[0]} sets Ray Serve's autoscaler: add --engine rayservice, "
                       "or scale the Deployment with --min-replicas, --max-replicas and --target-waiting")
    settings = parse_ray_autoscaling(pairs, {"min_replicas": "--min-replicas", "max_replicas": "--max-replicas"})
    from_file = dict(fields.get("ray_autoscaling", ()))
    for key, value in settings.items():
        if key in from_file and from_file[key] != value:
            raise BadInput(f"--ray-autoscaling {key}={value:g} and --autoscaling-from {args.autoscaling_from} "
                           f"({key} {from_file[key]}) disagree: drop one, or edit the file")
    merged = {**from_file, **settings}
    ray_serve_from_config(dict(merged))             # names a value Ray would refuse
    return {**fields, "ray_autoscaling": tuple(merged.items())}


def _merge_autoscaling(args: argparse.Namespace, fields: dict[str, Any]) -> dict[str, Any]:
    """The file's fields, refusing a flag given with another value."""
    for key, value in fields.items():
        flag_value = getattr(args, key, None)
        if key != "ray_autoscaling" and flag_value is not None and flag_value != value:
            flag = "--" + key.replace("_", "-")
            raise BadInput(f"{flag} {flag_value} and --autoscaling-from {args.autoscaling_from} "
                           f"({key} {value}) disagree: drop {flag}, or edit the file")
    return fields


def local_autoscaling_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """--engine rayservice --target local with --autoscaling-from or --ray-autoscaling: the
    autoscaling_config the local application runs with (--min/--max-replicas bound it when given)."""
    fields = autoscaling_given(args)
    if not fields:
        return None
    config = {"min_replicas": fields.get("min_replicas", args.min_replicas or 1),
              "max_replicas": fields.get("max_replicas", args.max_replicas or 1)}
    return {**config, **dict(fields["ray_autoscaling"])}


def _ray_here(args: argparse.Namespace) -> Level6Spec:
    """--engine rayservice --target local: the model (the built-in tiny one by default, or a
    local folder) served by the byo Serve application on a local Ray."""
    from options.sagemaker.plan import model_source

    if args.serve_app == "ray-llm":
        raise BadInput("--serve-app ray-llm cannot run here: ray.serve.llm needs vLLM with CUDA; "
                       "use --serve-app byo (the default) to serve locally, or --plan to render "
                       "the ray-llm RayService")
    for key, _ in _options(args.option):
        if not key.startswith(("SM_VLLM_", "OPTION_", "SPECTRUM_SERVER_", "VLLM_")):
            raise BadInput(f"--option {key} is not server configuration: use SM_VLLM_*, "
                           "OPTION_*, SPECTRUM_SERVER_* or VLLM_* names")
    adapters = _local_adapters(args)
    if adapters and getattr(args, "ray_ingress_replicas", None) == 0:
        raise BadInput("--ray-ingress-replicas 0 with --adapter: the ingress is what names each "
                       "request's adapter for Serve's multiplexing; keep an ingress (1 or more), or "
                       "drop --adapter")
    return Level6Spec(None, "", ray_here=(model_source(args.model, cloud=False),
                                          _options(args.option), adapters))


def _local_adapters(args: argparse.Namespace) -> LocalAdapters | None:
    """--adapter NAME=FOLDER for a local Ray (a cluster's pods fetch NAME=s3://... instead); the
    sizes as the rendered RayService would set them."""
    from infra.eks.spec import ADAPTER_NAME, LORA_RANKS, lora_sizes

    values = _as_list(getattr(args, "adapter", None))
    if not values:
        for flag in ("max_loras", "max_cpu_loras"):
            if getattr(args, flag, None) is not None:
                raise BadInput(f"--{flag.replace('_', '-')} needs at least one --adapter NAME=FOLDER "
                               "(without adapters LoRA stays off)")
        return None
    folders: list[tuple[str, Path]] = []
    for value in values:
        name, sep, where = (part.strip() for part in value.partition("="))
        if not sep or not name or not where:
            raise BadInput(f"--adapter {value!r} must look like NAME=FOLDER here (a folder of peft "
                           "files: adapter_config.json and adapter_model.safetensors)")
        if where.startswith("s3://"):
            raise BadInput(f"--adapter {value!r}: a local Ray reads adapters from this machine, not "
                           f"S3 (a cluster's pods fetch s3:// ones): download it first and give "
                           f"--adapter {name}=./{name}")
        if not ADAPTER_NAME.match(name):
            raise BadInput(f"--adapter {value!r}: the name {name!r} is what clients send as 'model': "
                           "letters, digits, '.', '_' and '-', starting with a letter or digit")
        if name in (n for n, _ in folders):
            raise BadInput(f"--adapter {name} is given twice: each adapter needs its own name")
        folder = Path(where).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise BadInput(f"--adapter {value!r}: {str(folder)!r} holds no adapter_config.json; give "
                           "the folder of a peft adapter (adapter_config.json and "
                           "adapter_model.safetensors)")
        folders.append((name, folder.resolve()))
    rank = getattr(args, "max_lora_rank", None) or 16
    if rank not in LORA_RANKS:
        raise BadInput(f"--max-lora-rank {rank!r} must be one of {', '.join(map(str, LORA_RANKS))}")
    max_loras, max_cpu_loras = lora_sizes(len(folders), getattr(args, "max_loras", None),
                                          getattr(args, "max_cpu_loras", None))
    if max_cpu_loras < max_loras:
        raise BadInput(f"--max-cpu-loras {max_cpu_loras} is below --max-loras {max_loras}: every "
                       f"adapter in a batch is also cached in host memory; raise it to {max_loras}")
    return LocalAdapters(tuple(folders), max_loras, rank, max_cpu_loras)


# ----------------------------------------------------------------------------------- plan

def _cost(rendered) -> dict[str, Any]:
    from cost import hourly_cost_line, load_prices
    from infra.eks.cluster import fixed_hourly as eks_fixed_hourly

    r = rendered.resolved
    table = load_prices()
    nodes_min, nodes_max = r.nodes_for(r.min_replicas), r.nodes_for(r.max_replicas)
    # The control plane and the small system node group are paid whatever the GPU count.
    fixed = eks_fixed_hourly(table)
    line = hourly_cost_line(r.instance.name, count=nodes_min, platform="ec2",
                            extra_hourly=fixed["hourly"], table=table)
    at_max = hourly_cost_line(r.instance.name, count=nodes_max, platform="ec2",
                              extra_hourly=fixed["hourly"], table=table)
    return {**line, "eks_cluster_hourly": fixed["control_plane_hourly"],
            "system_nodes": fixed["system_nodes"],
            "system_nodes_hourly": fixed["system_nodes_hourly"],
            "gpus": nodes_min * r.instance.gpus, "gpus_at_max": nodes_max * r.instance.gpus,
            "nodes_at_max": nodes_max, "monthly_usd_at_max": at_max["monthly_usd"]}


def helm_command(chart: dict[str, Any]) -> str:
    repo = chart["repo"]
    source = f"{repo}" if repo.startswith("oci://") else f"{chart['chart']} --repo {repo}"
    return (f"helm upgrade --install {chart['name']} {source} --namespace {chart['namespace']} "
            "--create-namespace --wait")


def plan(spec: Level6Spec) -> Plan:
    """Pure: render (the spec is checked first) and list what --target aws would do."""
    from infra.eks.cluster import eksctl_create_command, eksctl_delete_command
    from infra.eks.kube import ROLLOUT_CHECKS
    from infra.eks.render import render

    rendered = render(spec.eks)
    r = rendered.resolved
    config_path = os.path.join(spec.out_dir, "cluster.yaml")
    steps = [Step("eksctl", "CreateCluster",
                  {"ResourceId": r.cluster_name,
                   "command": shlex.join(eksctl_create_command(config_path)),
                   "config": rendered.cluster_config},
                  undo=Step("eksctl", "DeleteCluster", {
                      "ResourceId": r.cluster_name,
                      "command": shlex.join(eksctl_delete_command(config_path))}),
                  description="cluster, system node group" + (
                      ", Karpenter" if r.gpu_nodes == "karpenter" else ", GPU node group"))]
    for chart in rendered.required_charts():
        params = {"ResourceId": chart["name"], "command": helm_command(chart),
                  "needed_for": chart["needed_for"]}
        if chart["name"] in rendered.helm_values:
            params["values_file"] = os.path.join(spec.out_dir, "helm",
                                                 f"{chart['name']}-values.yaml")
            params["command"] += f" -f {params['values_file']}"
        steps.append(Step("helm", "InstallChart", params, description=chart["needed_for"]))
    for m in rendered.manifests:
        steps.append(Step("kubernetes", "Apply", {"ResourceId": m.ref, "file": m.file,
                                                  "manifest": m.doc},
                          undo=Step("kubernetes", "Delete", {"ResourceId": m.ref})))
    for m in rendered.manifests:
        if m.doc["kind"] in ROLLOUT_CHECKS:
            steps.append(Step("kubernetes", "WaitForRollout",
                              {"ResourceId": m.ref, "timeout_s": r.startup_timeout_s + 900}))
    notes = list(spec.notes) + list(r.warnings)
    cost = _cost(rendered)
    notes.append(f"cost counts {cost['count']} GPU node(s) at --min-replicas {r.min_replicas} "
                 f"plus the EKS control plane and the system nodes ({cost['system_nodes']}); "
                 f"at --max-replicas {r.max_replicas}: "
                 f"{cost['nodes_at_max']} node(s), ${cost['monthly_usd_at_max']:,.0f}/month")
    return Plan(LEVEL, steps, cost=cost, notes=notes,
                extra={"rendered": rendered, "documents": rendered.documents(),
                       "cluster_config": rendered.cluster_config, "out_dir": spec.out_dir})


# ----------------------------------------------------------------------------------- local

def run_local(spec: Level6Spec, args: argparse.Namespace) -> int:
    """Render into --out, validate everything, print what was made, the GPUs and the cost;
    with --engine rayservice, serve the application on a local Ray instead."""
    import json
    import sys

    if spec.ray_here is not None:
        from options.eks.ray_local import run_local as run_on_local_ray
        return run_on_local_ray(*spec.ray_here, args, autoscaling=local_autoscaling_config(args))

    from infra.eks.validate import validate_rendered

    stream = sys.stderr if args.json else sys.stdout

    def say(text: str = "") -> None:
        print(text, file=stream, flush=True)

    p = plan(spec)
    rendered = p.extra["rendered"]
    r = rendered.resolved
    out_dir = Path(spec.out_dir)
    written = rendered.write(out_dir)
    say(f"Level 6 — EKS, rendered into {out_dir}/ ({len(written)} files); validating "
        "(schemas, yamllint, checkov: ~10 s) ...")
    for warning in r.warnings:
        say(f"warning: {warning}")
    started = time.monotonic()
    report = validate_rendered(rendered, out_dir)
    elapsed = time.monotonic() - started
    summary = {
        "level": LEVEL, "target": "local", "out_dir": str(out_dir),
        "files": [str(p.relative_to(out_dir)) for p in written],
        "resources": [{"file": m.file, "resource": m.ref} for m in rendered.manifests],
        "cluster": {"name": r.cluster_name, "region": r.region,
                    "kubernetes": r.kubernetes_version, "gpu_nodes": r.gpu_nodes},
        "gpus": {"instance_type": r.instance.name, "gpu_type": r.instance.gpu_type,
                 "per_replica": r.gpus_per_replica, "tensor_parallel": r.tensor_parallel_size,
                 "pipeline_parallel": r.pipeline_parallel_size,
                 "at_min_replicas": rendered.gpu_count(r.min_replicas),
                 "at_max_replicas": rendered.gpu_count(r.max_replicas),
                 "node_pool_limit": r.gpu_limit},
        "cost": p.cost, "validation": report.to_json(), "validation_s": round(elapsed, 1),
        "warnings": list(r.warnings),
        "notes": [n for n in p.notes if n not in r.warnings],
    }
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary(summary, report, say)
    return 0 if report.ok else 1


def _print_summary(summary: dict[str, Any], report, say) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=None, highlight=False, width=120)
    table = Table(title="rendered resources")
    for col in ("file", "resource"):
        table.add_column(col)
    table.add_row("cluster.yaml", f"ClusterConfig/{summary['cluster']['name']} (eksctl, "
                                  f"{summary['cluster']['region']}, Kubernetes "
                                  f"{summary['cluster']['kubernetes']})")
    for row in summary["resources"]:
        table.add_row(row["file"], row["resource"])
    console.print(table)
    checks = Table(title=f"validation ({summary['validation_s']} s)")
    for col in ("check", "result", "checked", "details"):
        checks.add_column(col)
    for c in report.checks:
        details = "; ".join(str(f) for f in c.findings[:3]) or c.note
        if c.skipped:
            details = f"{len(c.skipped)} skipped with reasons in the manifest: " + "; ".join(
                s.split(":")[0] for s in c.skipped)
        style = {"passed": "green", "failed": "red"}.get(c.status, "yellow")
        checks.add_row(c.name, f"[{style}]{c.status}[/{style}]", str(c.checked), details)
    console.print(checks)
    g, c = summary["gpus"], summary["cost"]
    say(f"GPUs: {g['per_replica']} x {g['gpu_type']} per replica on {g['instance_type']} "
        f"(tensor parallel {g['tensor_parallel']}, pipeline {g['pipeline_parallel']}); "
        f"{g['at_min_replicas']} at min replicas, {g['at_max_replicas']} at max; node pool "
        f"limit {g['node_pool_limit']}")
    say(f"cost: ${c['hourly_usd']:,.3f}/hour, ${c['monthly_usd']:,.0f}/month at min replicas "
        f"({c['count']} x {c['instance_type']} EC2 + EKS ${c['eks_cluster_hourly']}/h; prices as "
        f"of {c['price_as_of']}); ${c['monthly_usd_at_max']:,.0f}/month at max")
    for note in summary["notes"]:
        say(f"note: {note}")
    if report.ok:
        say(f"next: python -m options.deploy --level 6 --target aws --image URI ...  "
            f"(or: eksctl create cluster -f {summary['out_dir']}/cluster.yaml, then "
            f"kubectl apply -f {summary['out_dir']}/manifests/)")
    else:
        say("validation FAILED: " + "; ".join(report.findings()[:5]))


# ----------------------------------------------------------------------------------- cloud

_MEMORY_APIS: dict[tuple[str, str], Any] = {}   # emulator: (endpoint_url, cluster) -> API


def _memory_api(target, cluster: str):
    from infra.eks.memory_api import InMemoryKubernetes

    key = (target.endpoint_url or "", cluster)
    if key not in _MEMORY_APIS:
        api = InMemoryKubernetes()
        api.start()
        _MEMORY_APIS[key] = api
    return _MEMORY_APIS[key]


def _kube_for(target, cluster: str, eks_cluster: dict[str, Any] | None):
    """The Kubernetes API to talk to: the in-memory one on the emulator, else kubeconfig's."""
    from infra.eks.kube import KubeApi

    if target.kind == "emulator":
        return KubeApi.from_url(_memory_api(target, cluster).url)
    api = KubeApi.from_kubeconfig()
    endpoint = (eks_cluster or {}).get("endpoint")
    if endpoint and api.host.rstrip("/") != endpoint.rstrip("/"):
        raise BadInput(f"kubeconfig's current context points at {api.host}, not cluster {cluster} "
                       f"({endpoint}): run aws eks update-kubeconfig --name {cluster} "
                       f"--region {target.region}")
    return api


def _say(text: str) -> None:
    from options.output import say
    say(text)


def apply(p: Plan, target) -> Deployment:
    from infra.eks import eks_api
    from infra.eks.kube import apply_manifests

    rendered = p.extra["rendered"]
    r = rendered.resolved
    out_dir = Path(p.extra["out_dir"])
    rendered.write(out_dir)
    started = time.monotonic()
    deployment = Deployment(LEVEL, f"{r.cluster_name}/{r.namespace}/{r.name}", target,
                            rung(LEVEL).can.dialect,
                            extra={"namespace": r.namespace, "name": r.name, "model": r.model})
    eks = target.client("eks")
    created_cluster = False
    _say(f"cluster {r.cluster_name} ({r.region}):")
    if target.kind == "emulator":
        made = eks_api.create_cluster_via_api(target, rendered.cluster_config, _say)
        created_cluster = bool(made)
        (deployment.created if made else deployment.reused).extend(made or [f"cluster {r.cluster_name}"])
    elif eks_api.describe_cluster(eks, r.cluster_name) is not None:
        _say("  exists: reused")
        deployment.reused.append(f"cluster {r.cluster_name}")
    else:
        import shutil

        command = p.steps[0].params["command"]
        if not shutil.which("helm"):
            # Checked before the cluster exists: without the add-ons the manifests would fail
            # and the new cluster would be removed again, 15 minutes later.
            raise RuntimeError("helm is not on PATH; it installs the add-ons the manifests need "
                               "(" + ", ".join(s.params["ResourceId"] for s in p.steps
                                               if s.service == "helm") + "). Install helm "
                               "(https://helm.sh/docs/intro/install/) and re-run; nothing was created")
        if not eks_api.eksctl_path():
            raise RuntimeError(f"cluster {r.cluster_name} does not exist and eksctl is not on PATH. "
                               f"Create it with:\n    {command}\nthen re-run this command "
                               "(manifests are in " + str(out_dir / "manifests") + ")")
        eks_api.run_eksctl(shlex.split(command), _say)
        created_cluster = True
        deployment.created.append(f"cluster {r.cluster_name}")
    try:
        eks_cluster = eks_api.describe_cluster(eks, r.cluster_name)
        _install_charts(p, target)
        api = _kube_for(target, r.cluster_name, eks_cluster)
        docs = rendered.documents() + _token_secret(r) + _gateway_secret(api, r)
        _say(f"applying {len(docs)} manifests to {api.host}:")
        result = apply_manifests(api, docs, _say, wait=target.kind == "aws",
                                 timeout_s=r.startup_timeout_s + 900)
        if target.kind == "emulator":
            _say("  rollout not awaited: the in-memory Kubernetes API runs no controllers")
    except Exception:
        if created_cluster:
            _say(f"removing cluster {r.cluster_name}, created by this run:")
            if target.kind == "emulator":
                eks_api.delete_cluster_via_api(target, r.cluster_name, _say)
            else:
                eks_api.run_eksctl(shlex.split(p.steps[0].undo.params["command"]), _say)
        raise
    deployment.created += result.created
    deployment.reused += result.updated
    deployment.elapsed_s = time.monotonic() - started
    deployment.base_url = _edge_address(api, r) if target.kind == "aws" else None
    return deployment


def _token_secret(r) -> list[dict[str, Any]]:
    """The hub token Secret, from $HF_TOKEN when set here (its value never leaves this call)."""
    from infra.eks.spec import HF_TOKEN_KEY, HF_TOKEN_SECRET

    token = os.environ.get("HF_TOKEN")
    if not token:
        return []
    return [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": HF_TOKEN_SECRET, "namespace": r.namespace},
             "stringData": {HF_TOKEN_KEY: token}}]


# The gateway reads its API-key HMAC secret from this variable too (containers/gateway).
GATEWAY_SECRET_ENV = "SPECTRUM_GATEWAY_SECRET"


def _gateway_secret(api, r) -> list[dict[str, Any]]:
    """The gateway's HMAC secret, when the cluster lacks it: $SPECTRUM_GATEWAY_SECRET, else 32
    random bytes. An existing one is kept: a new secret would invalidate every API key."""
    import secrets

    from infra.eks.gateway import SECRET_KEY, names

    if not r.gateway:
        return []
    doc = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": {"name": names(r)["secret"], "namespace": r.namespace}}
    if api.get(doc) is not None:
        return []
    value = os.environ.get(GATEWAY_SECRET_ENV) or secrets.token_hex(32)
    return [{**doc, "stringData": {SECRET_KEY: value}}]


def _install_charts(p: Plan, target) -> None:
    import shutil
    import subprocess

    charts = [s for s in p.steps if s.service == "helm"]
    if target.kind == "emulator":
        _say(f"add-ons: {len(charts)} Helm chart(s) skipped on the emulator: "
             + ", ".join(s.params["ResourceId"] for s in charts))
        return
    if not shutil.which("helm"):
        _say("add-ons: helm is not on PATH; install these charts if the cluster lacks them "
             "(applying checks their APIs):")
        for s in charts:
            _say(f"    {s.params['command']}")
        return
    for s in charts:
        _say(f"$ {s.params['command']}")
        if subprocess.run(shlex.split(s.params["command"])).returncode != 0:
            raise RuntimeError(f"this command failed: {s.params['command']}")


def _edge_address(api, r) -> str | None:
    from infra.eks.kube import KINDS

    kind = "Gateway" if r.edge == "gateway" else "Ingress"
    api_version = KINDS[kind][0]
    obj = api.get({"apiVersion": api_version, "kind": kind,
                   "metadata": {"name": r.name, "namespace": r.namespace}}) or {}
    status = obj.get("status") or {}
    addresses = [a.get("value") for a in status.get("addresses") or []] or [
        i.get("hostname") or i.get("ip") for i in (status.get("loadBalancer") or {}).get("ingress") or []]
    return f"http://{addresses[0]}" if addresses and addresses[0] else None


def invoke(deployment: Deployment, request):
    from options.contract import Request, Result, Usage, invoke_http

    if deployment.target.kind == "emulator":
        text = f"(emulator) no model runs on the in-memory cluster; it would answer: {request.prompt or ''}"
        return Result(text=text, finish_reason="stop", usage=Usage(input_tokens=0, output_tokens=0))
    if not deployment.base_url:
        raise RuntimeError(f"the edge of {deployment.endpoint_name} has no address yet: check "
                           f"kubectl -n {deployment.extra['namespace']} get gateway,ingress "
                           f"{deployment.extra['name']}")
    request = Request(**{**request.__dict__, "model": request.model or deployment.extra["model"]})
    return invoke_http(deployment.base_url, request, deployment.dialect)


def status(spec: Level6Spec, target) -> dict[str, Any]:
    from infra.eks import eks_api
    from infra.eks.render import render

    rendered = render(spec.eks)
    r = rendered.resolved
    eks_cluster = eks_api.describe_cluster(target.client("eks"), r.cluster_name)
    out: dict[str, Any] = {"cluster": r.cluster_name, "region": target.region,
                           "cluster_status": (eks_cluster or {}).get("status", "absent")}
    if eks_cluster is None:
        return {**out, "status": "absent"}
    if target.kind == "emulator" and (target.endpoint_url or "", r.cluster_name) not in _MEMORY_APIS:
        return {**out, "status": "cluster only (no in-memory API in this process)"}
    api = _kube_for(target, r.cluster_name, eks_cluster)
    present = {m.ref: api.get(m.doc) is not None for m in rendered.manifests}
    out["objects"] = present
    ready = all(present.values())
    out["status"] = "applied" if ready else f"{sum(present.values())}/{len(present)} objects present"
    return out


def down(spec: Level6Spec, target) -> list[str]:
    from infra.eks import eks_api
    from infra.eks.cluster import eksctl_delete_command
    from infra.eks.kube import delete_manifests
    from infra.eks.render import render

    rendered = render(spec.eks)
    r = rendered.resolved
    eks_cluster = eks_api.describe_cluster(target.client("eks"), r.cluster_name)
    removed: list[str] = []
    if eks_cluster is None:
        _say(f"cluster {r.cluster_name} does not exist: nothing to remove")
        return removed
    if target.kind == "aws" or (target.endpoint_url or "", r.cluster_name) in _MEMORY_APIS:
        api = _kube_for(target, r.cluster_name, eks_cluster)
        removed += delete_manifests(api, rendered.documents(), _say)
    if target.kind == "emulator":
        removed += eks_api.delete_cluster_via_api(target, r.cluster_name, _say)
        api = _MEMORY_APIS.pop((target.endpoint_url or "", r.cluster_name), None)
        if api:
            api.stop()
        return removed
    command = shlex.join(eksctl_delete_command(os.path.join(spec.out_dir, "cluster.yaml")))
    if "spectrum.io/model" not in (eks_cluster.get("tags") or {}):
        _say(f"cluster {r.cluster_name} was not created by Spectrum: kept")
    elif eks_api.eksctl_path():
        rendered.write(spec.out_dir)
        eks_api.run_eksctl(shlex.split(command), _say)
        removed.append(f"cluster {r.cluster_name}")
    else:
        _say(f"the cluster still bills by the hour; remove it with:\n    {command}")
    return removed
