"""The real ``python -m cost`` in a subprocess, for the tests that drive its CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "cost" / "data" / "traces" / "azure-llm-inference-2023-conv.csv")


def cost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cost", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def cost_json(*args: str) -> dict:
    """Its ``--json`` output; the run must succeed."""
    done = cost(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
