"""Program-aware priority for the bench's agent profile (``--profile agent --priority ...``).

An agent's user waits for every step of the program, so a step of a program that is already
running matters more than the first step of a new one: it has already been waited for. With
``later-steps`` step k (1-based) is sent with vLLM's request ``priority`` -k (lower is
scheduled sooner; ``options.contract`` carries it in OpenAI bodies and TGI's ``parameters``),
so the engine finishes running programs before it starts new ones. The
server must schedule by priority (vLLM's ``--scheduling-policy priority``; the
bring-your-own server: ``SM_VLLM_SCHEDULING_POLICY=priority``); under vLLM's default
first-come-first-served policy a priority other than 0 is refused.

``compare`` runs the same programs (steps, lengths, think time) at the same concurrency
``--rounds`` times each without and with the priorities, alternating which goes first
(``program.compare_priorities``; this module summarises and shows the rounds); each
round draws its own prompt words (seed + round), shared by its two runs, so neither run finds
the other's sessions in the prefix cache beyond the shared system prompt. The document's
``priority`` object:

- ``priority.off`` / ``priority.on``: ``program_e2e_ms_p50``, ``program_e2e_ms_p99``,
  ``programs_per_second`` (each ``{median, min, max}`` over rounds) and
  ``step_ttft_ms_p50`` (per step, the median over rounds);
- ``priority.p99_ratio`` and ``priority.p50_ratio``: program E2E with / without, per round,
  ``{median, min, max}``;
- ``priority.runs``: every run (round, mode, program p50/p99, programs/s, errors).
The document's ``program`` and ``steps`` are the median-p99 run with the priorities on.
"""
from __future__ import annotations

import statistics
from typing import Any

from options.bench.metrics import spread
from options.core import BadInput

MODES = ("off", "later-steps", "compare")


def step_priorities(steps: int) -> list[int]:
    """vLLM's priority of each step: -k for step k, so later steps of running programs go first."""
    return [-(k + 1) for k in range(steps)]


def priorities_for(mode: str, steps: int, details: dict[str, Any]) -> list[int] | None:
    """Each step's priority for ``mode`` (None when off). The contract carries ``priority`` in
    every dialect but Bedrock's Converse, which has no such field: refused there."""
    if mode == "off":
        return None
    if details.get("service") == "bedrock-runtime":
        raise BadInput(f"--priority {mode}: Bedrock has no request priority to send; measure a "
                       "server that runs vLLM (levels 2-6, --url, or the local one)")
    return step_priorities(steps)


def summarize_compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each mode's figures over rounds and the per-round with/without ratios (pure)."""
    out: dict[str, Any] = {}
    for mode in ("off", "on"):
        mine = [r for r in runs if r["mode"] == mode]
        n_steps = max((len(r["step_ttft_ms_p50"]) for r in mine), default=0)
        out[mode] = {k: spread([r[k] for r in mine])
                     for k in ("program_e2e_ms_p50", "program_e2e_ms_p99", "programs_per_second")}
        out[mode]["step_ttft_ms_p50"] = [
            statistics.median(xs) if (xs := [r["step_ttft_ms_p50"][k] for r in mine
                                              if r["step_ttft_ms_p50"][k] is not None]) else None
            for k in range(n_steps)]
    pick = {(r["round"], r["mode"]): r for r in runs}
    rounds = sorted({r["round"] for r in runs})
    for key, field in (("p99_ratio", "program_e2e_ms_p99"), ("p50_ratio", "program_e2e_ms_p50")):
        out[key] = spread([pick[(n, "on")][field] / pick[(n, "off")][field]
                            for n in rounds if (n, "on") in pick and (n, "off") in pick
                            and pick[(n, "on")][field] and pick[(n, "off")][field]])
    return out


def render_compare(p: dict[str, Any]):
    from rich.table import Table

    f = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    band = lambda s, fmt=f: f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"  # noqa: E731
    r2 = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    t = Table(title=f"program-aware priority: {p['rounds']} alternating rounds, medians (min–max)")
    for col in ("priority", "program E2E p50 ms", "program E2E p99 ms", "programs/s",
                "step TTFT p50 ms"):
        t.add_column(col, justify="right")
    for mode in ("off", "on"):
        e = p[mode]
        t.add_row("later steps first" if mode == "on" else "off", band(e["program_e2e_ms_p50"]),
                  band(e["program_e2e_ms_p99"]),
                  band(e["programs_per_second"], lambda x: "-" if x is None else f"{x:.3f}"),
                  " / ".join(f(x) for x in e["step_ttft_ms_p50"]))
    t.add_row("with / without", band(p["p50_ratio"], r2), band(p["p99_ratio"], r2), "", "")
    return t

