"""Prometheus metrics of the front end (``byo_*``), served at ``/metrics`` beside vLLM's
own engine metrics (``vllm:*``, e.g. ``vllm:num_requests_running``), which the engine
registers in the same default registry.

Everything here is updated once per request, never per token.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)

REQUESTS = Counter("byo_requests", "HTTP requests answered, by route and status",
                   ["route", "status"])
ERRORS = Counter("byo_request_errors", "Requests that failed, by route and kind",
                 ["route", "kind"])
TTFT = Histogram("byo_time_to_first_token_seconds",
                 "From the request reaching the engine to its first output", ["dialect"],
                 buckets=_LATENCY_BUCKETS)
E2E = Histogram("byo_e2e_request_latency_seconds",
                "From the request reaching the engine to its last output", ["dialect"],
                buckets=_LATENCY_BUCKETS)
RUNNING = Gauge("byo_requests_running", "Requests producing tokens now (first token sent)")
WAITING = Gauge("byo_requests_waiting", "Requests in the engine waiting for their first token")
PROMPT_TOKENS = Counter("byo_prompt_tokens", "Prompt tokens of requests handed to the engine")
OUTPUT_TOKENS = Counter("byo_output_tokens", "Output tokens sent to clients")
ABORTED = Counter("byo_requests_aborted", "Requests aborted in the engine because the client "
                  "went away")
ENGINE_READY = Gauge("byo_engine_ready", "1 when the engine serves, 0 while loading or dead")
ENGINE_INFO = Gauge("byo_engine_info", "1, labelled with what the engine runs as: runner "
                    "(generate | pooling), scheduling policy (fcfs | priority) and prefix "
                    "caching (on | off)", ["runner", "scheduling_policy", "prefix_caching"])
EMBEDDING_INPUTS = Counter("byo_embedding_inputs", "Inputs embedded (one vector each)")

# LoRA adapters (adapters.py), updated once per request or per load/eviction.
ADAPTER_LOADS = Counter("byo_adapter_loads", "Adapter loads into the engine", ["adapter"])
ADAPTER_LOAD_FAILURES = Counter("byo_adapter_load_failures",
                                "Adapter loads refused (bad source or files, engine refusal)",
                                ["adapter"])
ADAPTER_EVICTIONS = Counter("byo_adapter_evictions",
                            "Adapters evicted from the engine to make room (LRU)", ["adapter"])
ADAPTER_HITS = Counter("byo_adapter_hits",
                       "Requests that found their adapter already loaded", ["adapter"])
ADAPTER_LOAD_SECONDS = Histogram("byo_adapter_load_seconds",
                                 "From a load's start (fetch, checks) to the engine holding "
                                 "the adapter", ["adapter"], buckets=_LATENCY_BUCKETS)
ADAPTER_RESIDENT = Gauge("byo_adapter_resident",
                         "1 where each adapter is now: gpu (one of the engine's active slots), "
                         "cpu (the engine's adapter cache) or registered (known, not loaded)",
                         ["adapter", "where"])


def render() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
