"""Rung 1 on a trace: Bedrock's on-demand quotas, the SDK's retries, and a per-token bill.

Each request reserves ``input + max_tokens`` of the model's tokens-per-minute quota when it
starts (the trace's output size is its max_tokens: the replay asks for exactly that many), and
one request of the requests-per-minute quota where the account still has one. Quotas are
counted in whole clock minutes. A request over either is throttled (``ThrottlingException``),
and the SDK's standard retry mode tries it again after a jittered exponential backoff
(``random × min(20 s, 2^attempt)``) up to its attempts; what is still throttled then fails, is
not billed and misses the SLO. Served requests are billed exactly: Σ input × input price +
output × output price.

Latency on Bedrock is not ours to model from a bench of our server: TTFT = a fixed first-token
time + input / prompt rate, then output tokens at a per-request rate, plus the time spent
backing off. The defaults are stated assumptions (``cost/data/scaling-*.json``), overridable.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost.simulate.fleet import SERVED
from cost.simulate.scaling import default

THROTTLED = 4


@dataclass
class BedrockSettings:
    tpm: float | None = field(default_factory=lambda: default("bedrock", "tpm_default"))
    rpm: float | None = field(default_factory=lambda: default("bedrock", "rpm_default"))
    attempts: int = field(default_factory=lambda: default("bedrock", "retry_attempts"))
    max_backoff_s: float = field(default_factory=lambda: default("bedrock", "retry_max_backoff_s"))
    ttft_s: float = field(default_factory=lambda: default("bedrock", "ttft_s"))
    prefill_tok_s: float = field(default_factory=lambda: default("bedrock", "prefill_tok_s"))
    output_tok_s: float = field(default_factory=lambda: default("bedrock", "output_tok_s"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "bedrock_on_demand", "tpm": self.tpm, "rpm": self.rpm, "sdk_attempts": self.attempts,
                "max_backoff_s": self.max_backoff_s, "ttft_s": self.ttft_s, "prefill_tok_s": self.prefill_tok_s,
                "output_tok_s": self.output_tok_s}


@dataclass
class BedrockRun:
    first_token_s: np.ndarray
    finish_s: np.ndarray
    status: np.ndarray            # SERVED or THROTTLED (failed after every attempt)
    throttled_requests: int       # requests throttled at least once
    throttle_events: int          # throttled attempts, retries included
    throttle_times: list[float]   # when each throttled attempt happened (for the plot)


def simulate_bedrock(arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
                     settings: BedrockSettings, seed: int = 0) -> BedrockRun:
    n = len(arrival_s)
    inputs, outputs = input_tokens.tolist(), output_tokens.tolist()
    start = [math.nan] * n
    status = np.full(n, SERVED, dtype=np.int8)
    rng = np.random.default_rng(seed)
    tokens_used: dict[int, float] = {}
    requests_used: dict[int, int] = {}
    retries: list[tuple[float, int, int]] = []          # (time, request, attempt number)
    throttled_once = set()
    events = 0
    times: list[float] = []
    tpm, rpm = settings.tpm, settings.rpm
    arrivals = arrival_s.tolist()
    i = 0

    def attempt(t: float, r: int, k: int) -> None:
        nonlocal events
        minute = int(t // 60)
        need = inputs[r] + max(1, outputs[r])
        over = ((tpm is not None and tokens_used.get(minute, 0.0) + need > tpm)
                or (rpm is not None and requests_used.get(minute, 0) + 1 > rpm))
        if not over:
            tokens_used[minute] = tokens_used.get(minute, 0.0) + need
            requests_used[minute] = requests_used.get(minute, 0) + 1
            start[r] = t
            return
        events += 1
        times.append(t)
        throttled_once.add(r)
        if k >= settings.attempts:
            status[r] = THROTTLED
            return
        backoff = float(rng.random()) * min(settings.max_backoff_s, 2.0 ** k)
        heapq.heappush(retries, (t + backoff, r, k + 1))

    while i < n or retries:
        if retries and (i >= n or retries[0][0] < arrivals[i]):
            t, r, k = heapq.heappop(retries)
            attempt(t, r, k)
        else:
            attempt(arrivals[i], i, 1)
            i += 1
    began = np.array(start)
    first = began + settings.ttft_s + input_tokens / settings.prefill_tok_s
    finish = first + np.maximum(output_tokens - 1, 0) / settings.output_tok_s
    failed = status != SERVED
    first[failed] = np.nan
    finish[failed] = np.nan
    return BedrockRun(first, finish, status, len(throttled_once), events, times)
