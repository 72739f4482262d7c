"""Embeddings from the bring-your-own server through real HTTP: the tiny Llama run by vLLM as a
pooling model (``SM_VLLM_RUNNER=pooling``), first-come-first-served scheduling (vLLM's default).
The server is the suite's shared pooling server (tests/conftest.py), which the agent's retrieval
test also embeds with."""
from __future__ import annotations

import base64
import json
import math
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from byo_servers import StartedServer, engine_info
from options import contract

pytestmark = pytest.mark.engine

TEXTS = ["The deployment spectrum has six rungs.", "Bedrock bills per token.",
         "A GPU instance bills per hour, used or not."]


@pytest.fixture(scope="module")
def pooler(pooling_server) -> StartedServer:
    return StartedServer(pooling_server, [], pooling_server.log_path)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="module")
def hidden_size(tiny_model) -> int:
    return json.loads((tiny_model / "config.json").read_text())["hidden_size"]


def _vectors(response: requests.Response) -> list[list[float]]:
    assert response.status_code == 200, response.text
    return [d["embedding"] for d in response.json()["data"]]


def _close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


def test_a_batch_answers_one_vector_per_input_in_order(pooler, tokenizer, hidden_size):
    r = pooler.post("/v1/embeddings", {"input": TEXTS, "model": "anything"})
    body = r.json()
    assert r.status_code == 200, body
    assert body["object"] == "list" and body["model"] == pooler.server.env["HF_MODEL_ID"]
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", i) for i in range(3)]
    vectors = _vectors(r)
    assert {len(v) for v in vectors} == {hidden_size}
    assert all(math.isfinite(x) for v in vectors for x in v)
    # usage: the tokenizer's own count of every input, special tokens included
    counted = sum(len(tokenizer(t).input_ids) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": counted, "total_tokens": counted}
    # Order: each vector is its own text's, as when that text is embedded alone.
    alone = [_vectors(pooler.post("/v1/embeddings", {"input": t}))[0] for t in TEXTS]
    for i, (batched, single) in enumerate(zip(vectors, alone)):
        assert _close(batched, single), f"input {i} differs from itself embedded alone"
    # Different texts, different vectors.
    for i in range(3):
        for j in range(i + 1, 3):
            assert not _close(vectors[i], vectors[j], 1e-3), (i, j)


def test_same_text_same_vector_and_token_ids_equal_their_text(pooler, tokenizer):
    first = _vectors(pooler.post("/v1/embeddings", {"input": TEXTS[0]}))[0]
    again = _vectors(pooler.post("/v1/embeddings", {"input": [TEXTS[0]]}))[0]
    assert _close(first, again, 1e-5)
    ids = tokenizer(TEXTS[0]).input_ids
    r = pooler.post("/v1/embeddings", {"input": ids})
    assert _close(_vectors(r)[0], first) and r.json()["usage"]["prompt_tokens"] == len(ids)


def test_base64_decodes_to_the_float_vector(pooler):
    floats = _vectors(pooler.post("/v1/embeddings", {"input": TEXTS[:2]}))
    r = pooler.post("/v1/embeddings", {"input": TEXTS[:2], "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    for item, expected in zip(r.json()["data"], floats):
        raw = base64.b64decode(item["embedding"])
        assert len(raw) == 4 * len(expected)
        assert list(struct.unpack(f"<{len(expected)}f", raw)) == expected
    # The project's client reads both encodings (and the usage) the same way.
    via_client = contract.embed_http(pooler.url, TEXTS[:2], encoding_format="base64")
    assert via_client.vectors == floats and via_client.input_tokens == r.json()["usage"][
        "prompt_tokens"]


def test_invocations_take_the_openai_body_and_tei_feature_extraction(pooler):
    expected = _vectors(pooler.post("/v1/embeddings", {"input": TEXTS}))
    openai = _vectors(pooler.post("/invocations", {"input": TEXTS}))
    tei = pooler.post("/invocations", {"inputs": TEXTS})
    one = pooler.post("/invocations", {"inputs": TEXTS[1]})
    assert tei.status_code == 200 and one.status_code == 200, (tei.text, one.text)
    assert all(_close(a, b) for a, b in zip(openai, expected))
    assert isinstance(tei.json(), list) and all(_close(a, b) for a, b in zip(tei.json(), expected))
    assert len(one.json()) == 1 and _close(one.json()[0], expected[1])
    client = contract.embed_http(pooler.url, TEXTS, path="/invocations")
    assert all(_close(a, b) for a, b in zip(client.vectors, expected))


def _refused(server: StartedServer, path: str, body, field, *words: str) -> dict:
    r = server.post(path, body)
    assert r.status_code == 400, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["param"] == field, error
    for w in words:
        assert w in error["message"], error["message"]
    return error


def test_bad_input_is_a_400_naming_the_field_and_the_server_keeps_serving(pooler):
    s = pooler
    _refused(s, "/v1/embeddings", {"input": []}, "input", "must be a text")
    _refused(s, "/v1/embeddings", {"input": ["fine", 5]}, "input[1]", "non-empty text")
    _refused(s, "/v1/embeddings", {"input": ["fine", ""]}, "input[1]", "empty text")
    _refused(s, "/v1/embeddings", {"input": [[1, 2], [10**6]]}, "input[1]", "vocabulary")
    context = int(s.server.env["SM_VLLM_MAX_MODEL_LEN"])
    _refused(s, "/v1/embeddings", {"input": [[5] * (context + 1)]}, "input[0]",
             f"{context + 1} tokens", "max_model_len")
    _refused(s, "/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format")
    _refused(s, "/v1/embeddings", {"input": "x", "dimensions": 64}, "dimensions",
             "not a Matryoshka model", "leave dimensions out")
    _refused(s, "/invocations", {"inputs": "x", "normalize": False}, "normalize")
    # vLLM 0.32's first-come-first-served scheduler would ignore a priority: refused, saying why.
    _refused(s, "/v1/embeddings", {"input": "x", "priority": 3}, "priority",
             "'fcfs'", "SM_VLLM_SCHEDULING_POLICY=priority")
    assert s.post("/v1/embeddings", {"input": "x", "priority": 0}).status_code == 200
    # Generation on a pooling engine: what it runs and what to set.
    for path, body in [("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
                       ("/invocations", {"messages": [{"role": "user", "content": "hi"}]})]:
        _refused(s, path, body, "body", "runner 'pooling'", "embed", "/v1/embeddings",
                 "SM_VLLM_RUNNER=pooling")
    r = requests.post(s.url + "/v1/embeddings", data=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    # ... and it still serves, many at once.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda t: s.post("/v1/embeddings", {"input": [t] * 4}),
                                TEXTS * 4))
    assert {a.status_code for a in answers} == {200}
    assert requests.get(s.url + "/ping", timeout=2).status_code == 200


def test_the_server_says_what_its_engine_runs_as(pooler):
    (model,) = requests.get(pooler.url + "/v1/models", timeout=10).json()["data"]
    assert model["runner"] == "pooling" and "embed" in model["tasks"]
    assert model["scheduling_policy"] == "fcfs"
    assert isinstance(model["prefix_caching"], bool)
    state = "on" if model["prefix_caching"] else "off"
    assert engine_info(pooler) == {"runner": "pooling", "scheduling_policy": "fcfs",
                                           "prefix_caching": state}
    assert pooler.metric("byo_embedding_inputs_total") >= len(TEXTS)
    log = pooler.log.read_text()
    assert "runner pooling" in log and f"prefix caching {state}" in log
