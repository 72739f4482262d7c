"""Open-loop replay of a request trace: ``python -m options.bench --replay TRACE``.

Each request of the trace (``cost.traces``: Azure, Mooncake, ...) leaves at its own arrival time,
multiplied by the time scale, whatever the server is doing: a slow server makes requests pile
up in flight, as real users would, instead of slowing the senders down (a closed loop would hide
exactly the queueing a trace is replayed to see).

- Sizes: each prompt is built to the trace's input size in the target's own tokens (the bench's
  calibration, ``runner.calibrate``), ``max_tokens`` is the trace's output size (``ignore_eos``
  where the target has it, so the server generates that many), both clipped by ``--max-input`` /
  ``--max-output``; a row with 0 output tokens asks for 1.
- Prefixes: a prompt starts with its request number, so no two share a prefix, except where the
  trace names shared prompt blocks (Mooncake's ``hash_ids``): then the prompt is those blocks'
  text in order, ``--block-tokens`` tokens each (the text of a block is fixed by its id), so
  requests sharing leading ids share that many blocks and a prefix cache sees the trace's reuse.
- Pace: ``--time-scale F`` multiplies every arrival time (F > 1 slows the trace down);
  ``--load L --capacity BENCH.json`` picks the F at which the trace offers L × the output tok/s
  measured in BENCH.json.
- Sending: one scheduler thread sleeps until each arrival and hands the request to a pool that
  grows to the number in flight (up to ``MAX_IN_FLIGHT``; beyond it a request is lost as
  ``client_overloaded`` rather than delaying the ones after it). Each request's lateness (actual
  send − scheduled send) is recorded, so a run can show the client kept up.

Metrics are ``metrics.py``'s (``vllm bench serve``'s definitions); the JSON is a
``spectrum.bench/1`` document with a ``replay`` section whose ``spec`` is enough for a simulator
to replay the same requests at the same times. Where the target is a vLLM server with
``/metrics``, ``summary.server`` adds its own view of the same requests (``server_view``): the
mean TTFT split into the engine's queue, its prefill and the rest, which is where a model of the
engine alone parts from what the client measures.
"""
from __future__ import annotations

import functools
import math
import random
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from options.bench.metrics import STATS, RequestRecord, percentile, summarize
from options.bench.profile import RUN_TAG, PromptTokens, make_prompt
from options.core import BadInput

if TYPE_CHECKING:
    from cost.traces import Trace

# More threads than this would measure the client, not the server: a request arriving while this
# many are in flight is lost (status "client_overloaded") instead of waiting for a thread.
MAX_IN_FLIGHT = 2048
CLIENT_OVERLOADED = "client_overloaded"
# A send this much later than scheduled counts as late (late_sends).
LATE_S = 0.010
# Prompts are built ahead of their send time, in the scheduler's idle time, at most this far
# ahead (requests and tokens), so a long trace never holds every prompt in memory at once.
LOOKAHEAD_REQUESTS = 1024
LOOKAHEAD_TOKENS = 4_000_000
# A prompt is built in the wait before a send only if the wait exceeds twice the build's
# predicted time plus this margin; otherwise the scheduler sleeps and stays on time.
BUILD_MARGIN_S = 0.002
# The profile's burstiness (gamma shape) of evenly spaced arrivals, which is infinite.
STEADY_BURSTINESS = 10_000.0
# Flags a replay takes its load from the trace instead of, refused beside --replay.
CLOSED_LOOP_FLAGS = (("concurrency", "--concurrency"), ("request_rate", "--request-rate"),
                     ("adapters", "--adapters"))
SIZE_FLAGS = (("requests", "--requests", 64), ("prompt_tokens", "--prompt-tokens", "128"),
              ("output_tokens", "--output-tokens", "128"))


def add_arguments(parser) -> None:
    """The replay flags of ``python -m options.bench``: the trace reader's own, then the pace and
    the clipping."""
    from cost.traces import add_trace_arguments

    add_trace_arguments(parser, flag="--replay")
    g = parser.add_argument_group("trace replay (--replay TRACE)")
    g.add_argument("--time-scale", type=float, metavar="F",
                   help="multiply every arrival time by F (2 = half the request rate; default 1)")
    g.add_argument("--load", type=float, metavar="FRACTION",
                   help="with --capacity: pick the time scale at which the trace offers this "
                        "fraction of the measured output tok/s (0.7 = 70 %%)")
    g.add_argument("--capacity", metavar="BENCH.json",
                   help="a spectrum.bench/1 file whose measured output tok/s is the capacity "
                        "--load refers to (alone: the offered load is reported against it)")
    g.add_argument("--max-input", type=int, metavar="N", help="clip prompts to N tokens")
    g.add_argument("--max-output", type=int, metavar="N", help="clip answers to N tokens")


