"""Send a traffic profile to one target and record what each request measured.

A target is a function from a streaming ``Request`` to its ``StreamEvent``s (see
``options.contract``): an HTTP server in some dialect, a SageMaker endpoint, or Bedrock. The
bench always streams, since time to first token needs the first chunk's arrival.
"""
from __future__ import annotations

import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Sequence

from options.bench.metrics import RequestRecord
from options.bench.profile import CALIBRATION_WORDS, Profile, PromptTokens, make_prompt
from options.contract import InvokeError, Request, StreamError, StreamEvent, collect
from options.core import BadInput

Send = Callable[[Request], Iterator[StreamEvent]]
# Threads beyond this would measure the client, not the server.
MAX_THREADS = 512


def error_kind(exc: BaseException) -> str:
    """A short stable name for what went wrong, for error counts."""
    if isinstance(exc, InvokeError):
        return exc.kind
    if isinstance(exc, StreamError):
        return "stream_error"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, BadInput):
        return "rejected"
    code = getattr(exc, "code", "") or (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
    return code if isinstance(code, str) and code else type(exc).__name__


def measure(send: Send, request: Request) -> RequestRecord:
    """One request, timed from just before it is sent. Never raises: failures are records."""
    started = time.perf_counter()
    try:
        res = collect(send(request), started)
    except Exception as exc:  # a benchmark counts failures by kind instead of stopping
        return RequestRecord(error=error_kind(exc))
    if res.usage.output_tokens is None:
        # Token counts must be the server's own: without usage the request cannot be counted.
        return RequestRecord(error="no_usage")
    t = res.timings
    return RequestRecord(ttft_s=t.ttft_s, itl_s=t.itl_s, e2e_s=t.e2e_s,
                         input_tokens=res.usage.input_tokens, output_tokens=res.usage.output_tokens)


@dataclass
class Run:
    records: list[RequestRecord]
    started_at: str                # ISO 8601, UTC
    duration_s: float              # first send → last answer


def calibrate(send: Send, template: Request, seed: int = 0) -> PromptTokens | None:
    """Measure how the target counts generated prompts (two one-token requests, unmeasured).

    So that ``--prompt-tokens 512`` means 512 of the target's own tokens, whatever its
    tokenizer. None when the target reports no prompt token counts.
    """
    rng = random.Random(seed)
    points = []
    for words in CALIBRATION_WORDS:
        req = replace(template, prompt=make_prompt(rng, words, -words), messages=None,
                      max_tokens=1, stream=True)
        res = collect(send(req))
        if res.usage.input_tokens is None:
            return None
        points.append((words, res.usage.input_tokens))
    return PromptTokens.fit(*points)


def run(profile: Profile, send: Send, template: Request,
        on_done: Callable[[int, RequestRecord], None] | None = None,
        tokens: PromptTokens | None = None, models: Sequence[str | None] | None = None) -> Run:
    """Send every request of ``profile`` (arrivals, concurrency cap) and wait for all answers.

    ``template`` carries what every request shares (model, ignore_eos, sampling); the profile
    fills in each prompt and max_tokens. ``tokens`` comes from ``calibrate``. ``models``, one
    per request, names the model each request asks for (an adapter; None: the template's).
    """
    schedule = profile.plan(tokens)
    workers = min(profile.concurrency or profile.requests, profile.requests, MAX_THREADS)
    records: list[RequestRecord | None] = [None] * len(schedule)
    finished, lock = 0, threading.Lock()

    def task(i: int, prompt: str, max_tokens: int) -> None:
        nonlocal finished
        req = replace(template, prompt=prompt, messages=None, max_tokens=max_tokens, stream=True)
        if models is not None and models[i] is not None:
            req = replace(req, model=models[i])
        records[i] = rec = measure(send, req)
        with lock:
            finished += 1
            if on_done:
                on_done(finished, rec)

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench") as pool:
        for i, (offset, prompt, max_tokens) in enumerate(schedule):
            wait = t0 + offset - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            pool.submit(task, i, prompt, max_tokens)
    duration = time.perf_counter() - t0
    return Run([r for r in records if r is not None], started_at, duration)


def metrics_page(base_url: str | None) -> str | None:
    """The target's Prometheus ``/metrics`` text; None where it has none (SageMaker, Bedrock)."""
    if not base_url:
        return None
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10) as r:
            return r.read().decode("utf-8", "replace")
    except Exception:  # a target without /metrics (SageMaker, Bedrock, a proxy) just says less
        return None


# --- targets ----------------------------------------------------------------------------------

def http_target(base_url: str, dialect: str, path: str | None = None, timeout_s: float = 600) -> Send:
    from options.contract import invoke_http
    return lambda req: invoke_http(base_url, req, dialect, path=path, timeout_s=timeout_s)


def sagemaker_target(runtime_client: Any, endpoint_name: str, dialect: str) -> Send:
    from options.contract import invoke_sagemaker
    return lambda req: invoke_sagemaker(runtime_client, endpoint_name, req, dialect)


def bedrock_target(runtime_client: Any) -> Send:
    from options.bedrock.client import BedrockClient
    return BedrockClient(runtime_client).converse_stream
