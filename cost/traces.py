"""Request traces: the one reader both trace replay (``python -m options.bench --replay``) and the
simulator (``python -m cost simulate --trace``) use, so both see the same requests at the same times.

A trace is when each request arrived and how many tokens went in and came out. Four formats:

- ``azure``: the Azure LLM inference trace 2023 CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (``2023-11-16 18:15:46.6805900``). The conversation hour ships with Spectrum: ``AZURE_CONV_TRACE``.
- ``mooncake``: Mooncake's JSON lines ``{"timestamp": ms, "input_length", "output_length",
  "hash_ids": [...]}``; ``hash_ids`` (optional) name shared prompt blocks, kept as ``prefix_blocks``.
- ``ledger``: the gateway's metered ledger (its memory store's ``usage.jsonl``, or ``admin usage
  --json``), read with ``cost.bill.read_usage``. The gateway stamps a record (``ts_ms``) when its
  request ends, so a request arrived at ``ts_ms - latency_ms``. Failed requests are kept: they were
  offered traffic.
- ``curve``: a per-minute or hourly curve (e.g. a CloudWatch ``Invocations`` export): a time column
  and one column of requests (or tokens) per bin. Arrivals are drawn as a Poisson process whose
  rate follows the curve, constant within each bin, and each request's sizes are drawn from a
  trace of requests (``mix_trace``, by default the shipped Azure conversation hour).

What is done to every trace, in this order: rows sorted by time (a note says how many were out of
order); times re-based to the first row; ``window`` cut; ``scale`` applied to the arrival rate;
``token_scale`` applied to the sizes. ``Trace.spec`` records the arguments, so ``spec_trace`` reads
the same trace again (same seed, same requests).

Errors are ``BadInput`` naming the file, the line, the column (for JSON lines: the field), what is
wrong and what would be right.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from options.core import BadInput

TRACE_FORMATS = ("azure", "mooncake", "ledger", "curve")
AZURE_CONV_TRACE = Path(__file__).resolve().parent / "data" / "traces" / "azure-llm-inference-2023-conv.csv"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
WINDOW_SYNTAX = "START_S:END_S, seconds from the trace's first row, e.g. 600:1200"
FORMATS_HELP = ("azure (CSV with header TIMESTAMP,ContextTokens,GeneratedTokens), mooncake (JSON lines with "
                "timestamp, input_length, output_length), ledger (the gateway's usage.jsonl or `admin usage "
                "--json`), curve (CSV with a time column and a requests, Invocations or tokens column)")

# Separate random streams per step, so that changing --scale does not change a curve's draw.
_SCALE_STREAM, _CURVE_STREAM = 1, 2
# A curve's time column, and the words that say what its value column counts.
_TIME_WORDS = ("timestamp", "time", "date", "datetime", "ts", "period")
_REQUEST_WORDS = ("request", "requests", "invocation", "invocations", "count")
_TOKEN_WORDS = ("token", "tokens")
# Mooncake's traces name one hash id per 512 prompt tokens.
DEFAULT_BLOCK_TOKENS = 512
# A zone at the end of an ISO 8601 time: Z, +HH, +HHMM or +HH:MM.
_ZONE_SUFFIX = re.compile(r"(?:Z|[+-]\d\d(?::?\d\d)?)$", re.IGNORECASE)


# --- the trace -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trace:
    """Requests as arrivals and sizes, ready to replay or simulate.

    The arrays are read-only (a trace is shared by whoever read it); copy one to change it.
    ``prefix_blocks`` is a tuple per request of Mooncake ``hash_ids`` (empty where a row had
    none), or None when the trace says nothing about prefixes (every other format, and a Mooncake
    file without ``hash_ids``).
    """
    arrival_s: np.ndarray      # float64, seconds from the window's start, sorted ascending (>= 0)
    input_tokens: np.ndarray   # int64, >= 0 (after token_scale, rounded; >= 1 where the row had >= 1)
    output_tokens: np.ndarray  # int64, >= 0
    prefix_blocks: tuple[tuple[int, ...], ...] | None
    span_s: float              # the window's length: END-START with a window, else last - first arrival
                               # plus the mean gap (a curve: its bins' length); > 0 even for one request
    spec: dict                 # read_trace's arguments: spec_trace(spec) reads the same trace again
    notes: tuple[str, ...]     # what was done to it that a user should know

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def summary(self) -> dict:
        return {"requests": len(self), "span_s": float(self.span_s),
                "input_tokens": int(self.input_tokens.sum()), "output_tokens": int(self.output_tokens.sum())}

    # Defined here so the dataclass keeps them: the generated ones would compare arrays elementwise
    # (an error) and print every request.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (np.array_equal(self.arrival_s, other.arrival_s)
                and np.array_equal(self.input_tokens, other.input_tokens)
                and np.array_equal(self.output_tokens, other.output_tokens)
                and self.prefix_blocks == other.prefix_blocks and self.span_s == other.span_s
                and self.spec == other.spec and self.notes == other.notes)

    def __repr__(self) -> str:
        return (f"Trace({self.spec.get('format')} {self.spec.get('path')!r}: {len(self):,} requests "
                f"over {self.span_s:,.1f} s)")


class _Rows(NamedTuple):
    """What a format's reader hands to the common steps: one entry per request, in file order."""
    seconds: np.ndarray          # float64, from the earliest row (a curve: from its first bin)
    input_tokens: np.ndarray     # int64
    output_tokens: np.ndarray    # int64
    prefix_blocks: list | None   # tuples of ints, or None
    end_s: float | None          # where the trace's own window ends, when it knows (a curve)


