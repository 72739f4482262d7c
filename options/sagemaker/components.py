"""Many models on one SageMaker endpoint, as a plan: inference components (levels 3–5, any
instance) and a CPU multi-model endpoint (level 5). Pure: nothing here calls AWS.

Inference components: the endpoint config names no model (its variant carries only the
instances, managed instance scaling and routing; the execution role moves onto the config),
a *base* component runs the model with compute requirements sized from the instance and a
copy count, and one *adapter* component per LoRA adapter names the base
(``BaseInferenceComponentName``) and its S3 artifacts (``Container.ArtifactUrl``), sharing the
base's compute. Invocations name the component (``InferenceComponentName``).

Multi-model endpoint: one container in ``Mode: MultiModel`` whose ``ModelDataUrl`` is an S3
prefix; each invocation names the archive under it (``TargetModel``), which SageMaker fetches
and hands to the container's ``POST /models``. AWS offers this on CPU instances for any
container that implements the multi-model contract, but on GPU instances only with its NVIDIA
Triton container (AWS docs, "Supported algorithms, frameworks, and instances for multi-model
endpoints" and "Custom Containers Contract for Multi-Model Endpoints"): GPU adapters go
through inference components instead.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from options.core import BadInput
from options.plan import Step

BASE_COMPONENT_SUFFIX = "base"      # <endpoint>-base runs the model; adapters are <endpoint>-<name>
ROUTING_STRATEGY = "LEAST_OUTSTANDING_REQUESTS"   # long, uneven LLM requests: not RANDOM
# Left to SageMaker's agents and the OS on each instance, outside every component.
RESERVED_CPU_CORES = 2
RESERVED_MEMORY_FRACTION = 0.25
GPU_MME_WHY_NOT = ("AWS offers GPU multi-model endpoints only with its NVIDIA Triton container; "
                   "a bring-your-own container serves many models on one GPU endpoint through "
                   "inference components (--adapter NAME=s3://...)")
ADAPTER_FLAG_HELP = ("a LoRA adapter as its own inference component on the endpoint, repeatable: "
                     "NAME=s3://bucket/prefix (peft files there). With --invoke, a bare NAME sends "
                     "the request to that adapter. e.g. --adapter support=s3://my-bucket/adapters/support")


@dataclass(frozen=True)
class Adapter:
    name: str
    url: str


@dataclass
class AdapterFlags:
    """What the --adapter flags said: adapters to deploy, and the one --invoke addresses."""
    adapters: list[Adapter] = field(default_factory=list)
    invoke: str | None = None

    def __bool__(self) -> bool:
        return bool(self.adapters or self.invoke)


@dataclass
class InferenceComponents:
    """The components an endpoint carries instead of a model on its variant."""
    adapters: list[Adapter]
    accelerators: int                 # per copy of the base component (0 on CPU instances)
    cpu_cores: float                  # per copy
    memory_mb: int                    # per copy
    copy_count: int
    min_instances: int
    max_instances: int
    invoke: str | None = None         # adapter name the sample request goes to (None: the base)


# ----------------------------------------------------------------------------------- names

@functools.lru_cache(maxsize=None)
def _name_rule(shape: str, member: str) -> tuple[re.Pattern, int]:
    """The pattern and maximum length SageMaker's service model gives a member (botocore's copy)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    meta = model.shape_for(shape).members[member].metadata
    return re.compile(meta["pattern"]), meta["max"]


def component_name(endpoint_name: str, suffix: str) -> str:
    return f"{endpoint_name}-{suffix}"


def base_component_name(endpoint_name: str) -> str:
    return component_name(endpoint_name, BASE_COMPONENT_SUFFIX)


def _check_adapter_name(name: str, endpoint_name: str, flag: str) -> None:
    pattern, longest = _name_rule("CreateInferenceComponentInput", "InferenceComponentName")
    room = longest - len(endpoint_name) - 1
    if not pattern.fullmatch(name) or len(name) > room:
        raise BadInput(f"--adapter {flag!r}: {name!r} can't name an inference component: SageMaker "
                       f"names it {component_name(endpoint_name, '<NAME>')}, which must match "
                       f"{pattern.pattern} and fit {longest} characters, so NAME takes letters, "
                       f"digits and inner hyphens, at most {room} characters here (e.g. support-v2)")
    if name == BASE_COMPONENT_SUFFIX:
        raise BadInput(f"--adapter {flag!r}: {BASE_COMPONENT_SUFFIX!r} names the base model's "
                       f"component ({base_component_name(endpoint_name)}): choose another name")


