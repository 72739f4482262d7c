"""Embeddings on both sides of the wire, with no engine: the client's body (options.contract)
is what the server parses (byo_vllm.embeddings), and the server's answer, as floats, as base64
or in TEI's bare-list shape, reads back as the same vectors in the same order."""
from __future__ import annotations

import json

import pytest

from byo_vllm import embeddings as server
from byo_vllm.dialects import BadRequest
from options import contract
from options.core import BadInput, wire

# Values float32 holds exactly, so base64 round trips compare equal.
VECTORS = [[0.5, -1.25, 3.0], [0.0, 0.125, -2.5], [1.0, 1.0, -0.0625]]
TEXTS = ["first passage", "second", "third one"]


def _server_side(body: dict) -> server.EmbeddingRequest:
    data = json.loads(json.dumps(body))
    assert wire.detect_dialect(data) == wire.OPENAI_EMBEDDINGS
    return server.parse_embeddings(data, server.OPENAI)


@pytest.mark.parametrize("encoding", [None, "float", "base64"])
def test_client_body_reaches_the_server_and_the_answer_comes_back(encoding):
    body = contract.embeddings_to_wire(TEXTS, model="tiny", encoding_format=encoding)
    req = _server_side(body)
    assert req.inputs == TEXTS and req.encoding_format == (encoding or "float")
    answer = json.loads(json.dumps(server.answer(req, VECTORS, 17, "tiny")))
    assert answer["object"] == "list" and answer["model"] == "tiny"
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    assert {d["object"] for d in answer["data"]} == {"embedding"}
    assert answer["usage"] == {"prompt_tokens": 17, "total_tokens": 17}
    if encoding == "base64":
        assert all(isinstance(d["embedding"], str) for d in answer["data"])
    got = contract.embeddings_from_wire(answer)
    assert got.vectors == VECTORS and got.input_tokens == 17 and got.model == "tiny"


def test_answers_out_of_order_are_read_by_index():
    answer = server.answer(server.EmbeddingRequest(TEXTS, server.OPENAI, "input"), VECTORS, 3, "m")
    answer["data"].reverse()
    assert contract.embeddings_from_wire(answer).vectors == VECTORS


def test_tei_shape_answers_a_bare_list_of_vectors():
    req = server.parse_embeddings({"inputs": "one text"}, server.TEI)
    assert req.inputs == ["one text"] and req.field == "inputs"
    answer = server.answer(req, VECTORS[:1], 2, "m")
    assert answer == VECTORS[:1]
    assert contract.embeddings_from_wire(answer).vectors == VECTORS[:1]


@pytest.mark.parametrize("value,expected", [
    ("one", ["one"]), (["a", "b"], ["a", "b"]), ([5, 6, 7], [[5, 6, 7]]),
    ([[1, 2], [3]], [[1, 2], [3]])], ids=["text", "texts", "tokens", "token-lists"])
def test_every_openai_input_form_becomes_a_list_of_inputs(value, expected):
    assert server.parse_embeddings({"input": value}, server.OPENAI).inputs == expected


@pytest.mark.parametrize("body,shape,field,words", [
    ({"model": "m"}, server.OPENAI, "input", ["needs \"input\""]),
    ({"input": []}, server.OPENAI, "input", ["must be a text", "list"]),
    ({"input": 7}, server.OPENAI, "input", ["must be a text", "int 7"]),
    ({"input": ["ok", ""]}, server.OPENAI, "input[1]", ["empty text"]),
    ({"input": ["ok", {"text": "x"}]}, server.OPENAI, "input[1]", ["non-empty text", "dict"]),
    ({"input": [[1, -2]]}, server.OPENAI, "input[0]", ["token ids"]),
    ({"input": ["x"] * (server.MAX_INPUTS + 1)}, server.OPENAI, "input", ["at most 2048"]),
    ({"input": "x", "encoding_format": "int8"}, server.OPENAI, "encoding_format",
     ["'int8'", "float, base64"]),
    ({"input": "x", "dimensions": 0}, server.OPENAI, "dimensions", ["≥ 1"]),
    ({"input": "x", "priority": "soon"}, server.OPENAI, "priority", ["whole number"]),
    ({"inputs": [[1, 2]]}, server.TEI, "inputs[0]", ["non-empty text"]),
    ({"inputs": "x", "normalize": False}, server.TEI, "normalize", ["always normalised"]),
], ids=["no-input", "empty-list", "number", "empty-text", "object", "negative-token",
        "too-many", "encoding", "dimensions", "priority", "tei-tokens", "tei-normalize"])
def test_bad_embeddings_bodies_are_refused_naming_the_field(body, shape, field, words):
    with pytest.raises(BadRequest) as e:
        server.parse_embeddings(body, shape)
    assert e.value.field == field and e.value.status == 400
    for w in words:
        assert w in str(e.value)


def test_the_client_refuses_what_the_server_would():
    for texts in ([], "one text", ["ok", ""]):
        with pytest.raises(BadInput, match="non-empty list of non-empty texts"):
            contract.embeddings_to_wire(texts)
    with pytest.raises(BadInput, match="float or base64"):
        contract.embeddings_to_wire(["x"], encoding_format="int8")
    # An embeddings body is not a generation request.
    with pytest.raises(BadInput, match="asks for embeddings"):
        contract.detect_dialect({"input": ["x"]})
