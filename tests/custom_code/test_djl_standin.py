"""The djl_python stand-in behaves as djl_python does where a handler can tell."""
from __future__ import annotations

import json

import pytest

from byo_vllm.djl_standin import Input, Output


def test_a_request_is_one_input_with_its_body_under_data():
    item = Input.for_request(b'{"inputs": "hi"}', "application/json", {"Accept": "*/*"})
    assert not item.is_batch() and item.get_batches() == [item]
    assert item.get_property("CONTENT-TYPE") == "application/json"   # case-insensitive
    assert item.get_property("accept") == "*/*"
    assert item.get_as_json() == {"inputs": "hi"}
    assert item.get_data() == {"inputs": "hi"}                       # chosen by content type
    assert item.get_as_bytes("data") == b'{"inputs": "hi"}'
    assert item.contains_key("data") and not item.contains_key("other")
    with pytest.raises(KeyError, match="other"):
        item.get_as_bytes("other")


def test_get_data_decodes_by_content_type():
    assert Input.for_request(b"plain words", "text/plain").get_data() == "plain words"
    assert Input.for_request(b"\x00\x01", "application/octet-stream").get_data() == b"\x00\x01"
    assert Input.for_request(b"", None).get_data() is None


def test_warm_up_input_is_empty():
    warm_up = Input()
    warm_up.properties["model_dir"] = "/opt/ml/model"
    assert warm_up.is_empty() and warm_up.get_properties() == {"model_dir": "/opt/ml/model"}
    assert not Input.for_request(b"x", "text/plain").is_empty()


def test_a_batch_round_trips_through_djl_key_prefixes():
    items = [Input.for_request(json.dumps({"inputs": str(i)}).encode(), "application/json")
             for i in range(12)]
    batch = Input.batch_of(items, {"model_dir": "/m"})
    assert batch.is_batch() and batch.get_batch_size() == 12
    # DJL's wire form: batch_size, then batch_NNN_<key> with a three-digit index.
    assert batch.properties["batch_size"] == "12"
    assert batch.properties["batch_011_Content-Type"] == "application/json"
    assert batch.content.key_at(11) == "batch_011_data"
    split = batch.get_batches()
    assert [b.get_as_json()["inputs"] for b in split] == [str(i) for i in range(12)]
    assert all(b.get_property("content-type") == "application/json" for b in split)


def test_output_keys_batch_items_and_encodes_values():
    out = Output()
    out.add("text", batch_index=0).add(b"raw", key="k", batch_index=1).add({"a": 1})
    assert out.content.get_keys() == ["batch_0.", "batch_1.k", None]
    assert out.content.value_at(0) == b"text" and out.content.value_at(1) == b"raw"
    assert json.loads(out.content.value_at(2)) == {"a": 1}
    out.add_as_json({"\u00e9": [1.5]}, batch_index=2)
    assert out.content.value_at(3).decode("utf-8") == '{\n  "\u00e9":[\n    1.5\n  ]\n}'
    with pytest.raises(ValueError):                # djl_python refuses NaN too
        out.add_as_json(float("nan"))


def test_error_sets_the_code_and_a_json_body():
    out = Output().error("bad thing", code=400, message="invalid request")
    assert (out.code, out.message) == (400, "invalid request")
    assert out.properties["content-type"] == "application/json"
    assert json.loads(out.content.value_at(0)) == {"code": 400, "message": "invalid request",
                                                   "error": "bad thing"}
    default = Output().error("boom")
    assert default.code == 424 and default.message == "prediction failure"
    assert Output().set_code(201).set_message("Created").code == 201


def test_stream_content_is_pulled_through_the_formatter():
    out = Output()
    out.add_stream_content(iter(["a", "b"]))
    assert [out.stream_output_formatter(x) for x in out.stream_content] == [
        b'{"outputs": "a"}\n', b'{"outputs": "b"}\n']
    custom = Output().add_stream_content(["x"], output_formatter=lambda x: x.upper().encode())
    assert [custom.stream_output_formatter(x) for x in custom.stream_content] == [b"X"]