def parse_adapter_flags(values: list[str], endpoint_name: str, *, invoking: bool) -> AdapterFlags:
    """--adapter NAME=s3://bucket/prefix (deploy) and a bare --adapter NAME (where --invoke goes)."""
    flags = AdapterFlags()
    if not values:   # the service model loads only when there is a name to check against it
        return flags
    url_rule, _ = _name_rule("InferenceComponentContainerSpecification", "ArtifactUrl")
    seen: dict[str, str] = {}
    for value in values:
        name, sep, url = (part.strip() for part in value.partition("="))
        if not sep:
            _check_adapter_name(name, endpoint_name, value)
            if not invoking:
                raise BadInput(f"--adapter {value!r} has no URL: deploy an adapter with "
                               f"--adapter {name or 'NAME'}=s3://bucket/prefix; a bare name only "
                               f"chooses where --invoke TEXT goes")
            if flags.invoke and flags.invoke != name:
                raise BadInput(f"--adapter {value!r}: --invoke already goes to adapter "
                               f"{flags.invoke!r}; one request addresses one adapter")
            flags.invoke = name
            continue
        _check_adapter_name(name, endpoint_name, value)
        if not url.startswith("s3://") or not url_rule.fullmatch(url) or url == "s3://":
            raise BadInput(f"--adapter {value!r}: {url!r} is not an S3 location; SageMaker fetches "
                           f"adapter artifacts from S3: upload the peft files (adapter_config.json, "
                           f"adapter_model.safetensors) first, e.g. aws s3 cp --recursive ./{name} "
                           f"s3://my-bucket/adapters/{name}/ then --adapter {name}=s3://my-bucket/adapters/{name}/")
        if name in seen:
            raise BadInput(f"--adapter {value!r}: adapter {name!r} is given twice (also "
                           f"{name}={seen[name]}); each adapter needs its own name")
        seen[name] = url
        flags.adapters.append(Adapter(name, url))
    return flags


# ----------------------------------------------------------------------------------- sizing

