"""Programs, not requests: the bench's ``--profile agent``.

An agent answers one question with several serial calls, so its user waits for the sum of
their latencies, and the program's tail is worse than any one step's. Here each program is a
closed loop of ``steps`` requests: every prompt starts with one system prompt shared by all
programs, then the session's own context, which grows by each previous answer (as an agent's
transcript does, so a server with prefix caching can reuse all but the newest part); between
steps the client waits ``think_ms`` (simulated tool time). ``concurrency`` programs run at once
and a new one starts as soon as one ends.

Measured: per step and per program TTFT/E2E, program throughput, the server's prefix-cache hit
rate (from its Prometheus ``/metrics``), and a prediction of the program tail from the per-step
distributions alone (Monte-Carlo sums of independent serial steps), printed beside the
measured tail. Program E2E runs from the first step's send to the last step's last token,
think time included; program TTFT is the time until the last step's first token, i.e. until
the user starts to see the final answer.
"""
from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from options.bench.metrics import (STATS, RequestRecord, distribution_ms, percentile,
                                   prometheus_samples, summarize)
from options.bench.profile import Lengths, PromptTokens, make_prompt
from options.bench.runner import metrics_page
from options.core import BadInput

PREDICTION_SAMPLES = 20_000
TAIL = ("p95", "p99")
# vLLM's counters (tokens looked up in / found in the prefix cache); prometheus_client
# exports a Counter named X as X_total.
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
NO_HIT_RATE = ("not measured: the target's /metrics shows no vLLM prefix-cache lookups during the run "
               "(no such page, as on SageMaker or Bedrock, or prefix caching is off)")
SYSTEM_PROMPT_HEAD = "You are a careful research agent. Answer from the context."


def add_arguments(parser) -> None:
    """The program flags (for ``--profile agent``), in their own group of ``python -m options.bench``'s parser."""
    g = parser.add_argument_group("agent programs (--profile agent)")
    g.add_argument("--programs", type=int, default=32, help="programs to run (32)")
    g.add_argument("--steps", type=int, default=4, help="serial calls per program (4)")
    g.add_argument("--think-ms", type=float, default=200.0,
                   help="simulated tool time between a program's calls, in ms (200)")
    g.add_argument("--system-tokens", type=int, default=128,
                   help="tokens of the system prompt every program shares (128); each step then "
                        "adds --prompt-tokens of its own text and the previous answer")
    from options.bench.priority import MODES
    g.add_argument("--priority", choices=MODES, default="off",
                   help="later-steps: step k of a program is sent with vLLM's priority -k (lower "
                        "runs sooner), so running programs finish first; compare: --rounds "
                        "alternating runs without and with it, same programs and concurrency. "
                        "The server must schedule by priority (SM_VLLM_SCHEDULING_POLICY=priority)")


@dataclass(frozen=True)
class ProgramProfile:
    programs: int
    steps: int
    think_ms: float
    system_tokens: int
    prompt_tokens: Lengths          # each step's new text (a question, a tool's result)
    output_tokens: Lengths          # each step's answer
    concurrency: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value, low in (("--programs", self.programs, 1), ("--steps", self.steps, 1),
                                 ("--concurrency", self.concurrency, 1),
                                 ("--system-tokens", self.system_tokens, 0)):
            if not isinstance(value, int) or value < low:
                raise BadInput(f"{name} {value!r} must be a whole number >= {low}")
        if not 0 <= self.think_ms <= 600_000:
            raise BadInput(f"--think-ms {self.think_ms:g} must be between 0 and 600000 ms")

    def plan(self, tokens: PromptTokens | None = None) -> tuple[str, list[list[tuple[str, int]]]]:
        """The shared system prompt, and each program's (step text, max_tokens) in order."""
        tokens = tokens or PromptTokens()
        rng = random.Random(self.seed)
        system = SYSTEM_PROMPT_HEAD
        if self.system_tokens:
            words = max(1, tokens.words_for(self.system_tokens) - len(SYSTEM_PROMPT_HEAD.split()))
            system += " " + make_prompt(rng, words, 0)     # the run's tag: no earlier run's cache
        programs = []
        for i in range(self.programs):
            steps = []
            for k in range(self.steps):
                n = i * self.steps + k
                text = make_prompt(rng, tokens.words_for(self.prompt_tokens.sample(rng, n)), i)
                steps.append((f"session {i} step {k + 1}: {text}", self.output_tokens.sample(rng, n)))
            programs.append(steps)
        return system, programs

    def to_json(self) -> dict[str, Any]:
        # The request-level keys too, so the request table and `cost ... --bench` read it as well.
        return {"kind": "agent", "programs": self.programs, "steps": self.steps,
                "think_ms": self.think_ms, "system_tokens": self.system_tokens,
                "requests": self.programs * self.steps, "concurrency": self.concurrency,
                "request_rate": None, "burstiness": 1.0,
                "prompt_tokens": self.prompt_tokens.to_json(),
                "output_tokens": self.output_tokens.to_json(), "seed": self.seed}