# --- reading ---------------------------------------------------------------------------------------

def read_trace(path, fmt=None, window=None, scale=1.0, token_scale=1.0, seed=0, mix_trace=None) -> Trace:
    """The trace in ``path``.

    ``fmt``: one of TRACE_FORMATS, or None to tell it from the content. ``window``: (START_S,
    END_S) (or "START_S:END_S") relative to the first row's time; keeps arrivals in [START, END)
    and re-bases them to START. ``scale`` (> 0): multiplies the arrival rate, keeping each
    request's sizes and the trace's shape (see ``scale_arrivals``; a curve's rate is multiplied
    directly); the copies' Mooncake prefix block ids are offset per copy, so no copy shares a
    prefix with the original or with another copy. ``token_scale`` (> 0): multiplies every
    request's input and output tokens (rounded; a request that had tokens keeps at least one).
    ``seed``: for everything drawn at random (scale's copies and thinning, a curve's arrivals and
    sizes). ``mix_trace``: for a curve only, the trace of requests its sizes are drawn from
    (default: the shipped Azure conversation hour).
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise BadInput(f"trace path {path!r} is not a file name: give the trace's file")
    path = Path(path)
    window = _check_window(window)
    scale = _check_positive(scale, "--scale", "it multiplies the arrival rate: 0.5 halves it, 2 doubles it")
    token_scale = _check_positive(token_scale, "--token-scale",
                                  "it multiplies every request's input and output tokens: 0.5 halves them")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BadInput(f"--trace-seed {seed!r} is not a seed: give a whole number >= 0, e.g. 0")
    seed = int(seed)
    text = _read_text(path)
    if fmt is None:
        fmt = detect_format(path, text)
    elif not isinstance(fmt, str) or fmt.strip().lower() not in TRACE_FORMATS:
        raise BadInput(f"trace format {fmt!r} is not one of {', '.join(TRACE_FORMATS)}: {FORMATS_HELP}")
    fmt = fmt.strip().lower()
    if mix_trace is not None and fmt != "curve":
        raise BadInput(f"--mix-trace {str(mix_trace)!r} is for a curve (it fills the curve with requests); "
                       f"trace {str(path)!r} is {fmt}, whose requests carry their own sizes: leave --mix-trace out")
    spec = {"path": os.path.abspath(path), "format": fmt, "window": list(window) if window else None,
            "scale": scale, "token_scale": token_scale, "seed": seed,
            "mix_trace": os.path.abspath(mix_trace) if mix_trace is not None else None}

    notes: list[str] = []
    if fmt == "azure":
        rows = _read_azure(path, text)
    elif fmt == "mooncake":
        rows = _read_mooncake(path, text, notes)
    elif fmt == "ledger":
        rows = _read_ledger(path, notes)
    else:
        rows = _read_curve(path, text, mix_trace, scale, seed, notes)
    if rows.seconds.size == 0:
        raise BadInput(f"trace {str(path)!r} holds no requests: give a trace with at least one")

    seconds, inputs, outputs, blocks = _sorted(rows, path, fmt, notes)
    own_span = rows.end_s if rows.end_s is not None else _span_of(seconds, notes)
    if window is not None:
        seconds, inputs, outputs, blocks = _cut_window(path, window, seconds, inputs, outputs, blocks,
                                                        own_span, notes)
        span = window[1] - window[0]
    else:
        span = own_span
    if scale != 1.0 and fmt != "curve":   # a curve's rate was scaled as it was drawn
        rng = np.random.default_rng((seed, _SCALE_STREAM))
        seconds, source, copy = scale_arrivals(seconds, span, scale, rng)
        if seconds.size == 0:
            raise BadInput(f"--scale {scale:g} kept none of the trace's {len(inputs):,} requests: give a larger "
                           f"scale (each request is kept with probability {scale:g})")
        inputs, outputs = inputs[source], outputs[source]
        if blocks is not None:
            blocks = _offset_blocks(blocks, source, copy)
        notes.append(_scale_note(scale, len(source), blocks is not None))
    if token_scale != 1.0:
        inputs, outputs = _scale_tokens(inputs, token_scale), _scale_tokens(outputs, token_scale)
        notes.append(f"--token-scale {token_scale:g}: input and output tokens multiplied by {token_scale:g} "
                     f"(rounded; a request that had tokens keeps at least 1)")
    return Trace(_frozen(seconds.astype(np.float64, copy=False)), _frozen(inputs.astype(np.int64, copy=False)),
                 _frozen(outputs.astype(np.int64, copy=False)),
                 tuple(blocks) if blocks is not None else None, float(span), spec, tuple(notes))


def spec_trace(spec: dict) -> Trace:
    """Read a trace again from the ``spec`` a replay recorded (``Trace.spec``): the same requests
    at the same times, as long as the file is unchanged."""
    if not isinstance(spec, dict) or "path" not in spec:
        raise BadInput(f"trace spec {spec!r} is not a trace's spec: it is a JSON object with \"path\", "
                       f"\"format\", \"window\", \"scale\", \"token_scale\", \"seed\", \"mix_trace\"")
    known = {"path", "format", "window", "scale", "token_scale", "seed", "mix_trace"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise BadInput(f"trace spec has unknown key(s) {', '.join(map(repr, unknown))}: a trace's spec holds "
                       f"{', '.join(sorted(known))}")
    args = dict(spec)
    args["fmt"] = args.pop("format", None)
    return read_trace(**args)


class SentSizes(NamedTuple):
    """The sizes a replay sends for a trace's requests, and how many rows the rule changed."""
    input_tokens: np.ndarray        # prompts clipped to max_input, at least 1 token
    output_tokens: np.ndarray       # answers clipped to max_output, at least 1 token
    clipped_input: int              # rows whose prompt max_input shortened
    clipped_output: int             # rows whose answer max_output shortened
    zero_output: int                # rows with 0 output tokens, sent asking for 1