def size_components(instance, accelerators_per_copy: int | None, instance_count: int,
                    max_instances: int | None, flags: AdapterFlags, *,
                    scale_to_zero: bool = False) -> InferenceComponents:
    """One copy per ``accelerators_per_copy`` GPUs (all of them by default; one copy on CPU),
    each with an even share of the cores and memory left after SageMaker's own reserve.
    ``scale_to_zero``: one copy to start, no instance kept, and ``max_instances`` counts copies
    (the instances that many need)."""
    gpus = instance.gpus
    per_copy = min(accelerators_per_copy or gpus, gpus) if gpus else 0
    copies_per_instance = gpus // per_copy if per_copy else 1
    cores = max(0.25, (instance.vcpus - RESERVED_CPU_CORES) / copies_per_instance)
    memory = int(instance.memory_gib * 1024 * (1 - RESERVED_MEMORY_FRACTION) / copies_per_instance)
    if scale_to_zero:
        copies, low = 1, 0
        high = -(-(max_instances or 1) // copies_per_instance)
    else:
        copies, low = copies_per_instance * instance_count, instance_count
        high = max(max_instances or instance_count, instance_count)
    return InferenceComponents(
        adapters=list(flags.adapters), accelerators=per_copy, cpu_cores=float(int(cores * 4) / 4),
        memory_mb=max(128, memory), copy_count=copies, min_instances=low, max_instances=high,
        invoke=flags.invoke)


# ----------------------------------------------------------------------------------- steps

def component_steps(endpoint_name: str, variant: str, model_name: str, ic: InferenceComponents,
                    startup: dict[str, int], tags: list[dict[str, str]]) -> list[Step]:
    """CreateInferenceComponent for the base, then one per adapter (each undone by its Delete)."""
    base = base_component_name(endpoint_name)
    compute: dict[str, Any] = {"NumberOfCpuCoresRequired": ic.cpu_cores,
                               "MinMemoryRequiredInMb": ic.memory_mb}
    if ic.accelerators:
        compute["NumberOfAcceleratorDevicesRequired"] = float(ic.accelerators)
    spec: dict[str, Any] = {"ModelName": model_name, "ComputeResourceRequirements": compute}
    if startup:
        spec["StartupParameters"] = startup
    steps = [Step("sagemaker", "CreateInferenceComponent",
                  {"InferenceComponentName": base, "EndpointName": endpoint_name, "VariantName": variant,
                   "Specification": spec, "RuntimeConfig": {"CopyCount": ic.copy_count}, "Tags": tags},
                  undo=Step("sagemaker", "DeleteInferenceComponent", {"InferenceComponentName": base}),
                  description=f"base component {base}: {ic.copy_count} cop{'y' if ic.copy_count == 1 else 'ies'}"
                              f" of {model_name}, each {_compute_text(ic)}")]
    for adapter in ic.adapters:
        name = component_name(endpoint_name, adapter.name)
        steps.append(Step(
            "sagemaker", "CreateInferenceComponent",
            {"InferenceComponentName": name, "EndpointName": endpoint_name, "VariantName": variant,
             "Specification": {"BaseInferenceComponentName": base,
                               "Container": {"ArtifactUrl": adapter.url}},
             "Tags": tags + [{"Key": "spectrum:adapter", "Value": adapter.name}]},
            undo=Step("sagemaker", "DeleteInferenceComponent", {"InferenceComponentName": name}),
            description=f"adapter component {name}: {adapter.url} on {base}"))
    return steps


def _compute_text(ic: InferenceComponents) -> str:
    gpus = f"{ic.accelerators} accelerator(s), " if ic.accelerators else ""
    return f"{gpus}{ic.cpu_cores:g} CPU cores, {ic.memory_mb} MB"


def routing(endpoint_name: str, ic: InferenceComponents) -> dict[str, str]:
    """What InvokeEndpoint names on an endpoint of components: the adapter's, else the base's."""
    return {"InferenceComponentName": component_name(endpoint_name, ic.invoke) if ic.invoke
            else base_component_name(endpoint_name)}


def plan_notes(endpoint_name: str, instance, ic: InferenceComponents) -> list[str]:
    notes = [f"inference components: the endpoint config names no model; {base_component_name(endpoint_name)} "
             f"runs it ({_compute_text(ic)} per copy, sized from {instance.sagemaker_name}: "
             f"{instance.vcpus} vCPUs, {instance.memory_gib:g} GiB, {instance.gpus} GPU(s), less "
             f"{RESERVED_CPU_CORES} cores and {RESERVED_MEMORY_FRACTION:.0%} of memory for SageMaker's agents)",
             f"managed instance scaling: {ic.min_instances}–{ic.max_instances} instance(s) as copies "
             f"need them; routing {ROUTING_STRATEGY}"]
    if ic.min_instances == 0:
        notes.append("scale to zero: no instance, and no bill, while the copies are at 0; after an idle "
                     "spell the first requests fail (InvokeEndpoint errors, not a queue) for the minutes a "
                     "copy takes to start, as python -m cost simulate --scale-to-zero counts them")
    if ic.adapters:
        notes.append(f"{len(ic.adapters)} adapter component(s) share the base's compute: no extra "
                     f"instance cost; created after the base is InService, deleted before it")
    notes.append(f"invoke: InvokeEndpoint with InferenceComponentName={routing(endpoint_name, ic)['InferenceComponentName']}")
    return notes


# ----------------------------------------------------------------------------------- multi-model

def check_multi_model(prefix: str, instance, flags: AdapterFlags) -> dict[str, str]:
    """--multi-model s3://bucket/prefix/ on a CPU instance → {adapter name: TargetModel}."""
    if not prefix.startswith("s3://") or len(prefix) <= len("s3://") or not prefix.endswith("/"):
        raise BadInput(f"--multi-model {prefix!r} is not an S3 prefix: give the folder the models' "
                       f"archives are in, ending in '/', e.g. --multi-model s3://my-bucket/models/")
    if instance.gpus:
        raise BadInput(f"--multi-model on {instance.sagemaker_name} ({instance.gpus} × {instance.gpu_type}): "
                       f"{GPU_MME_WHY_NOT}; for a multi-model endpoint choose a CPU instance, "
                       f"e.g. --instance-type ml.m6i.xlarge")
    targets: dict[str, str] = {}
    for adapter in flags.adapters:
        if not adapter.url.startswith(prefix) or adapter.url == prefix:
            raise BadInput(f"--adapter {adapter.name}={adapter.url}: on a multi-model endpoint every "
                           f"model lives under --multi-model {prefix} (SageMaker invokes it by its "
                           f"path there), e.g. --adapter {adapter.name}={prefix}{adapter.name}.tar.gz")
        targets[adapter.name] = adapter.url[len(prefix):]
    return targets


def multi_model_target(name: str, targets: dict[str, str]) -> str:
    """TargetModel for --invoke --adapter NAME: the path given with it, else NAME.tar.gz."""
    return targets.get(name, f"{name}.tar.gz")


def multi_model_notes(prefix: str, targets: dict[str, str], invoke: str | None) -> list[str]:
    notes = [f"multi-model endpoint: the container runs in Mode MultiModel over {prefix}; SageMaker "
             f"loads a model on its first request (TargetModel = its path under the prefix) and "
             f"unloads idle ones when memory runs short",
             f"CPU only: {GPU_MME_WHY_NOT}",
             "the image must be the CPU build of containers/byo-vllm, which implements the "
             "multi-model contract (POST/GET/DELETE /models)"]
    if targets:
        notes.append("models: " + ", ".join(f"{n} → TargetModel {t}" for n, t in targets.items())
                     + " (nothing to create: they load on demand)")
    if invoke:
        notes.append(f"invoke: InvokeEndpoint with TargetModel={multi_model_target(invoke, targets)}")
    return notes


# ----------------------------------------------------------------------------------- from the flags

def refuse_locally(args) -> None:
    """--adapter, --multi-model and --autoscale-* describe a SageMaker endpoint: not for the local target."""
    from options.sagemaker.autoscaling import autoscaling_from_args
    autoscaling_from_args(args)       # any --autoscale-* flag here says why nothing is autoscaled
    if getattr(args, "adapter", None) or getattr(args, "multi_model", None):
        flag = "--adapter" if args.adapter else "--multi-model"
        raise BadInput(f"{flag} shapes a SageMaker endpoint (inference components or a multi-model "
                       f"endpoint): add --plan to see its requests, or --target aws. Locally the "
                       f"bring-your-own server loads adapters from the model folder's adapters/<name>/ "
                       f"or through POST /models")


def endpoint_fields(args, name: str, instance, *, accelerators_per_copy: int | None = None,
                    scaling=None) -> dict[str, Any]:
    """The EndpointSpec fields --adapter / --multi-model ask for ({} for one model, as before)."""
    if args.status or args.down:   # they read what the endpoint holds, whatever the flags say
        return {}
    flags = parse_adapter_flags(args.adapter, name, invoking=bool(args.invoke))
    prefix = getattr(args, "multi_model", None)
    if prefix:
        if getattr(args, "scale_to_zero", False):
            raise BadInput(f"--scale-to-zero with --multi-model {prefix}: a multi-model endpoint's container "
                           f"runs on the variant, which keeps one instance or more; scaling to 0 needs "
                           f"inference components (--adapter NAME=s3://... for adapters)")
        targets = check_multi_model(prefix, instance, flags)
        invoke = flags.invoke or (flags.adapters[0].name if flags.adapters else None)
        if invoke is None and (args.invoke or args.target == "emulator") and not args.plan:
            raise BadInput(f"--multi-model {prefix}: every request to a multi-model endpoint names "
                           f"its model (TargetModel): add --adapter NAME (invokes {prefix}NAME.tar.gz) "
                           f"or --adapter NAME={prefix}path/to/model.tar.gz")
        return {"multi_model_prefix": prefix, "multi_model_targets": targets, "multi_model_invoke": invoke}
    if scaling is None:
        from options.sagemaker.autoscaling import autoscaling_from_args
        scaling = autoscaling_from_args(args)
    if scaling is not None and scaling.scale_to_zero:
        # One copy to start, as python -m cost simulate starts; the copies' own autoscaling
        # (plan.scale_to_zero_steps) takes them between 0 and the maximum.
        return {"components": size_components(instance, accelerators_per_copy, 1, scaling.max_capacity,
                                               flags, scale_to_zero=True)}
    if not flags:
        return {}
    # Autoscaling bounds become managed instance scaling's bounds. A target-tracking policy on
    # the variant does not apply to an endpoint of components (SageMaker scales their copies):
    # refuse a metric or target rather than drop it unsaid.
    chosen = [f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
              for flag, value in (("--autoscale-metric", args.autoscale_metric),
                                  ("--autoscale-target", args.autoscale_target)) if value is not None]
    if chosen:
        raise BadInput(f"{' '.join(chosen)} with --adapter: an endpoint of inference components "
                       f"scales its instances by managed instance scaling (bounded by --autoscale-min/"
                       f"--autoscale-max), not by a target-tracking policy on the variant; drop "
                       f"{' and '.join(c.split()[0] for c in chosen)}, deploy without --adapter, or add "
                       f"--scale-to-zero (target tracking on the base component's copies)")
    low = scaling.min_capacity if scaling else args.instance_count
    return {"components": size_components(instance, accelerators_per_copy, low,
                                          scaling.max_capacity if scaling else None, flags)}
