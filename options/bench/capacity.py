"""``python -m options.bench --profile capacity``: measure one server's engine steps and fit the
capacity model the trace simulator runs (``cost.simulate.capacity``).

Every request streams with ``ignore_eos``, so each asks for and gets exactly its output length.
Each of ``--rounds`` rounds (3) sends the points below in a seeded random order, so that a slow
spell of a noisy machine lands on several points a little instead of on one a lot:

- prefill: serial requests (one at a time) of six prompt lengths from 16 tokens up to the
  server's ``max_model_len`` (capped at ``LONGEST_PROMPT``), ``SERIAL_REPEATS`` each, 8 output
  tokens: on an idle engine the TTFT is the request overhead plus the prefill step;
- decode: bursts of c requests sent at once, c in 1, 2, 4 … 64 (up to ``max_num_seqs``), 128
  prompt and 64 output tokens, at least ``MIN_BURSTS`` bursts and ``BURST_REQUESTS`` requests a
  round: after sharing the prefill budget the c sequences decode together, one token each per
  step. The point is the median request's time per output token (``(E2E − TTFT)/(tokens − 1)``,
  which counts tokens, unlike the gaps between text chunks: a chunk can carry several tokens);
- long context: the same with prompts of ~0.6 × ``max_model_len`` at c in 1, 4, 16, so the KV
  cache's share of a step is told apart from the sequences';
- then mixed: prompts of about half ``max_model_len`` sent one at a time while 8 others decode a
  long answer: the cost of a prefill inside a decode batch;
- last, with ``--replay TRACE`` (and the trace's ``--window``, ``--max-input``, ``--max-output``
  as a replay would take them): saturation with that trace's request mix. ``max_num_seqs`` ×
  ``SATURATION_IN_FLIGHT`` requests in flight, closed loop, sizes in the trace's order, each one
  answered is replaced at once, so the batch stays full and prompts keep arriving as answers
  finish. After ``SATURATION_WARMUP_S`` the server's own counters (``/metrics``:
  ``vllm:generation_tokens_total``, and ``vllm:num_requests_running`` sampled every 0.5 s) are
  read across ``SATURATION_WINDOW_S``: output tokens a second, and the batch that made them.
  What the replay at a --load of this profile will meet near capacity, measured instead of
  extrapolated from bursts of short prompts.
- after saturation, steady: the same mix sent open loop, Poisson arrivals offering each of
  ``STEADY_LOADS`` of the output tok/s just measured in turn, for ``STEADY_WINDOW_S`` or
  ``STEADY_MIN_REQUESTS`` requests, whichever lasts longer. For each answered
  request: its time per output token, and what its decode steps held on average (sequences
  decoding, their KV tokens, prompt tokens prefilled a second), read from every request's first
  and last token times; each load's requests grouped by that batch into up to ``STEADY_GROUPS``
  points. The regime a replay below capacity meets, where bursts (all sequences synchronous, no
  prompt arriving) misjudge the step. Each phase is also kept whole (``steady_phases``: its
  requests' times and sizes, and vLLM's own split of their TTFT into queue, prefill and the rest).

The server's limits come from ``--max-num-seqs``, ``--max-num-batched-tokens`` and
``--kv-cache-tokens`` where given, else from what the server says (``GET /v1/models``:
``max_model_len``; ``/metrics``: vLLM's ``vllm:cache_config_info``, the KV cache in tokens), else
from the engine settings of a server the bench started, else vLLM's defaults; each is recorded
with its source. ``cost.simulate.capacity.fit_capacity`` fits the model to the points; the fit
must reproduce the decode points within 10 % and the prefill points within 15 %, which is printed
(and kept in the JSON as ``capacity_model.fit.check``).
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from cost.simulate.capacity import STEADY_GROUPS, STEADY_MIN_GROUP, STEADY_SAMPLES, group_by_batch
from options.bench import runner
from options.bench.metrics import RequestRecord, metric_sum, prometheus_samples, summarize
from options.bench.profile import Profile, PromptTokens, make_prompt, parse_lengths
from options.core import BadInput

DECODE_PROMPT_TOKENS = 128
DECODE_OUTPUT_TOKENS = 64
# Bursts past 64 were tried (up to max_num_seqs, 128 here): the step no longer grew linearly there
# (the fit missed its 10 % bound) and the replays' predictions near capacity did not improve.
CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64)
LONG_CONCURRENCIES = (1, 4, 16)
SERIAL_OUTPUT_TOKENS = 8
SERIAL_REPEATS = 5                  # per prompt length and round
SHORTEST_PROMPT = 16
# Beyond a few thousand tokens attention's quadratic cost shows in a prefill, which a step model
# linear in tokens cannot follow; traces' prompts are mostly shorter.
LONGEST_PROMPT = 8192
LONG_PROMPT_CAP = 4096
BURST_REQUESTS = 12                 # requests per decode point and round (bursts of c) …
LONG_BURST_REQUESTS = 4
MIN_BURSTS = 3                      # … and at least this many bursts: one slow burst is not the point
MIXED_BACKGROUND = 8                # sequences decoding while the mixed point's prompts arrive
MIXED_BACKGROUND_OUTPUT = 512
MIXED_PROBES = 6                    # per round, at most
# Prompts are sized through the calibration (words → tokens), which is close but not exact: stay
# this far under max_model_len so no prompt is refused.
PROMPT_SAFETY = 0.9
# Fewer text chunks per output token than this and a stream came in clumps: the server's front end
# or this client was kept off the CPU, so the gaps say nothing of the engine's steps. (A healthy
# stream of the tiny model's byte-level tokens gives ~0.75: a token that is part of a character
# comes with the next one.)
CLUMPED_BELOW = 0.4
# The saturation point: requests in flight per max_num_seqs (more than the batch holds, so a
# finished answer's slot is taken at once), and how long it runs before and while it is read.
SATURATION_IN_FLIGHT = 1.25
SATURATION_WARMUP_S = 6.0
SATURATION_WINDOW_S = 12.0
SATURATION_SAMPLE_S = 0.5
# The steady points: the load offered (of the saturated output tok/s) and how long arrivals last,
# at least; how they are grouped is cost.simulate.capacity's (STEADY_GROUPS, STEADY_MIN_GROUP, ...).
STEADY_LOADS = (0.6, 0.85)
STEADY_WINDOW_S = 10.0
# ...and how many requests a phase sends, at least: a slow server (a few requests a second) gets a
# longer phase. On an AVX2 host a 10 s phase sent 40-55 requests: three or four groups of 13, so
# noisy that the 85 % phase's largest batch came out below the 60 % phase's.
STEADY_MIN_REQUESTS = 10 * STEADY_MIN_GROUP
# Planning when the server does not say its max_model_len (a SageMaker endpoint, a plain URL).
ASSUMED_MAX_MODEL_LEN = 2048
# vLLM 0.32's limits when none are set (engine/arg_utils.py, OpenAI API server): on CPU, the
# engine the bench starts on this machine; on a GPU under 70 GiB, the likeliest remote server.
VLLM_CPU_DEFAULTS = {"max_num_seqs": 128, "max_num_batched_tokens": 2048}
VLLM_GPU_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
# Environment variables that set the engine's limits on the bring-your-own server, first wins
# (vLLM's own spelling, then LMI's, then LMI's shortcut).
LIMIT_VARIABLES = {
    "max_num_seqs": ("SM_VLLM_MAX_NUM_SEQS", "OPTION_MAX_ROLLING_BATCH_SIZE", "MAX_BATCH_SIZE"),
    "max_num_batched_tokens": ("SM_VLLM_MAX_NUM_BATCHED_TOKENS", "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS"),
    "max_model_len": ("SM_VLLM_MAX_MODEL_LEN", "OPTION_MAX_MODEL_LEN"),
}


def add_arguments(parser) -> None:
    """The capacity profile's flags (for ``--profile capacity``)."""
    g = parser.add_argument_group("server limits (--profile capacity), where the server does not say them")
    g.add_argument("--max-num-seqs", type=int, metavar="N",
                   help="the server's vLLM max_num_seqs (default: what the server the bench starts "
                        "was configured with, else vLLM's default)")
    g.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                   help="the server's vLLM max_num_batched_tokens (default: as --max-num-seqs)")
    g.add_argument("--kv-cache-tokens", type=int, metavar="N",
                   help="the server's KV cache in tokens (default: from its /metrics)")


