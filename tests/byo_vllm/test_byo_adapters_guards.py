"""The load API's guards, without an engine: where adapters may come from (allowed roots, no
'..' or symlink escape, s3:// prefixes), and the checks of an adapter's files before the
engine sees them (peft config, rank, target modules and shapes, safetensors only).

``write_peft_adapter`` builds adapters for the tiny model in peft's layout; the engine tests
use it too."""
from __future__ import annotations

import json
import os
import pickle
import struct
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from byo_vllm.adapters import (CONFIG_FILE, WEIGHTS_FILE, AllowedSources, base_model_modules,
                               check_adapter_folder, copy_local, fetch_s3, write_zero_adapter)
from byo_vllm.config import ConfigError, settings_from_env
from byo_vllm.dialects import BadRequest

# The tiny model's attention projections (options/tiny_model.py): hidden 128, 2 heads of 64,
# one KV head; two layers.
TINY = {f"model.layers.{i}.self_attn.{m}": shape for i in range(2)
        for m, shape in (("q_proj", (128, 128)), ("k_proj", (64, 128)),
                         ("v_proj", (64, 128)), ("o_proj", (128, 128)))}


def write_peft_adapter(folder: Path, seed: int, rank: int = 8,
                       targets: tuple[str, ...] = ("q_proj", "v_proj"),
                       base: dict[str, tuple[int, int]] = TINY, scale: float = 1.0,
                       config: dict | None = None) -> Path:
    """A LoRA adapter in peft's layout whose weights change the model's output."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (out, inp) in base.items():
        if module.rsplit(".", 1)[-1] not in targets:
            continue
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, inp)) * scale
                                           ).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out, rank)) * scale
                                           ).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(config or {
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "bias": "none", "target_modules": list(targets), "task_type": "CAUSAL_LM"}))
    return folder


@pytest.fixture
def roots(tmp_path):
    model = tmp_path / "model"
    (model / "adapters").mkdir(parents=True)
    extra = tmp_path / "extra"
    extra.mkdir()
    return AllowedSources.build(model, [str(extra), "s3://bucket/adapters"]), model, extra


@contextmanager
def refused(status: int, *words: str):
    """The block raises BadRequest with ``status`` and a message holding every word."""
    with pytest.raises(BadRequest) as info:
        yield
    assert info.value.status == status, (info.value.status, str(info.value))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# -- allowed roots ---------------------------------------------------------------------------
def test_sources_under_the_roots_are_accepted(roots):
    sources, model, extra = roots
    inside = write_peft_adapter(model / "adapters" / "a", 1)
    assert sources.check(str(inside)).local == Path(os.path.realpath(inside))
    assert sources.check(str(extra)).local is not None
    assert sources.check("s3://bucket/adapters/a1").bucket == "bucket"
    assert "/opt/ml/models" in sources.describe()


def test_a_folder_outside_the_roots_is_403_naming_them(roots, tmp_path):
    sources, model, extra = roots
    outside = write_peft_adapter(tmp_path / "elsewhere", 1)
    with refused(403, str(outside), str(model), str(extra), "/opt/ml/models",
                 "s3://bucket/adapters/"):
        sources.check(str(outside))
    with refused(403, "outside"):
        sources.check("/etc")


def test_dot_dot_is_refused_even_when_it_lands_inside(roots):
    sources, model, _ = roots
    write_peft_adapter(model / "adapters" / "a", 1)
    with refused(403, "'..'"):
        sources.check(str(model / "adapters" / ".." / "adapters" / "a"))
    with refused(403, "'..'"):
        sources.check(str(model) + "/../../etc")


def test_a_symlink_out_of_a_root_is_403(roots, tmp_path):
    sources, model, _ = roots
    secret = write_peft_adapter(tmp_path / "secret", 1)
    link = model / "adapters" / "link"
    link.symlink_to(secret)
    with refused(403, "symlink", str(secret)):
        sources.check(str(link))
    # A folder inside whose weights file is a symlink to a file outside: refused on copy.
    folder = model / "adapters" / "mixed"
    folder.mkdir()
    (folder / CONFIG_FILE).write_text((secret / CONFIG_FILE).read_text())
    (folder / WEIGHTS_FILE).symlink_to(secret / WEIGHTS_FILE)
    with refused(403, "symlink", str(secret / WEIGHTS_FILE)):
        copy_local(sources.check(str(folder)), sources, tmp_path / "copy")


def test_not_a_source_is_400(roots):
    sources, _, _ = roots
    for url in ("relative/path", "", None, 7, "https://example.com/a", "file:///x"):
        with refused(400, "url="):
            sources.check(url)


def test_s3_prefixes_are_matched_on_whole_segments(roots):
    sources, _, _ = roots
    with refused(403, "s3://bucket/adapters-evil/a", "SPECTRUM_SERVER_ADAPTER_SOURCES"):
        sources.check("s3://bucket/adapters-evil/a")
    with refused(403, "s3://other/adapters/a"):
        sources.check("s3://other/adapters/a")
    with refused(403, "'..'"):
        sources.check("s3://bucket/adapters/../private")
    with refused(400, "s3://bucket/prefix"):
        sources.check("s3:///adapters")
    no_s3 = AllowedSources.build(None)
    with refused(403, "none are configured"):
        no_s3.check("s3://bucket/adapters/a")


# -- the files ---------------------------------------------------------------------------------
def test_a_good_adapter_passes_with_its_modules(tmp_path):
    spec = check_adapter_folder(write_peft_adapter(tmp_path / "a", 1), TINY, 16)
    assert spec.rank == 8
    assert spec.modules == sorted(m for m in TINY if m.endswith(("q_proj", "v_proj")))


def test_no_config_is_400(tmp_path):
    folder = write_peft_adapter(tmp_path / "a", 1)
    (folder / CONFIG_FILE).unlink()
    with refused(400, CONFIG_FILE):
        check_adapter_folder(folder, TINY, 16)


def test_rank_above_max_lora_rank_is_400(tmp_path):
    folder = write_peft_adapter(tmp_path / "a", 1, rank=16)
    with refused(400, "r=16", "max_lora_rank 8", "SM_VLLM_MAX_LORA_RANK"):
        check_adapter_folder(folder, TINY, 8)


def test_target_modules_the_base_lacks_are_400(tmp_path):
    folder = write_peft_adapter(tmp_path / "a", 1, config={
        "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "c_attn"]})
    with refused(400, "c_attn", "q_proj"):
        check_adapter_folder(folder, TINY, 16)


def test_weights_for_another_model_are_400(tmp_path):
    wider = {m: (out * 2, inp * 2) for m, (out, inp) in TINY.items()}
    folder = write_peft_adapter(tmp_path / "a", 1, base=wider)
    with refused(400, "trained for another model"):
        check_adapter_folder(folder, TINY, 16)
    stray = write_peft_adapter(tmp_path / "b", 1, base={"model.layers.9.self_attn.q_proj":
                                                        (128, 128)})
    with refused(400, "model.layers.9.self_attn.q_proj", "not a module"):
        check_adapter_folder(stray, TINY, 16)


def test_a_truncated_or_foreign_weights_file_is_400(tmp_path):
    folder = write_peft_adapter(tmp_path / "a", 1)
    data = (folder / WEIGHTS_FILE).read_bytes()
    (folder / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with refused(400, "truncated"):
        check_adapter_folder(folder, TINY, 16)
    (folder / WEIGHTS_FILE).write_bytes(struct.pack("<Q", 10 ** 12) + b"{}")
    with refused(400, "not a safetensors file"):
        check_adapter_folder(folder, TINY, 16)
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
               np.zeros((8, 128), np.int64)}, str(folder / WEIGHTS_FILE))
    with refused(400, "I64"):
        check_adapter_folder(folder, TINY, 16)


class _Payload:
    """Unpickling this writes a file: the test proves the pickle was never opened."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickled_bin_is_refused_and_never_unpickled(roots, tmp_path):
    sources, model, _ = roots
    folder = model / "adapters" / "pickled"
    write_peft_adapter(folder, 1)
    (folder / WEIGHTS_FILE).unlink()
    marker = tmp_path / "unpickled"
    (folder / "adapter_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    dest = tmp_path / "copy"
    copy_local(sources.check(str(folder)), sources, dest)
    assert not (dest / "adapter_model.bin").stat().st_size     # a marker, never the pickle
    with refused(400, "adapter_model.bin", "pickle", "safetensors"):
        check_adapter_folder(dest, TINY, 16)
    assert not marker.exists()


def test_base_model_modules_from_the_tiny_model(tiny_model):
    modules = base_model_modules(tiny_model)
    assert {m: modules[m] for m in TINY} == TINY
    assert base_model_modules(tiny_model / "missing") is None


def test_the_zero_adapter_passes_the_checks_and_is_all_zero(tmp_path):
    from safetensors.numpy import load_file

    write_zero_adapter(tmp_path / "zero", TINY)
    spec = check_adapter_folder(tmp_path / "zero", TINY, 8)
    assert spec.rank == 1 and all(m.endswith("q_proj") for m in spec.modules)
    tensors = load_file(str(tmp_path / "zero" / WEIGHTS_FILE))
    assert all(not t.any() for k, t in tensors.items() if "lora_B" in k)


# -- S3 (moto) -----------------------------------------------------------------------------
@pytest.fixture
def s3(monkeypatch):
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        import boto3
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bucket")
        yield client


def test_an_s3_adapter_is_fetched_and_checked(s3, roots, tmp_path):
    sources, _, _ = roots
    local = write_peft_adapter(tmp_path / "src", 3)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        s3.upload_file(str(local / name), "bucket", f"adapters/a3/{name}")
    s3.put_object(Bucket="bucket", Key="adapters/a3/README.md", Body=b"notes")
    dest = tmp_path / "fetched"
    fetch_s3(sources.check("s3://bucket/adapters/a3"), dest)
    assert sorted(p.name for p in dest.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert check_adapter_folder(dest, TINY, 16).rank == 8
    assert (dest / WEIGHTS_FILE).read_bytes() == (local / WEIGHTS_FILE).read_bytes()


def test_an_s3_pickle_is_never_downloaded(s3, roots, tmp_path):
    sources, _, _ = roots
    s3.put_object(Bucket="bucket", Key="adapters/p/adapter_config.json",
                  Body=json.dumps({"r": 8, "target_modules": ["q_proj"]}).encode())
    s3.put_object(Bucket="bucket", Key="adapters/p/adapter_model.bin", Body=b"pickle bytes")
    dest = tmp_path / "fetched"
    fetch_s3(sources.check("s3://bucket/adapters/p"), dest)
    assert (dest / "adapter_model.bin").stat().st_size == 0
    with refused(400, "adapter_model.bin", "pickle"):
        check_adapter_folder(dest, TINY, 16)
    with refused(400, "no objects"):
        fetch_s3(sources.check("s3://bucket/adapters/none"), tmp_path / "none")


# -- settings ------------------------------------------------------------------------------
def test_adapter_settings(tmp_path):
    settings = settings_from_env({
        "HF_MODEL_ID": str(tmp_path),
        "SPECTRUM_SERVER_ADAPTER_SOURCES": f"s3://bucket/adapters, {tmp_path}",
        "SPECTRUM_SERVER_BASE_ZERO_ADAPTER": "TRUE"})
    assert settings.adapter_sources == ("s3://bucket/adapters", str(tmp_path))
    assert settings.base_zero_adapter == "true"
    assert settings_from_env({"HF_MODEL_ID": str(tmp_path)}).base_zero_adapter == "auto"
    with pytest.raises(ConfigError) as e:
        settings_from_env({"HF_MODEL_ID": str(tmp_path),
                           "SPECTRUM_SERVER_ADAPTER_SOURCES": "relative,s3://,/a/../b",
                           "SPECTRUM_SERVER_BASE_ZERO_ADAPTER": "sometimes"})
    for word in ("'relative'", "'s3://' names no bucket", "'/a/../b'", "'sometimes'"):
        assert word in str(e.value), word