def sent_sizes(trace: Trace, max_input: int | None = None, max_output: int | None = None) -> SentSizes:
    """The one rule for what a replay of ``trace`` asks for: ``options.bench --replay`` sends
    these sizes, and ``cost simulate --predict-replay`` re-predicts the replay from them."""
    inputs, outputs = trace.input_tokens, trace.output_tokens
    clipped_in = int((inputs > max_input).sum()) if max_input is not None else 0
    clipped_out = int((outputs > max_output).sum()) if max_output is not None else 0
    if max_input is not None:
        inputs = np.minimum(inputs, max_input)
    if max_output is not None:
        outputs = np.minimum(outputs, max_output)
    zero_out = int((outputs < 1).sum())
    return SentSizes(np.maximum(inputs, 1), np.maximum(outputs, 1), clipped_in, clipped_out, zero_out)


def detect_format(path: str | Path, text: str | None = None) -> str:
    """The format of a trace, from its first line; BadInput naming the formats when it is not clear."""
    path = Path(path)
    text = _read_text(path) if text is None else text
    number, first = _first_line(text)
    if first is None:
        raise BadInput(f"trace {str(path)!r} is empty: give a trace with a header or a first record "
                       f"({FORMATS_HELP})")
    stripped = first.strip()
    if stripped.startswith(("{", "[")):
        try:
            record = json.loads(stripped)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            if "input_length" in record:
                return "mooncake"
            if "entries" in record or {"ts_ms", "input_tokens", "output_tokens"} <= set(record):
                return "ledger"
        elif record is None and re.search(r'"entries"\s*:', text[:65536]):
            return "ledger"   # `admin usage --json`, printed over many lines
        raise BadInput(f"trace {str(path)!r} line {number} starts like JSON but is not a trace "
                       f"record I know ({_clip(stripped)}): give --format, one of {FORMATS_HELP}")
    header = next(csv.reader([first]))
    names = {name.strip().lower() for name in header}
    if {name.lower() for name in AZURE_COLUMNS} <= names:
        return "azure"
    if len(header) >= 2 and _time_column(header) is not None:
        return "curve"
    raise BadInput(f"trace {str(path)!r}: cannot tell its format from line {number} ({_clip(stripped)}): "
                   f"give --format, one of {FORMATS_HELP}")


# --- the formats -----------------------------------------------------------------------------------

def _read_azure(path: Path, text: str) -> _Rows:
    header, rows, lines = _csv_table(path, text)
    where = {name.strip().lower(): i for i, name in enumerate(header)}
    for name in AZURE_COLUMNS:
        if name.lower() not in where:
            raise BadInput(f"trace {str(path)!r} line {lines[0]}: the header has no {name!r} column (it has "
                           f"{', '.join(map(repr, header))}); an Azure trace's header is {','.join(AZURE_COLUMNS)}")
    time_at, input_at, output_at = (where[name.lower()] for name in AZURE_COLUMNS)
    body, body_lines = rows[1:], lines[1:]
    if not body:
        raise BadInput(f"trace {str(path)!r} has a header but no rows (line {lines[0] + 1} onwards): give at "
                       f"least one request")
    return _Rows(
        _seconds_column([r[time_at] for r in body], _cell_namer(path, body_lines, time_at, header[time_at])),
        _token_column([r[input_at] for r in body], _cell_namer(path, body_lines, input_at, header[input_at])),
        _token_column([r[output_at] for r in body], _cell_namer(path, body_lines, output_at, header[output_at])),
        None, None)


def _read_mooncake(path: Path, text: str, notes: list[str]) -> _Rows:
    times, inputs, outputs, blocks = [], [], [], []
    any_blocks = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"trace {str(path)!r} line {number}, column {exc.colno}: not JSON ({exc.msg}); a "
                           f"Mooncake trace is one JSON object a line: {{\"timestamp\": ms, \"input_length\": "
                           f"N, \"output_length\": N, \"hash_ids\": [...]}}") from None
        where = f"trace {str(path)!r} line {number}"
        if not isinstance(record, dict):
            raise BadInput(f"{where}: a Mooncake record is a JSON object, got {_clip(line.strip())}")
        for name in MOONCAKE_FIELDS:
            if name not in record:
                raise BadInput(f"{where}: the record has no {name!r} field; each record carries "
                               f"{', '.join(MOONCAKE_FIELDS)} (and optionally hash_ids)")
        stamp = record["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
            raise BadInput(f"{where}, field 'timestamp': {stamp!r} is not a time; give milliseconds from the "
                           f"trace's start, e.g. 27482")
        times.append(stamp / 1000.0)
        inputs.append(_whole_tokens(record["input_length"], f"{where}, field 'input_length'"))
        outputs.append(_whole_tokens(record["output_length"], f"{where}, field 'output_length'"))
        ids = record.get("hash_ids")
        if ids is None:
            blocks.append(())
            continue
        if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in ids):
            raise BadInput(f"{where}, field 'hash_ids': {_clip(json.dumps(ids))} is not a list of block ids; "
                           f"give whole numbers >= 0, e.g. [0, 1, 2]")
        any_blocks = True
        blocks.append(tuple(ids))
    if not times:
        raise BadInput(f"trace {str(path)!r} holds no records: give JSON lines, one request each")
    if not any_blocks:
        notes.append("no record has hash_ids: the trace says nothing about shared prefixes (prefix_blocks is None)")
    seconds = np.asarray(times, dtype=np.float64)
    return _Rows(seconds - seconds.min(), np.asarray(inputs, dtype=np.int64), np.asarray(outputs, dtype=np.int64),
                 blocks if any_blocks else None, None)


