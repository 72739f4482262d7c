"""Where cloud requests go: the user's account, an embedded local AWS, or nowhere (local).

``Target.client(service)`` is the one place boto3 clients are made, so every rung honours the
same endpoint override, region and retry policy. ``emulator()`` runs moto in server mode on
127.0.0.1 for as long as a ``with`` block lasts: ``--target emulator`` sends the real boto3
requests to it, end to end, with no account.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

from options.local_server import free_port
from options.core import BadInput

TARGET_KINDS = ("local", "emulator", "aws")
DEFAULT_REGION = "us-east-1"
# moto accepts any credentials; real ones must never be sent to it.
_EMULATOR_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@dataclass(frozen=True)
class Target:
    kind: str                      # "local" | "emulator" | "aws"
    region: str = DEFAULT_REGION
    endpoint_url: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise BadInput(f"target {self.kind!r} is not known: choose one of {', '.join(TARGET_KINDS)}")
        if self.kind == "emulator" and not self.endpoint_url:
            raise BadInput("the emulator target needs the emulator's URL (--endpoint-url "
                           "http://127.0.0.1:PORT), or let the CLI start one for the command")

    @property
    def is_cloud(self) -> bool:
        return self.kind in ("emulator", "aws")

    def client(self, service: str, **kw: Any):
        """A boto3 client for ``service`` on this target, with botocore's standard retries."""
        if self.kind == "local":
            raise RuntimeError("the local target sends no cloud requests")
        import boto3
        from botocore.config import Config

        kw.setdefault("region_name", self.region)
        kw.setdefault("config", Config(retries={"mode": "standard", "max_attempts": 5}))
        if self.endpoint_url:
            kw.setdefault("endpoint_url", self.endpoint_url)
        if self.kind == "emulator":
            for key, value in _EMULATOR_CREDENTIALS.items():
                kw.setdefault(key, value)
        return boto3.client(service, **kw)

    def account_id(self) -> str:
        return self.client("sts").get_caller_identity()["Account"]

    def describe(self) -> str:
        if self.kind == "aws":
            return f"AWS account (region {self.region})"
        if self.kind == "emulator":
            return f"local AWS emulator at {self.endpoint_url} (region {self.region})"
        return "this machine (no cloud)"


@contextlib.contextmanager
def moto_accepts_current_instance_types() -> Iterator[None]:
    """moto's SageMaker list of instance types (5.2.5) predates g5/g6/g6e/p5: widen it.

    Any ``ml.*`` name passes; real AWS still validates names, and the CLI checks them against
    the price catalogue before sending anything.
    """
    from moto.sagemaker.models import FakeEndpointConfig

    original = FakeEndpointConfig.validate_instance_type

    def validate(self, instance_type: str) -> None:
        if not instance_type.startswith("ml."):
            original(self, instance_type)

    FakeEndpointConfig.validate_instance_type = validate
    try:
        yield
    finally:
        FakeEndpointConfig.validate_instance_type = original


