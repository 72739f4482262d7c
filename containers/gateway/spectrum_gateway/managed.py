"""Managed upstreams: Bedrock (Converse) and SageMaker endpoints, through ``options/contract.py``.

The OpenAI body becomes the contract's one ``Request``; the contract's dialects turn it into
Converse arguments or an endpoint's body and turn the answer (or each stream event) back into
OpenAI's shape. boto3 is synchronous, so each call, and each stream event, runs in a worker
thread. ``ManagedResponse`` looks to the app like an HTTP upstream's response (status,
``aread``, ``pump``, ``aclose``), so fallback, relaying and metering are shared.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import anyio

from .config import GatewayConfig, Upstream
from .errors import GatewayError
from .upstream import StreamBroken, UpstreamFailure, pump_from


def _contract():
    from options import contract     # imported on first use: boto3 and botocore are heavy
    return contract


class ManagedResponse:
    """A Bedrock or SageMaker answer, in OpenAI's shape, read like an HTTP upstream's response."""

    waits_to_close = True      # a stream is closed in a worker thread

    def __init__(self, body: dict | None = None, events=None, closer=None) -> None:
        self.status_code = 200
        self.headers = {"content-type": "text/event-stream" if events is not None
                        else "application/json"}
        self._body, self._events, self._closer = body, events, closer

    async def aread(self) -> bytes:
        return json.dumps(self._body).encode()

    async def aiter_raw(self):
        contract = _contract()
        try:
            while True:
                message = await anyio.to_thread.run_sync(next, self._events, None)
                if message is None:
                    break
                yield contract.sse_message(message)
            yield contract.SSE_DONE
        except Exception as e:     # the contract's StreamError, botocore's EventStreamError
            raise StreamBroken(f"{type(e).__name__}: {e}") from None

    async def pump(self, sink) -> None:
        await pump_from(self.aiter_raw(), sink)

    def expect_end(self, within_s: float) -> None:
        """Nothing to wait for: the stream ends with the [DONE] made here."""

    async def aclose(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            await anyio.to_thread.run_sync(closer)


def _failure(upstream: Upstream, error: Exception) -> Exception:
    """botocore's exception → an UpstreamFailure to fall back on, or a GatewayError to return."""
    from botocore import exceptions as bx
    if isinstance(error, bx.ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 500
        code = error.response.get("Error", {}).get("Code", "")
        message = error.response.get("Error", {}).get("Message", str(error))
        if status == 429 or code in ("ThrottlingException", "ServiceQuotaExceededException"):
            return UpstreamFailure(upstream.name, "status", f"answered 429 ({code}): {message}", 429)
        if status >= 500 or code in ("ModelNotReadyException", "ServiceUnavailableException"):
            return UpstreamFailure(upstream.name, "status", f"answered {status} ({code}): {message}", status)
        return GatewayError(status, f"upstream {upstream.name} refused the request ({code}): "
                                    f"{message}", "upstream_rejected")
    if isinstance(error, (bx.ReadTimeoutError, bx.ConnectTimeoutError)):
        return UpstreamFailure(upstream.name, "timeout", f"timed out ({type(error).__name__})")
    if isinstance(error, (bx.EndpointConnectionError, bx.ConnectionClosedError, bx.NoRegionError,
                          bx.NoCredentialsError)):
        return UpstreamFailure(upstream.name, "refused", f"unreachable ({error})")
    return UpstreamFailure(upstream.name, "refused", f"failed ({type(error).__name__}: {error})")


class ManagedUpstreams:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._clients: dict = {}
        self._lock = threading.Lock()

    def _client(self, service: str, settings: dict):
        key = (service, settings.get("region"), settings.get("endpoint_url"))
        with self._lock:       # boto3 clients are thread-safe to use, not to create
            if key not in self._clients:
                import boto3
                from botocore.config import Config
                self._clients[key] = boto3.session.Session().client(
                    service, region_name=settings.get("region"),
                    endpoint_url=settings.get("endpoint_url"),
                    # One attempt: a failure goes to the model's fallback, not to a retry loop.
                    config=Config(retries={"total_max_attempts": 1},
                                  connect_timeout=self.config.connect_timeout_s,
                                  read_timeout=self.config.upstream_timeout_s))
            return self._clients[key]

    def warm(self) -> None:
        """Import the contract and boto3 and make the clients now, not on the first request."""
        _contract()
        for model in self.config.models.values():
            for u in model.upstreams:
                if u.bedrock:
                    self._client("bedrock-runtime", u.bedrock)
                elif u.sagemaker:
                    self._client("sagemaker-runtime", u.sagemaker)

    async def open(self, upstream: Upstream, path: str, body: dict, model_name: str,
                   request_id: str) -> ManagedResponse:
        contract = _contract()
        from options.core import BadInput
        openai = contract.dialect("openai-chat" if path == "/chat/completions" else "openai-completions")
        try:
            request = openai.from_wire(body)
        except BadInput as e:
            raise GatewayError(400, str(e), "invalid_request") from None
        stamp = {"id": f"spg-{request_id}", "created": int(time.time()), "model": model_name}

        def call():
            if upstream.bedrock:
                bedrock = contract.dialect("bedrock")
                client = self._client("bedrock-runtime", upstream.bedrock)
                wire = bedrock.to_wire(replace(request, model=upstream.bedrock["model_id"]))
                if request.stream:
                    stream = client.converse_stream(**wire)["stream"]
                    events = (ev for msg in stream for ev in bedrock.events_from_wire(msg))
                    return None, events, stream.close
                return bedrock.result_from_wire(client.converse(**wire)), None, None
            settings = upstream.sagemaker
            client = self._client("sagemaker-runtime", settings)
            answer = contract.invoke_sagemaker(
                client, settings["endpoint"], replace(request, model=upstream.model or request.model),
                settings.get("dialect", "openai-chat"))
            if request.stream:
                return None, answer, answer.close
            return answer, None, None

        try:
            result, events, closer = await anyio.to_thread.run_sync(call)
        except GatewayError:
            raise
        except Exception as e:
            raise _failure(upstream, e) from None
        if events is None:
            return ManagedResponse({**stamp, **openai.result_to_wire(result)})
        messages = ({**stamp, **message} for ev in events
                    if (message := openai.stream_to_wire(ev)) is not None)
        return ManagedResponse(events=messages, closer=closer)