def _read_ledger(path: Path, notes: list[str]) -> _Rows:
    from cost.bill import read_usage   # the ledger's one reader: its checks and messages

    records = read_usage(path)
    if not records:
        raise BadInput(f"usage file {str(path)!r} holds no ledger records: give the gateway's usage.jsonl or "
                       f"`admin usage --json` output with at least one request")
    ended_ms = np.fromiter((r["ts_ms"] for r in records), dtype=np.float64, count=len(records))
    latency_ms = np.fromiter((_latency_ms(r) for r in records), dtype=np.float64, count=len(records))
    without_latency = int(np.isnan(latency_ms).sum())
    arrived_ms = ended_ms - np.nan_to_num(latency_ms, nan=0.0)
    notes.append("arrivals are ts_ms - latency_ms: the gateway stamps a ledger record when its request ends"
                 + (f" ({without_latency:,} records without latency_ms arrive at their ts_ms)"
                    if without_latency else ""))
    statuses = np.fromiter((r["status"] for r in records), dtype=np.int64, count=len(records))
    outputs = np.fromiter((r["output_tokens"] for r in records), dtype=np.int64, count=len(records))
    failed = statuses != 200
    if failed.any():
        empty = int((failed & (outputs == 0)).sum())
        notes.append(f"{int(failed.sum()):,} requests failed (status != 200), {empty:,} of them with 0 output "
                     f"tokens: kept, as traffic that was offered")
    return _Rows((arrived_ms - arrived_ms.min()) / 1000.0,
                 np.fromiter((r["input_tokens"] for r in records), dtype=np.int64, count=len(records)),
                 outputs, None, None)


def _latency_ms(record: dict) -> float:
    value = record.get("latency_ms")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        return math.nan
    return float(value)


def _read_curve(path: Path, text: str, mix_trace, scale: float, seed: int, notes: list[str]) -> _Rows:
    """Requests drawn onto a curve's shape: a Poisson process whose rate is constant within each
    bin (the expected count of a bin is its value, or its tokens over the mix's mean tokens per
    request), times ``scale``; each request's sizes drawn (with their input/output pairing) from
    ``mix_trace``."""
    header, rows, lines = _csv_table(path, text)
    time_at, value_at, counts_what = _curve_columns(path, header, lines[0])
    body, body_lines = rows[1:], lines[1:]
    if len(body) < 2:
        raise BadInput(f"curve {str(path)!r} has {len(body)} row(s) after its header: a curve needs at least two, "
                       f"so that its bin width (the time between rows) is known")
    starts = _seconds_column([r[time_at] for r in body], _cell_namer(path, body_lines, time_at, header[time_at]))
    values, blanks = _value_column([r[value_at] for r in body],
                                   _cell_namer(path, body_lines, value_at, header[value_at]))
    order = np.argsort(starts, kind="stable")
    if np.any(np.diff(starts) < 0):
        notes.append(f"{_plural(int(np.sum(np.diff(starts) < 0)), 'curve row was', 'curve rows were')} out of "
                     f"time order: sorted")
    starts, values = starts[order], values[order]
    gaps = np.diff(starts)
    if np.any(gaps == 0):
        first, second = sorted(order[np.flatnonzero(gaps == 0)[0]:][:2])
        raise BadInput(f"curve {str(path)!r} lines {body_lines[first]} and {body_lines[second]}, column "
                       f"{time_at + 1} ({header[time_at]}): two rows for the same time; give one row per bin")
    width = _bin_width(gaps)
    # Each row's value happened in [its time, its time + width); where the next row comes later
    # than that, the curve had no data points there (CloudWatch leaves empty periods out): no traffic.
    lengths = np.append(np.minimum(gaps, width), width)
    mix = _mix(mix_trace)
    mean_in, mean_out = float(mix.input_tokens.mean()), float(mix.output_tokens.mean())
    if counts_what == "tokens":
        expected = values / (mean_in + mean_out)
        reading = (f"tokens per bin, divided by the mix's mean {mean_in + mean_out:,.0f} tokens (input + output) "
                   f"per request")
    else:
        expected = values
        reading = "requests per bin"
    rng = np.random.default_rng((seed, _CURVE_STREAM))
    counts = rng.poisson(expected * scale)
    total = int(counts.sum())
    seconds = np.repeat(starts, counts) + rng.random(total) * np.repeat(lengths, counts)
    picks = rng.integers(0, len(mix), total)
    notes.append(f"curve: column {header[value_at]!r} read as {reading}, {len(body):,} bins of {width:g} s; "
                 f"arrivals drawn as a Poisson process at that rate"
                 + (f" x {scale:g} (--scale)" if scale != 1.0 else "")
                 + f"; sizes drawn from {_mix_name(mix_trace)} ({len(mix):,} requests, mean {mean_in:,.0f} input "
                   f"/ {mean_out:,.0f} output tokens)")
    if blanks:
        notes.append(f"{_plural(blanks, 'curve row', 'curve rows')} had no value: taken as 0")
    if np.any(gaps > width):
        notes.append(f"{_plural(int(np.sum(gaps > width)), 'gap', 'gaps')} between curve rows longer than a bin "
                     f"({width:g} s): no traffic there")
    return _Rows(seconds, mix.input_tokens[picks], mix.output_tokens[picks], None, float(starts[-1] + width))


