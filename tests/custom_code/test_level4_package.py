"""serving.properties, the model folder and model.tar.gz for LMI."""
from __future__ import annotations

import hashlib
import os
import tarfile

import pytest

from options.custom_code.package import (build_model_tarball, handler_path, prepare_model_dir,
                                         serving_properties)
from options.core import BadInput


def parse(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_serving_properties_defaults_run_the_handler_with_dynamic_batching():
    text = serving_properties({})
    props = parse(text)
    assert props == {"engine": "Python", "option.entryPoint": "model.py",
                     "option.dtype": "fp16", "option.rolling_batch": "disable",
                     "batch_size": "4", "max_batch_delay": "100"}
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[0] == "batch_size=4"                 # frontend keys, then options, sorted
    assert lines[-1] == "option.rolling_batch=disable"


def test_serving_properties_take_options_in_env_or_properties_form():
    props = parse(serving_properties({
        "OPTION_MODEL_ID": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bf16",
        "option.max_new_tokens": "64", "batch_size": "8", "max_batch_delay": "50",
        "OPTION_ENTRYPOINT": "handler.py"}))
    assert props["option.model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert props["option.dtype"] == "bf16" and props["option.max_new_tokens"] == "64"
    assert props["batch_size"] == "8" and props["max_batch_delay"] == "50"
    assert props["option.entryPoint"] == "handler.py"


@pytest.mark.parametrize("properties, needle", [
    ({"batch_size": "0"}, "batch_size='0' must be a whole number of at least 1"),
    ({"max_batch_delay": "-5"}, "max_batch_delay='-5'"),
    ({"OPTION_ENTRYPOINT": "djl_python.vllm"}, "must name a .py file"),
    ({"dtype": "int3"}, "option.dtype='int3' is not one of"),
    ({"engine": "MPI"}, "use engine=Python"),
    ({"HF_TOKEN": "hf_secret"}, "looks like a secret"),
])
def test_bad_properties_are_refused_with_the_fix(properties, needle):
    with pytest.raises(BadInput) as caught:
        serving_properties(properties)
    assert needle in str(caught.value)
    assert "hf_secret" not in str(caught.value)


def test_prepare_model_dir_lays_out_weights_handler_and_properties(tiny_model, tmp_path):
    dest = prepare_model_dir(tmp_path / "model", tiny_model,
                             {"OPTION_MODEL_ID": "ignored/because-weights-are-local",
                              "batch_size": "2"})
    names = sorted(p.name for p in dest.iterdir())
    assert names == sorted({p.name for p in tiny_model.iterdir()} | {"model.py",
                                                                      "serving.properties"})
    assert (dest / "model.py").read_bytes() == handler_path().read_bytes()
    assert "djl_standin.py" not in names              # the stand-in is never packaged
    props = parse((dest / "serving.properties").read_text())
    assert "option.model_id" not in props              # the handler loads from model_dir
    assert props["batch_size"] == "2"
    weights = dest / "model.safetensors"
    assert weights.read_bytes() == (tiny_model / "model.safetensors").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]   # no temporary left over


def test_prepare_model_dir_without_weights_needs_a_model_id(tmp_path):
    with pytest.raises(BadInput, match="no model"):
        prepare_model_dir(tmp_path / "model", None, {})
    dest = prepare_model_dir(tmp_path / "model", None, {"model_id": "s3://bucket/llama/"})
    assert sorted(p.name for p in dest.iterdir()) == ["model.py", "serving.properties"]
    assert parse((dest / "serving.properties").read_text())["option.model_id"] == "s3://bucket/llama/"


def test_prepare_model_dir_refuses_and_leaves_nothing(tiny_model, tmp_path):
    with pytest.raises(BadInput, match="has no config.json"):
        prepare_model_dir(tmp_path / "a", tmp_path, {})
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(BadInput, match="not an empty folder"):
        prepare_model_dir(taken, tiny_model, {})
    with pytest.raises(BadInput, match="batch_size"):
        prepare_model_dir(tmp_path / "b", tiny_model, {"batch_size": "many"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_tarball_has_files_at_the_root_and_is_byte_for_byte_repeatable(tiny_model, tmp_path):
    model_dir = prepare_model_dir(tmp_path / "model", tiny_model, {})
    (model_dir / "extra").mkdir()
    (model_dir / "extra" / "notes.txt").write_text("a nested file")
    first = build_model_tarball(model_dir, tmp_path / "out")       # a folder: model.tar.gz in it
    assert first == tmp_path / "out" / "model.tar.gz"
    digest = hashlib.sha256(first.read_bytes()).hexdigest()

    # Touch every file: a new mtime must not change the archive.
    for path in model_dir.rglob("*"):
        os.utime(path, (1_900_000_000, 1_900_000_000))
    second = build_model_tarball(model_dir, tmp_path / "again.tar.gz")
    assert hashlib.sha256(second.read_bytes()).hexdigest() == digest

    with tarfile.open(first, "r:gz") as archive:
        members = archive.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        assert "model.py" in names and "serving.properties" in names and "config.json" in names
        assert "extra/notes.txt" in names
        assert not any(n.startswith(("/", "./")) or "model/" in n for n in names)
        assert {m.mtime for m in members} == {0} and {m.uid for m in members} == {0}
        assert archive.extractfile("model.py").read() == handler_path().read_bytes()
        assert archive.extractfile("model.safetensors").read() == \
            (tiny_model / "model.safetensors").read_bytes()
    assert first.read_bytes()[4:8] == b"\x00\x00\x00\x00"            # gzip header time is 0
    assert not list((tmp_path / "out").glob(".*partial"))


def test_tarball_refuses_a_folder_that_is_not_prepared_or_itself(tiny_model, tmp_path):
    with pytest.raises(BadInput, match="prepare it with prepare_model_dir"):
        build_model_tarball(tiny_model, tmp_path)
    model_dir = prepare_model_dir(tmp_path / "model", tiny_model, {})
    with pytest.raises(BadInput, match="would contain itself"):
        build_model_tarball(model_dir, model_dir)
    assert not (model_dir / "model.tar.gz").exists()
