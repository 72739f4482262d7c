"""The bench's two outputs: the JSON file the cost model reads, and a table for people."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from options.bench.metrics import STATS, Summary
from options.bench.profile import Profile
from options.core import BadInput

SCHEMA = "spectrum.bench/1"


def bench_json(summary: Summary, profile: Profile, *, level: int | None, target: str, model: str | None,
               started_at: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``spectrum.bench/1`` document (read by ``python -m cost breakeven --bench``)."""
    doc: dict[str, Any] = {
        "schema": SCHEMA, "level": level, "target": target, "model": model,
        "profile": profile.to_json(), "metrics": summary.metrics_json(),
        "counts": summary.counts_json(), "started_at": started_at,
        "duration_s": summary.duration_s,
    }
    if details:
        doc["details"] = details        # how it was reached (URL, dialect, ...): not needed to read it
    return doc


def write_json(doc: dict[str, Any], path: str) -> None:
    text = json.dumps(doc, indent=2) + "\n"
    if path == "-":
        print(text, end="")
        return
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise BadInput(f"--json {path!r} cannot be written: {exc.strerror}") from None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def render_table(doc: dict[str, Any]):
    """A rich renderable: latency distributions, throughput, counts and errors."""
    from rich.console import Group
    from rich.table import Table

    m, c, p = doc["metrics"], doc["counts"], doc["profile"]
    pace = (f"concurrency {p['concurrency']}" if p["request_rate"] is None else
            f"{p['request_rate']:g} req/s (burstiness {p['burstiness']:g})"
            + (f", at most {p['concurrency']} in flight" if p["concurrency"] else ""))
    lengths = lambda d: {"fixed": lambda: f"{d['value']}",  # noqa: E731
                         "uniform": lambda: f"{d['low']}–{d['high']}",
                         "jsonl": lambda: f"{d['path']} (mean {d['mean']:.0f})"}[d["kind"]]()
    title = (f"level {doc['level'] if doc['level'] is not None else '?'} · {doc['target']} · "
             f"{doc['model'] or 'server default model'}")
    lat = Table(title=title, caption=f"{p['requests']} requests, {pace}, prompt ≈ "
                f"{lengths(p['prompt_tokens'])} tokens, output {lengths(p['output_tokens'])} tokens, "
                f"seed {p['seed']}")
    lat.add_column("latency (ms)")
    for s in STATS:
        lat.add_column(s, justify="right")
    for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        lat.add_row(label, *(_ms(m[key][s]) for s in STATS))
    tput = Table(show_header=False)
    tput.add_row("output tokens/s", f"{m['output_tokens_per_second']:,.1f}")
    tput.add_row("requests/s", f"{m['requests_per_second']:,.2f}")
    tput.add_row("completed", f"{c['completed']} of {p['requests']}")
    tput.add_row("tokens in / out (server usage)", f"{c['input_tokens']:,} / {c['output_tokens']:,}")
    tput.add_row("wall time", f"{doc['duration_s']:.2f} s")
    tput.add_row("errors", ", ".join(f"{k}: {v}" for k, v in c["errors"].items()) or "none")
    return Group(lat, tput)
