"""Level 3: your model on AWS's LMI container (DJL Serving, vLLM inside), configured by OPTION_* env.

``python -m options.deploy --level 3`` serves the built-in tiny model on this machine through
the bring-your-own server, which maps the same OPTION_* settings onto vLLM; ``--target aws``
deploys the LMI image with those settings, after checking they fit the instance.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from options.sagemaker import components, is_cloud_run, plan as sm
from options.core import BadInput, mask_secrets
from options.plan import Plan
# apply / invoke / status / down are the same for every SageMaker endpoint rung.
from options.sagemaker.apply import rung_apply as apply, rung_down as down, rung_invoke as invoke, \
    rung_status as status  # noqa: F401

LEVEL = 3
DEFAULT_INSTANCE = "ml.g5.xlarge"


def add_arguments(group: argparse._ArgumentGroup) -> None:
    from options.lmi.config import add_lmi_version_argument

    add_lmi_version_argument(group)
    group.add_argument("--param-count", type=_count, metavar="N",
                       help="model parameters, when config.json can't be read, e.g. --param-count 8B")
    group.add_argument("--attention-heads", type=int, metavar="N",
                       help="attention heads, when config.json can't be read, e.g. --attention-heads 32")
    group.add_argument("--kv-heads", type=int, metavar="N",
                       help="key/value heads, when config.json can't be read, e.g. --kv-heads 8")
    group.add_argument("--num-layers", type=int, metavar="N",
                       help="transformer layers, when config.json can't be read, e.g. --num-layers 32")
    group.add_argument("--head-dim", type=int, metavar="N",
                       help="attention head size, when config.json can't be read, e.g. --head-dim 128")
    sm.add_endpoint_arguments(group)


def _count(text: str) -> float:
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * scale[t[-1]] if t and t[-1] in scale else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: write 8B, 70e9 or 1.5B") from None


@dataclass
class LmiSpec:
    name: str
    region: str
    source: sm.ModelSource
    config: Any                                   # options.lmi.config.LmiConfig
    cloud: bool
    endpoint: sm.EndpointSpec | None = None
    upload: list = field(default_factory=list)    # steps copying a local folder to S3
    shape: Any = None
    fit: Any = None


def spec_from_args(args: argparse.Namespace) -> LmiSpec:
    from options.lmi.config import LmiConfig, check_fit, image_uri, model_shape, parse_options, \
        startup_timeout_s

    cloud = is_cloud_run(args)
    source = sm.model_source(args.model, cloud=cloud)
    options, plain = parse_options(args.option)
    if not cloud:
        components.refuse_locally(args)
        return LmiSpec(args.name or "local", sm.region_of(args), source,
                       LmiConfig("<local folder>", options, plain), cloud=False)

    basics = sm.endpoint_basics(args, LEVEL, source.hub_id or str(source.path), DEFAULT_INSTANCE,
                                serves_adapters=True)
    config = LmiConfig(source.hub_id or "/opt/ml/model", options, plain)
    shape = model_shape(source.hub_id or "", source.path,
                        {"parameters": args.param_count, "num_attention_heads": args.attention_heads,
                         "num_kv_heads": args.kv_heads, "num_layers": args.num_layers,
                         "head_dim": args.head_dim})
    instance = sm.instance_info(basics["instance_type"])
    from cost.prices import load_prices
    report = check_fit(config, shape, instance, load_prices())

    upload, data_source = [], None
    if source.path:
        upload, data_source = sm.upload_model_folder(basics["name"], basics["region"], source.path)
    timeout = startup_timeout_s(report.weights_gib)
    # --autoscale-* (options.sagemaker.plan, shared by levels 2-5) arrive in basics["autoscaling"].
    many = components.endpoint_fields(args, basics["name"], instance,
                                      accelerators_per_copy=report.tensor_parallel, scaling=basics["autoscaling"])
    if many.get("components") and many["components"].adapters:
        # LMI loads adapter components only with LoRA on. Not sized by the adapter count, so
        # adding an adapter later keeps the model and the base component as they are.
        config.options.setdefault("enable_lora", "true")
    endpoint = sm.EndpointSpec(
        level=LEVEL, image_uri=image_uri(basics["region"], args.lmi_version),
        environment=config.env(), model_data_source=data_source,
        startup_health_check_timeout_s=timeout, model_data_download_timeout_s=timeout,
        **basics, **many)
    return LmiSpec(basics["name"], basics["region"], source, config, True, endpoint, upload, shape, report)


def plan(spec: LmiSpec) -> Plan:
    if spec.endpoint is None:
        raise BadInput("a level-3 plan describes a cloud deployment: add --plan or --target aws")
    e = spec.endpoint
    r = spec.fit
    notes = [f"model: {spec.source.label}; sizing from {spec.shape.source}"]
    if r.weights_gib is not None:
        notes.append(f"fits {e.instance_type}: weights {r.weights_gib:.1f} GiB"
                     + (f" + KV {r.kv_gib_per_sequence:.2f} GiB per {r.max_model_len}-token sequence"
                        if r.kv_gib_per_sequence else "")
                     + f" of {r.usable_gib:.1f} GiB usable over {r.tensor_parallel} GPU(s)")
    notes += r.notes + [f"not checked: {s}" for s in r.skipped]
    notes.append(f"container start-up health check: {e.startup_health_check_timeout_s} s (sized from the weights)")
    if e.role_arn == sm.DEFAULT_ROLE_ARN:
        notes.append("execution role: the default name; give --role-arn if yours differs")
    return sm.endpoint_plan(LEVEL, spec.upload, e, notes,
                            extra={"serving_properties": spec.config.serving_properties()})


@contextmanager
def local_server(spec: LmiSpec) -> Iterator[tuple[dict[str, str], str]]:
    """The local server's environment for this LMI configuration, and what it is."""
    from options.lmi.config import LmiConfig

    folder = spec.source.local_folder() if spec.source.hub_id is None else None
    config = LmiConfig(str(folder) if folder else spec.source.hub_id, spec.config.options,
                       spec.config.plain_env)
    yield config.env(), f"LMI configuration {_options_line(config)} mapped onto vLLM"


def run_local(spec: LmiSpec, args: argparse.Namespace) -> int:
    from options.local_target import serve_rung_locally
    return serve_rung_locally(LEVEL, local_server(spec), args, spec.source)


def _options_line(config) -> str:
    opts = mask_secrets({k: v for k, v in config.env().items() if k.startswith("OPTION_")})
    return " ".join(f"{k}={v}" for k, v in opts.items()) or "(LMI defaults)"
