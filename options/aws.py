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
    with moto_accepts_current_instance_types():
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