# --- the plan: sizes, times, pace (pure; read before any server starts) -------------------------

@dataclass(frozen=True)
class Pace:
    """How fast the trace is replayed, and where that figure came from."""
    time_scale: float
    load: float | None = None                 # fraction of the capacity the replay offers
    capacity_file: str | None = None
    capacity_output_tok_s: float | None = None
    capacity_source: str | None = None        # which figure of the capacity file was used


@dataclass(frozen=True)
class ReplayPlan:
    """Every request's scheduled send time and sizes, after clipping and scaling."""
    trace: "Trace"
    arrival_s: tuple[float, ...]          # scaled: when each request is sent, from the start
    input_tokens: tuple[int, ...]         # prompt size to build (clipped)
    output_tokens: tuple[int, ...]        # max_tokens sent (clipped; 0 in the trace → 1)
    pace: Pace
    max_input: int | None
    max_output: int | None
    block_tokens: int
    clipped_input: int = 0                # rows whose prompt --max-input shortened
    clipped_output: int = 0               # rows whose answer --max-output shortened
    zero_output: int = 0                  # rows with 0 output tokens, sent with max_tokens 1
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        """The replay's length in scaled time (the trace's span × the time scale)."""
        return float(self.trace.span_s) * self.pace.time_scale

    @property
    def offered_output_tok_s(self) -> float | None:
        """Output tokens asked for (max_tokens) per second of the scaled trace."""
        return sum(self.output_tokens) / self.span_s if self.span_s > 0 else None

    @classmethod
    def from_args(cls, args) -> "ReplayPlan | None":
        """The replay the arguments ask for; None without --replay (after refusing the replay's
        own flags given without it)."""
        from cost.traces import trace_from_args

        if not args.replay:
            trace_from_args(args)            # refuses --window, --scale, ... without --replay
            for flag, value, default in replay_only_flags(args):
                if value != default:
                    raise BadInput(f"{flag} is for a trace replay: add --replay TRACE, or leave it out")
            return None
        check_arguments(args)
        trace = trace_from_args(args)
        if len(trace) == 0:
            raise BadInput(f"--replay {args.replay}: no requests to replay"
                           + (f" in --window {args.trace_window}" if args.trace_window else "")
                           + "; widen the window or check the file")
        return plan_replay(trace, max_input=args.max_input, max_output=args.max_output,
                           block_tokens=args.block_tokens, time_scale=args.time_scale,
                           load=args.load, capacity_file=args.capacity)


def replay_only_flags(args) -> list[tuple[str, Any, Any]]:
    """(flag, value, default) of the flags that mean something only with --replay."""
    from cost.traces import DEFAULT_BLOCK_TOKENS

    return [("--time-scale", args.time_scale, None), ("--load", args.load, None),
            ("--capacity", args.capacity, None), ("--max-input", args.max_input, None),
            ("--max-output", args.max_output, None),
            ("--block-tokens", args.block_tokens, DEFAULT_BLOCK_TOKENS)]


def check_arguments(args) -> None:
    """Refuse what a replay cannot mean, before a trace is read or a server started."""
    for attr, flag in CLOSED_LOOP_FLAGS:
        if getattr(args, attr, None):
            raise BadInput(f"--replay sends each request at its trace arrival time (open loop): "
                           f"leave out {flag}; pace it with --time-scale or --load")
    if getattr(args, "profile", "requests") != "requests":
        raise BadInput(f"--replay replays a trace's requests; --profile {args.profile} is another "
                       "kind of run: leave one of them out")
    for attr, flag, default in SIZE_FLAGS:
        if getattr(args, attr, default) != default:
            raise BadInput(f"--replay takes request count and sizes from the trace: leave out {flag} "
                           "(clip sizes with --max-input / --max-output, pick rows with --window)")
    if args.load is not None and args.time_scale is not None:
        raise BadInput("give --time-scale or --load, not both: --load picks the time scale")
    if args.time_scale is not None and not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise BadInput(f"--time-scale {args.time_scale:g} must be > 0 (1 = the trace's own pace, "
                       "2 = half as fast)")
    if args.load is not None:
        if not (math.isfinite(args.load) and args.load > 0):
            raise BadInput(f"--load {args.load:g} must be > 0, a fraction of the capacity such as 0.7")
        if not args.capacity:
            raise BadInput(f"--load {args.load:g} is a fraction of a measured capacity: give "
                           "--capacity BENCH.json (from `python -m options.bench --json BENCH.json`)")
    for flag, value in (("--max-input", args.max_input), ("--max-output", args.max_output),
                        ("--block-tokens", args.block_tokens)):
        if value is not None and value < 1:
            raise BadInput(f"{flag} {value} must be a whole number >= 1")


