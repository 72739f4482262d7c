"""The cost of one agent task on every rung, at a program-level latency target.

An agent task is several serial calls, so it is priced as a whole: its tokens (every call's
input and output) and, on a self-hosted rung, how many tasks one replica completes per second
while the task's p99 stays within the target. Two sources:

- an agent trace (``python -m options.agent ... --trace FILE``): one task's calls and tokens;
  a self-hosted replica's capacity then comes from ``--capacity`` (output tokens/s);
- an agent bench (``python -m options.bench --profile agent --json FILE``): tokens per task,
  programs per second and the measured program p99 at the benched concurrency.

Bedrock bills each task's tokens. A self-hosted rung bills replica-hours: at a monthly volume
it runs ``max(min_replicas, ceil(peak / capacity))`` replicas (the fleet model of
``cost.fleet``), so its cost per task falls with volume until the flip point, the monthly
task count at which it becomes cheaper than Bedrock.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost.breakeven import Capacity, Mix, check_range
from options.core import RUNGS, BadInput

TRACE_SCHEMA = "spectrum.agent-trace/1"
BENCH_SCHEMA = "spectrum.bench/1"
DEFAULT_TASKS_PER_MONTH = 100_000


@dataclass(frozen=True)
class Task:
    """What one agent task uses, and what was measured about it."""
    input_tokens: float
    output_tokens: float
    calls: float
    origin: str
    e2e_p99_ms: float | None = None          # the program's measured p99 (a bench)
    tasks_per_second: float | None = None    # one replica's measured program throughput (a bench)
    measured_at: dict[str, Any] | None = None

    @property
    def tokens(self) -> float:
        return self.input_tokens + self.output_tokens

    @property
    def mix(self) -> Mix:
        return Mix(self.input_tokens, self.output_tokens,
                   f"{self.input_tokens / self.output_tokens:.2f}:1 (the task's own)")


def _read(path: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"{what} {path!r} does not exist (write an agent trace with `python -m options.agent ... "
                       "--trace FILE`, an agent bench with `python -m options.bench --profile agent --json FILE`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{what} {path!r} is not readable JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{what} {path!r} holds a {type(doc).__name__}, not a JSON object")
    return doc


def _positive(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{where} is {value!r}: it must be a positive number")
    return float(value)


def task_from_trace(path: str) -> Task:
    """One task from an agent trace: the sum of its calls' tokens."""
    doc = _read(path, "trace")
    where = f"trace {path!r}"
    if doc.get("schema") != TRACE_SCHEMA:
        raise BadInput(f"{where} is not an agent trace (expected \"schema\": \"{TRACE_SCHEMA}\", got "
                       f"{doc.get('schema')!r}); write one with `python -m options.agent ... --trace FILE`")
    calls = doc.get("calls")
    if not isinstance(calls, list) or not calls:
        raise BadInput(f"{where} has no calls: the agent made none, so there is no task to price")
    tokens = {"input_tokens": 0.0, "output_tokens": 0.0}
    for k, call in enumerate(calls):
        for key in tokens:
            value = call.get(key) if isinstance(call, dict) else None
            if not isinstance(value, int) or value < 0:
                raise BadInput(f"{where}: calls[{k}].{key} is {value!r}; it must be a whole number >= 0 "
                               "(the server's own count)")
            tokens[key] += value
    _positive(tokens["output_tokens"], f"{where}: the calls' output tokens")
    return Task(tokens["input_tokens"], tokens["output_tokens"], len(calls), where,
                measured_at={"level": doc.get("level"), "target": doc.get("target"), "model": doc.get("model"),
                             "e2e_ms": (doc.get("totals") or {}).get("e2e_ms")})


def task_from_bench(path: str) -> Task:
    """Tokens per task, programs per second and the program p99 from an agent bench."""
    doc = _read(path, "bench file")
    where = f"bench file {path!r}"
    profile = doc.get("profile") or {}
    if doc.get("schema") != BENCH_SCHEMA or profile.get("kind") != "agent" or "program" not in doc:
        raise BadInput(f"{where} is not an agent bench (expected \"schema\": \"{BENCH_SCHEMA}\" with a "
                       "\"program\" section); write one with `python -m options.bench --profile agent "
                       "--json FILE`")
    counts, program = doc.get("counts") or {}, doc["program"]
    completed = _positive(counts.get("completed"), f"{where}: counts.completed")
    steps = _positive(profile.get("steps"), f"{where}: profile.steps")
    per_call_in = (counts.get("input_tokens") or 0) / completed
    per_call_out = _positive(counts.get("output_tokens"), f"{where}: counts.output_tokens") / completed
    return Task(per_call_in * steps, per_call_out * steps, steps, where,
                e2e_p99_ms=_positive((program.get("e2e_ms") or {}).get("p99"), f"{where}: program.e2e_ms.p99"),
                tasks_per_second=_positive(program.get("programs_per_second"), f"{where}: program.programs_per_second"),
                measured_at={"level": doc.get("level"), "target": doc.get("target"), "model": doc.get("model"),
                             "concurrency": profile.get("concurrency"),
                             "prefix_cache_hit_rate": doc.get("prefix_cache_hit_rate")})


