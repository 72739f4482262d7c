"""Bedrock Converse over boto3's ``bedrock-runtime``: answers, streams, cost, and errors a user can act on.

Retries are botocore's own (``standard`` mode): it backs off with full jitter on
``ThrottlingException`` and on ``ModelNotReadyException``, which the service model marks as
retryable, and honours ``x-amz-retry-after``. No loop of our own is needed. Errors raised
inside an open stream are not retried (the text already shown cannot be taken back); they
are reported with what to do.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Iterator

from options.contract import BedrockConverse, Request, Result, StreamEvent, StreamError, Usage
from options.core import BadInput

# Cross-region inference profile prefix -> the region prefixes it can be called from.
PROFILE_GEOGRAPHIES = {
    "us.": ("us-",), "us-gov.": ("us-gov-",), "eu.": ("eu-",), "apac.": ("ap-",),
    "jp.": ("ap-northeast-",), "au.": ("ap-southeast-",), "ca.": ("ca-",), "global.": ("",),
}
DEFAULT_MAX_ATTEMPTS = 6
# Long generations stream for minutes; botocore's default 60 s read timeout would cut them.
READ_TIMEOUT_S = 600
# The Converse field each CLI flag fills, to name the flag in validation errors.
FIELD_FLAGS = {"inferenceConfig.maxTokens": "--max-tokens", "maxTokens": "--max-tokens",
               "inferenceConfig.temperature": "--temperature", "temperature": "--temperature",
               "inferenceConfig.topP": "--top-p", "topP": "--top-p",
               "inferenceConfig.stopSequences": "--stop", "stopSequences": "--stop",
               "modelId": "--model", "system": "--system", "messages": "the prompt"}


class BedrockError(RuntimeError):
    """A Bedrock call failed for a reason the user can act on; the message says how."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class BedrockBadRequest(BadInput):
    """Bedrock rejected the request's values (exit 2): names the field and its limit."""


def split_profile(model_id: str) -> tuple[str | None, str]:
    """'us.amazon.nova-micro-v1:0' -> ('us.', 'amazon.nova-micro-v1:0'); no prefix -> (None, id)."""
    for prefix in sorted(PROFILE_GEOGRAPHIES, key=len, reverse=True):
        if model_id.startswith(prefix):
            return prefix, model_id[len(prefix):]
    return None, model_id


def check_model_region(model_id: str, region: str) -> None:
    """A cross-region profile can only be called from a region of its own geography."""
    prefix, base = split_profile(model_id)
    if prefix is None or model_id.startswith("arn:"):
        return
    allowed = PROFILE_GEOGRAPHIES[prefix]
    if not any(region.startswith(a) for a in allowed):
        fits = [p for p, a in PROFILE_GEOGRAPHIES.items() if p != "global." and any(region.startswith(x) for x in a)]
        better = f"{fits[0]}{base}" if fits else f"global.{base}"
        raise BadInput(f"inference profile {model_id!r} is for regions {', '.join(a + '*' for a in allowed)}, "
                       f"but the region is {region!r}: use {better!r} (or global.{base}), or pick a "
                       f"{allowed[0]}* region with --region")


def _client_error_parts(exc: Exception) -> tuple[str, str]:
    err = getattr(exc, "response", {}).get("Error", {})
    return err.get("Code", type(exc).__name__), err.get("Message", str(exc))


_CONSTRAINT = re.compile(r"Value '([^']*)' at '([^']+)' failed to satisfy constraint: ([^;]+)")
_LIMIT = re.compile(r"(max(?:imum)?[_ ]?tokens?|maxTokens|temperature|top[_ ]?p|topP|stop ?sequences?)"
                    r"[^0-9]*?(?:limit|maximum|max|exceeds|less than or equal to)[^0-9]*([0-9][0-9,.]*)",
                    re.IGNORECASE)


def explain_validation(message: str) -> str:
    """Bedrock's validation message -> which field, its value, and the limit it broke."""
    parts = []
    for value, field, constraint in _CONSTRAINT.findall(message):
        flag = FIELD_FLAGS.get(field)
        parts.append(f"{field}{f' ({flag})' if flag else ''} = {value!r}: {constraint.strip().rstrip('.')}")
    if not parts:
        m = _LIMIT.search(message)
        if m:
            key = m.group(1).replace(" ", "").replace("_", "").replace("imum", "").lower()
            field = {"maxtokens": "maxTokens", "maxtoken": "maxTokens", "temperature": "temperature",
                     "topp": "topP", "stopsequences": "stopSequences",
                     "stopsequence": "stopSequences"}.get(key, m.group(1))
            parts.append(f"{field} ({FIELD_FLAGS.get(field, field)}) is over this model's limit of "
                         f"{m.group(2).rstrip('.,')}")
    return "; ".join(parts)