def plan_replay(trace: "Trace", *, max_input: int | None = None, max_output: int | None = None,
                block_tokens: int | None = None, time_scale: float | None = None,
                load: float | None = None, capacity_file: str | None = None) -> ReplayPlan:
    """Clip the trace's sizes, then resolve its pace to one time scale (``block_tokens``: a
    prefix block id's prompt tokens, Mooncake's 512 by default)."""
    from cost.traces import DEFAULT_BLOCK_TOKENS, sent_sizes

    block_tokens = block_tokens or DEFAULT_BLOCK_TOKENS

    sizes = sent_sizes(trace, max_input, max_output)
    inputs, outputs = sizes.input_tokens.tolist(), sizes.output_tokens.tolist()
    clipped_in, clipped_out, zero_out = sizes.clipped_input, sizes.clipped_output, sizes.zero_output
    notes = list(trace.notes)
    if clipped_in:
        notes.append(f"{clipped_in} of {len(inputs)} prompts clipped to --max-input {max_input} tokens")
    if clipped_out:
        notes.append(f"{clipped_out} of {len(outputs)} answers clipped to --max-output {max_output} tokens")
    if zero_out:
        notes.append(f"{zero_out} of {len(outputs)} requests have 0 output tokens in the trace: sent "
                     "with max_tokens 1 (a request asks for at least one token)")
    span = float(trace.span_s)
    pace = Pace(time_scale if time_scale is not None else 1.0)
    if capacity_file:
        mean_in, mean_out = sum(inputs) / len(inputs), sum(outputs) / len(outputs)
        capacity, source = capacity_from_bench(capacity_file, mean_in, mean_out)
        offered_unscaled = sum(outputs) / span if span > 0 else None
        if offered_unscaled is None:
            raise BadInput("--capacity: the trace's requests all arrive at once (span 0 s), so it "
                           "offers no rate to compare with a capacity; widen --window")
        if load is not None:
            pace = Pace(time_scale_for_load(offered_unscaled, load, capacity), load, capacity_file,
                        capacity, source)
        else:
            pace = Pace(pace.time_scale, offered_unscaled / pace.time_scale / capacity, capacity_file,
                        capacity, source)
    scale = pace.time_scale
    return ReplayPlan(trace, tuple(float(t) * scale for t in trace.arrival_s.tolist()),
                      tuple(inputs), tuple(outputs), pace, max_input, max_output, block_tokens,
                      clipped_in, clipped_out, zero_out, tuple(notes))


def time_scale_for_load(offered_output_tok_s: float, load: float, capacity_output_tok_s: float) -> float:
    """The factor on arrival times at which a trace offering ``offered_output_tok_s`` (at its own
    pace) offers ``load`` × ``capacity_output_tok_s``: stretching time by F divides the rate by F."""
    return offered_output_tok_s / (load * capacity_output_tok_s)