@contextlib.contextmanager
def moto_serves_inference_components() -> Iterator[None]:
    """moto 5.2.5 has no inference components and refuses an endpoint config whose variant names
    no model: add both to the embedded emulator, so --target emulator runs an endpoint of
    components end to end. As with moto's endpoints, a component is InService at once; what it
    checks is what SageMaker would refuse outright (unknown endpoint, model or base, a taken name).
    """
    from moto.core.responses import ActionResult, EmptyResult
    from moto.core.utils import utcnow
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.models import SageMakerModelBackend
    from moto.sagemaker.responses import SageMakerResponse

    def held(backend) -> dict[str, dict[str, Any]]:
        return backend.__dict__.setdefault("spectrum_inference_components", {})  # reset() clears it

    def find(backend, name: str) -> dict[str, Any]:
        if name not in held(backend):
            raise ValidationError(message=f"Could not find inference component '{name}'.")
        return held(backend)[name]

    def create(self) -> ActionResult:
        backend, name = self.sagemaker_backend, self._get_param("InferenceComponentName")
        endpoint, spec = self._get_param("EndpointName"), self._get_param("Specification") or {}
        if name in held(backend):
            raise ValidationError(message=f"Cannot create already existing inference component '{name}'.")
        if endpoint not in backend.endpoints:
            raise ValidationError(message=f"Could not find endpoint '{endpoint}'.")
        if spec.get("ModelName") and spec["ModelName"] not in backend._models:
            raise ValidationError(message=f"Could not find model '{spec['ModelName']}'.")
        if spec.get("BaseInferenceComponentName"):
            find(backend, spec["BaseInferenceComponentName"])
        arn = f"arn:aws:sagemaker:{self.region}:{self.current_account}:inference-component/{name}"
        held(backend)[name] = {
            "InferenceComponentName": name, "InferenceComponentArn": arn, "EndpointName": endpoint,
            "EndpointArn": backend.endpoints[endpoint].arn,
            "VariantName": self._get_param("VariantName") or "AllTraffic", "Specification": spec,
            "RuntimeConfig": self._get_param("RuntimeConfig") or {}, "CreationTime": utcnow(),
            "LastModifiedTime": utcnow(), "InferenceComponentStatus": "InService"}
        return ActionResult({"InferenceComponentArn": arn})

    def describe(self) -> ActionResult:
        found = dict(find(self.sagemaker_backend, self._get_param("InferenceComponentName")))
        copies = found.pop("RuntimeConfig").get("CopyCount")
        if copies is not None:
            found["RuntimeConfig"] = {"DesiredCopyCount": copies, "CurrentCopyCount": copies}
        return ActionResult(found)

    def delete(self) -> ActionResult:
        backend, name = self.sagemaker_backend, self._get_param("InferenceComponentName")
        find(backend, name)
        if any(c["Specification"].get("BaseInferenceComponentName") == name for c in held(backend).values()):
            raise ValidationError(message=f"Inference component '{name}' still carries adapter components.")
        del held(backend)[name]
        return EmptyResult()

    def list_(self) -> ActionResult:
        endpoint = self._get_param("EndpointNameEquals")
        keys = ("InferenceComponentName", "InferenceComponentArn", "EndpointName", "EndpointArn",
                "VariantName", "CreationTime", "LastModifiedTime", "InferenceComponentStatus")
        return ActionResult({"InferenceComponents": [
            {k: c[k] for k in keys} for c in held(self.sagemaker_backend).values()
            if endpoint in (None, c["EndpointName"])]})

    original_check = SageMakerModelBackend.validate_production_variants

    def check_variants(self, variants: list[dict[str, Any]]) -> None:
        original_check(self, [v for v in variants if "ModelName" in v])  # no model: components

    added = {"create_inference_component": create, "describe_inference_component": describe,
             "delete_inference_component": delete, "list_inference_components": list_}
    before = {action: SageMakerResponse.__dict__.get(action) for action in added}  # nested emulators
    for action, handler in added.items():
        setattr(SageMakerResponse, action, handler)
    SageMakerModelBackend.validate_production_variants = check_variants
    try:
        yield
    finally:
        for action, previous in before.items():
            if previous is None:
                delattr(SageMakerResponse, action)
            else:
                setattr(SageMakerResponse, action, previous)
        SageMakerModelBackend.validate_production_variants = original_check


@contextlib.contextmanager
def moto_scales_inference_components() -> Iterator[None]:
    """moto 5.2.5's Application Auto Scaling refuses an inference component's copy count as a
    scalable dimension (``sagemaker:inference-component:DesiredCopyCount``, which AWS documents
    for --scale-to-zero): add it to the dimensions moto accepts. Everything else about the
    target and its policies is moto's own."""
    from enum import Enum

    from moto.applicationautoscaling import models, responses

    original = models.ScalableDimensionValueSet
    widened = Enum(original.__name__, {**{m.name: m.value for m in original},
                                       "SAGEMAKER_INFERENCE_COMPONENT_DESIRED_COPY_COUNT":
                                       "sagemaker:inference-component:DesiredCopyCount"})
    models.ScalableDimensionValueSet = responses.ScalableDimensionValueSet = widened
    try:
        yield
    finally:
        models.ScalableDimensionValueSet = responses.ScalableDimensionValueSet = original


@contextlib.contextmanager
def emulator(port: int | None = None) -> Iterator[str]:
    """Run moto's server on 127.0.0.1 while the block lasts; yields its URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BadInput("the emulator target needs moto's server: pip install 'spectrum[emulator]'") from exc
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request access log in the CLI
    port = port or free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    with moto_accepts_current_instance_types(), moto_serves_inference_components(), \
            moto_scales_inference_components():
        server.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.stop()


def emulator_reachable(url: str, timeout_s: float = 2.0) -> bool:
    """True when something answers HTTP at ``url`` (an emulator started elsewhere)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url.rstrip("/") + "/moto-api/", timeout=timeout_s)
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def queue_emulator_result(endpoint_url: str, region: str, body: str,
                          content_type: str = "application/json") -> None:
    """Queue the answer moto's sagemaker-runtime gives to the next InvokeEndpoint.

    moto has no model behind an endpoint: it replays queued results. The CLI uses
    this so an emulator run prints a whole invocation, clearly labelled as the emulator's.
    """
    import json
    import urllib.request

    payload = {"results": [{"Body": body, "ContentType": content_type,
                            "InvokedProductionVariant": "AllTraffic",
                            "CustomAttributes": ""}],
               "region": region}
    req = urllib.request.Request(
        endpoint_url.rstrip("/") + "/moto-api/static/sagemaker/endpoint-results",
        data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


def credentials_hint() -> str:
    if os.environ.get("AWS_PROFILE"):
        return f"credentials from profile {os.environ['AWS_PROFILE']!r}"
    return "credentials from the usual chain (env, ~/.aws, SSO, instance role)"
