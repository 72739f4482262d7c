"""``--adapter NAME=FOLDER`` on ``--level 6 --engine rayservice --target local``: peft folders on
this machine, sized as the rendered RayService would size them, copied into the one folder the
server registers; everything wrong is refused before Ray starts. (Served end to end through
HAProxy in tests/ray_serve/test_ray_haproxy.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from options.core import BadInput


def local_spec(*argv: str):
    from options.deploy import parse_args
    from options.eks import spec_from_args

    return spec_from_args(parse_args(["--level", "6", "--engine", "rayservice", "--target", "local",
                                      *argv]))


def peft_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    return path


def test_local_folders_get_the_rendered_sizes_and_one_folder_of_copies(tmp_path):
    from options.eks.ray_local import adapters_folder

    a1, a2 = peft_folder(tmp_path / "x" / "first"), peft_folder(tmp_path / "second")
    _, _, adapters = local_spec("--adapter", f"a1={a1}", "--adapter", f"a2={a2}").ray_here
    assert [name for name, _ in adapters.folders] == ["a1", "a2"]
    # infra.eks.spec's defaults: every adapter in a batch (at most 4), all cached, rank 16
    assert (adapters.max_loras, adapters.max_cpu_loras, adapters.max_lora_rank) == (2, 2, 16)
    with adapters_folder(adapters) as folder:
        settings = adapters.settings(folder)
        assert settings["SM_VLLM_ENABLE_LORA"] == "true"
        assert settings["SPECTRUM_SERVER_ADAPTERS_DIR"] == folder
        assert sorted(p.name for p in Path(folder).iterdir()) == ["a1", "a2"]
        assert (Path(folder) / "a1" / "adapter_model.safetensors").read_bytes() == b"weights"
    assert not Path(folder).exists()                 # removed with the command
    sized = local_spec("--adapter", f"a1={a1}", "--max-cpu-loras", "3", "--max-lora-rank", "32")
    assert (sized.ray_here[2].max_cpu_loras, sized.ray_here[2].max_lora_rank) == (3, 32)
    assert local_spec().ray_here[2] is None


@pytest.mark.parametrize("adapter, message", [
    ("a1=s3://bucket/adapters/a1", "a local Ray reads adapters from this machine, not S3"),
    ("a1={missing}", "holds no adapter_config.json"),
    ("a1", "must look like NAME=FOLDER"),
    ("a/1={good}", "the name 'a/1' is what clients send as 'model'"),
])
def test_bad_adapters_are_refused_before_ray_starts(tmp_path, adapter, message):
    good = peft_folder(tmp_path / "good")
    with pytest.raises(BadInput, match=message):
        local_spec("--adapter", adapter.format(missing=tmp_path / "nope", good=good))


def test_twice_the_same_name_or_no_ingress_is_refused(tmp_path):
    good = peft_folder(tmp_path / "good")
    with pytest.raises(BadInput, match="--adapter a1 is given twice"):
        local_spec("--adapter", f"a1={good}", "--adapter", f"a1={good}")
    with pytest.raises(BadInput, match="--ray-ingress-replicas 0 with --adapter"):
        local_spec("--adapter", f"a1={good}", "--ray-ingress-replicas", "0")
    with pytest.raises(BadInput, match="--max-cpu-loras 1 is below --max-loras 2"):
        local_spec("--adapter", f"a1={good}", "--max-loras", "2", "--max-cpu-loras", "1")