def capacity_from_bench(path: str, mean_input: float, mean_output: float) -> tuple[float, str]:
    """A replica's output tok/s from a bench file, and which figure it is.

    In order: a plain ``capacity_model.saturated_output_tok_s`` number; where the file holds a
    capacity model or the profile to fit one (``capacity_model``, ``capacity_profile``: ``python
    -m options.bench --profile capacity``), the simulator's ``CapacityModel``'s saturated rate at this trace's mean sizes, which is what --load should refer to; else
    the bench's measured ``metrics.output_tokens_per_second``, which depends on the load it was
    measured at.
    """
    import json

    from cost.bench import BENCH_SCHEMA, load_bench

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None                           # load_bench below says what is wrong with the file
    if isinstance(doc, dict) and doc.get("schema") == BENCH_SCHEMA:
        figure = doc.get("capacity_model")
        saturated = figure.get("saturated_output_tok_s") if isinstance(figure, dict) else None
        if isinstance(saturated, (int, float)) and not isinstance(saturated, bool) \
                and math.isfinite(saturated) and saturated > 0:
            return float(saturated), "capacity_model.saturated_output_tok_s"
        section = next((k for k in ("capacity_model", "capacity_profile") if k in doc), None)
        if section is not None:
            from cost.simulate.capacity import CapacityModel
            model = CapacityModel.from_bench(doc, repr(path))
            rate = float(model.saturated_output_tok_s(mean_input, max(1.0, mean_output)))
            if math.isfinite(rate) and rate > 0:
                return rate, (f"{section}: CapacityModel.saturated_output_tok_s at {mean_input:,.0f} in / "
                              f"{mean_output:,.0f} out tokens")
    measured = load_bench(path)               # BadInput for a missing, unreadable or wrong file
    return measured.output_tokens_per_second, "metrics.output_tokens_per_second"


# --- prompts ------------------------------------------------------------------------------------

class PromptBuilder:
    """Prompts of the trace's sizes in the target's tokens, sharing the trace's prefix blocks.

    Without blocks a prompt is ``make_prompt``'s: the run's tag and its request number first, so
    none shares a prefix with another. With blocks it is the text of each of its blocks in order
    (a block's text is fixed by the run and its id, and starts with them), cut at the prompt's size; a prompt longer than
    its blocks goes on with text of its own.
    """

    def __init__(self, tokens: PromptTokens | None, seed: int, block_tokens: int,
                 prefix_blocks: Sequence[Sequence[int]] | None):
        self.tokens = tokens or PromptTokens()
        self.seed = seed
        self.words_per_block = max(1, round(block_tokens / self.tokens.per_word))
        self.prefix_blocks = prefix_blocks
        # Shared blocks recur (that is the point): their text is made once, within a bound.
        self._block_words = functools.lru_cache(maxsize=8192)(self._make_block_words)

    def prompt(self, i: int, input_tokens: int) -> str:
        words = self.tokens.words_for(input_tokens)
        blocks = self.prefix_blocks[i] if self.prefix_blocks else ()
        own = random.Random(f"{self.seed}:request:{i}")
        if not blocks:
            return make_prompt(own, words, i)
        parts: list[str] = []
        for block in blocks:
            if words <= 0:
                break
            text = self._block_words(int(block))[:words]
            parts.extend(text)
            words -= len(text)
        if words > 0:
            parts.append(make_prompt(own, words, i))
        return " ".join(parts)

    def _make_block_words(self, block: int) -> tuple[str, ...]:
        return tuple(make_prompt(random.Random(f"{self.seed}:block:{block}"), self.words_per_block,
                                 block).split(" "))


# --- sending ------------------------------------------------------------------------------------

@dataclass
class LiveCounts:
    """What the replay has done so far (the progress bar reads it while the replay runs)."""
    sent: int = 0
    done: int = 0                    # answered, failed or lost
    failed: int = 0                  # sent and failed, plus lost
    lost: int = 0                    # never sent: the client had MAX_IN_FLIGHT in flight
    in_flight: int = 0
    peak_in_flight: int = 0


@dataclass
class ReplayRun:
    scheduled_s: list[float]                 # when each request was due, from the start
    sent_s: list[float | None]               # when it was sent (None: lost)
    records: list[RequestRecord]
    started_at: str                          # ISO 8601, UTC
    duration_s: float                        # start → last answer
    peak_in_flight: int

    @property
    def lateness_s(self) -> list[float]:
        return [s - t for s, t in zip(self.sent_s, self.scheduled_s) if s is not None]


