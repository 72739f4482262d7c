"""End to end, as a new user runs it: `python -m options.deploy --level N --once` on this machine.

Each run starts the bring-your-own server (the real vLLM engine on CPU for levels 3 and 5, the
model.py handler for level 4) with the built-in tiny model, waits for /ping, sends one streamed
sample request and exits 0. They start engines: run this folder under the engine lock.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.engine]


@pytest.mark.parametrize("level", [3, 4, 5])
def test_local_once_serves_a_sample(level, tiny_model):
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    done = subprocess.run([sys.executable, "-m", "options.deploy", "--level", str(level), "--once",
                           "--json", "--max-tokens", "16", "--invoke", "Say hello.",
                           "--option", "HF_TOKEN=hf_e2e_secret_value"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    answer = summary["answer"]
    assert summary["target"] == "local" and summary["ready_s"] > 0
    assert answer["text"], summary
    assert 0 < answer["timings"]["ttft_s"] <= answer["timings"]["e2e_s"]
    assert "RANDOM" in done.stderr and "GET http://127.0.0.1:" in done.stderr
    assert "hf_e2e_secret_value" not in done.stdout + done.stderr