def step_prompt(history: Sequence[tuple[str, str]], text: str) -> str:
    """A step's prompt after the system prompt: every earlier step and its answer, then this one.

    Earlier text is never rewritten, so step k's prompt is a prefix of step k+1's."""
    done = "".join(f"{q}\nAnswer: {a}\n" for q, a in history)
    return f"{done}{text}\nAnswer:"


@dataclass
class ProgramRecord:
    """One program: its steps' records, and when it started and ended (perf_counter seconds)."""
    steps: list[RequestRecord] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    last_step_first_token: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e_s(self) -> float:
        return self.ended - self.started

    @property
    def ttft_s(self) -> float | None:
        return None if self.last_step_first_token is None else self.last_step_first_token - self.started


@dataclass
class ProgramRun:
    programs: list[ProgramRecord]
    started_at: str
    duration_s: float


def run_program(send, template, system: str, steps: list[tuple[str, int]], think_s: float,
                priorities: Sequence[int] | None = None) -> ProgramRecord:
    """One program's steps in order; it stops at the first failed step (an agent cannot go on).
    ``priorities[k]``, if given, is step k's vLLM scheduling priority."""
    from options.bench.runner import error_kind
    from options.contract import collect

    rec = ProgramRecord(started=time.perf_counter())
    history: list[tuple[str, str]] = []
    for k, (text, max_tokens) in enumerate(steps):
        if k:
            time.sleep(think_s)
        req = replace(template, system=system, prompt=step_prompt(history, text), messages=None,
                      max_tokens=max_tokens, stream=True,
                      priority=priorities[k] if priorities else template.priority)
        sent = time.perf_counter()
        try:
            res = collect(send(req), sent)
        except Exception as exc:  # a failed step fails the program; the bench counts it
            rec.steps.append(RequestRecord(error=error_kind(exc)))
        else:
            t = res.timings
            # Token counts must be the server's own; an answer without text has no TTFT.
            error = ("no_usage" if res.usage.output_tokens is None else
                     "no_text" if t.ttft_s is None else None)
            rec.steps.append(RequestRecord(ttft_s=t.ttft_s, itl_s=t.itl_s, e2e_s=t.e2e_s,
                                           input_tokens=res.usage.input_tokens,
                                           output_tokens=res.usage.output_tokens, error=error))
            history.append((text, res.text))
        if not rec.steps[-1].ok:
            rec.error = f"step {k + 1}: {rec.steps[-1].error}"
            break
        if k == len(steps) - 1:
            rec.last_step_first_token = sent + rec.steps[-1].ttft_s
    rec.ended = time.perf_counter()
    return rec


def run(profile: ProgramProfile, send, template, tokens: PromptTokens | None = None,
        on_done: Callable[[int, ProgramRecord], None] | None = None,
        priorities: Sequence[int] | None = None) -> ProgramRun:
    """Every program of ``profile``, at most ``concurrency`` at once (closed loop)."""
    system, programs = profile.plan(tokens)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(profile.concurrency, len(programs)),
                            thread_name_prefix="program") as pool:
        futures = [pool.submit(run_program, send, template, system, steps, profile.think_ms / 1000,
                               priorities) for steps in programs]
        for n, done in enumerate(as_completed(futures), 1):
            if on_done:
                on_done(n, done.result())
    return ProgramRun([f.result() for f in futures], started_at, time.perf_counter() - t0)


# --- maths (pure) -----------------------------------------------------------------------------