def check_args(args) -> None:
    """Bad input for --profile capacity, found before any server starts."""
    from options.core import BEDROCK, rung

    if args.level is not None and not args.url and rung(args.level).can.dialect == BEDROCK:
        raise BadInput("--profile capacity measures a server's engine steps with exact output lengths "
                       "(ignore_eos), which Bedrock has no switch for: measure a self-hosted rung")
    if args.adapters:
        raise BadInput("--profile capacity measures the base model: leave out --adapters")
    for flag, value in (("--time-scale", args.time_scale), ("--load", args.load),
                        ("--capacity", args.capacity)):
        if value is not None:
            raise BadInput(f"{flag} paces a replay; --profile capacity saturates the server (with "
                           "--replay TRACE: that trace's request mix): leave it out")
    if args.rounds < 1:
        raise BadInput(f"--rounds {args.rounds} must be at least 1")
    for flag in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise BadInput(f"--{flag.replace('_', '-')} {value} must be at least 1")


def saturation_mix(args) -> list[tuple[int, int]] | None:
    """The (input, output) sizes of the saturation point's requests: the ``--replay`` trace's,
    cut and clipped as its replay would send them (``cost.traces.sent_sizes``); None without
    --replay (after refusing the trace's flags given without it)."""
    from cost.traces import sent_sizes, trace_from_args

    if not args.replay:
        trace_from_args(args)                # refuses --window, --scale, ... without --replay
        for flag, value in (("--max-input", args.max_input), ("--max-output", args.max_output)):
            if value is not None:
                raise BadInput(f"{flag} clips a trace's sizes: add --replay TRACE (the mix the "
                               "profile saturates the server with), or leave it out")
        return None
    for flag, value in (("--max-input", args.max_input), ("--max-output", args.max_output)):
        if value is not None and value < 1:
            raise BadInput(f"{flag} {value} must be a whole number >= 1")
    trace = trace_from_args(args)
    if len(trace) == 0:
        raise BadInput(f"--replay {args.replay}: no requests for the saturation point"
                       + (f" in --window {args.trace_window}" if args.trace_window else ""))
    sizes = sent_sizes(trace, args.max_input, args.max_output)
    return list(zip(sizes.input_tokens.tolist(), sizes.output_tokens.tolist()))


# --- the server's limits ---------------------------------------------------------------------

@dataclass
class ServerLimits:
    values: dict[str, int | None] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value: int | None, source: str) -> None:
        self.values[name], self.sources[name] = value, source

    def __getitem__(self, name: str):
        return self.values[name]


