"""What each request used: the ledger entry (the bill's source) and the Prometheus counters.

Counters are kept by the store, so with Redis ``/metrics`` shows the whole gateway (every
worker and replica), not whichever worker the scrape happened to reach. Labels are tenant,
model, upstream and status: never a key, never a prompt.
"""
from __future__ import annotations

import functools
import time

import orjson

METRIC_HELP = {
    "spectrum_gateway_requests_total": ("counter", "Requests answered, by tenant, model, upstream and status."),
    "spectrum_gateway_tokens_total": ("counter", "Tokens the upstreams reported, by tenant, model, upstream and direction."),
    "spectrum_gateway_cost_usd_total": ("counter", "Cost at the upstreams' configured prices, by tenant and upstream."),
    "spectrum_gateway_request_seconds": ("summary", "Latency of requests an upstream answered, by tenant and upstream."),
    "spectrum_gateway_fallbacks_total": ("counter", "Requests sent to a fallback upstream, by model and the upstream that failed."),
    "spectrum_gateway_auth_failures_total": ("counter", "Requests refused before a tenant was known, by reason."),
    "spectrum_gateway_replica_requests_total": ("counter", "Requests a replica answered, by model, upstream, replica and how it was chosen (affinity, spill, failover, least_in_flight, round_robin)."),
    "spectrum_gateway_replica_in_flight": ("gauge", "Requests in flight to each replica, in this process."),
    "spectrum_gateway_replica_ejected": ("gauge", "1 while this process skips a replica that refused, timed out or answered 5xx."),
    "spectrum_gateway_streams_in_flight": ("gauge", "Streams being relayed by this process."),
}


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def sample(name: str, **labels) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def ledger_line(entry: dict) -> bytes:
    """An entry as the file ledger stores it: compact JSON in UTF-8, one line with its newline
    (orjson: a third of the standard encoder's CPU, on every request)."""
    return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)


def ledger_json(entry: dict) -> str:
    """An entry as Redis's ledger stores it: the same JSON, as text."""
    return orjson.dumps(entry).decode()


def ledger_entry(*, request_id: str, tenant: str, key_id: str, model: str | None,
                 upstream: str | None, fallback_from: list[str], input_tokens: int,
                 output_tokens: int, usage_source: str, status: int, latency_s: float,
                 stream: bool, cost_usd: float, replica: str | None = None,
                 routing: str | None = None) -> dict:
    return {"ts_ms": int(time.time() * 1000), "request_id": request_id, "tenant": tenant,
            "key_id": key_id, "model": model, "upstream": upstream,
            "fallback_from": fallback_from, "input_tokens": input_tokens,
            "output_tokens": output_tokens, "usage_source": usage_source, "status": status,
            "latency_ms": round(latency_s * 1000, 2), "stream": stream,
            "cost_usd": round(cost_usd, 8), "replica": replica, "routing": routing}


@functools.lru_cache(maxsize=8192)
def _names(tenant: str, model: str, upstream: str, status: int) -> tuple:
    """The sample names one (tenant, model, upstream, status) counts under, built once."""
    per_call = dict(tenant=tenant, model=model, upstream=upstream)
    per_upstream = dict(tenant=tenant, upstream=upstream)
    return (sample("spectrum_gateway_requests_total", **per_call, status=status),
            sample("spectrum_gateway_tokens_total", **per_call, direction="input"),
            sample("spectrum_gateway_tokens_total", **per_call, direction="output"),
            sample("spectrum_gateway_cost_usd_total", **per_upstream),
            sample("spectrum_gateway_request_seconds_sum", **per_upstream),
            sample("spectrum_gateway_request_seconds_count", **per_upstream))


def increments(entry: dict) -> dict:
    """The counter increments one ledger entry makes."""
    model, upstream = entry["model"] or "", entry["upstream"] or ""
    requests, tokens_in, tokens_out, cost, seconds, count = _names(
        entry["tenant"], model, upstream, entry["status"])
    out = {requests: 1}
    if upstream:
        if entry["input_tokens"]:
            out[tokens_in] = entry["input_tokens"]
        if entry["output_tokens"]:
            out[tokens_out] = entry["output_tokens"]
        if entry["cost_usd"]:
            out[cost] = entry["cost_usd"]
        out[seconds] = entry["latency_ms"] / 1000
        out[count] = 1
    for failed in entry["fallback_from"]:
        out[sample("spectrum_gateway_fallbacks_total", model=model, upstream=failed)] = 1
    if entry.get("replica"):
        out[sample("spectrum_gateway_replica_requests_total", model=model, upstream=upstream,
                   replica=entry["replica"], routing=entry["routing"])] = 1
    return out


def render(counters: dict[str, float], gauges: dict[str, float]) -> str:
    """Prometheus text exposition of the store's counters and this process's gauges (both
    keyed by their sample, ``name{labels}``)."""
    lines = []
    by_name: dict[str, list] = {}
    for field, value in [*counters.items(), *gauges.items()]:
        name = field.split("{", 1)[0]
        base = name.rsplit("_", 1)[0]
        if METRIC_HELP.get(base, ("",))[0] == "summary":     # _sum and _count: one family
            name = base
        by_name.setdefault(name, []).append((field, value))
    for name in sorted(by_name):
        kind, text = METRIC_HELP.get(name, ("counter", name))
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f"{field} {_number(value)}" for field, value in sorted(by_name[name])]
    return "\n".join(lines) + "\n"