def with_p95(values_s: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99 in ms: the program's tail is compared at p95 and p99."""
    out = distribution_ms(values_s)
    out["p95"] = percentile([v * 1000 for v in values_s], 95)
    return {k: out[k] for k in ("mean", "p50", "p90", "p95", "p99")}


def predict_program_ms(step_e2e_s: Sequence[Sequence[float]], think_s: float,
                       samples: int = PREDICTION_SAMPLES, seed: int = 0) -> dict[str, float | None]:
    """The program E2E tail if its steps were independent: Monte-Carlo sums of one E2E drawn
    from each step's measured distribution, plus the think time between steps (ms)."""
    if not step_e2e_s or any(not xs for xs in step_e2e_s):
        return {q: None for q in TAIL}
    rng = random.Random(seed)
    gaps = think_s * (len(step_e2e_s) - 1)
    sums = [1000 * (gaps + sum(rng.choice(xs) for xs in step_e2e_s)) for _ in range(samples)]
    return {q: percentile(sums, float(q[1:])) for q in TAIL}


def summarize_programs(run: ProgramRun, think_s: float, seed: int = 0) -> dict[str, Any]:
    """The ``program``, ``steps`` and request-level parts of the bench document."""
    done = [p for p in run.programs if p.ok]
    n_steps = max((len(p.steps) for p in run.programs), default=0)
    steps = []
    for k in range(n_steps):
        recs = [p.steps[k] for p in run.programs if len(p.steps) > k and p.steps[k].ok]
        steps.append({"step": k + 1, "completed": len(recs),
                      "input_tokens_mean": (sum(r.input_tokens or 0 for r in recs) / len(recs)) if recs else None,
                      "ttft_ms": distribution_ms([r.ttft_s for r in recs]),
                      "e2e_ms": distribution_ms([r.e2e_s for r in recs])})
    # The prediction draws from completed programs' steps only, like the measured tail.
    per_step = [[p.steps[k].e2e_s for p in done] for k in range(n_steps)] if done else []
    step_p99s = [s["e2e_ms"]["p99"] for s in steps]
    errors: dict[str, int] = {}
    for p in run.programs:
        if not p.ok:
            errors[p.error] = errors.get(p.error, 0) + 1
    program = {
        "completed": len(done), "errors": dict(sorted(errors.items())),
        "programs_per_second": len(done) / run.duration_s,
        "ttft_ms": distribution_ms([p.ttft_s for p in done]),
        "e2e_ms": with_p95([p.e2e_s for p in done]),
        "predicted_e2e_ms": predict_program_ms(per_step, think_s, seed=seed),
        # The course's shortcut, for contrast: adding the steps' p99s over-states the tail.
        "sum_of_step_p99_ms": (sum(step_p99s) + 1000 * think_s * (n_steps - 1))
        if done and None not in step_p99s else None,
        # What the steps' E2E and the think time leave out: client work, the stream's tail.
        "overhead_ms_mean": (sum(p.e2e_s - sum(r.e2e_s for r in p.steps) for p in done) / len(done)
                             * 1000 - 1000 * think_s * (n_steps - 1)) if done else None,
    }
    requests = summarize([r for p in run.programs for r in p.steps], run.duration_s)
    return {"program": program, "steps": steps, "requests": requests}


# --- the server's prefix cache ----------------------------------------------------------------

def prefix_cache_counters(metrics_text: str) -> tuple[float, float] | None:
    """(queries, hits) summed over every engine in a Prometheus text page; None if absent."""
    totals = {PREFIX_QUERIES: 0.0, PREFIX_HITS: 0.0}
    seen = False
    for name, _, value in prometheus_samples(metrics_text):
        name = name.removesuffix("_total")
        if name in totals:
            totals[name] += value
            seen = True
    return (totals[PREFIX_QUERIES], totals[PREFIX_HITS]) if seen else None


def read_prefix_cache(base_url: str | None) -> tuple[float, float] | None:
    """The counters from ``base_url``/metrics; None where the target has no such page."""
    text = metrics_page(base_url)
    return None if text is None else prefix_cache_counters(text)


def hit_rate(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Share of prompt tokens found in the prefix cache between two readings (0-1)."""
    if before is None or after is None:
        return None
    queries, hits = after[0] - before[0], after[1] - before[1]
    return hits / queries if queries > 0 else None


# --- the CLI's run ----------------------------------------------------------------------------

def profile_from_args(args) -> ProgramProfile:
    from options.bench.profile import one_concurrency, parse_lengths

    if args.request_rate is not None:
        raise BadInput("--profile agent runs closed-loop programs (a new one starts when one ends): "
                       "leave out --request-rate and set --concurrency")
    return ProgramProfile(programs=args.programs, steps=args.steps, think_ms=args.think_ms,
                          system_tokens=args.system_tokens,
                          prompt_tokens=parse_lengths(args.prompt_tokens, "--prompt-tokens", ("prompt_tokens",)),
                          output_tokens=parse_lengths(args.output_tokens, "--output-tokens",
                                                      ("output_tokens", "max_tokens")),
                          concurrency=one_concurrency(args) or 8, seed=args.seed)


def measure_programs(profile: ProgramProfile, send, template, tokens, url: str | None, bar=None,
                     priorities: Sequence[int] | None = None) -> tuple[ProgramRun, dict[str, Any], float | None]:
    """One run of every program: the run, its summary parts, and the prefix-cache hit rate."""
    before = read_prefix_cache(url)
    task = bar.add_task("programs", total=profile.programs) if bar else None
    result = run(profile, send, template, tokens,
                 (lambda n, _: bar.update(task, completed=n)) if bar else None, priorities)
    rate = hit_rate(before, read_prefix_cache(url))
    return result, summarize_programs(result, profile.think_ms / 1000, profile.seed), rate


def bench_programs(args, template, send, details: dict[str, Any], console) -> int:
    """``python -m options.bench --profile agent``: run, summarise, write JSON, print tables."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from options.bench import priority, report
    from options.bench.warmup import warm_up_and_calibrate

    profile = profile_from_args(args)
    priorities = priority.priorities_for(args.priority, profile.steps, details)   # before any load
    ready, tokens = warm_up_and_calibrate(args, send, template, console, profile.seed)
    if not ready:
        return 1
    if args.priority == "compare":
        return compare_priorities(args, profile, template, send, details, tokens, console)
    with Progress(TextColumn("[bold]programs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=args.no_progress, transient=True) as bar:
        result, parts, rate = measure_programs(profile, send, template, tokens, details.get("url"),
                                               bar, priorities)
    doc = program_doc(args, profile, template, details, tokens, result, parts, rate)
    if priorities:
        doc["priority"] = {"mode": args.priority, "step_priorities": priorities}
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(render_table(doc))
    if not parts["program"]["completed"]:
        console.print(f"[red]every program failed:[/red] {parts['program']['errors']}")
        return 1
    return 0


def compare_priorities(args, profile, template, send, details, tokens, console) -> int:
    """``--priority compare``: alternate runs without and with the priorities, then report."""
    from options.bench import report
    from options.bench.priority import priorities_for, render_compare, step_priorities, summarize_compare

    if not isinstance(args.rounds, int) or args.rounds < 1:
        raise BadInput(f"--rounds {args.rounds!r} must be a whole number >= 1 (3 or more to read "
                       "medians with a spread)")
    priorities = priorities_for("later-steps", profile.steps, details)
    say = (lambda *_: None) if args.no_progress else console.print
    runs, kept = [], {}
    for rnd in range(1, args.rounds + 1):
        this = replace(profile, seed=profile.seed + rnd - 1)   # its own words, shared by both modes
        for mode in (("off", "on") if rnd % 2 else ("on", "off")):
            result, parts, rate = measure_programs(this, send, template, tokens, details.get("url"),
                                                   priorities=priorities if mode == "on" else None)
            prog = parts["program"]
            row = {"round": rnd, "mode": mode, "program_e2e_ms_p50": prog["e2e_ms"]["p50"],
                   "program_e2e_ms_p99": prog["e2e_ms"]["p99"],
                   "programs_per_second": prog["programs_per_second"],
                   "step_ttft_ms_p50": [s["ttft_ms"]["p50"] for s in parts["steps"]],
                   "completed": prog["completed"], "errors": prog["errors"], "prefix_cache_hit_rate": rate}
            runs.append(row)
            kept[(rnd, mode)] = (this, result, parts, rate)
            say(f"round {rnd} · priority {mode}: program E2E p50 {row['program_e2e_ms_p50'] or 0:,.0f} ms, "
                f"p99 {row['program_e2e_ms_p99'] or 0:,.0f} ms"
                + (f", errors {prog['errors']}" if prog["errors"] else ""))
    ons = sorted((r for r in runs if r["mode"] == "on"), key=lambda r: r["program_e2e_ms_p99"] or 0)
    this, result, parts, rate = kept[(ons[(len(ons) - 1) // 2]["round"], "on")]
    doc = program_doc(args, this, template, details, tokens, result, parts, rate)
    doc["priority"] = {"mode": "compare", "rounds": args.rounds,
                       "step_priorities": step_priorities(profile.steps),
                       **summarize_compare(runs), "runs": runs}
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(render_table(doc))
        console.print(render_compare(doc["priority"]))
    failed = [r for r in runs if r["completed"] == 0]
    if failed:
        console.print(f"[red]every program of a run failed:[/red] {failed[0]['errors']}")
        return 1
    return 0


def program_doc(args, profile, template, details, tokens, result, parts, rate) -> dict[str, Any]:
    from options.bench import report

    doc = report.bench_json(parts["requests"], profile, level=args.level, target=args.target,
                            model=template.model or args.model or details.get("served_model"),
                            started_at=result.started_at,
                            details={**details, "warmup_requests": args.warmup,
                                     "prompt_calibration": tokens.to_json() if tokens else None,
                                     "prefix_cache": "vLLM's /metrics counters" if rate is not None else
                                     NO_HIT_RATE})
    doc.update(program=parts["program"], steps=parts["steps"], prefix_cache_hit_rate=rate)
    return doc


def render_table(doc: dict[str, Any]):
    """Per-step and per-program latency, predicted vs measured tail, throughput, cache hits."""
    from rich.console import Group
    from rich.table import Table

    from options.bench.report import _ms

    p, prog = doc["profile"], doc["program"]
    lat = Table(title=f"{p['programs']} programs × {p['steps']} steps, {p['concurrency']} at once, "
                      f"think {p['think_ms']:g} ms · level {doc['level'] if doc['level'] is not None else '?'} · "
                      f"{doc['target']} · {doc['model'] or 'server default model'}")
    lat.add_column("latency (ms)")
    for s in STATS:
        lat.add_column(s, justify="right")
    for step in doc["steps"]:
        for key, label in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
            lat.add_row(f"step {step['step']} {label}", *(_ms(step[key][s]) for s in STATS))
    lat.add_row("program TTFT (last step)", *(_ms(prog["ttft_ms"][s]) for s in STATS))
    lat.add_row("program E2E", *(_ms(prog["e2e_ms"][s]) for s in STATS))
    tail = Table(title="program tail: measured vs predicted from the steps")
    tail.add_column("")
    for q in TAIL:
        tail.add_column(q, justify="right")
    tail.add_row("measured", *(_ms(prog["e2e_ms"][q]) for q in TAIL))
    tail.add_row("predicted (independent steps, sampled)", *(_ms(prog["predicted_e2e_ms"][q]) for q in TAIL))
    tail.add_row("sum of step p99s", "", _ms(prog["sum_of_step_p99_ms"]))
    rate = doc["prefix_cache_hit_rate"]
    tput = Table(show_header=False)
    tput.add_row("programs/s", f"{prog['programs_per_second']:,.3f}")
    tput.add_row("output tokens/s", f"{doc['metrics']['output_tokens_per_second']:,.1f}")
    tput.add_row("completed", f"{prog['completed']} of {p['programs']} programs")
    tput.add_row("tokens in / out (server usage)",
                 f"{doc['counts']['input_tokens']:,} / {doc['counts']['output_tokens']:,}")
    tput.add_row("prefix-cache hit rate", "not measured" if rate is None else f"{rate:.1%}")
    tput.add_row("wall time", f"{doc['duration_s']:.2f} s")
    tput.add_row("errors", ", ".join(f"{k}: {v}" for k, v in prog["errors"].items()) or "none")
    return Group(lat, tail, tput)
