"""cost.traces: the one trace reader of replay and simulation, on real files written to tmp_path
and on the Azure conversation trace Spectrum ships.

Expected values are computed here from the files themselves (the csv module, datetime, json),
never from the code under test.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from cost.traces import (AZURE_CONV_TRACE, TRACE_FORMATS, Trace, add_trace_arguments, detect_format,
                         parse_window, read_trace, spec_trace, trace_from_args)
from options.core import BadInput

REPO = Path(__file__).resolve().parents[2]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
T0 = datetime(2023, 11, 16, 18, 15, 46, 680590)


def azure_time(seconds: float) -> str:
    """The Azure trace's own time format: 7 fractional digits."""
    stamp = T0 + timedelta(seconds=seconds)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"


def write_azure(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    path.write_text("\n".join([AZURE_HEADER] + [f"{azure_time(t)},{i},{o}" for t, i, o in rows]) + "\n")
    return path


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def ledger_record(ts_ms: int, latency_ms: float, input_tokens: int, output_tokens: int, status: int = 200,
                  model: str | None = "chat", upstream: str | None = "stable") -> dict:
    """A record with the fields the gateway's meter.ledger_entry writes."""
    return {"ts_ms": ts_ms, "request_id": f"r{ts_ms}", "tenant": "acme", "key_id": "k1", "model": model,
            "upstream": upstream, "fallback_from": [], "input_tokens": input_tokens,
            "output_tokens": output_tokens, "usage_source": "upstream", "status": status,
            "latency_ms": latency_ms, "stream": False, "cost_usd": 0.0, "replica": None, "routing": None}


def shipped_rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds from the first row, input, output) of the shipped trace, read with csv + datetime."""
    with AZURE_CONV_TRACE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = [datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f") for r in rows]
    seconds = np.array([(s - stamps[0]).total_seconds() for s in stamps])
    return (seconds, np.array([int(r["ContextTokens"]) for r in rows]),
            np.array([int(r["GeneratedTokens"]) for r in rows]))


SHIPPED_SECONDS, SHIPPED_INPUT, SHIPPED_OUTPUT = shipped_rows()


def per_minute(seconds: np.ndarray, span_s: float) -> np.ndarray:
    return np.histogram(seconds, bins=np.arange(0, span_s + 60, 60))[0]


def bad_input(call, *parts: str) -> str:
    """The BadInput message of ``call()``, checked to name every part."""
    with pytest.raises(BadInput) as caught:
        call()
    message = str(caught.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


# --- the shipped trace ---------------------------------------------------------------------------

def test_the_shipped_azure_trace_reads_with_its_own_times_and_sizes():
    trace = read_trace(AZURE_CONV_TRACE)
    assert len(trace) == 19_366 == len(SHIPPED_SECONDS)
    assert trace.arrival_s.dtype == np.float64 and trace.input_tokens.dtype == np.int64
    assert trace.output_tokens.dtype == np.int64
    np.testing.assert_allclose(trace.arrival_s, SHIPPED_SECONDS, atol=1e-6)
    np.testing.assert_array_equal(trace.input_tokens, SHIPPED_INPUT)
    np.testing.assert_array_equal(trace.output_tokens, SHIPPED_OUTPUT)
    assert trace.arrival_s[0] == 0 and np.all(np.diff(trace.arrival_s) >= 0)
    last = SHIPPED_SECONDS[-1]
    assert trace.span_s == pytest.approx(last + last / (len(SHIPPED_SECONDS) - 1))
    assert trace.prefix_blocks is None and trace.notes == ()
    assert trace.summary() == {"requests": 19_366, "span_s": trace.span_s,
                               "input_tokens": int(SHIPPED_INPUT.sum()), "output_tokens": int(SHIPPED_OUTPUT.sum())}
    assert trace.spec == {"path": str(AZURE_CONV_TRACE), "format": "azure", "window": None, "scale": 1.0,
                          "token_scale": 1.0, "seed": 0, "mix_trace": None}
    # The README's figures: mean 1,155 input and 211 output tokens, minutes from 37 to 507 requests.
    assert round(trace.input_tokens.mean()) == 1155 and round(trace.output_tokens.mean()) == 211
    minutes = np.bincount((trace.arrival_s // 60).astype(int))
    assert minutes.min() == 37 and minutes.max() == 507


def test_the_shipped_trace_travels_with_its_license_and_in_the_package_data():
    readme = (AZURE_CONV_TRACE.parent / "README.md").read_text()
    for part in ("Azure/AzurePublicDataset", "CC-BY 4.0", "Splitwise", AZURE_CONV_TRACE.name):
        assert part in readme
    assert AZURE_CONV_TRACE.read_text().splitlines()[0] == AZURE_HEADER
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "data/traces/*" in project["tool"]["setuptools"]["package-data"]["cost"]
    assert any(dep.startswith("numpy") for dep in project["project"]["dependencies"])


def test_the_shipped_trace_at_scale_25_is_25_copies_of_its_requests_in_its_span():
    """Scale multiplies the rate, not the sizes: 25 × the rows over the same span, each row's
    sizes kept. (How long reading takes is a speed, measured in benchmarks, not held here.)"""
    plain = read_trace(AZURE_CONV_TRACE)
    scaled = read_trace(AZURE_CONV_TRACE, scale=25)
    assert len(scaled) == 25 * len(plain) == 25 * 19_366
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    assert scaled.arrival_s[-1] == pytest.approx(plain.arrival_s[-1], rel=0.01)
    assert scaled.input_tokens.sum() == 25 * plain.input_tokens.sum()
    assert scaled.output_tokens.sum() == 25 * plain.output_tokens.sum()


# --- each format -----------------------------------------------------------------------------------

def test_azure_times_keep_their_seven_fractional_digits(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"{AZURE_HEADER}\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
                    f"\n2023-11-16 18:15:50.9951697,5,0\n")
    trace = read_trace(path)
    np.testing.assert_allclose(trace.arrival_s, [0, 4.314579, 4.3145797], atol=1e-9)
    assert trace.input_tokens.tolist() == [374, 396, 5] and trace.output_tokens.tolist() == [44, 109, 0]


def test_azure_columns_are_found_by_name_in_any_order_and_case(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("generatedtokens,TIMESTAMP,CONTEXTTOKENS\n7,2023-11-16 18:00:00,70\n8,2023-11-16 18:00:02,80\n")
    trace = read_trace(path)
    assert trace.input_tokens.tolist() == [70, 80] and trace.output_tokens.tolist() == [7, 8]
    assert trace.arrival_s.tolist() == [0, 2]


def test_mooncake_lines_carry_times_in_ms_and_prefix_blocks(tmp_path):
    path = write_lines(tmp_path / "mooncake.jsonl", [
        {"timestamp": 1000, "input_length": 600, "output_length": 12, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 900, "output_length": 30, "hash_ids": [0, 1, 2]},
        {"timestamp": 4000, "input_length": 50, "output_length": 5}])
    trace = read_trace(path)
    assert trace.spec["format"] == "mooncake"
    assert trace.arrival_s.tolist() == [0, 0.5, 3.0]
    assert trace.input_tokens.tolist() == [600, 900, 50] and trace.output_tokens.tolist() == [12, 30, 5]
    assert trace.prefix_blocks == ((0, 1), (0, 1, 2), ())


def test_mooncake_without_hash_ids_says_nothing_about_prefixes(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 2},
                                              {"timestamp": 10, "input_length": 3, "output_length": 4}])
    trace = read_trace(path)
    assert trace.prefix_blocks is None
    assert any("hash_ids" in note for note in trace.notes)


def test_the_ledger_gives_arrivals_as_end_minus_latency_and_keeps_failed_requests(tmp_path):
    records = [ledger_record(1_000_000 + 5_000, 4_000.0, 100, 20),          # arrived at +1 s
               ledger_record(1_000_000 + 2_500, 500.0, 200, 0, status=502),  # arrived at +2 s
               ledger_record(1_000_000 + 3_000, 0.0, 0, 0, status=429, model=None, upstream=None),
               ledger_record(1_000_000 + 1_200, 1_200.0, 50, 7)]              # arrived at 0
    path = write_lines(tmp_path / "usage.jsonl", records)
    trace = read_trace(path)
    assert trace.spec["format"] == "ledger"
    assert trace.arrival_s.tolist() == [0, 1, 2, 3]
    assert trace.input_tokens.tolist() == [50, 100, 200, 0]
    assert trace.output_tokens.tolist() == [7, 20, 0, 0]
    notes = " | ".join(trace.notes)
    assert "ts_ms - latency_ms" in notes
    assert "2 requests failed" in notes and "2 of them with 0 output tokens" in notes
    assert "out of arrival order" in notes


def test_the_ledger_reads_admin_usage_json_too(tmp_path):
    path = tmp_path / "usage.json"
    path.write_text(json.dumps({"entries": [ledger_record(10_000, 1_000, 5, 6), ledger_record(12_000, 1_000, 7, 8)],
                                "summary": []}, indent=2))
    trace = read_trace(path)
    assert trace.spec["format"] == "ledger"
    assert trace.arrival_s.tolist() == [0, 2] and trace.input_tokens.tolist() == [5, 7]


def test_ledger_errors_come_from_the_bill_s_reader_with_the_line(tmp_path):
    bad = ledger_record(1, 0, 1, 1)
    del bad["input_tokens"]
    path = write_lines(tmp_path / "usage.jsonl", [ledger_record(1, 0, 1, 1), bad])
    bad_input(lambda: read_trace(path, fmt="ledger"), str(path), "line 2", "'input_tokens'")


# --- detection -------------------------------------------------------------------------------------

def test_each_format_is_told_from_its_content(tmp_path):
    azure = write_azure(tmp_path / "a.txt", [(0, 1, 1)])
    mooncake = write_lines(tmp_path / "m.data", [{"timestamp": 0, "input_length": 1, "output_length": 1}])
    ledger = write_lines(tmp_path / "l.data", [ledger_record(5, 1, 1, 1)])
    curve = tmp_path / "c.data"
    curve.write_text("Timestamp,Invocations\n2026-11-30T10:00:00Z,5\n2026-11-30T10:01:00Z,6\n")
    for path, fmt in ((azure, "azure"), (mooncake, "mooncake"), (ledger, "ledger"), (curve, "curve")):
        assert detect_format(path) == fmt
        assert read_trace(path).spec["format"] == fmt
    assert set(TRACE_FORMATS) == {"azure", "mooncake", "ledger", "curve"}


def test_an_unknown_layout_names_the_formats(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    bad_input(lambda: read_trace(path), str(path), "line 1", "--format", *TRACE_FORMATS)
    other = write_lines(tmp_path / "x.jsonl", [{"prompt": "hi"}])
    bad_input(lambda: read_trace(other), str(other), "line 1", "--format", "mooncake")
    bad_input(lambda: read_trace(path, fmt="burstgpt"), "'burstgpt'", *TRACE_FORMATS)


# --- window, scale, token scale, order ---------------------------------------------------------------

def test_a_window_cuts_and_rebases_the_arrivals(tmp_path):
    path = write_azure(tmp_path / "t.csv", [(0, 1, 1), (1, 2, 2), (2.5, 3, 3), (4, 4, 4), (10, 5, 5)])
    trace = read_trace(path, window=(1, 4))
    np.testing.assert_allclose(trace.arrival_s, [0, 1.5], atol=1e-9)
    assert trace.input_tokens.tolist() == [2, 3]
    assert trace.span_s == 3
    assert trace.spec["window"] == [1.0, 4.0]
    assert read_trace(path, window="1:4") == trace


def test_an_empty_window_says_the_trace_s_own_span(tmp_path):
    path = write_azure(tmp_path / "t.csv", [(0, 1, 1), (30, 2, 2)])
    bad_input(lambda: read_trace(path, window=(100, 200)), str(path), "100:200", "0.000 to 30.000 s",
              "span 60.000 s")


def test_scale_below_one_thins_and_keeps_each_request_s_sizes():
    trace = read_trace(AZURE_CONV_TRACE, scale=0.5, seed=1)
    n = len(SHIPPED_SECONDS)
    assert abs(len(trace) - n / 2) < 5 * math.sqrt(n / 4)
    where = np.searchsorted(SHIPPED_SECONDS, trace.arrival_s - 1e-7)
    np.testing.assert_allclose(SHIPPED_SECONDS[where], trace.arrival_s, atol=1e-6)   # original instants
    np.testing.assert_array_equal(SHIPPED_INPUT[where], trace.input_tokens)
    np.testing.assert_array_equal(SHIPPED_OUTPUT[where], trace.output_tokens)
    assert trace.span_s == read_trace(AZURE_CONV_TRACE).span_s


def test_scale_above_one_keeps_span_shape_and_sizes():
    original = read_trace(AZURE_CONV_TRACE)
    trace = read_trace(AZURE_CONV_TRACE, scale=2.5, seed=4)
    n = len(original)
    assert abs(len(trace) - 2.5 * n) < 5 * math.sqrt(n / 4)
    assert trace.span_s == original.span_s
    assert trace.arrival_s[0] >= 0 and trace.arrival_s[-1] < trace.span_s
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert len(np.unique(trace.arrival_s)) == len(trace)          # no two copies at one instant
    counts = per_minute(trace.arrival_s, trace.span_s)
    assert np.corrcoef(counts, per_minute(original.arrival_s, original.span_s))[0, 1] > 0.9
    assert trace.input_tokens.mean() == pytest.approx(original.input_tokens.mean(), rel=0.03)
    assert set(zip(trace.input_tokens.tolist(), trace.output_tokens.tolist())) <= \
        set(zip(SHIPPED_INPUT.tolist(), SHIPPED_OUTPUT.tolist()))
    assert any("--scale 2.5" in note for note in trace.notes)


def test_scale_is_seeded():
    assert read_trace(AZURE_CONV_TRACE, scale=1.5, seed=7) == read_trace(AZURE_CONV_TRACE, scale=1.5, seed=7)
    a, b = read_trace(AZURE_CONV_TRACE, scale=1.5, seed=7), read_trace(AZURE_CONV_TRACE, scale=1.5, seed=8)
    assert len(a) != len(b) or not np.array_equal(a.arrival_s, b.arrival_s)


def test_scaled_copies_share_no_prefix_with_the_original(tmp_path):
    records = [{"timestamp": 1000 * i, "input_length": 10, "output_length": 1, "hash_ids": [0, 1, i + 2]}
               for i in range(50)]
    trace = read_trace(write_lines(tmp_path / "m.jsonl", records), scale=2, seed=3)
    assert len(trace) == 100
    original_ids = set(range(52))
    first = [b for b in trace.prefix_blocks if set(b) <= original_ids]
    copies = [b for b in trace.prefix_blocks if not set(b) & original_ids]
    assert len(first) == 50 and len(copies) == 50
    # The copy still shares its own first two blocks among its requests, as the original did.
    assert len({b[:2] for b in copies}) == 1 and len({b[2] for b in copies}) == 50


def test_token_scale_rounds_and_keeps_a_token_where_there_was_one(tmp_path):
    path = write_azure(tmp_path / "t.csv", [(0, 0, 10), (1, 1, 3), (2, 3, 1), (3, 10, 0)])
    small = read_trace(path, token_scale=0.1)
    assert small.input_tokens.tolist() == [0, 1, 1, 1] and small.output_tokens.tolist() == [1, 1, 1, 0]
    large = read_trace(path, token_scale=1.7)
    assert large.input_tokens.tolist() == [0, 2, 5, 17] and large.output_tokens.tolist() == [17, 5, 2, 0]
    assert any("--token-scale 1.7" in note for note in large.notes)


def test_rows_out_of_order_are_sorted_with_a_note(tmp_path):
    path = write_azure(tmp_path / "t.csv", [(5, 5, 50), (1, 1, 10), (3, 3, 30), (2, 2, 20), (9, 9, 90)])
    trace = read_trace(path)
    np.testing.assert_allclose(trace.arrival_s, [0, 1, 2, 4, 8], atol=1e-9)   # from the earliest row
    assert trace.input_tokens.tolist() == [1, 2, 3, 5, 9] and trace.output_tokens.tolist() == [10, 20, 30, 50, 90]
    assert "2 rows were out of order: sorted" in trace.notes


def test_one_request_still_has_a_span(tmp_path):
    trace = read_trace(write_azure(tmp_path / "t.csv", [(0, 4, 2)]))
    assert len(trace) == 1 and trace.span_s > 0


def test_a_trace_s_arrays_are_read_only():
    trace = read_trace(AZURE_CONV_TRACE)
    with pytest.raises(ValueError):
        trace.arrival_s[0] = 5.0


# --- the curve -----------------------------------------------------------------------------------------

def write_curve(path: Path, values, column: str = "requests", bin_s: int = 60) -> Path:
    start = datetime(2026, 11, 30, 10, 0, 0)
    lines = [f"timestamp,{column}"] + [f"{(start + timedelta(seconds=bin_s * i)).isoformat()}Z,{v}"
                                       for i, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_curve_carries_the_mix_onto_its_shape(tmp_path):
    values = [int(300 + 200 * math.sin(i / 6)) for i in range(60)]
    trace = read_trace(write_curve(tmp_path / "curve.csv", values, column="Requests"), seed=2)
    assert trace.spec["format"] == "curve" and trace.prefix_blocks is None
    assert trace.span_s == 3600
    counts = per_minute(trace.arrival_s, 3600)[:60]
    for count, value in zip(counts, values):
        assert abs(count - value) <= 5 * math.sqrt(value) + 2
    assert np.corrcoef(counts, values)[0, 1] > 0.95
    assert trace.input_tokens.mean() == pytest.approx(SHIPPED_INPUT.mean(), rel=0.04)
    assert trace.output_tokens.mean() == pytest.approx(SHIPPED_OUTPUT.mean(), rel=0.04)
    assert set(zip(trace.input_tokens.tolist(), trace.output_tokens.tolist())) <= \
        set(zip(SHIPPED_INPUT.tolist(), SHIPPED_OUTPUT.tolist()))   # pairs drawn whole
    assert any("'Requests' read as requests per bin" in note and "60 bins of 60 s" in note for note in trace.notes)


def test_a_tokens_curve_divides_by_the_mix_s_tokens_per_request(tmp_path):
    per_request = float(SHIPPED_INPUT.mean() + SHIPPED_OUTPUT.mean())
    trace = read_trace(write_curve(tmp_path / "c.csv", [200 * per_request] * 30, column="Tokens"))
    counts = per_minute(trace.arrival_s, trace.span_s)[:30]
    assert abs(counts.sum() - 6000) < 5 * math.sqrt(6000)
    assert any("'Tokens' read as tokens per bin" in note for note in trace.notes)


def test_a_curve_takes_epoch_seconds_hourly_bins_a_mix_and_a_scale(tmp_path):
    path = tmp_path / "hourly.csv"
    path.write_text("time,Invocations\n1764496800,360\n1764500400,720\n1764504000,180\n")
    mix = write_lines(tmp_path / "mix.jsonl", [{"timestamp": 0, "input_length": 100, "output_length": 10}])
    trace = read_trace(path, mix_trace=mix, scale=2, seed=5)
    assert trace.span_s == 3 * 3600
    counts = np.histogram(trace.arrival_s, bins=[0, 3600, 7200, 10800])[0]
    for count, value in zip(counts, [720, 1440, 360]):
        assert abs(count - value) < 5 * math.sqrt(value)
    assert set(trace.input_tokens.tolist()) == {100} and set(trace.output_tokens.tolist()) == {10}
    assert trace.spec["mix_trace"] == str(mix)


def test_a_curve_s_errors_name_the_line_and_column(tmp_path):
    bad_value = tmp_path / "v.csv"
    bad_value.write_text("timestamp,requests\n2026-11-30T10:00:00Z,5\n2026-11-30T10:01:00Z,lots\n")
    bad_input(lambda: read_trace(bad_value), str(bad_value), "line 3, column 2 (requests)", "'lots'")
    two = tmp_path / "two.csv"
    two.write_text("timestamp,input_tokens,output_tokens\n2026-11-30T10:00:00Z,5,6\n2026-11-30T10:01:00Z,5,6\n")
    bad_input(lambda: read_trace(two, fmt="curve"), str(two), "line 1", "'input_tokens', 'output_tokens'")
    unnamed = tmp_path / "u.csv"
    unnamed.write_text("timestamp,Sum\n2026-11-30T10:00:00Z,5\n2026-11-30T10:01:00Z,6\n")
    bad_input(lambda: read_trace(unnamed), str(unnamed), "line 1", "'Sum'", "requests", "tokens")
    twice = tmp_path / "d.csv"
    twice.write_text("timestamp,requests\n2026-11-30T10:00:00Z,5\n2026-11-30T10:01:00Z,6\n2026-11-30T10:00:00Z,7\n")
    bad_input(lambda: read_trace(twice), str(twice), "lines 2 and 4", "same time")
    one = tmp_path / "one.csv"
    one.write_text("timestamp,requests\n2026-11-30T10:00:00Z,5\n")
    bad_input(lambda: read_trace(one), str(one), "at least two")
    azure = write_azure(tmp_path / "a.csv", [(0, 1, 1)])
    bad_input(lambda: read_trace(write_curve(tmp_path / "c.csv", [1, 2]), mix_trace=one), str(one), "curve")
    bad_input(lambda: read_trace(azure, mix_trace=azure), "--mix-trace", "azure")


# --- errors ----------------------------------------------------------------------------------------------

def test_azure_errors_name_the_file_line_and_column(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    bad_input(lambda: read_trace(empty), str(empty), "empty")
    bad_input(lambda: read_trace(empty, fmt="azure"), str(empty), "empty", "line 1")
    header_only = tmp_path / "h.csv"
    header_only.write_text(AZURE_HEADER + "\n")
    bad_input(lambda: read_trace(header_only), str(header_only), "no rows", "line 2")
    missing = tmp_path / "m.csv"
    missing.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n")
    bad_input(lambda: read_trace(missing, fmt="azure"), str(missing), "line 1", "'GeneratedTokens'", AZURE_HEADER)

    def with_row(row: str) -> Path:
        path = tmp_path / "bad.csv"
        path.write_text(f"{AZURE_HEADER}\n2023-11-16 18:00:00.0000000,5,6\n{row}\n")
        return path
    bad_input(lambda: read_trace(with_row("2023-11-16 18:00:01,-5,6")), "line 3, column 2 (ContextTokens)",
              "'-5' is negative", ">= 0")
    bad_input(lambda: read_trace(with_row("2023-11-16 18:00:01,5,abc")), "line 3, column 3 (GeneratedTokens)",
              "'abc'", "whole number")
    bad_input(lambda: read_trace(with_row("2023-11-16 18:00:01,5,2.5")), "line 3, column 3", "2.5")
    bad_input(lambda: read_trace(with_row("2023-11-16 25:00:01,5,6")), str(tmp_path / "bad.csv"),
              "line 3, column 1 (TIMESTAMP)", "'2023-11-16 25:00:01' is not a time", "ISO 8601")
    bad_input(lambda: read_trace(with_row(",5,6")), "line 3, column 1 (TIMESTAMP)", "'' is not a time")
    bad_input(lambda: read_trace(with_row("2023-11-16 18:00:01,5")), "line 3", "2 fields", "has 3")
    assert read_trace(with_row("2023-11-16 18:00:01,5,6.0")).output_tokens.tolist() == [6, 6]
    bad_input(lambda: read_trace(tmp_path / "nowhere.csv"), "nowhere.csv", "does not exist")


def test_mooncake_errors_name_the_line_and_field(tmp_path):
    good = {"timestamp": 0, "input_length": 1, "output_length": 1}

    def with_record(line: str) -> Path:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(good) + "\n" + line + "\n")
        return path
    bad_input(lambda: read_trace(with_record('{"timestamp": 5, "input_length": 1,'), fmt="mooncake"),
              "line 2, column", "not JSON")
    bad_input(lambda: read_trace(with_record('{"timestamp": 5, "output_length": 1}'), fmt="mooncake"),
              "line 2", "'input_length'")
    bad_input(lambda: read_trace(with_record('{"timestamp": 5, "input_length": 1, "output_length": -3}')),
              "line 2, field 'output_length'", "-3", "negative")
    bad_input(lambda: read_trace(with_record('{"timestamp": "soon", "input_length": 1, "output_length": 3}')),
              "line 2, field 'timestamp'", "'soon'")
    bad_input(lambda: read_trace(with_record('{"timestamp": 5, "input_length": 1, "output_length": 3, '
                                             '"hash_ids": "abc"}')), "line 2, field 'hash_ids'")


def test_bad_arguments_say_what_is_right(tmp_path):
    path = write_azure(tmp_path / "t.csv", [(0, 1, 1), (1, 1, 1)])
    for scale in (0, -1, float("nan"), "2"):
        bad_input(lambda: read_trace(path, scale=scale), "--scale", "> 0")
    bad_input(lambda: read_trace(path, token_scale=0), "--token-scale", "> 0")
    bad_input(lambda: read_trace(path, seed=-1), "--trace-seed", ">= 0")
    bad_input(lambda: read_trace(path, window=(5, 1)), "--window", "START_S:END_S")
    for text in ("10", "a:b", "5:5", "-1:4", "10:5", "1:2:3", "0:inf"):
        bad_input(lambda: parse_window(text), repr(text), "START_S:END_S")
    assert parse_window("600:1200") == (600.0, 1200.0) and parse_window(" 0 : 1.5 ") == (0.0, 1.5)
    thin = write_azure(tmp_path / "one.csv", [(0, 1, 1)])
    bad_input(lambda: read_trace(thin, scale=1e-9), "--scale 1e-09", "kept none")


# --- the recorded spec and the command line -----------------------------------------------------------

def test_spec_trace_reads_the_same_trace_again(tmp_path):
    trace = read_trace(AZURE_CONV_TRACE, window=(600, 1800), scale=1.7, token_scale=0.5, seed=11)
    recorded = json.loads(json.dumps(trace.spec))          # as a replay's JSON carries it
    again = spec_trace(recorded)
    assert again == trace and again.notes == trace.notes
    curve = read_trace(write_curve(tmp_path / "c.csv", [30, 60, 90]), seed=3, scale=1.5)
    assert spec_trace(json.loads(json.dumps(curve.spec))) == curve
    bad_input(lambda: spec_trace({"path": str(AZURE_CONV_TRACE), "speed": 2}), "'speed'")


def test_the_command_line_flags_read_the_trace(tmp_path):
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    args = parser.parse_args(["--trace", str(AZURE_CONV_TRACE), "--window", "0:600", "--scale", "2",
                              "--token-scale", "0.5", "--trace-seed", "3", "--format", "azure"])
    assert trace_from_args(args) == read_trace(AZURE_CONV_TRACE, fmt="azure", window=(0, 600), scale=2,
                                               token_scale=0.5, seed=3)
    assert trace_from_args(parser.parse_args([])) is None
    bad_input(lambda: trace_from_args(parser.parse_args(["--scale", "2"])), "--scale", "--trace")
    bad_input(lambda: trace_from_args(parser.parse_args(["--trace", str(AZURE_CONV_TRACE), "--window", "9"])),
              "--window '9'")
    assert "TRACE" in parser.format_help() and "--mix-trace" in parser.format_help()

    replay = argparse.ArgumentParser()
    add_trace_arguments(replay, flag="--replay")
    curve = write_curve(tmp_path / "c.csv", [10, 20])
    mix = write_lines(tmp_path / "mix.jsonl", [{"timestamp": 0, "input_length": 9, "output_length": 3}])
    trace = trace_from_args(replay.parse_args(["--replay", str(curve), "--mix-trace", str(mix)]))
    assert isinstance(trace, Trace) and set(trace.input_tokens.tolist()) == {9}


def test_a_curve_s_left_out_periods_carry_no_traffic(tmp_path):
    path = tmp_path / "gappy.csv"
    path.write_text("timestamp,requests\n2026-11-30T10:00:00Z,100\n2026-11-30T10:01:00Z,\n"
                    "2026-11-30T10:05:00Z,100\n")
    trace = read_trace(path)
    assert trace.span_s == 360                          # bins of 60 s, the curve's period
    assert not np.any((trace.arrival_s >= 60) & (trace.arrival_s < 300))
    assert "1 curve row had no value: taken as 0" in trace.notes
