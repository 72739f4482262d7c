"""Read a benchmark result (``python -m options.bench --json FILE``) as a replica's capacity.

The capacity is the measured output tokens/s; the traffic profile and the latency it was
measured at travel with it, because a throughput means nothing without them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cost.breakeven import Capacity
from options.core import BadInput

BENCH_SCHEMA = "spectrum.bench/1"


def load_bench(path: str | Path) -> Capacity:
    path = Path(path)
    where = f"bench file {str(path)!r}"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{where} does not exist (write one with `python -m options.bench --json FILE`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{where} is not readable JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != BENCH_SCHEMA:
        raise BadInput(f"{where} is not a Spectrum bench result (expected \"schema\": \"{BENCH_SCHEMA}\", "
                       f"got {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r})")
    metrics = doc.get("metrics") or {}
    tps = metrics.get("output_tokens_per_second")
    if not isinstance(tps, (int, float)) or isinstance(tps, bool) or not math.isfinite(tps) or tps <= 0:
        raise BadInput(f"{where}: metrics.output_tokens_per_second is {tps!r}; a capacity must be a "
                       f"positive number (did every request fail? counts: {doc.get('counts')})")
    return Capacity(float(tps), where, measured_at=measured_at(doc))


def measured_at(doc: dict[str, Any]) -> dict[str, Any]:
    """The traffic profile and latencies behind the throughput, plus a one-line summary."""
    profile = doc.get("profile") or {}
    metrics = doc.get("metrics") or {}
    counts = doc.get("counts") or {}
    info: dict[str, Any] = {
        "level": doc.get("level"), "target": doc.get("target"), "model": doc.get("model"),
        "started_at": doc.get("started_at"), "duration_s": doc.get("duration_s"),
        "profile": profile,
        "ttft_ms": metrics.get("ttft_ms"), "itl_ms": metrics.get("itl_ms"),
        "tpot_ms": metrics.get("tpot_ms"), "e2e_ms": metrics.get("e2e_ms"),
        "requests_per_second": metrics.get("requests_per_second"),
        "completed": counts.get("completed"), "errors": counts.get("errors") or {},
    }
    if counts.get("input_tokens") and counts.get("output_tokens"):
        info["measured_mix"] = f"{counts['input_tokens'] / counts['output_tokens']:.2f}:1"
    if profile.get("request_rate") is None:
        load = f"concurrency {profile.get('concurrency')}"
    else:  # Poisson arrivals, optionally capped in flight
        load = (f"{profile['request_rate']:g} req/s (burstiness {profile.get('burstiness', 1.0):g})"
                + (f", at most {profile['concurrency']} in flight" if profile.get("concurrency") else ""))
    parts = [f"level {doc.get('level')} on {doc.get('target')}", f"model {doc.get('model')}",
             f"{profile.get('requests')} requests at {load}",
             f"prompt {_lengths(profile.get('prompt_tokens'))}, output {_lengths(profile.get('output_tokens'))}"]
    latency = [f"{name} p50 {_ms(metrics.get(key), 'p50')} p99 {_ms(metrics.get(key), 'p99')}"
               for name, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))
               if isinstance(metrics.get(key), dict)]
    if latency:
        parts.append("latency " + ", ".join(latency))
    errors = sum((counts.get("errors") or {}).values())
    if errors:
        parts.append(f"{errors} errors")
    info["summary"] = "; ".join(parts)
    return info


def _lengths(spec: Any) -> str:
    """The bench's length distributions: fixed {value}, uniform {low, high}, jsonl {path, mean}."""
    if not isinstance(spec, dict):
        return "?"
    kind = spec.get("kind")
    if kind == "fixed":
        return f"{spec.get('value')} tokens"
    if kind == "uniform":
        return f"{spec.get('low')}-{spec.get('high')} tokens"
    if kind == "jsonl":
        mean = spec.get("mean")
        return f"{spec.get('path')} (mean {mean:.0f} tokens)" if isinstance(mean, (int, float)) else str(spec.get("path"))
    return ", ".join(f"{k}={v}" for k, v in spec.items())


def _ms(stats: Any, key: str) -> str:
    value = stats.get(key) if isinstance(stats, dict) else None
    return f"{value:,.0f} ms" if isinstance(value, (int, float)) else "?"
