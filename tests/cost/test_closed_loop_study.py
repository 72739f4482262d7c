"""The closed-loop study's summary (benchmarks/closed-loop/run.py) on SYNTHETIC request records: the
"sent together" figure its README reads lockstep from, and its means. No server."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "closed-loop" / "run.py"
_spec = importlib.util.spec_from_file_location("closed_loop_study", SCRIPT)
study = importlib.util.module_from_spec(_spec)
sys.modules["closed_loop_study"] = study
_spec.loader.exec_module(study)


def record(sent: float, ttft: float, e2e: float) -> dict:
    return {"sent_s": sent, "first_s": sent + ttft, "end_s": sent + e2e}


def test_requests_sent_within_30_ms_count_as_one_wave():
    in_step = [record(w * 2.0 + k * 0.005, 0.4, 1.4) for w in range(3) for k in range(4)]
    drifted = [record(w * 2.0 + k * 0.5, 0.15, 1.2) for w in range(3) for k in range(4)]
    assert study.summary(in_step, 64)["mean_requests_sent_together"] == 4.0
    assert study.summary(drifted, 64)["mean_requests_sent_together"] == 1.0


def test_the_means_are_the_requests_own():
    recs = [record(0.0, 0.1, 0.73), record(0.001, 0.3, 0.93)]
    s = study.summary(recs, 64)
    assert s["requests"] == 2
    assert s["ttft_ms_mean"] == pytest.approx(200.0)
    assert s["e2e_ms_mean"] == pytest.approx(830.0)
    assert s["tpot_ms_mean"] == pytest.approx(10.0)       # (730 - 100) / 63 and (930 - 300) / 63