def _bin_width(gaps: np.ndarray) -> float:
    """The curve's period: its most common gap between rows (the shortest of equally common ones),
    so that left-out empty periods (longer gaps) do not widen the bins."""
    rounded_ms = np.rint(gaps * 1000).astype(np.int64)
    widths, counts = np.unique(rounded_ms, return_counts=True)
    return float(widths[np.argmax(counts)]) / 1000.0   # argmax takes the first, the shortest, of ties


def _plural(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"


def _mix(mix_trace) -> Trace:
    mix = read_trace(AZURE_CONV_TRACE if mix_trace is None else mix_trace)
    if mix.spec["format"] == "curve":
        raise BadInput(f"--mix-trace {str(mix_trace)!r} is a curve: give a trace of requests (azure, mooncake or "
                       f"ledger) whose sizes fill the curve")
    return mix


def _mix_name(mix_trace) -> str:
    return "the Azure conversation trace 2023" if mix_trace is None else repr(str(mix_trace))


# --- the common steps --------------------------------------------------------------------------------

def _sorted(rows: _Rows, path: Path, fmt: str, notes: list[str]):
    """The rows in time order (stable: rows with the same time keep their order)."""
    seconds, inputs, outputs, blocks = rows.seconds, rows.input_tokens, rows.output_tokens, rows.prefix_blocks
    if fmt == "curve":   # drawn, not read: nothing a user wrote was out of order
        order = np.argsort(seconds, kind="stable")
    else:
        out_of_order = int(np.sum(np.diff(seconds) < 0))
        if not out_of_order:
            return seconds, inputs, outputs, blocks
        order = np.argsort(seconds, kind="stable")
        if fmt == "ledger":
            what = _plural(out_of_order, "record was", "records were") + \
                " out of arrival order (the ledger is written as requests end)"
        else:
            what = _plural(out_of_order, "row was", "rows were") + " out of order"
        notes.append(f"{what}: sorted")
    return (seconds[order], inputs[order], outputs[order],
            [blocks[i] for i in order] if blocks is not None else None)


def _span_of(seconds: np.ndarray, notes: list[str]) -> float:
    """Last arrival - first arrival + the mean gap: the window a trace's own requests suggest
    (n requests, n gaps). One request (or all at one instant) has no gap: 1 s, with a note."""
    n, last = len(seconds), float(seconds[-1] - seconds[0])
    if n >= 2 and last > 0:
        return last * n / (n - 1)
    notes.append("the trace has no gap between arrivals to measure its span: taken as 1 s")
    return 1.0


def _cut_window(path, window, seconds, inputs, outputs, blocks, own_span, notes):
    start, end = window
    keep = (seconds >= start) & (seconds < end)
    if not keep.any():
        raise BadInput(f"--window {start:g}:{end:g} holds no request of trace {str(path)!r}: its {len(seconds):,} "
                       f"requests arrive from {seconds[0]:,.3f} to {seconds[-1]:,.3f} s after its first row (span "
                       f"{own_span:,.3f} s); give START_S:END_S inside that")
    index = np.flatnonzero(keep)
    notes.append(f"--window {start:g}:{end:g}: {len(index):,} of {len(seconds):,} requests, "
                 f"times re-based to {start:g} s")
    if end > own_span:
        notes.append(f"the window runs past the trace's end ({own_span:,.3f} s): no traffic after that")
    return (seconds[index] - start, inputs[index], outputs[index],
            [blocks[i] for i in index] if blocks is not None else None)


def scale_arrivals(seconds: np.ndarray, span_s: float, scale: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrivals at ``scale`` times the rate, with the trace's shape: (arrivals sorted, index of the
    request each copies, which copy it is: 0 the original, 1, 2, ...).

    ``floor(scale)`` superposed copies plus one Bernoulli-thinned copy that keeps each request
    with probability ``frac(scale)``; below 1 the trace is only thinned. Copies after the first
    arrive at a random point of their request's gap to the next arrival (the last request's gap
    runs to ``span_s``), so no two copies arrive at the same instant and no arrival leaves the
    window. ``seconds`` is sorted and < ``span_s``.
    """
    n = len(seconds)
    whole = int(math.floor(scale))
    part = scale - whole
    if whole == 0:
        index = np.flatnonzero(rng.random(n) < scale)
        return seconds[index], index, np.zeros(len(index), dtype=np.int64)
    gaps = np.diff(seconds, append=span_s)
    arrivals, sources, copies = [seconds], [np.arange(n)], [np.zeros(n, dtype=np.int64)]
    for copy in range(1, whole):
        arrivals.append(seconds + rng.random(n) * gaps)
        sources.append(np.arange(n))
        copies.append(np.full(n, copy, dtype=np.int64))
    if part > 0:
        index = np.flatnonzero(rng.random(n) < part)
        arrivals.append(seconds[index] + rng.random(len(index)) * gaps[index])
        sources.append(index)
        copies.append(np.full(len(index), whole, dtype=np.int64))
    arrival, source, copy_of = np.concatenate(arrivals), np.concatenate(sources), np.concatenate(copies)
    order = np.argsort(arrival, kind="stable")
    return arrival[order], source[order], copy_of[order]


def _offset_blocks(blocks: list, source: np.ndarray, copy: np.ndarray) -> list:
    """Each copy's prefix blocks moved past every id of the original (copy k adds k x (largest id
    + 1)), so that copies share prefixes among their own requests as the original did, but never
    with the original or with another copy: a scaled trace is more users, not the same users again."""
    stride = 1 + max((max(ids) for ids in blocks if ids), default=-1)
    out = []
    for i, k in zip(source.tolist(), copy.tolist()):
        ids = blocks[i]
        out.append(ids if k == 0 or not ids else tuple(map((k * stride).__add__, ids)))
    return out


def _scale_note(scale: float, requests: int, has_blocks: bool) -> str:
    whole = int(math.floor(scale))
    if whole == 0:
        return f"--scale {scale:g}: each request kept with probability {scale:g} ({requests:,} requests)"
    text = f"--scale {scale:g}: {whole} cop{'y' if whole == 1 else 'ies'} of every request"
    if scale > whole:
        text += f" and one more of each with probability {scale - whole:g}"
    text += (f" ({requests:,} requests); copies after the first arrive at a random point of their request's "
             f"gap to the next")
    if has_blocks:
        text += "; each copy's prefix block ids are offset, so copies share no prefix with the original"
    return text


def _scale_tokens(tokens: np.ndarray, factor: float) -> np.ndarray:
    scaled = np.rint(tokens * factor).astype(np.int64)
    return np.where(tokens >= 1, np.maximum(scaled, 1), scaled)


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


# --- cells -----------------------------------------------------------------------------------------

def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"trace {str(path)!r} does not exist: give the path of a trace file") from None
    except IsADirectoryError:
        raise BadInput(f"trace {str(path)!r} is a directory: give the path of a trace file") from None
    except OSError as exc:
        raise BadInput(f"trace {str(path)!r} is not readable: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")   # exports from spreadsheets start with a byte-order mark
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise BadInput(f"trace {str(path)!r} line {line}: byte {exc.start} is not UTF-8; traces are UTF-8 text "
                       f"(CSV or JSON lines)") from None


def _first_line(text: str) -> tuple[int, str | None]:
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            return number, line
    return 1, None


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _csv_table(path: Path, text: str) -> tuple[list[str], list[list[str]], list[int]]:
    """Header and rows (blank lines left out), each row's line number, every row as wide as the header."""
    rows, lines = [], []
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            if row and any(cell.strip() for cell in row):
                rows.append(row)
                lines.append(reader.line_num)
    except csv.Error as exc:
        raise BadInput(f"trace {str(path)!r} line {reader.line_num}: not CSV ({exc})") from None
    if not rows:
        raise BadInput(f"trace {str(path)!r} is empty (line 1): give a CSV with a header and one row a request")
    width = len(rows[0])
    wrong = next((i for i, row in enumerate(rows) if len(row) != width), None)
    if wrong is not None:
        raise BadInput(f"trace {str(path)!r} line {lines[wrong]}: {len(rows[wrong])} fields, but the header "
                       f"(line {lines[0]}) has {width}: give every row one value per header column")
    return rows[0], rows, lines