def discover_limits(args, details: dict[str, Any]) -> ServerLimits:
    """The server's max_num_seqs, max_num_batched_tokens, KV cache tokens and max_model_len, each
    with where it came from."""
    url = details.get("url")
    models = _models_entry(url)
    cache = _cache_config(url)
    started_here = str(details.get("server", "")).startswith("started by the bench")
    configured = _configured_limits(args) if started_here else {}
    defaults, said = ((VLLM_CPU_DEFAULTS, "vLLM 0.32's default for its API server on CPU")
                      if started_here else
                      (VLLM_GPU_DEFAULTS, "assumed: vLLM 0.32's default for its API server on a "
                                          "GPU under 70 GiB (the server does not say; give --{flag})"))
    limits = ServerLimits()
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        flag = getattr(args, name)
        if flag is not None:                         # >= 1: check_args saw to it
            limits.set(name, flag, f"--{name.replace('_', '-')}")
        elif _whole(models.get(name)):
            limits.set(name, models[name], "GET /v1/models")
        elif name in configured:
            limits.set(name, *configured[name])
        else:
            limits.set(name, defaults[name], said.format(flag=name.replace("_", "-")))
    if _whole(models.get("max_model_len")):
        limits.set("max_model_len", models["max_model_len"], "GET /v1/models")
    elif "max_model_len" in configured:
        limits.set("max_model_len", *configured["max_model_len"])
    else:
        limits.set("max_model_len", None, "unknown (the server does not say)")
    if args.kv_cache_tokens is not None:
        limits.set("kv_cache_tokens", args.kv_cache_tokens, "--kv-cache-tokens")
    elif cache is not None:
        limits.set("kv_cache_tokens", *cache)
    else:
        longest = limits["max_model_len"] or ASSUMED_MAX_MODEL_LEN
        limits.set("kv_cache_tokens", limits["max_num_seqs"] * longest,
                   "assumed: room for every sequence at full length (the server's /metrics has no "
                   "vllm:cache_config_info; give --kv-cache-tokens)")
    return limits


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _models_entry(url: str | None) -> dict[str, Any]:
    """The first model of GET /v1/models (vLLM's and the bring-your-own server's carry
    max_model_len), or {}."""
    if not url:
        return {}
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=5) as r:
            data = json.load(r).get("data") or [{}]
            return data[0] if isinstance(data[0], dict) else {}
    except Exception:  # a server without the route just says less
        return {}


def _cache_config(url: str | None) -> tuple[int, str] | None:
    page = runner.metrics_page(url)
    return kv_cache_from_metrics(page) if page else None


def kv_cache_from_metrics(page: str) -> tuple[int, str] | None:
    """The KV cache in tokens from a Prometheus page's ``vllm:cache_config_info`` labels:
    ``kv_cache_size_tokens`` where vLLM gives it, else ``num_gpu_blocks`` × ``block_size``; and
    which. None where the page has neither."""
    for name, labels, _ in prometheus_samples(page):
        if name != "vllm:cache_config_info":
            continue
        size = labels.get("kv_cache_size_tokens", "")
        if size.isdigit() and int(size) > 0:
            return int(size), "/metrics vllm:cache_config_info kv_cache_size_tokens"
        blocks, block = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and block.isdigit() and int(blocks) * int(block) > 0:
            return int(blocks) * int(block), "/metrics vllm:cache_config_info num_gpu_blocks × block_size"
    return None


def _configured_limits(args) -> dict[str, tuple[int, str]]:
    """The limits a server the bench started was configured with: its environment (the bench's
    own, under what the rung's configuration set), read as the server reads it."""
    env = {**os.environ, **(getattr(args, "server_env", None) or {})}
    out = {}
    for name, variables in LIMIT_VARIABLES.items():
        for var in variables:
            value = env.get(var, "").strip()
            if value.isdigit() and int(value) >= 1:
                out[name] = (int(value), f"{var}={value} (the server the bench started)")
                break
    return out