def explain(exc: Exception, model_id: str, region: str, attempts: int | None = None) -> Exception:
    """A botocore error -> an error whose message says what to do about it."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return BedrockError("no AWS credentials found: configure them (aws configure, AWS_PROFILE, "
                            "or environment variables) before using --target aws", "NoCredentials")
    if isinstance(exc, EndpointConnectionError):
        return BedrockError(f"cannot reach Bedrock in {region}: {exc} (check the region and the "
                            "network)", "EndpointConnectionError")
    if not isinstance(exc, (ClientError, StreamError)):
        return exc
    code, message = _client_error_parts(exc)
    if isinstance(exc, StreamError):
        code, message = "ModelStreamError", str(exc)
    # Errors inside a stream are spelled in lower camel case (throttlingException).
    code = code[:1].upper() + code[1:]
    tried = f" after {attempts} attempts" if attempts else ""
    if code == "AccessDeniedException":
        return BedrockError(
            f"access to model {model_id!r} in {region} is denied. Request access to this model in "
            f"the Bedrock console (Model access, region {region}), and make sure your IAM identity "
            f"may call bedrock:InvokeModel and bedrock:InvokeModelWithResponseStream on it. "
            f"AWS said: {message}", code)
    if code == "ValidationException":
        detail = explain_validation(message)
        hint = ""
        if "on-demand throughput" in message and "inference profile" in message:
            _, base = split_profile(model_id)
            hint = (f" This model is only served through a cross-region inference profile: use "
                    f"--model us.{base} (or eu./apac./global. for your region).")
        elif "model identifier is invalid" in message.lower():
            hint = (f" List the model ids of {region} with `python -m options.bedrock models "
                    f"--region {region}`.")
        said = f"{detail} (AWS said: {message})" if detail else message
        return BedrockBadRequest(f"Bedrock rejected the request to {model_id!r}: {said}{hint}")
    if code == "ResourceNotFoundException":
        return BedrockBadRequest(f"model {model_id!r} is not available in {region}: {message}. List "
                                 f"the models there with `python -m options.bedrock models "
                                 f"--region {region}`, or try a cross-region profile (us., eu., apac., global.)")
    if code in ("ThrottlingException", "ServiceQuotaExceededException"):
        return BedrockError(f"Bedrock is still throttling {model_id!r} in {region}{tried}: {message}. "
                            "Lower the request rate, ask for a higher quota (Service Quotas → Amazon "
                            "Bedrock), or spread load with a cross-region profile (us./eu./apac./global.)", code)
    if code == "ModelNotReadyException":
        return BedrockError(f"model {model_id!r} is not ready in {region}{tried}: {message}. It is "
                            "being loaded; try again in a minute", code)
    if code == "ModelTimeoutException":
        return BedrockError(f"model {model_id!r} took too long: {message}. Ask for fewer tokens "
                            "(--max-tokens) or use --stream", code)
    return BedrockError(f"Bedrock call to {model_id!r} in {region} failed ({code}): {message}", code)


def retry_config(max_attempts: int = DEFAULT_MAX_ATTEMPTS, mode: str = "standard"):
    from botocore.config import Config
    # total_max_attempts counts the first call too (botocore's max_attempts counts only retries).
    return Config(retries={"mode": mode, "total_max_attempts": max_attempts}, read_timeout=READ_TIMEOUT_S,
                  connect_timeout=10)


@dataclass
class BedrockClient:
    """Converse and ConverseStream for one region; every answer priced from its usage."""
    runtime: Any                      # a boto3 bedrock-runtime client
    prices: Any = None                # cost.prices.PriceTable; the newest dated table if None

    @property
    def region(self) -> str:
        return self.runtime.meta.region_name

    def _price_table(self):
        if self.prices is None:
            from cost.prices import load_prices
            self.prices = load_prices()
        return self.prices

    def cost(self, model_id: str, usage: Usage) -> float | None:
        """USD for ``usage`` at on-demand prices; None when the table has no price for the model."""
        from cost.prices import UnknownName

        if usage.input_tokens is None or usage.output_tokens is None:
            return None
        try:
            return self._price_table().bedrock(model_id).cost(usage.input_tokens, usage.output_tokens)
        except UnknownName:
            return None

    def converse(self, request: Request) -> Result:
        body = BedrockConverse().to_wire(request)
        check_model_region(request.model, self.region)
        started = time.perf_counter()
        try:
            answer = self.runtime.converse(**body)
        except Exception as exc:
            raise self._explained(exc, request.model) from exc
        result = BedrockConverse().result_from_wire(answer)
        result.timings.e2e_s = time.perf_counter() - started
        latency = (answer.get("metrics") or {}).get("latencyMs")
        result.timings.server_latency_s = latency / 1000 if latency is not None else None
        result.usage.cost_usd = self.cost(request.model, result.usage)
        result.raw = {k: v for k, v in answer.items() if k != "ResponseMetadata"}
        return result

    def converse_stream(self, request: Request) -> Iterator[StreamEvent]:
        """Text deltas as they arrive, then the finish reason and the usage (with its cost)."""
        body = BedrockConverse().to_wire(request)
        check_model_region(request.model, self.region)
        try:
            answer = self.runtime.converse_stream(**body)
        except Exception as exc:
            raise self._explained(exc, request.model) from exc
        return self._events(answer["stream"], request.model)

    def _events(self, stream: Any, model_id: str) -> Iterator[StreamEvent]:
        from botocore.exceptions import EventStreamError

        dialect = BedrockConverse()
        try:
            for raw in stream:
                for ev in dialect.events_from_wire(raw):
                    if ev.kind == "usage":
                        ev.usage.cost_usd = self.cost(model_id, ev.usage)
                    yield ev
        except (EventStreamError, StreamError) as exc:
            raise self._explained(exc, model_id) from exc

    def _explained(self, exc: Exception, model_id: str) -> Exception:
        attempts = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("RetryAttempts")
        return explain(exc, model_id, self.region, attempts + 1 if attempts is not None else None)

    def invoke(self, request: Request) -> Result | Iterator[StreamEvent]:
        return self.converse_stream(request) if request.stream else self.converse(request)
