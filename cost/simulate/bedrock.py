"""Rung 1 on a trace: Bedrock's on-demand quotas, the SDK's retries, and a per-token bill.

Each request reserves ``input + max_tokens`` of the model's tokens-per-minute quota when it
starts (the trace's output size is its max_tokens: the replay asks for exactly that many), and
one request of the requests-per-minute quota where the account still has one. Quotas are
counted in whole clock minutes. A request over either is throttled (``ThrottlingException``),
and the SDK's standard retry mode tries it again after a jittered exponential backoff
(``random × min(20 s, 2^attempt)``) up to its attempts; what is still throttled then fails, is
not billed and misses the SLO. Served requests are billed exactly: Σ input × input price +
output × output price.

The SDK's read timeout (``timeouts.FrontDoor``, from the accepted attempt: a throttled one
fails at once) fails a request whose first event comes later (the client streams) as
TIMED_OUT: it misses the SLO, and is billed, since Bedrock finishes and bills a generation its
client left (the timeouts file gives the reports). It is not retried: the read times out inside
an open stream, which the SDK hands to the caller.

Latency on Bedrock is not ours to model from a bench of our server: TTFT = a fixed first-token
time + input / prompt rate, then output tokens at a per-request rate, plus the time spent
backing off. The defaults are stated assumptions (``cost/data/scaling-*.json``), overridable.

Rung 1's two other forms, where the user asks for them:

- Batch inference (``batch_run``): billed at the model's batch price (50 % of on-demand where
  Bedrock lists one); a job answers within its 24 h window and returns no stream, so each
  request's answer (first token and last alike) is taken at its arrival + the window, the worst
  case the window allows. Batch jobs are not counted against the on-demand TPM/RPM quotas, so
  nothing is throttled. Job-size quotas (records per job) are not modelled: the trace's requests
  are taken as gathered into jobs that fit them.
- Provisioned Throughput (``ProvisionedThroughput``): N model units for the trace's whole span,
  billed for every started hour. Their capacity, N x the per-unit tokens per minute the user
  gives (AWS publishes none), is enforced as the on-demand quota is: reserved per request, in
  whole clock minutes. A request over it is throttled, not queued: Bedrock answers a call beyond
  a provisioned model's capacity with ``ThrottlingException`` as it does beyond a quota, and the
  SDK retries it with the same backoff; what is still throttled after every attempt fails. So
  the same ``simulate_bedrock`` runs both, with the PT's capacity as its TPM and no RPM.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cost.simulate.fleet import SERVED, TIMED_OUT
from cost.simulate.scaling import default
from options.core import BadInput

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
    status: np.ndarray            # SERVED, THROTTLED (failed after every attempt) or TIMED_OUT
    throttled_requests: int       # requests throttled at least once
    throttle_events: int          # throttled attempts, retries included
    throttle_times: list[float]   # when each throttled attempt happened (for the plot)


def simulate_bedrock(arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
                     settings: BedrockSettings, seed: int = 0, front_door=None) -> BedrockRun:
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
    if front_door is not None:
        status[~failed & front_door.late(began, first, finish)] = TIMED_OUT
    return BedrockRun(first, finish, status, len(throttled_once), events, times)


def batch_run(arrival_s: np.ndarray) -> BedrockRun:
    """Batch inference: every request served, its answer at arrival + the 24 h window (worst case)."""
    done = arrival_s + default("bedrock", "batch_window_s")
    return BedrockRun(done.copy(), done, np.full(len(arrival_s), SERVED, dtype=np.int8), 0, 0, [])


PT_TERMS = tuple(default("bedrock", "pt_term_hours"))


@dataclass(frozen=True)
class ProvisionedThroughput:
    """Bedrock Provisioned Throughput as the user prices it: per-unit tokens per minute and USD
    per unit-hour (both from the user: AWS publishes neither here), the commitment term, and a
    unit count (None: the simulator finds the least meeting the SLO)."""
    unit_tpm: float
    unit_usd_hour: float
    term: str = "none"
    units: int | None = None

    def __post_init__(self) -> None:
        for flag, value, unit in (("--bedrock-pt-unit-tpm", self.unit_tpm, "tokens per minute per model unit"),
                                  ("--bedrock-pt-unit-usd-hour", self.unit_usd_hour, "USD per model unit-hour")):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise BadInput(f"{flag} {value!r} must be a number > 0 ({unit}, from the Bedrock console or "
                               "your account team for this model)")
        if self.term not in PT_TERMS:
            raise BadInput(f"--bedrock-pt-term {self.term!r}: choose one of {', '.join(PT_TERMS)}")
        if self.units is not None and not (isinstance(self.units, int) and self.units >= 1):
            raise BadInput(f"--bedrock-pt-units {self.units!r} must be a whole number >= 1 (model units), "
                           "or left out for the least that meets the SLO")

    def window_usd(self, units: int, span_s: float) -> float:
        """Every started hour of the window, each unit at its hourly price."""
        return units * math.ceil(span_s / 3600 - 1e-9) * self.unit_usd_hour

    def monthly_usd(self, units: int, hours_per_month: float) -> float:
        """Kept through the month (a provisioned model bills until deleted, not per request)."""
        return units * hours_per_month * self.unit_usd_hour

    def commitment_usd(self, units: int) -> float | None:
        """What a committed term bills in all, whatever the traffic (None without a commitment)."""
        hours = default("bedrock", "pt_term_hours")[self.term]
        return None if self.term == "none" else units * hours * self.unit_usd_hour

    def units_without_throttling(self, input_tokens: np.ndarray, output_tokens: np.ndarray,
                                 arrival_s: np.ndarray) -> int:
        """Units whose capacity holds the trace's busiest clock minute (and its largest request)."""
        need = input_tokens + np.maximum(1, output_tokens)
        per_minute = np.bincount((arrival_s // 60).astype(np.int64), weights=need)
        return max(1, math.ceil(float(per_minute.max()) / self.unit_tpm - 1e-9))

    def run(self, arrival_s, input_tokens, output_tokens, settings: BedrockSettings, units: int,
            seed: int = 0, front_door=None) -> BedrockRun:
        on_units = replace(settings, tpm=units * self.unit_tpm, rpm=None)
        return simulate_bedrock(arrival_s, input_tokens, output_tokens, on_units, seed, front_door)

    def to_json(self, units: int) -> dict[str, Any]:
        return {"kind": "bedrock_provisioned_throughput", "model_units": units, "term": self.term,
                "unit_tpm": self.unit_tpm, "unit_usd_hour": self.unit_usd_hour, "capacity_tpm": units * self.unit_tpm,
                "over_capacity": "throttled (ThrottlingException), retried by the SDK with backoff",
                "units_given": self.units is not None}
