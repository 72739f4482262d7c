"""Level 4: your own code (model.py) on AWS's LMI container.

The handler (options/custom_code/model.py) and its serving.properties are packaged with the
weights as the model.tar.gz LMI expects (options/custom_code/package.py). On the cloud the
archive goes to S3 and a SageMaker model runs the LMI image with ``ModelDataUrl`` pointing at
it; locally the bring-your-own server loads the same folder and serves it through the handler.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from options.sagemaker import components, is_cloud_run, plan as sm
from options.core import is_secret_name
from options.plan import Plan, Step
# apply / invoke / status / down are the same for every SageMaker endpoint rung.
from options.sagemaker.apply import rung_apply as apply, rung_down as down, rung_invoke as invoke, \
    rung_status as status  # noqa: F401

LEVEL = 4
DEFAULT_INSTANCE = "ml.g5.xlarge"


def add_arguments(group: argparse._ArgumentGroup) -> None:
    from options.lmi.config import add_lmi_version_argument

    add_lmi_version_argument(group)
    sm.add_endpoint_arguments(group)


@dataclass
class CustomCodeSpec:
    name: str
    source: sm.ModelSource
    properties: dict[str, str]            # serving.properties entries, any spelling
    secret_env: dict[str, str]            # secrets travel as env, never inside the archive
    endpoint: sm.EndpointSpec | None = None
    pre_steps: list[Step] = field(default_factory=list)
    tarball: Path | None = None


def split_options(pairs: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    from options.lmi.config import parse_options

    options, plain = parse_options(pairs)
    secrets = {k: v for k, v in plain.items() if is_secret_name(k)}
    properties = {**{k: v for k, v in plain.items() if k not in secrets}, **options}
    secrets.update({k.upper(): properties.pop(k) for k in list(properties) if is_secret_name(k)})
    return properties, secrets


def package_dir() -> Path:
    import os
    root = Path(os.environ.get("SPECTRUM_CACHE", Path.home() / ".cache" / "spectrum"))
    return root / "level4"


def prepare(source: sm.ModelSource, properties: dict[str, str], into: Path) -> Path:
    from options.custom_code.package import prepare_model_dir

    return prepare_model_dir(into, source.local_folder(), properties)


def spec_from_args(args: argparse.Namespace) -> CustomCodeSpec:
    from options.custom_code.package import build_model_tarball, serving_properties
    from options.lmi.config import image_uri, startup_timeout_s

    cloud = is_cloud_run(args)
    # The weights travel inside model.tar.gz: the model is a local folder (default: the tiny one).
    source = sm.model_source(args.model, cloud=False)
    if source.hub_id:
        from options.core import BadInput
        raise BadInput(f"--model {source.hub_id!r}: level 4 packages the weights with the handler, "
                       f"so it needs a local folder (config.json + weights); download the model "
                       f"first, or use level 3 for a hub id")
    properties, secrets = split_options(args.option)
    serving_properties(properties)  # validates the options before anything is built
    if not cloud:
        components.refuse_locally(args)
        return CustomCodeSpec(args.name or "local", source, properties, secrets)
    if args.status or args.down:  # only the name matters: don't build an archive to delete things
        return CustomCodeSpec(sm.validate_name(args.name or sm.default_name(LEVEL, str(source.path or "tiny-model"))),
                              source, properties, secrets)

    basics = sm.endpoint_basics(args, LEVEL, str(source.path or "tiny-model"), DEFAULT_INSTANCE,
                                serves_adapters=True)
    many = components.endpoint_fields(args, basics["name"], sm.instance_info(basics["instance_type"]))
    if many.get("components") and many["components"].adapters:
        properties.setdefault("enable_lora", "true")   # LMI hands adapter components to the engine
    work = package_dir() / basics["name"]
    work.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="model-", dir=work))
    try:
        folder = prepare(source, properties, staging / "model")
        tarball = build_model_tarball(folder, work / "model.tar.gz")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    bucket = sm.default_bucket(basics["region"])
    key = f"{basics['name']}/model.tar.gz"
    pre = sm.upload_steps(bucket, basics["region"], [(tarball, key)])
    size_gib = tarball.stat().st_size / 1024 ** 3
    endpoint = sm.EndpointSpec(level=LEVEL, image_uri=image_uri(basics["region"], args.lmi_version),
                               environment=dict(secrets), model_data_url=f"s3://{bucket}/{key}",
                               startup_health_check_timeout_s=startup_timeout_s(size_gib),
                               model_data_download_timeout_s=startup_timeout_s(size_gib), **basics, **many)
    return CustomCodeSpec(basics["name"], source, properties, secrets, endpoint, pre, tarball)


def plan(spec: CustomCodeSpec) -> Plan:
    from options.custom_code.package import serving_properties

    e = spec.endpoint
    notes = [f"model: {spec.source.label}, packaged with model.py as {spec.tarball} "
             f"({spec.tarball.stat().st_size / 1e6:.1f} MB)"]
    return sm.endpoint_plan(LEVEL, spec.pre_steps, e, notes,
                            extra={"serving_properties": serving_properties(spec.properties)})


@contextmanager
def local_server(spec: CustomCodeSpec) -> Iterator[tuple[dict[str, str], str]]:
    """The model folder packaged with model.py, staged for the local server while it runs."""
    work = package_dir()
    work.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="local-", dir=work))
    try:
        folder = prepare(spec.source, spec.properties, staging / "model")
        yield ({"HF_MODEL_ID": str(folder), **spec.secret_env},
               f"model.py handler from {folder} (serving.properties beside it)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def run_local(spec: CustomCodeSpec, args: argparse.Namespace) -> int:
    from options.local_target import serve_rung_locally
    return serve_rung_locally(LEVEL, local_server(spec), args, spec.source)