def replica_capacity(task: Task, capacity_tok_s: float | None,
                     origin: str = "--capacity") -> tuple[Capacity | None, str]:
    """One replica's capacity in output tokens/s, and where it came from (``origin``: the flag, or
    the specs it was predicted from)."""
    if capacity_tok_s is not None:
        check_range("capacity", capacity_tok_s, 0.0, 1e7, low_open=True, unit=" output tok/s")
        return Capacity(capacity_tok_s, origin), (
            f"one replica: {capacity_tok_s:,.1f} output tok/s ({origin}) = "
            f"{capacity_tok_s / task.output_tokens:.4g} tasks/s at {task.output_tokens:,.0f} output tokens a task")
    if task.tasks_per_second is not None:
        tok_s = task.tasks_per_second * task.output_tokens
        return Capacity(tok_s, task.origin, measured_at=task.measured_at or {}), (
            f"one replica: {task.tasks_per_second:.4g} tasks/s measured by {task.origin} at concurrency "
            f"{(task.measured_at or {}).get('concurrency')}, program p99 {task.e2e_p99_ms:,.0f} ms")
    return None, "no replica capacity: self-hosted rungs are priced only with --capacity or an agent --bench"


def price_task(task: Task, table, model_id: str, instance: str, *, tasks_per_month: float,
               slo_p99_ms: float | None = None, capacity_tok_s: float | None = None,
               hours_per_day: float = 24.0, min_replicas: int = 1, discount_pct: float = 0.0,
               tier: str = "on_demand", eks_fixed_hourly: float = 0.0,
               capacity_origin: str = "--capacity") -> dict[str, Any]:
    """Dollars per task on every rung at ``tasks_per_month``, and each self-hosted rung's flip point
    (``capacity_origin`` says where ``capacity_tok_s`` came from)."""
    from cost.breakeven import SECONDS_PER_HOUR
    from cost.fleet import build_fleets, make_traffic

    check_range("tasks per month", tasks_per_month, 0.0, 1e13, low_open=True)
    if slo_p99_ms is not None:
        check_range("--slo-p99", slo_p99_ms, 0.0, 1e8, low_open=True, unit=" ms")
    price = table.bedrock(model_id)
    bedrock_task = price.cost(task.input_tokens, task.output_tokens, tier)
    traffic, _ = make_traffic(task.mix, tokens_per_month=tasks_per_month * task.tokens, hours_per_day=hours_per_day)
    capacity, capacity_note = replica_capacity(task, capacity_tok_s, capacity_origin)
    assumptions = [
        f"one task = {task.calls:g} calls, {task.input_tokens:,.0f} input + {task.output_tokens:,.0f} output tokens "
        f"({task.origin})",
        f"Bedrock {price.model_id} ({tier}): prices as of {price.as_of}; {price.source}; prompt caching not counted",
        capacity_note,
        f"{tasks_per_month:,.0f} tasks/month over {hours_per_day:g} h/day, peak = average",
    ]
    rows: list[dict[str, Any]] = [{
        "level": 1, "rung": RUNGS[0].name, "billing": RUNGS[0].billed, "per_task_usd": bedrock_task,
        "monthly_usd": bedrock_task * tasks_per_month, "meets_slo": None,
        "latency": "not measured here: Bedrock's latency is the service's"}]
    slo_note = None
    if capacity is not None:
        meets = None
        if slo_p99_ms is not None and task.e2e_p99_ms is not None:
            meets = task.e2e_p99_ms <= slo_p99_ms
            slo_note = (f"program p99 {task.e2e_p99_ms:,.0f} ms {'within' if meets else 'over'} the "
                        f"{slo_p99_ms:,.0f} ms target at the benched concurrency"
                        + ("" if meets else ": self-hosted rungs are left out of the cheapest; bench "
                           "again at a lower --concurrency to find the load that meets it"))
        elif slo_p99_ms is not None:
            slo_note = (f"the capacity ({capacity_origin.split(':')[0]}) carries no program latency: whether "
                        "it meets the p99 target is not known")
        inst = table.instance(instance)
        for fleet in build_fleets(table, inst, {}, capacity, min_replicas, discount_pct,
                                  eks_fixed_hourly=eks_fixed_hourly):
            monthly = fleet.monthly(traffic)
            tasks_per_hour = capacity.output_tokens_per_second / task.output_tokens * SECONDS_PER_HOUR
            flip = fleet.breakeven_tokens_per_month(traffic, bedrock_task / task.tokens * 1e6)
            rung = RUNGS[fleet.level - 1]
            rows.append({"level": fleet.level, "rung": rung.name, "billing": rung.billed,
                         "per_task_usd": monthly / tasks_per_month, "monthly_usd": monthly,
                         "per_task_at_full_load_usd": fleet.hourly / tasks_per_hour,
                         "replicas": fleet.replicas(traffic), "meets_slo": meets,
                         "flip_tasks_per_month": None if flip is None else flip / task.tokens,
                         **fleet.to_json(traffic)})
    if slo_note:
        assumptions.append(slo_note)
    if task.tasks_per_second is not None and (task.measured_at or {}).get("target") in ("local", "emulator"):
        assumptions.append(f"the bench ran on target {task.measured_at['target']!r}, not on {instance}: rerun it "
                           "against the real endpoint before trusting the self-hosted figures")
    eligible = [r for r in rows if r["meets_slo"] is not False]
    cheapest = min(eligible, key=lambda r: (round(r["monthly_usd"], 6), r["level"]))
    flips = [r for r in eligible if r.get("flip_tasks_per_month") is not None]
    first_flip = min(flips, key=lambda r: (r["flip_tasks_per_month"], r["level"])) if flips else None
    return {"task": {"input_tokens": task.input_tokens, "output_tokens": task.output_tokens, "calls": task.calls,
                     "origin": task.origin, "e2e_p99_ms": task.e2e_p99_ms, "measured_at": task.measured_at},
            "tasks_per_month": tasks_per_month, "slo_p99_ms": slo_p99_ms, "rungs": rows,
            "cheapest_level": cheapest["level"], "cheapest_rung": cheapest["rung"],
            # Above this monthly volume a self-hosted rung costs less per task than Bedrock.
            "flip": None if first_flip is None else {"level": first_flip["level"], "rung": first_flip["rung"],
                                                     "tasks_per_month": first_flip["flip_tasks_per_month"]},
            "assumptions": assumptions}


