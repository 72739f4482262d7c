"""End to end: `python -m options.bench --level 3` on this machine starts rung 3's own local
server (its LMI configuration mapped onto vLLM) and measures it in rung 3's dialect. Starts an
engine: run this folder under the engine lock."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.engine]


def test_bench_level_3_runs_the_lmi_configuration(tiny_model, tmp_path):
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "options.bench", "--level", "3", "--no-progress",
                           "--option", "OPTION_MAX_ROLLING_BATCH_SIZE=4",
                           "--option", "OPTION_MAX_MODEL_LEN=512",
                           "--requests", "6", "--concurrency", "3", "--prompt-tokens", "16",
                           "--output-tokens", "8", "--ignore-eos", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "LMI configuration" in done.stdout and "OPTION_MAX_ROLLING_BATCH_SIZE=4" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["level"] == 3 and doc["details"]["dialect"] == "tgi"
    assert doc["counts"]["completed"] == 6 and doc["counts"]["errors"] == {}
    assert doc["counts"]["output_tokens"] == 6 * 8