# --- the plan --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CapacityPlan:
    serial_prompts: tuple[int, ...]
    decode: tuple[tuple[int, int], ...]          # (concurrency, prompt tokens)
    mixed_background: int
    mixed_background_output: int
    mixed_prompt: int

    @classmethod
    def for_limits(cls, limits: ServerLimits) -> "CapacityPlan":
        max_len = limits["max_model_len"] or ASSUMED_MAX_MODEL_LEN
        seqs, budget, kv = limits["max_num_seqs"], limits["max_num_batched_tokens"], limits["kv_cache_tokens"]
        longest = min(LONGEST_PROMPT, int(PROMPT_SAFETY * (max_len - SERIAL_OUTPUT_TOKENS)))
        if longest < 2 * SHORTEST_PROMPT:
            raise BadInput(f"max_model_len {max_len} leaves no room for a capacity profile's prompts "
                           f"(at least {2 * SHORTEST_PROMPT + SERIAL_OUTPUT_TOKENS} tokens)")
        serial = sorted({SHORTEST_PROMPT, longest // 8, longest // 4, longest // 2, 3 * longest // 4, longest})
        short = min(DECODE_PROMPT_TOKENS, longest // 2)
        long_prompt = min(LONG_PROMPT_CAP, int(PROMPT_SAFETY * (0.75 * max_len)) - DECODE_OUTPUT_TOKENS)
        decode = [(c, short) for c in CONCURRENCIES
                  if c <= seqs and c * (short + DECODE_OUTPUT_TOKENS) <= kv]
        if long_prompt > 2 * short:
            decode += [(c, long_prompt) for c in LONG_CONCURRENCIES
                       if c <= seqs and c * (long_prompt + DECODE_OUTPUT_TOKENS) <= 0.9 * kv]
        background = min(MIXED_BACKGROUND, seqs - 1)
        background_output = min(MIXED_BACKGROUND_OUTPUT, int(PROMPT_SAFETY * max_len) - short)
        mixed_prompt = min(longest // 2, budget - background)
        if background < 1 or background_output < 4 * DECODE_OUTPUT_TOKENS or mixed_prompt < SHORTEST_PROMPT:
            background = 0                          # no room for the mixed point on this server
        return cls(tuple(serial), tuple(decode), background, background_output, mixed_prompt)

    def requests_per_round(self) -> int:
        """Requests a round sends (the mixed point's probes not counted: they depend on timing)."""
        return (len(self.serial_prompts) * SERIAL_REPEATS
                + sum(c * _bursts(c, p, self.decode) for c, p in self.decode) + self.mixed_background)


def _bursts(concurrency: int, prompt: int, decode) -> int:
    """Bursts of ``concurrency`` a round sends for a decode point: enough for its requests."""
    long = prompt != min(p for _, p in decode)
    return max(MIN_BURSTS, math.ceil((LONG_BURST_REQUESTS if long else BURST_REQUESTS) / concurrency))


# --- measuring -------------------------------------------------------------------------------

class Measurer:
    """Sends the plan's requests (each profile seeded anew, so no prompt finds another's in the
    prefix cache) and keeps their records by point."""

    def __init__(self, send, template, tokens: PromptTokens | None, seed: int,
                 on_request: Callable[[RequestRecord], None]):
        self.send, self.template, self.tokens = send, template, tokens
        self.seed, self.runs = seed, 0
        self.on_request = on_request

    def run(self, requests: int, prompt: int, output: int, concurrency: int) -> runner.Run:
        self.runs += 1
        profile = Profile(requests=requests, prompt_tokens=parse_lengths(str(prompt), "prompt", ()),
                          output_tokens=parse_lengths(str(output), "output", ()),
                          concurrency=concurrency, seed=self.seed * 100_003 + self.runs)
        return runner.run(profile, self.send, self.template, lambda _n, rec: self.on_request(rec),
                          self.tokens)

    def probe(self, prompt: int, index: int) -> RequestRecord:
        rng = random.Random(self.seed * 100_003 + 50_000 + index)
        words = (self.tokens or PromptTokens()).words_for(prompt)
        req = replace(self.template, prompt=make_prompt(rng, words, 1_000_000 + index), messages=None,
                      max_tokens=SERIAL_OUTPUT_TOKENS, stream=True)
        rec = runner.measure(self.send, req)
        self.on_request(rec)
        return rec


@dataclass
class Collected:
    serial: dict[int, list[RequestRecord]] = field(default_factory=dict)
    decode: dict[tuple[int, int], list[tuple[int, RequestRecord]]] = field(default_factory=dict)   # (round, rec)
    decode_runs: dict[tuple[int, int], list[runner.Run]] = field(default_factory=dict)
    mixed: list[dict[str, float]] = field(default_factory=list)
    mixed_background: list[RequestRecord] = field(default_factory=list)
    saturation: dict[str, Any] | None = None
    steady: list[dict[str, Any]] = field(default_factory=list)
    steady_phases: list[dict[str, Any]] = field(default_factory=list)
    started_at: str | None = None


def measure(plan: CapacityPlan, m: Measurer, rounds: int, say_phase: Callable[[str], None]) -> Collected:
    """Every round: the serial requests and the decode bursts in a seeded random order (so a slow
    spell of the machine lands on several points a little, not on one a lot), then the mixed point."""
    got = Collected()
    probes = 0
    for r in range(rounds):
        tasks = [("prefill", 1, prompt) for prompt in plan.serial_prompts for _ in range(SERIAL_REPEATS)]
        tasks += [("decode", c, prompt) for c, prompt in plan.decode
                  for _ in range(_bursts(c, prompt, plan.decode))]
        random.Random(m.seed * 7919 + r).shuffle(tasks)
        for kind, c, prompt in tasks:
            say_phase(f"round {r + 1}/{rounds}: {kind}, {c} × {prompt}-token prompt")
            if kind == "prefill":
                run = m.run(1, prompt, SERIAL_OUTPUT_TOKENS, 1)
                got.serial.setdefault(prompt, []).extend(run.records)
            else:
                run = m.run(c, prompt, DECODE_OUTPUT_TOKENS, c)
                got.decode.setdefault((c, prompt), []).extend((r, rec) for rec in run.records)
                got.decode_runs.setdefault((c, prompt), []).append(run)
            got.started_at = got.started_at or run.started_at
        if plan.mixed_background:
            say_phase(f"round {r + 1}/{rounds}: mixed, {plan.mixed_prompt}-token prompts while "
                      f"{plan.mixed_background} decode")
            probes = _measure_mixed(plan, m, got, probes)
    return got


def _measure_mixed(plan: CapacityPlan, m: Measurer, got: Collected, probes: int) -> int:
    """One background burst decoding a long answer, and prompts sent one at a time while it runs.

    A probe counts where every background sequence had its first token before the probe was sent
    and none had finished when the probe's last token came; the background's KV tokens at the
    probe are interpolated from each sequence's first and last token times.
    """
    bg, out = plan.mixed_background, plan.mixed_background_output
    step = _decode_step_estimate(got, bg)
    first = _median([rec.ttft_s for key, recs in got.decode.items() if key[0] == bg
                     for _, rec in recs if rec.ttft_s is not None]) or 0.05
    holder: dict[str, runner.Run] = {}
    t0 = time.perf_counter()
    thread = threading.Thread(target=lambda: holder.update(
        run=m.run(bg, DECODE_PROMPT_TOKENS, out, bg)), daemon=True)
    thread.start()
    time.sleep(2 * first + 4 * step)                   # after the background's prefill
    sent: list[tuple[float, RequestRecord]] = []
    deadline = 0.8 * (first + out * step)
    # Spread over the background's answer, so the probes meet its KV cache at several sizes; at
    # least a few steps apart, so the batch settles between them.
    interval = max(3 * step, (deadline - (time.perf_counter() - t0)) / MIXED_PROBES)
    while thread.is_alive() and time.perf_counter() - t0 < deadline and len(sent) < MIXED_PROBES:
        at = time.perf_counter() - t0
        sent.append((at, m.probe(plan.mixed_prompt, probes)))
        probes += 1
        time.sleep(max(0.0, at + interval - (time.perf_counter() - t0)))
    thread.join()
    background = holder["run"].records if "run" in holder else []
    got.mixed_background.extend(background)
    done = [b for b in background if b.ok and b.ttft_s is not None and b.e2e_s is not None]
    if len(done) < bg:
        return probes
    for at, rec in sent:
        if not rec.ok or rec.ttft_s is None or rec.e2e_s is None:
            continue
        if at < max(b.ttft_s for b in done) or at + rec.e2e_s > min(b.e2e_s for b in done):
            continue                                   # the background was not all decoding
        kv = sum(b.input_tokens + 1 + (b.output_tokens - 1) * (at - b.ttft_s) / (b.e2e_s - b.ttft_s)
                 for b in done)
        got.mixed.append({"ttft_s": rec.ttft_s, "prompt_tokens": rec.input_tokens, "background_kv_tokens": kv})
    return probes


def _metric_sum(url: str, name: str) -> float | None:
    page = runner.metrics_page(url)
    return None if page is None else metric_sum(page, name)


def measure_saturation(m: Measurer, url: str | None, mix: list[tuple[int, int]], max_num_seqs: int,
                       warmup_s: float = SATURATION_WARMUP_S, window_s: float = SATURATION_WINDOW_S
                       ) -> tuple[dict[str, Any] | None, str | None]:
    """The saturation point (see the module docstring), or None and why."""
    if not url:
        return None, "saturation: the target has no URL whose /metrics could be read: left out"
    generated = "vllm:generation_tokens_total"
    if _metric_sum(url, generated) is None:
        return None, f"saturation: the server's /metrics has no {generated}: left out"
    in_flight = math.ceil(max_num_seqs * SATURATION_IN_FLIGHT)
    stop = threading.Event()
    answered: list[tuple[int, int]] = []      # (input tokens asked for, the server's count)
    failed: dict[str, int] = {}
    lock = threading.Lock()

    def worker(k: int) -> None:
        rng = random.Random(m.seed * 100_003 + 70_000 + k)
        words = m.tokens or PromptTokens()
        while not stop.is_set():
            i_tok, o_tok = mix[k % len(mix)]
            req = replace(m.template, prompt=make_prompt(rng, words.words_for(i_tok), 2_000_000 + k),
                          messages=None, max_tokens=o_tok, stream=True)
            rec = runner.measure(m.send, req)
            m.on_request(rec)
            with lock:
                if rec.ok:
                    answered.append((i_tok, rec.input_tokens or i_tok))
                else:
                    failed[rec.error or "failed"] = failed.get(rec.error or "failed", 0) + 1
            k += in_flight

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(in_flight)]
    for t in threads:
        t.start()
    try:
        time.sleep(warmup_s)
        t0, g0 = time.monotonic(), _metric_sum(url, generated)
        running: list[float] = []
        while time.monotonic() - t0 < window_s:
            time.sleep(SATURATION_SAMPLE_S)
            value = _metric_sum(url, "vllm:num_requests_running")
            if value is not None:
                running.append(value)
        t1, g1 = time.monotonic(), _metric_sum(url, generated)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    if g0 is None or g1 is None or g1 <= g0 or not running:
        return None, ("saturation: no output tokens counted in the window"
                      + (f" (failures: {', '.join(f'{k}: {v}' for k, v in failed.items())})" if failed else ""))
    # The mix's mean sizes, the prompt's as the server counts it (prompts are built from a
    # words-to-tokens calibration: a few % off what was asked for). Outputs are exact (ignore_eos).
    counted = sum(c for _, c in answered) / sum(i for i, _ in answered) if answered else 1.0
    mean_in = statistics.mean(i for i, _ in mix) * counted
    mean_out = statistics.mean(o for _, o in mix)
    tok_s = (g1 - g0) / (t1 - t0)
    return {"kind": "saturation", "running_seqs": statistics.mean(running),
            "input_tokens": mean_in, "output_tokens": mean_out, "token_s": 1.0 / tok_s,
            "output_tokens_per_second": tok_s, "in_flight": in_flight, "window_s": t1 - t0,
            "running_seqs_min": min(running), "running_seqs_max": max(running),
            "requests_answered": len(answered), "requests_failed": sum(failed.values())}, None


def measure_steady(m: Measurer, mix: list[tuple[int, int]], saturation: dict[str, Any],
                   load: float, window_s: float = STEADY_WINDOW_S, url: str | None = None
                   ) -> tuple[list[dict[str, Any]], str | None, dict[str, Any]]:
    """The steady points at one ``load`` (see the module docstring), or none and why; and the
    phase itself (``steady_phase``)."""
    import numpy as np

    from options.bench.replay import read_server_latencies, send_open_loop, server_view

    mean_out = statistics.mean(o for _, o in mix)
    rate = load * saturation["output_tokens_per_second"] / mean_out          # requests a second
    phase = round(load * 100)                 # seeds and prompt numbers of their own per load
    arrivals = np.cumsum(np.random.default_rng([m.seed, 7_919, phase]).exponential(
        1 / rate, max(math.ceil(rate * window_s), STEADY_MIN_REQUESTS)))
    sizes = [mix[i % len(mix)] for i in range(len(arrivals))]
    words = m.tokens or PromptTokens()

    def build(i: int):
        rng = random.Random(f"{m.seed}:steady:{phase}:{i}")
        return replace(m.template, prompt=make_prompt(rng, words.words_for(sizes[i][0]),
                                                      3_000_000 + phase * 10_000 + i),
                       messages=None, max_tokens=sizes[i][1], stream=True)

    before = read_server_latencies(url)
    run = send_open_loop(arrivals.tolist(), build, m.send, [i for i, _ in sizes])
    for rec in run.records:
        m.on_request(rec)
    phase_doc = steady_phase(load, rate, run.sent_s, run.records, server_view(before, read_server_latencies(url),
                                                                               run.records))
    points = steady_points(run.sent_s, run.records)
    if not points:
        failed = sum(1 for r in run.records if not r.ok)
        return [], (f"steady at {load:.0%}: too few answers to group ({len(run.records) - failed} of {len(run.records)} "
                    f"answered, {STEADY_MIN_GROUP} needed a group): left out"), phase_doc
    return [{**p, "load": load, "request_rate": rate} for p in points], None, phase_doc


def steady_phase(load: float, rate: float, sent_s: list[float | None], records: list[RequestRecord],
                 server: dict[str, Any] | None) -> dict[str, Any]:
    """One steady phase as the profile keeps it: its answered requests, column by column (send
    time, TTFT, E2E, sizes: what ``steady_points`` grouped, so another grouping or another term
    can be fitted from the file later), and the server's own split of their TTFT
    (``replay.server_view``), which says how much of it lies outside the engine at this load."""
    done = [(t, r) for t, r in zip(sent_s, records) if t is not None and r.ok and r.ttft_s is not None
            and r.e2e_s is not None]
    return {"load": load, "request_rate": rate, "sent": len(records),
            "requests": {"sent_s": [round(t, 6) for t, _ in done], "ttft_s": [round(r.ttft_s, 6) for _, r in done],
                         "e2e_s": [round(r.e2e_s, 6) for _, r in done],
                         "input_tokens": [r.input_tokens for _, r in done],
                         "output_tokens": [r.output_tokens for _, r in done]},
            "server": server}


def steady_points(sent_s: list[float | None], records: list[RequestRecord],
                  groups: int = STEADY_GROUPS, min_group: int = STEADY_MIN_GROUP,
                  samples: int = STEADY_SAMPLES) -> list[dict[str, Any]]:
    """Group open-loop requests by the batch their decode met: the ``steady`` points
    (``cost.simulate.capacity.group_by_batch``, from each answered request's send time and
    client timings)."""
    done = [(s, r) for s, r in zip(sent_s, records) if s is not None and r.ok]
    return group_by_batch([s for s, _ in done], [r.ttft_s for _, r in done], [r.e2e_s for _, r in done],
                          [r.input_tokens for _, r in done], [r.output_tokens for _, r in done],
                          groups=groups, min_group=min_group, samples=samples)


def _decode_step_estimate(got: Collected, concurrency: int) -> float:
    """The measured time per output token at the decode point nearest ``concurrency``."""
    if not got.decode:
        return 0.05
    c, p = min(got.decode, key=lambda key: (abs(key[0] - concurrency), key[1]))
    return _median([rec.tpot_s for _, rec in got.decode[(c, p)] if rec.tpot_s]) or 0.05


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# --- the profile and the fit ----------------------------------------------------------------

def capacity_profile(plan: CapacityPlan, got: Collected, limits: ServerLimits, rounds: int) -> tuple[dict, list[str]]:
    """The ``capacity_profile`` document (what fit_capacity reads), and notes on points dropped."""
    points, notes = [], []
    for prompt, recs in got.serial.items():
        ok = [r for r in recs if r.ok and r.ttft_s is not None and r.input_tokens]
        if not ok:
            notes.append(f"prefill {prompt}: every request failed ({_errors(recs)})")
            continue
        ttfts = [r.ttft_s for r in ok]
        points.append({"kind": "prefill", "prompt_tokens": statistics.mean(r.input_tokens for r in ok),
                       "output_tokens": SERIAL_OUTPUT_TOKENS, "ttft_s": statistics.median(ttfts),
                       "ttft_s_min": min(ttfts), "ttft_s_max": max(ttfts), "samples": len(ok),
                       "step_s": _median(r.tpot_s for r in ok)})
    for (c, prompt), pairs in got.decode.items():
        exact = [(rnd, r) for rnd, r in pairs if r.ok and r.tpot_s and r.output_tokens == DECODE_OUTPUT_TOKENS]
        ok = [(rnd, r) for rnd, r in exact if len(r.itl_s) + 1 >= CLUMPED_BELOW * r.output_tokens]
        if len(ok) < len(exact):
            notes.append(f"decode c={c}, prompt {prompt}: {len(exact) - len(ok)} of {len(exact)} streams came "
                         "in clumps (the server's front end or this client was short of CPU): left out")
        if not ok:
            notes.append(f"decode c={c}, prompt {prompt}: no request gave {DECODE_OUTPUT_TOKENS} tokens "
                         f"({_errors([r for _, r in pairs])})")
            continue
        recs = [r for _, r in ok]
        runs = got.decode_runs[(c, prompt)]
        per_round = [_median(r.tpot_s for rnd, r in ok if rnd == k) for k in range(rounds)]
        mean_prompt = statistics.mean(r.input_tokens for r in recs)
        points.append({"kind": "decode", "requests": c, "prompt_tokens": mean_prompt,
                       "output_tokens": DECODE_OUTPUT_TOKENS,
                       "step_s": statistics.median(r.tpot_s for r in recs),
                       "kv_tokens": c * (mean_prompt + DECODE_OUTPUT_TOKENS / 2),
                       "itl_p50_s": _median(g for r in recs for g in r.itl_s),
                       "ttft_p50_s": _median(r.ttft_s for r in recs),
                       "step_s_by_round": [x for x in per_round if x is not None],
                       "output_tokens_per_second": sum(r.output_tokens for r in recs)
                       / sum(run.duration_s for run in runs),
                       "samples": len(recs), "clumped": len(exact) - len(ok)})
    if got.mixed:
        bgs = [b for b in got.mixed_background if b.ok and b.tpot_s]
        points.append({"kind": "mixed", "background_seqs": plan.mixed_background,
                       "background_kv_tokens": statistics.median(p["background_kv_tokens"] for p in got.mixed),
                       "prompt_tokens": statistics.mean(p["prompt_tokens"] for p in got.mixed),
                       "ttft_s": statistics.median(p["ttft_s"] for p in got.mixed),
                       "background_step_s": _median(b.tpot_s for b in bgs), "samples": len(got.mixed)})
    elif plan.mixed_background:
        notes.append("mixed: no prompt arrived while the whole background was decoding")
    if got.saturation is not None:
        points.append(got.saturation)
    points += got.steady
    order = {"prefill": 0, "decode": 1, "mixed": 2, "saturation": 3, "steady": 4}
    points.sort(key=lambda p: (order[p["kind"]], (round(p["prompt_tokens"], -2), p["requests"]) if p["kind"] == "decode"
                               else p.get("decoding_seqs", p.get("prompt_tokens", 0))))
    profile = {"schema": "spectrum.capacity_profile/1", "limits": dict(limits.values),
               "limit_sources": dict(limits.sources), "rounds": rounds, "points": points,
               "method": {"decode_prompt_tokens": DECODE_PROMPT_TOKENS,
                          "decode_output_tokens": DECODE_OUTPUT_TOKENS,
                          "serial_output_tokens": SERIAL_OUTPUT_TOKENS, "serial_repeats": SERIAL_REPEATS,
                          "step_s": "decode: median over requests of (E2E − TTFT)/(output tokens − 1)"}}
    if got.steady_phases:
        profile["steady_phases"] = got.steady_phases
    return profile, notes


def _errors(records) -> str:
    kinds: dict[str, int] = {}
    for r in records:
        if r.error:
            kinds[r.error] = kinds.get(r.error, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in kinds.items()) or "no errors, but no usable timings"


# --- the command -----------------------------------------------------------------------------

def bench_capacity(args, template, send, details, console, mix: list[tuple[int, int]] | None = None) -> int:
    """``python -m options.bench --profile capacity``: measure, fit, write JSON, print tables."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cost.simulate.capacity import fit_capacity
    from options.bench import report
    from options.bench.warmup import warm_up_and_calibrate

    check_args(args)
    template = replace(template, ignore_eos=True, stream=True)
    ready, tokens = warm_up_and_calibrate(args, send, template, console, args.seed)
    if not ready:
        return 1
    limits = discover_limits(args, details)
    plan = CapacityPlan.for_limits(limits)
    with Progress(TextColumn("[bold]capacity"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[phase]}"), TimeElapsedColumn(),
                  console=console, disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("requests", total=plan.requests_per_round() * args.rounds, phase="")
        counted = [0]

        def on_request(_rec) -> None:
            counted[0] += 1
            total = max(bar.tasks[0].total or 0, counted[0])
            bar.update(task, completed=counted[0], total=total)

        measurer = Measurer(send, template, tokens, args.seed, on_request)
        got = measure(plan, measurer, args.rounds, lambda phase: bar.update(task, phase=phase))
        saturation_note = None
        if mix:
            bar.update(task, phase=f"saturation: the trace's mix, {len(mix):,} request sizes")
            got.saturation, saturation_note = measure_saturation(
                measurer, details.get("url"), mix, limits["max_num_seqs"])
        steady_notes = []
        for load in STEADY_LOADS if got.saturation is not None else ():
            bar.update(task, phase=f"steady: the trace's mix at {load:.0%} of the saturated rate")
            points, note, phase = measure_steady(measurer, mix, got.saturation, load, url=details.get("url"))
            got.steady += points
            got.steady_phases.append(phase)
            steady_notes += [note] if note else []
    profile, notes = capacity_profile(plan, got, limits, args.rounds)
    notes += [note for note in (saturation_note, *steady_notes) if note]
    for note in notes:
        console.print(f"[yellow]{note}[/yellow]")
    kinds = {p["kind"] for p in profile["points"]}
    if not {"prefill", "decode"} <= kinds:
        console.print("[red]too few points measured to fit a capacity model[/red] (need prefill and "
                      "decode points; see the notes above)")
        return 1
    origin = _origin(args, details)
    model = fit_capacity(profile, origin)
    # The document's metrics (what older readers take as the capacity): the highest concurrency
    # measured with the short prompt, all its bursts.
    short = min(p for _, p in got.decode_runs)
    top_key = max(k for k in got.decode_runs if k[1] == short)
    top_runs = got.decode_runs[top_key]
    summary = summarize([r for run in top_runs for r in run.records], sum(run.duration_s for run in top_runs))
    top_profile = Profile(requests=summary.completed + sum(summary.errors.values()),
                          prompt_tokens=parse_lengths(str(top_key[1]), "prompt", ()),
                          output_tokens=parse_lengths(str(DECODE_OUTPUT_TOKENS), "output", ()),
                          concurrency=top_key[0], seed=args.seed)
    details = {**details, "ignore_eos": True, "warmup_requests": args.warmup,
               "prompt_calibration": tokens.to_json() if tokens else None,
               "metrics_from": f"the decode point at concurrency {top_key[0]} (prompt {top_key[1]} tokens), "
                               f"all its bursts over {args.rounds} rounds"}
    doc = report.bench_json(summary, top_profile, level=args.level, target=args.target,
                            model=template.model or args.model or details.get("served_model"),
                            started_at=got.started_at or "", details=details)
    doc["capacity_profile"] = profile
    doc["capacity_model"] = model.to_json()
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(render_tables(model, profile))
    return 0


def _origin(args, details) -> str:
    where = details.get("url") or details.get("endpoint") or "the target"
    return (f"{args.json or '(not saved)'}: python -m options.bench --profile capacity on {where}"
            + (f" (level {args.level})" if args.level is not None else ""))


def render_tables(model, profile: dict[str, Any]):
    """Points (measured, fitted, residual), the coefficients, the limits, and the verdict."""
    from rich.console import Group
    from rich.table import Table

    from cost.simulate.capacity import TOLERANCE, wave_terms

    fit = model.fit
    points = Table(title="capacity profile: measured vs the fitted model",
                   caption="prefill: TTFT of one request on an idle server; decode: median time per "
                           "output token in bursts of c requests; mixed: TTFT of a prompt while others decode; "
                           "saturation: time per output token of the whole server; steady: median time per "
                           "output token of requests that met that batch")
    for col in ("point", "KV tokens", "measured ms", "fitted ms", "residual"):
        points.add_column(col, justify="left" if col == "point" else "right")
    bursts = Table(title="bursts: TTFT p50 (not fitted; includes the front end taking requests in turn)")
    for col in ("burst", "measured ms", "model ms"):
        bursts.add_column(col, justify="left" if col == "burst" else "right")
    coef = model.coefficients()
    for p in fit["points"]:
        tol = TOLERANCE.get(p["kind"])
        mark = "" if tol is None else (" ✓" if abs(p["residual"]) <= tol else " ✗")
        if p["kind"] == "prefill":
            label, kv = f"prefill {p['prompt_tokens']:,.0f} tok", p["prompt_tokens"]
        elif p["kind"] == "decode":
            label, kv = f"decode c={p['requests']}, prompt {p['prompt_tokens']:,.0f}", p.get("kv_tokens", 0)
        elif p["kind"] == "saturation":
            label = (f"saturation: {p['running_seqs']:.0f} running, the trace's mix "
                     f"({p['input_tokens']:,.0f} in / {p['output_tokens']:,.0f} out)")
            kv = p["running_seqs"] * (p["input_tokens"] + p["output_tokens"] / 2)
        elif p["kind"] == "steady":
            label = (f"steady at {p['load']:.0%}: {p['decoding_seqs']:.1f} decoding, "
                     f"{p['prefill_tokens_per_s']:,.0f} prompt tok/s ({p.get('requests', '?')} requests)")
            kv = p["kv_tokens"]
        else:
            label = f"mixed {p['prompt_tokens']:,.0f} tok + {p['background_seqs']} decoding"
            kv = p["background_kv_tokens"] + p["prompt_tokens"]
        points.add_row(label, f"{kv:,.0f}", f"{p['measured_s'] * 1e3:.3f}", f"{p['predicted_s'] * 1e3:.3f}",
                       f"{p['residual']:+.1%}{mark}")
        if p["kind"] == "decode" and p.get("ttft_p50_s"):
            ttft, _ = wave_terms(p["requests"], p["prompt_tokens"], p["output_tokens"],
                                 model.max_num_batched_tokens, model.max_num_seqs)
            mid = ttft[(len(ttft) - 1) // 2], ttft[len(ttft) // 2]
            predicted = sum((a + b) / 2 * c for a, b, c in zip(*mid, coef))
            bursts.add_row(label, f"{p['ttft_p50_s'] * 1e3:.2f}", f"{predicted * 1e3:.2f}")
    coefficients = Table(title="fitted model", show_header=False)
    for label, value in (("step_base_s", f"{model.step_base_s * 1e3:.4g} ms"),
                         ("step_per_seq_s", f"{model.step_per_seq_s * 1e3:.4g} ms"),
                         ("step_per_kv_token_s", f"{model.step_per_kv_token_s * 1e6:.4g} µs"),
                         ("prefill_per_token_s", f"{model.prefill_per_token_s * 1e6:.4g} µs"),
                         ("request_overhead_s", f"{model.request_overhead_s * 1e3:.4g} ms")):
        coefficients.add_row(label, value)
    for name, value in profile["limits"].items():
        coefficients.add_row(name, f"{value:,}" if value else "unknown", profile["limit_sources"].get(name, ""))
    coefficients.add_row("saturated output tok/s", f"{model.saturated_output_tok_s(128, 64):,.0f} at 128 in / 64 out; "
                         f"{model.saturated_output_tok_s(1000, 200):,.0f} at 1,000 in / 200 out")
    lines = []
    names = {"decode": "decode steps (time per output token)", "prefill": "prefill TTFT"}
    for kind, c in fit["check"].items():
        verdict = "[green]yes[/green]" if c["ok"] else "[red]no[/red]"
        lines.append(f"the fit reproduces the {names[kind]} within {c['tolerance']:.0%}: {verdict} "
                     f"(worst {c['worst']:.1%})")
    if "mixed" in fit["worst_residual"]:
        lines.append(f"mixed point (prefill inside a decode batch): {fit['worst_residual']['mixed']:.1%} off")
    if "steady" in fit["worst_residual"]:
        loads = sorted({p["load"] for p in fit["points"] if p["kind"] == "steady"})
        lines.append(f"steady points (the trace's mix at {', '.join(f'{x:.0%}' for x in loads)} load): worst "
                     f"{fit['worst_residual']['steady']:.1%} off")
        if not fit["check"].get("decode", {}).get("ok", True):
            lines.append("the decode bursts and the steady points disagree (a burst's synchronous steps are "
                         "slower than a steady load's at the same batch): the fit weighs the steady points, "
                         "the regime a replay below capacity meets")
    if "saturation" in fit["worst_residual"]:
        sat = next(p for p in fit["points"] if p["kind"] == "saturation")
        lines.append(f"saturation with the trace's mix: {sat['output_tokens_per_second']:,.0f} output tok/s "
                     f"measured, {model.saturated_output_tok_s(sat['input_tokens'], sat['output_tokens']):,.0f} "
                     f"the fitted model's ({fit['worst_residual']['saturation']:+.1%} per token)")
    return Group(points, bursts, coefficients, *lines)