def render(data: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    from cost.breakeven import tokens
    from cost.render import SHORT_NAMES, _assumptions, _money, console

    t = Table(box=box.SIMPLE_HEAD, title=f"One agent task on every rung at {data['tasks_per_month']:,.0f} tasks/month"
              + (f", program p99 target {data['slo_p99_ms']:,.0f} ms" if data["slo_p99_ms"] else ""))
    for col in ("lvl", "rung", "runs on", "repl.", "$/task", "$/task full", "$/month", "flips at", "p99 ok"):
        t.add_column(col, justify="left" if col in ("rung", "runs on") else "right", no_wrap=True)
    for r in data["rungs"]:
        flip = r.get("flip_tasks_per_month")
        self_hosted = r["level"] != 1
        t.add_row(str(r["level"]), SHORT_NAMES[r["level"]], r.get("instance_type", "per token"),
                  str(r.get("replicas", "—")), _money(r["per_task_usd"], 5),
                  _money(r.get("per_task_at_full_load_usd"), 5) if self_hosted else "—",
                  _money(r["monthly_usd"], 0),
                  ("never" if flip is None else f"{tokens(flip)}/mo") if self_hosted else "—",
                  {True: "yes", False: "no", None: "?"}[r["meets_slo"]],
                  style="bold green" if r["level"] == data["cheapest_level"] else None)
    console.print(t)
    console.print(f"Cheapest: rung {data['cheapest_level']} ({data['cheapest_rung']})", highlight=False)
    flip = data["flip"]
    console.print("No self-hosted rung gets cheaper than Bedrock at any volume" if flip is None else
                  f"Self-hosting gets cheaper than Bedrock above {flip['tasks_per_month']:,.0f} tasks/month "
                  f"(rung {flip['level']}, {SHORT_NAMES[flip['level']]})", highlight=False)
    _assumptions(data["assumptions"])
