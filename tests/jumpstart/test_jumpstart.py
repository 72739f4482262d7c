"""Level 2 resolves through the SageMaker SDK offline, from the specs Spectrum ships."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from options.jumpstart import SPECS_DIR, bundled_model_ids, resolve

REPO = Path(__file__).resolve().parents[2]


def test_bundled_manifest_points_at_specs_that_exist():
    manifest = json.loads((SPECS_DIR / "models_manifest.json").read_text())
    for row in manifest:
        spec = json.loads((SPECS_DIR / row["spec_key"]).read_text())
        assert spec["model_id"] == row["model_id"] and spec["version"] == row["version"]
        assert spec["hosting_instance_type_variants"]["regional_aliases"]["us-east-1"]
    assert "huggingface-llm-mistral-7b-instruct" in bundled_model_ids()


def test_resolve_offline_with_telemetry_off(monkeypatch):
    monkeypatch.delenv("SAGEMAKER_USER_CONFIG_OVERRIDE", raising=False)
    found = resolve("huggingface-llm-mistral-7b-instruct", "*", "us-west-2", "ml.g5.12xlarge", "bundled")
    assert found["image_uri"].startswith("763104351884.dkr.ecr.us-west-2.amazonaws.com/huggingface-pytorch-tgi")
    assert found["environment"]["SM_NUM_GPUS"] == "4"
    assert found["artifacts"].startswith("s3://jumpstart-cache-prod-us-west-2/")
    assert os.environ["AWS_JUMPSTART_SPECS_LOCAL_ROOT_DIR_OVERRIDE"] == str(SPECS_DIR)
    config = Path(os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"]).read_text()
    assert "TelemetryOptOut: true" in config


def test_level3_plan_never_imports_the_sdk_or_an_engine():
    code = ("import sys; from options.deploy import main; "
            "assert main(['--level', '3', '--plan', '--json']) == 0; "
            "heavy = [m for m in ('sagemaker', 'torch', 'vllm', 'moto', 'kubernetes') if m in sys.modules]; "
            "print('HEAVY', heavy)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