def _cell_namer(path: Path, lines: Sequence[int], column: int, name: str) -> Callable[[int], str]:
    """Row index -> 'trace 'x' line N, column C (NAME)', for messages."""
    return lambda row: f"trace {str(path)!r} line {lines[row]}, column {column + 1} ({name.strip()})"


def _token_column(cells: list[str], where: Callable[[int], str]) -> np.ndarray:
    """Whole numbers >= 0, one per cell (12.0 is 12)."""
    try:
        tokens = np.array(cells).astype(np.int64)
    except (ValueError, OverflowError):
        tokens = np.array([_whole_tokens(_number(cell), where(i), cell) for i, cell in enumerate(cells)],
                          dtype=np.int64)
    negative = np.flatnonzero(tokens < 0)
    if negative.size:
        i = int(negative[0])
        raise BadInput(f"{where(i)}: {cells[i].strip()!r} is negative; token counts are whole numbers >= 0")
    return tokens


def _number(cell: str):
    try:
        return int(cell)
    except ValueError:
        try:
            return float(cell)
        except ValueError:
            return cell


def _whole_tokens(value: Any, where: str, shown: Any = None) -> int:
    """A token count: a whole number >= 0 (a float like 12.0 is 12)."""
    shown = value if shown is None else shown
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{where}: {shown!r} is not a number of tokens; give a whole number >= 0, e.g. 512")
    if value < 0:
        raise BadInput(f"{where}: {shown!r} is negative; token counts are whole numbers >= 0")
    return value


