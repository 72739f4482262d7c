"""The gateway's benchmark (benchmarks/gateway/run.py) runs end to end and reports what its README table is made of:
a tiny run (one round, two concurrent clients, few streams) of the direct path, the floor
relay and the gateway. Figures are not judged here (a benchmark is read, not timed in tests);
what is checked is that every contender served every stream whole and was measured."""
from __future__ import annotations

import json
import subprocess
import sys

from gateway_harness import REPO

BENCH = REPO / "benchmarks" / "gateway" / "run.py"


def test_a_tiny_run_measures_every_contender_and_loses_no_stream(tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "1", "--concurrency", "2",
         "--contenders", "direct,floor,gateway", "--no-litellm", "--min-streams", "4",
         "--streams-per-user", "2", "--max-tokens", "16", "--whole-requests", "300",
         "--whole-concurrency", "2",
         "--json", str(out), "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    summary = {(s["mode"], s["contender"]): s for s in results["summary"]}
    assert set(summary) == {(m, c) for m in ("stream", "whole")
                            for c in ("direct", "floor", "gateway")}
    for (mode, name), s in summary.items():
        assert s["lost"] == 0, (mode, name, results["rows"])
        assert s["requests"] == (300 if mode == "whole" else 4)
        if name != "direct":
            # CPU time is read in 10 ms ticks: the floor's few milliseconds here may read 0.
            key = "proxy_cpu_ms_per_request" if mode == "whole" else "proxy_cpu_ms_per_token"
            assert s[key]["median"] >= 0, (mode, name, s)
    # 300 whole answers through the gateway cost several ticks (0.12-0.6 ms each, by host;
    # 40 of them could read 0 on a fast one).
    assert summary["whole", "gateway"]["proxy_cpu_ms_per_request"]["median"] > 0
    for row in results["rows"]:
        if row["mode"] == "stream":
            assert row["tokens"] == 4 * 16 and row["ttft_ms_p50"] > 0
            if row["contender"] != "direct":     # the kernel's share is part of the total
                assert 0 <= row["proxy_kernel_cpu_ms_per_token"] <= row["proxy_cpu_ms_per_token"]
    # Each proxy's CPU as a multiple of the floor's in the same round: the figure that compares
    # across hosts (absent where a 10 ms tick left either at 0).
    for row in results["rows"]:
        if row["contender"] == "direct":
            continue
        key = "proxy_cpu_ms_per_request" if row["mode"] == "whole" else "proxy_cpu_ms_per_token"
        floor = next(f for f in results["rows"] if f["contender"] == "floor"
                     and (f["mode"], f["round"], f["concurrency"]) ==
                     (row["mode"], row["round"], row["concurrency"]))
        if row[key] and floor[key]:
            assert row["proxy_cpu_vs_floor"] == round(row[key] / floor[key], 2)
        else:
            assert "proxy_cpu_vs_floor" not in row
    assert "| of it kernel | × floor's |" in done.stdout
    again = subprocess.run([sys.executable, str(BENCH), "--tables-of", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == results["table"].strip()
    # The table printed is the one the README shows: a row per contender and mode.
    assert done.stdout.count("| 2 | floor |") == 2 and done.stdout.count("| 2 | gateway |") == 2