def send_open_loop(arrival_s: Sequence[float], build: Callable[[int], Any], send: Callable,
                   sizes: Sequence[int] | None = None, *, max_in_flight: int = MAX_IN_FLIGHT,
                   on_progress: Callable[[LiveCounts], None] | None = None,
                   progress_every_s: float = 0.1) -> ReplayRun:
    """Send request ``i`` (``build(i)``, a ``Request``) at ``arrival_s[i]`` seconds from the start,
    however many are still in flight, and wait for every answer.

    ``sizes`` (prompt tokens) tells how long building each request will take, so that prompts
    are built ahead in the waits between sends and never in a send's way.
    """
    from options.bench.runner import measure

    n = len(arrival_s)
    sizes = list(sizes) if sizes is not None else [1] * n
    counts, lock = LiveCounts(), threading.Lock()
    records: list[RequestRecord | None] = [None] * n
    sent_at: list[float | None] = [None] * n
    clock = {"t0": 0.0, "last_end": 0.0}
    all_done, stop = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="replay")

    def finish_one(i: int, rec: RequestRecord) -> None:
        records[i] = rec
        with lock:
            counts.done += 1
            counts.failed += 0 if rec.ok else 1
            if counts.done == n:
                all_done.set()

    def request_task(i: int, request) -> None:
        sent = time.perf_counter()
        sent_at[i] = sent - clock["t0"]
        rec = measure(send, request)
        ended = time.perf_counter()
        with lock:
            counts.in_flight -= 1
            clock["last_end"] = max(clock["last_end"], ended)
        finish_one(i, rec)

    def schedule() -> None:
        ready: deque = deque()
        prepared = {"next": 0, "tokens": 0, "s_per_token": 2e-6}

        def room() -> bool:
            return (prepared["next"] < n and len(ready) < LOOKAHEAD_REQUESTS
                    and prepared["tokens"] < LOOKAHEAD_TOKENS)

        def prepare_one() -> None:
            j = prepared["next"]
            began = time.perf_counter()
            ready.append(build(j))
            took = time.perf_counter() - began
            # A running estimate of build time per token, weighted to recent builds.
            prepared["s_per_token"] = 0.8 * prepared["s_per_token"] + 0.2 * took / max(1, sizes[j])
            prepared["next"], prepared["tokens"] = j + 1, prepared["tokens"] + sizes[j]

        while room():                       # the first prompts are built before the clock starts
            prepare_one()
        clock["t0"] = t0 = time.perf_counter()
        for i in range(n):
            if stop.is_set():
                return
            due = t0 + arrival_s[i]
            while room() and due - time.perf_counter() > \
                    2 * prepared["s_per_token"] * sizes[prepared["next"]] + BUILD_MARGIN_S:
                prepare_one()
            if not ready:                   # building fell behind: this send will be late
                prepare_one()
            request = ready.popleft()
            prepared["tokens"] -= sizes[i]
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            with lock:
                overloaded = counts.in_flight >= max_in_flight
                if not overloaded:
                    counts.sent += 1
                    counts.in_flight += 1
                    counts.peak_in_flight = max(counts.peak_in_flight, counts.in_flight)
                else:
                    counts.lost += 1
            if overloaded:
                finish_one(i, RequestRecord(error=CLIENT_OVERLOADED))
                continue
            pool.submit(request_task, i, request)

    def scheduler_thread() -> None:
        try:
            schedule()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            failure.append(exc)
            all_done.set()

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    # Python's default switch interval (5 ms) is kept: a waking scheduler waits at most that long
    # for a busy reader thread. A shorter one (0.5 ms was tried) slowed the readers of hundreds of
    # streams more than it helped the sends: throughput at 90 % load fell by 4-30 % in A/B rounds.
    scheduler = threading.Thread(target=scheduler_thread, name="replay-scheduler", daemon=True)
    try:
        scheduler.start()
        while not all_done.wait(progress_every_s):
            if on_progress:
                on_progress(counts)
        if failure:
            raise failure[0]
        pool.shutdown(wait=True)
    except BaseException:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    if on_progress:
        on_progress(counts)
    t0 = clock["t0"]
    end = max(clock["last_end"], t0 + (arrival_s[-1] if n else 0.0))
    return ReplayRun([float(a) for a in arrival_s], sent_at,
                     [r if r is not None else RequestRecord(error="not_sent") for r in records], started_at, max(end - t0, 1e-9), counts.peak_in_flight)


# --- the server's own view of the same requests ----------------------------------------------------

# vLLM's per-request histograms (seconds), read before and after a replay: their means over the
# replay split its TTFT into the engine's queue (scheduler waiting, from when the engine took the
# request between two steps), its prefill (scheduled to first token) and the rest, which the
# client alone sees: HTTP, tokenising, waiting for the running step to end, the API server
# handing the token on, the client reading it.
SERVER_LATENCIES = {"ttft": "vllm:time_to_first_token_seconds", "queue": "vllm:request_queue_time_seconds",
                    "prefill": "vllm:request_prefill_time_seconds", "e2e": "vllm:e2e_request_latency_seconds"}