def _value_column(cells: list[str], where: Callable[[int], str]) -> tuple[np.ndarray, int]:
    """A curve's values: numbers >= 0; an empty cell is 0 (a period without data). Also how many were empty."""
    blank = [not cell.strip() for cell in cells]
    values = np.zeros(len(cells), dtype=np.float64)
    for i, cell in enumerate(cells):
        if blank[i]:
            continue
        try:
            value = float(cell)
        except ValueError:
            raise BadInput(f"{where(i)}: {cell.strip()!r} is not a number; give a count >= 0 per bin") from None
        if not math.isfinite(value) or value < 0:
            raise BadInput(f"{where(i)}: {cell.strip()!r} is not a count; give a number >= 0 per bin")
        values[i] = value
    return values, sum(blank)


def _seconds_column(cells: list[str], where: Callable[[int], str]) -> np.ndarray:
    """Times as seconds from the earliest: ISO 8601 date-times (any fractional digits, a zone
    optional: Z, +HH:MM) or numbers (epoch seconds; epoch milliseconds when they are that large)."""
    try:
        numbers = np.array(cells).astype(np.float64)
    except ValueError:
        numbers = None
    if numbers is not None:
        bad = np.flatnonzero(~np.isfinite(numbers))
        if bad.size:
            raise BadInput(f"{where(int(bad[0]))}: {cells[int(bad[0])].strip()!r} is not a time; give an ISO 8601 "
                           f"time (2023-11-16 18:15:46.68) or epoch seconds")
        if np.median(np.abs(numbers)) > 1e11:   # 1e11 s is the year 5138; 1e11 ms is 1973
            numbers = numbers / 1000.0
        return numbers - numbers.min()
    nanoseconds = _clock_nanoseconds(cells, where)
    return (nanoseconds - nanoseconds.min()) / 1e9


def _clock_nanoseconds(cells: list[str], where: Callable[[int], str]) -> np.ndarray:
    """ISO 8601 date-times as int64 nanoseconds (UTC where a zone is given). numpy parses the
    whole column at C speed when every cell has the same zone (or none); otherwise, or to find
    a bad cell, cell by cell."""
    first_zone = _split_zone(cells[0].strip())[1] if cells else ""
    if first_zone and all(cell.endswith(first_zone) for cell in cells):
        clocks, offset = [cell[:-len(first_zone)] for cell in cells], _zone_offset_ns(first_zone)
    elif not first_zone:
        clocks, offset = cells, 0
    else:
        clocks = None
    if clocks is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # numpy warns, and ignores it, when a cell has a zone
                stamps = np.array(clocks, dtype="datetime64[ns]")
            if not np.isnat(stamps).any():
                return stamps.astype(np.int64) - offset
        except (ValueError, UserWarning, DeprecationWarning):
            pass
    return np.array([_one_clock(cell, where(i)) for i, cell in enumerate(cells)], dtype=np.int64)


def _split_zone(text: str) -> tuple[str, str]:
    if ":" not in text:   # a date alone: its "-16" is the day, not a zone
        return text, ""
    match = _ZONE_SUFFIX.search(text)
    return (text[:match.start()], match.group(0)) if match else (text, "")


def _zone_offset_ns(zone: str) -> int:
    if zone.upper() == "Z":
        return 0
    digits = zone[1:].replace(":", "")
    minutes = int(digits[:2]) * 60 + (int(digits[2:4]) if len(digits) >= 4 else 0)
    return (1 if zone[0] == "+" else -1) * minutes * 60 * 10**9


def _one_clock(cell: str, where: str) -> int:
    clock, zone = _split_zone(cell.strip())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            stamp = np.datetime64(clock.replace(" ", "T", 1), "ns")
    except (ValueError, UserWarning, DeprecationWarning):
        stamp = np.datetime64("NaT")
    if not clock or np.isnat(stamp):
        raise BadInput(f"{where}: {cell.strip()!r} is not a time; give an ISO 8601 time such as "
                       f"2023-11-16 18:15:46.6805900 (a zone like Z or +01:00 may follow) or epoch seconds")
    return int(stamp.astype(np.int64)) - (_zone_offset_ns(zone) if zone else 0)


def _time_column(header: Sequence[str]) -> int | None:
    names = [_words(name) for name in header]
    for i, words in enumerate(names):   # an exact name first: "Timestamp" over "Time to first token"
        if len(words) == 1 and words[0] in _TIME_WORDS:
            return i
    for i, words in enumerate(names):
        if any(w in ("time", "timestamp", "date", "datetime") for w in words) and not \
                any(w in _TOKEN_WORDS for w in words):
            return i
    return None


