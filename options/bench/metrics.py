"""Benchmark maths, pure: per-request records in, the summary every rung is compared by out.

Definitions follow vLLM's ``vllm bench serve``, so numbers from here and from it agree:
- TTFT: request sent → first chunk that carries text.
- ITL: every gap between consecutive chunks with text, pooled over all requests.
- E2E: request sent → last chunk with text; so E2E = TTFT + Σ ITL for each request.
- TPOT: (E2E − TTFT) / (output tokens − 1), per request with more than one output token.
- Output tok/s: output tokens (from the server's usage) / wall time; input tokens never count.
- Requests/s: completed requests / wall time (it depends on the arrival pattern).
Percentiles interpolate linearly between the closest ranks (numpy's default).
"""
from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

STATS = ("mean", "p50", "p90", "p99")
# One sample line of a Prometheus text page: name, {labels}, value.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class RequestRecord:
    """What one request measured. ``error`` names the kind of failure, or is None."""
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100) with linear interpolation; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    if not values:
        return None
    xs = sorted(values)
    rank = (len(xs) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def distribution_ms(values_s: Iterable[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 of seconds, in milliseconds."""
    ms = [v * 1000 for v in values_s]
    return {"mean": sum(ms) / len(ms) if ms else None, "p50": percentile(ms, 50),
            "p90": percentile(ms, 90), "p99": percentile(ms, 99)}


@dataclass
class Summary:
    duration_s: float
    completed: int
    errors: dict[str, int]
    input_tokens: int
    output_tokens: int
    output_tokens_per_second: float
    requests_per_second: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]

    def metrics_json(self) -> dict[str, Any]:
        return {"output_tokens_per_second": self.output_tokens_per_second,
                "requests_per_second": self.requests_per_second,
                "ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms, "tpot_ms": self.tpot_ms,
                "e2e_ms": self.e2e_ms}

    def counts_json(self) -> dict[str, Any]:
        return {"completed": self.completed, "errors": dict(self.errors),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Summary:
    """Summarise a run that took ``duration_s`` of wall time (first send → last answer)."""
    if duration_s <= 0:
        raise ValueError(f"duration_s={duration_s} must be positive")
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in done)
    return Summary(
        duration_s=duration_s,
        completed=len(done),
        errors=dict(sorted(Counter(r.error for r in records if not r.ok).items())),
        input_tokens=sum(r.input_tokens or 0 for r in done),
        output_tokens=out_tokens,
        output_tokens_per_second=out_tokens / duration_s,
        requests_per_second=len(done) / duration_s,
        ttft_ms=distribution_ms(r.ttft_s for r in done if r.ttft_s is not None),
        itl_ms=distribution_ms(gap for r in done for gap in r.itl_s),
        tpot_ms=distribution_ms(t for r in done if (t := r.tpot_s) is not None),
        e2e_ms=distribution_ms(r.e2e_s for r in done if r.e2e_s is not None),
    )


def prometheus_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus text page; comments skipped."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            yield m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))


def metric_sum(text: str, name: str) -> float | None:
    """A metric's value summed over its label sets (every engine, every model) in a Prometheus
    text page; None where the page has no sample of it."""
    values = [value for sample, _, value in prometheus_samples(text) if sample == name]
    return sum(values) if values else None


def spread(values: Iterable[float | None]) -> dict[str, float | None]:
    """Median, min and max of a contender's figure over rounds (Nones skipped)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is missing or b is 0."""
    return a / b if a is not None and b else None