def read_server_latencies(base_url: str | None) -> dict[str, tuple[float, float]] | None:
    """``server_latencies`` of ``base_url``/metrics."""
    from options.bench.runner import metrics_page

    return server_latencies(metrics_page(base_url))


def server_latencies(text: str | None) -> dict[str, tuple[float, float]] | None:
    """{part: (sum of seconds, count)} of ``SERVER_LATENCIES`` in a Prometheus page; None where
    there is no page or not these histograms (not vLLM)."""
    from options.bench.metrics import metric_sum

    if text is None:
        return None
    sums = {part: (metric_sum(text, name + "_sum"), metric_sum(text, name + "_count"))
            for part, name in SERVER_LATENCIES.items()}
    return None if any(v is None for pair in sums.values() for v in pair) else sums


def server_view(before: dict[str, tuple[float, float]] | None, after: dict[str, tuple[float, float]] | None,
                records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """The server's mean of each part over the requests it finished between two readings, beside
    the client's own means, and what of the client's TTFT the engine's queue and prefill leave."""
    if before is None or after is None:
        return None
    count = after["ttft"][1] - before["ttft"][1]
    if count <= 0:
        return None
    mean_ms = {part: round((after[part][0] - before[part][0]) / max(1.0, after[part][1] - before[part][1]) * 1000, 3)
               for part in SERVER_LATENCIES}
    done = [r for r in records if r.ok and r.ttft_s is not None and r.e2e_s is not None]
    client = {"ttft": round(sum(r.ttft_s for r in done) / len(done) * 1000, 3),
              "e2e": round(sum(r.e2e_s for r in done) / len(done) * 1000, 3)} if done else None
    return {"requests": int(count), "mean_ms": mean_ms, "client_mean_ms": client,
            "ttft_outside_engine_ms": None if client is None else
            round(client["ttft"] - mean_ms["queue"] - mean_ms["prefill"], 3)}


# --- the CLI's run ------------------------------------------------------------------------------

def bench_replay(args, plan: ReplayPlan, template, send, details: dict[str, Any], console) -> int:
    """``python -m options.bench --replay``: calibrate, replay, summarise, write JSON, print tables."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from options.bench import report
    from options.bench.program import hit_rate, prefix_cache_counters
    from options.bench.runner import metrics_page
    from options.bench.warmup import warm_up_and_calibrate

    bedrock = details.get("service") == "bedrock-runtime"
    # Exact output sizes where the target can be told to ignore end-of-sequence (not Bedrock).
    template = replace(template, ignore_eos=not bedrock)
    for note in plan.notes:
        console.print(f"[dim]{note}[/dim]")
    console.print(f"replaying {len(plan)} requests over {plan.span_s:,.1f} s (time scale "
                  f"{plan.pace.time_scale:.4g}" + (f", {plan.pace.load:.0%} of "
                  f"{plan.pace.capacity_output_tok_s:,.0f} output tok/s" if plan.pace.load else "") + ")")
    ready, tokens = warm_up_and_calibrate(args, send, template, console, args.seed)
    if not ready:
        return 1
    prompts = PromptBuilder(tokens, args.seed, plan.block_tokens, plan.trace.prefix_blocks)

    def build(i: int):
        return replace(template, prompt=prompts.prompt(i, plan.input_tokens[i]), messages=None,
                       max_tokens=plan.output_tokens[i], stream=True)

    def server_reading():
        """(prefix-cache counters, latency histograms) from one read of the server's /metrics."""
        page = metrics_page(details.get("url"))
        return (None if page is None else prefix_cache_counters(page)), server_latencies(page)

    cache_before, latencies_before = server_reading()
    with Progress(TextColumn("[bold]replay"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("sent {task.fields[sent]} · in flight {task.fields[in_flight]} · "
                             "failed {task.fields[failed]}"), TimeElapsedColumn(),
                  console=console, disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("replay", total=len(plan), sent=0, in_flight=0, failed=0)
        run = send_open_loop(plan.arrival_s, build, send, plan.input_tokens,
                             on_progress=lambda c: bar.update(task, completed=c.done, sent=c.sent,
                                                              in_flight=c.in_flight, failed=c.failed))
    cache_after, latencies_after = server_reading()
    doc = replay_doc(args, plan, run, template, details, tokens, hit_rate(cache_before, cache_after),
                     server_view(latencies_before, latencies_after, run.records))
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(render_table(doc))
    if doc["counts"]["completed"] == 0:
        console.print(f"[red]every request failed:[/red] {doc['counts']['errors']}")
        return 1
    return 0


@dataclass(frozen=True)
class TraceProfile:
    """The document's ``profile`` for a replay: what the trace offered, in the bench's terms."""
    plan: ReplayPlan
    seed: int

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        gaps = [b - a for a, b in zip(p.arrival_s, p.arrival_s[1:])]
        out: dict[str, Any] = {
            "kind": "replay", "requests": len(p), "concurrency": None,
            "request_rate": len(p) / p.span_s if p.span_s > 0 else None,
            "prompt_tokens": _sizes(p.input_tokens), "output_tokens": _sizes(p.output_tokens),
            "seed": self.seed}
        mean = sum(gaps) / len(gaps) if gaps else 0.0
        variance = sum((g - mean) ** 2 for g in gaps) / len(gaps) if gaps else 0.0
        if mean > 0:
            # The gamma shape with the gaps' coefficient of variation, as --burstiness means it
            # (1 = Poisson, < 1 burstier); evenly spaced arrivals are capped at STEADY_BURSTINESS.
            out["burstiness"] = round(min(mean * mean / variance, STEADY_BURSTINESS), 4) \
                if variance > 0 else STEADY_BURSTINESS
        return out


def _sizes(values: Sequence[int]) -> dict[str, Any]:
    return {"kind": "trace", "mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def replay_doc(args, plan: ReplayPlan, run: ReplayRun, template, details: dict[str, Any],
               tokens: PromptTokens | None, prefix_cache_hit_rate: float | None,
               server: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``spectrum.bench/1`` document of a replay: the bench's keys plus ``replay``."""
    from options.bench import report

    summary = summarize(run.records, run.duration_s)
    model = template.model or args.model or details.get("served_model")
    doc = report.bench_json(summary, TraceProfile(plan, args.seed), level=args.level,
                            target=args.target, model=model, started_at=run.started_at,
                            details={**details, "ignore_eos": template.ignore_eos,
                                     "warmup_requests": args.warmup,
                                     "prompt_calibration": tokens.to_json() if tokens else None})
    requests = []
    for i, rec in enumerate(run.records):
        ok = rec.ok
        requests.append({
            "arrival_s": round(run.scheduled_s[i], 6),
            "sent_s": None if run.sent_s[i] is None else round(run.sent_s[i], 6),
            "input_tokens": rec.input_tokens if ok and rec.input_tokens is not None else plan.input_tokens[i],
            "output_tokens": rec.output_tokens if ok else plan.output_tokens[i],
            "ttft_ms": None if rec.ttft_s is None else round(rec.ttft_s * 1000, 3),
            "e2e_ms": None if rec.e2e_s is None else round(rec.e2e_s * 1000, 3),
            "status": "ok" if ok else rec.error})
    late_ms = [x * 1000 for x in run.lateness_s]
    pick = lambda d: {k: d[k] for k in ("p50", "p90", "p99")}  # noqa: E731
    target = {"level": args.level, "target": args.target, "dialect": details.get("dialect"),
              "model": model}
    for key in ("url", "path", "endpoint", "region", "service"):
        if details.get(key):
            target[key] = details[key]
    pace = plan.pace
    doc["replay"] = {
        "spec": {"trace": _jsonable(plan.trace.spec), "requests": len(plan),
                 "time_scale": pace.time_scale, "load": pace.load,
                 "capacity_file": pace.capacity_file, "capacity_output_tok_s": pace.capacity_output_tok_s,
                 "capacity_source": pace.capacity_source,
                 "max_input": plan.max_input, "max_output": plan.max_output,
                 "zero_output_sent_as": 1, "block_tokens": plan.block_tokens,
                 "prefix_blocks": plan.trace.prefix_blocks is not None,
                 "ignore_eos": template.ignore_eos, "prompt_seed": args.seed, "prompt_tag": RUN_TAG,
                 "max_in_flight": MAX_IN_FLIGHT, "target": target},
        "requests": requests,
        "summary": {
            "ttft_ms": pick(summary.ttft_ms), "e2e_ms": pick(summary.e2e_ms),
            "tpot_ms": pick(summary.tpot_ms), "itl_ms": pick(summary.itl_ms),
            "throughput_tok_s": summary.output_tokens_per_second,
            "offered_output_tok_s": plan.offered_output_tok_s,
            "completed": summary.completed,
            "failed": sum(summary.errors.values()) - summary.errors.get(CLIENT_OVERLOADED, 0),
            "lost": summary.errors.get(CLIENT_OVERLOADED, 0),
            "late_sends": sum(1 for x in late_ms if x > LATE_S * 1000),
            "lateness_ms": {"p50": percentile(late_ms, 50), "p99": percentile(late_ms, 99),
                            "max": max(late_ms) if late_ms else None},
            "peak_in_flight": run.peak_in_flight,
            "clipped": {"input": plan.clipped_input, "output": plan.clipped_output,
                        "zero_output": plan.zero_output},
            "prefix_cache_hit_rate": prefix_cache_hit_rate,
            "server": server,
            "duration_s": run.duration_s},
        "notes": list(plan.notes),
    }
    return doc


def _jsonable(value: Any) -> Any:
    """The trace's spec as JSON types (tuples → lists, numpy numbers → Python numbers)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def render_table(doc: dict[str, Any]):
    """Latency distributions, then how the replay went: offered vs served, lateness, losses."""
    from rich.console import Group
    from rich.table import Table

    from options.bench.report import _ms

    m, c, r = doc["metrics"], doc["counts"], doc["replay"]
    spec, s = r["spec"], r["summary"]
    trace = spec["trace"]
    pace = f"time scale {spec['time_scale']:.4g}"
    if spec["load"] is not None:
        pace += (f", {spec['load']:.0%} of {spec['capacity_output_tok_s']:,.0f} output tok/s "
                 f"({spec['capacity_file']})")
    lat = Table(title=f"replay · level {doc['level'] if doc['level'] is not None else '?'} · "
                      f"{doc['target']} · {doc['model'] or 'server default model'}",
                caption=f"{spec['requests']} requests of {Path(trace.get('path') or '?').name} "
                        f"({trace.get('format')}), {pace}")
    lat.add_column("latency (ms)")
    for q in STATS:
        lat.add_column(q, justify="right")
    for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        lat.add_row(label, *(_ms(m[key][q]) for q in STATS))
    offered = s["offered_output_tok_s"]
    late = s["lateness_ms"]
    out = Table(show_header=False)
    out.add_row("output tokens/s offered / served",
                f"{'-' if offered is None else f'{offered:,.1f}'} / {s['throughput_tok_s']:,.1f}")
    out.add_row("completed", f"{c['completed']} of {spec['requests']}")
    out.add_row("failed / lost (client overloaded)", f"{s['failed']} / {s['lost']}")
    out.add_row("send lateness p50 / p99 / max",
                f"{_ms(late['p50'])} / {_ms(late['p99'])} / {_ms(late['max'])} ms")
    out.add_row(f"late sends (> {LATE_S * 1000:.0f} ms)", str(s["late_sends"]))
    out.add_row("peak in flight", str(s["peak_in_flight"]))
    out.add_row("tokens in / out (server usage)", f"{c['input_tokens']:,} / {c['output_tokens']:,}")
    clipped = s["clipped"]
    if any(clipped.values()):
        out.add_row("clipped prompts / answers, 0-token answers",
                    f"{clipped['input']} / {clipped['output']}, {clipped['zero_output']}")
    if s["prefix_cache_hit_rate"] is not None:
        out.add_row("prefix-cache hit rate", f"{s['prefix_cache_hit_rate']:.1%}")
    view = s.get("server")
    if view and view["client_mean_ms"]:
        mean = view["mean_ms"]
        out.add_row("mean TTFT, client = engine queue + prefill + the rest",
                    f"{_ms(view['client_mean_ms']['ttft'])} = {_ms(mean['queue'])} + {_ms(mean['prefill'])} + "
                    f"{_ms(view['ttft_outside_engine_ms'])} ms (the server's own TTFT {_ms(mean['ttft'])} ms)")
    out.add_row("wall time", f"{s['duration_s']:.2f} s")
    out.add_row("errors", ", ".join(f"{k}: {v}" for k, v in c["errors"].items()) or "none")
    return Group(lat, out)