def _curve_columns(path: Path, header: list[str], line: int) -> tuple[int, int, str]:
    """(time column, value column, "requests" | "tokens") of a curve's header."""
    shown = ", ".join(map(repr, header))
    time_at = _time_column(header)
    if time_at is None:
        raise BadInput(f"curve {str(path)!r} line {line}: no time column among {shown}; name one timestamp "
                       f"(ISO 8601 or epoch seconds)")
    others = [i for i in range(len(header)) if i != time_at]
    requests = [i for i in others if any(w in _REQUEST_WORDS for w in _words(header[i]))
                and not any(w in _TOKEN_WORDS for w in _words(header[i]))]
    tokens = [i for i in others if any(w in _TOKEN_WORDS for w in _words(header[i]))]
    for found, what in ((requests, "requests"), (tokens, "tokens")):
        if len(found) == 1:
            return time_at, found[0], what
        if len(found) > 1:
            raise BadInput(f"curve {str(path)!r} line {line}: columns {', '.join(repr(header[i]) for i in found)} "
                           f"all count {what}; keep one value column (requests, Invocations or tokens per bin)")
    raise BadInput(f"curve {str(path)!r} line {line}: no column says what it counts among {shown}; name the value "
                   f"column requests (or Invocations) for requests per bin, or tokens for tokens per bin")


def _words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.strip().lower())


# --- arguments -------------------------------------------------------------------------------------

def parse_window(text) -> tuple[float, float]:
    """'START_S:END_S' -> (start, end): seconds from the trace's first row, 0 <= START < END."""
    parts = text.split(":") if isinstance(text, str) else []
    try:
        start, end = (float(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        start = end = None
    if start is None or not (math.isfinite(start) and math.isfinite(end)):
        raise BadInput(f"--window {text!r} is not understood: write {WINDOW_SYNTAX}")
    if start < 0 or end <= start:
        raise BadInput(f"--window {text!r}: START must be >= 0 and END larger than START; write {WINDOW_SYNTAX}")
    return start, end


def _check_window(window) -> tuple[float, float] | None:
    if window is None:
        return None
    if isinstance(window, str):
        return parse_window(window)
    if isinstance(window, (tuple, list)) and len(window) == 2 and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in window):
        return parse_window(f"{float(window[0])!r}:{float(window[1])!r}")
    raise BadInput(f"window {window!r} is not a window: give (START_S, END_S) or {WINDOW_SYNTAX}")


def _check_positive(value, flag: str, why: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{flag} {value!r} must be a number > 0: {why}")
    return float(value)


def add_trace_arguments(parser: argparse.ArgumentParser, flag: str = "--trace") -> None:
    """Add ``flag`` (the trace file, metavar TRACE) and the options that say how to read it:
    --format, --window A:B, --scale K, --token-scale F, --mix-trace FILE, --trace-seed N, and
    --block-tokens N (how many prompt tokens a prefix block id stands for: a replay builds its
    prompts' shared heads from it, the simulator its prefix-cache hits). ``trace_from_args``
    reads them back."""
    group = parser.add_argument_group("trace", f"the requests: {flag} and how to read it")
    dest = flag.lstrip("-").replace("-", "_")
    group.add_argument(flag, dest=dest, metavar="TRACE",
                       help="a trace of requests: Azure CSV, Mooncake JSON lines, the gateway's ledger, or a "
                            "per-minute/hourly curve (format told from the content, or --format)")
    group.add_argument("--format", dest="trace_format", choices=TRACE_FORMATS, default=None,
                       help="the trace's format, when it cannot be told from its first line")
    group.add_argument("--window", dest="trace_window", metavar="A:B", default=None,
                       help="keep arrivals from A to B seconds after the trace's first row (re-based to A)")
    group.add_argument("--scale", dest="trace_scale", type=float, metavar="K", default=1.0,
                       help="multiply the arrival rate by K, keeping each request's sizes and the trace's shape "
                            "(default 1)")
    group.add_argument("--token-scale", dest="trace_token_scale", type=float, metavar="F", default=1.0,
                       help="multiply every request's input and output tokens by F (default 1)")
    group.add_argument("--mix-trace", dest="trace_mix", metavar="FILE", default=None,
                       help="for a curve: the trace whose request sizes fill it (default: the shipped Azure "
                            "conversation trace)")
    group.add_argument("--trace-seed", dest="trace_seed", type=int, metavar="N", default=0,
                       help="seed for what is drawn at random (scaling, a curve's arrivals) (default 0)")
    group.add_argument("--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS, metavar="N",
                       help="prompt tokens per shared block of a trace with prefix blocks (Mooncake's "
                            f"hash_ids; {DEFAULT_BLOCK_TOKENS}, as Mooncake counts them)")
    parser.set_defaults(trace_flag=flag)


def trace_from_args(args: argparse.Namespace, path=None) -> Trace | None:
    """The trace the arguments ``add_trace_arguments`` added name; None when its flag was not
    given (``path``, when given, is read instead of the flag's value)."""
    flag = getattr(args, "trace_flag", "--trace")
    path = getattr(args, flag.lstrip("-").replace("-", "_"), None) if path is None else path
    options = {"--format": args.trace_format, "--window": args.trace_window, "--mix-trace": args.trace_mix,
               "--scale": None if args.trace_scale == 1.0 else args.trace_scale,
               "--token-scale": None if args.trace_token_scale == 1.0 else args.trace_token_scale,
               "--trace-seed": None if args.trace_seed == 0 else args.trace_seed}
    if path is None:
        given = [name for name, value in options.items() if value is not None]
        if given:
            raise BadInput(f"{', '.join(given)} say(s) how to read a trace, but no {flag} was given: add "
                           f"{flag} FILE or leave them out")
        return None
    return read_trace(path, fmt=args.trace_format, window=parse_window(args.trace_window) if args.trace_window
                      else None, scale=args.trace_scale, token_scale=args.trace_token_scale, seed=args.trace_seed,
                      mix_trace=args.trace_mix)
