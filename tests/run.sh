#!/usr/bin/env bash
# Sets up everything the test suite needs in a fresh virtual environment, then runs it.
# Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Real services and tools the tests use, from Debian's packages when missing: podman (runc as
# its runtime, debootstrap for the image's base) runs the bring-your-own image; redis-server
# backs the gateway's shared state.
missing=()
for pair in podman:podman runc:runc debootstrap:debootstrap redis-server:redis-server; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "tests/run.sh: installing ${missing[*]} (Debian packages)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "tests/run.sh: missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]}) and rerun" >&2
    exit 1
  fi
fi

python=${PYTHON:-python3}
venv=${SPECTRUM_VENV:-.venv}
checkov_venv=${SPECTRUM_CHECKOV_VENV:-.venv-checkov}
guidellm_venv=${SPECTRUM_GUIDELLM_VENV:-.venv-guidellm}
pip_quiet=(-m pip install -q --disable-pip-version-check)

# The two tools' environments install in the background while the project's does: pip keeps one
# core busy, and this machine has two.
tool_envs() {
  # checkov downgrades packages it shares with the project: it gets an environment of its own.
  [ -x "$checkov_venv/bin/checkov" ] || { "$python" -m venv "$checkov_venv" &&
    "$checkov_venv/bin/python" "${pip_quiet[@]}" 'checkov>=3.2,<4'; } || return 1
  # guidellm (the vLLM project's benchmark tool) runs against the server as a user runs it: from
  # an environment of its own, torch pinned to the CPU build first so no resolver pulls a CUDA one.
  [ -x "$guidellm_venv/bin/guidellm" ] || { "$python" -m venv "$guidellm_venv" &&
    "$guidellm_venv/bin/python" "${pip_quiet[@]}" torch==2.13.0 &&
    "$guidellm_venv/bin/python" "${pip_quiet[@]}" 'guidellm==0.8.1'; } || return 1
}
tools_log=$(mktemp)
tool_envs > "$tools_log" 2>&1 &
tools_pid=$!
trap 'kill "$tools_pid" 2>/dev/null || true' EXIT      # the project's install failed: stop theirs

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# torch first and pinned to the CPU build, so no resolver pulls a multi-GB CUDA build.
"$venv/bin/python" "${pip_quiet[@]}" torch==2.13.0
"$venv/bin/python" "${pip_quiet[@]}" -e '.[dev,engine-cpu,ray]'
# PyPI's torchvision does not load beside torch 2.13.0+cpu and breaks transformers' imports.
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

trap - EXIT
if ! wait "$tools_pid"; then
  cat "$tools_log" >&2
  echo "tests/run.sh: installing checkov or guidellm into $checkov_venv / $guidellm_venv failed (above)" >&2
  exit 1
fi
grep -v "^WARNING: Location 'file:" "$tools_log" >&2 || true
rm -f "$tools_log"
export SPECTRUM_CHECKOV="$PWD/$checkov_venv/bin/checkov"
export SPECTRUM_GUIDELLM="$PWD/$guidellm_venv/bin/guidellm"

# vLLM on CPU reserves most of a NUMA node for its KV cache unless told otherwise.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export SAGEMAKER_SUPPRESS_V2_WARNING=1
# Two workers (pytest-xdist): the tests that run an engine or an image in one, in their order,
# the rest in the other (tests/conftest.py groups them). SPECTRUM_TEST_WORKERS=0 runs everything
# in this process.
exec "$venv/bin/python" -m pytest -n "${SPECTRUM_TEST_WORKERS:-2}" --dist loadgroup "$@"
