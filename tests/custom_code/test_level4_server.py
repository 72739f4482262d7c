"""Level 4 locally: the bring-your-own server runs a prepared model folder's model.py over HTTP."""
from __future__ import annotations

import json

import pytest
import requests

from options.custom_code.package import prepare_model_dir
from options.local_server import LocalServer


@pytest.fixture(scope="module")
def level4_server(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("level4-server")
    model_dir = prepare_model_dir(root / "model", tiny_model,
                                  {"dtype": "fp32", "batch_size": "2", "max_batch_delay": "20",
                                   "max_new_tokens": "8"})
    server = LocalServer({"HF_MODEL_ID": str(model_dir)}, log_path=root / "server.log")
    states: list[str] = []
    server.start()
    try:
        server.wait_ready(180, on_progress=lambda _elapsed, state: states.append(state))
        yield server, states
    finally:
        server.stop()


def test_ping_is_ready_only_after_the_handler_loaded(level4_server):
    server, states = level4_server
    assert states[-1] == "ready"
    assert set(states[:-1]) <= {"down", "loading"}
    ping = requests.get(server.url + "/ping", timeout=2)
    assert ping.status_code == 200 and ping.content == b""


def test_invocations_answer_json_through_model_py(level4_server):
    server, _ = level4_server
    response = requests.post(server.url + "/invocations",
                             json={"inputs": "Hello", "parameters": {"details": True}}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    answer = response.json()
    assert isinstance(answer["generated_text"], str)
    assert 1 <= answer["details"]["generated_tokens"] <= 8     # option.max_new_tokens=8


def test_invocations_stream_jsonlines_chunked(level4_server):
    server, _ = level4_server
    plain = requests.post(server.url + "/invocations", json={"inputs": "Hello"}, timeout=60).json()
    with requests.post(server.url + "/invocations", json={"inputs": "Hello", "stream": True},
                       stream=True, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("application/jsonlines")
        assert response.headers.get("Transfer-Encoding") == "chunked"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert "".join(line["token"]["text"] for line in lines) == plain["generated_text"]
    assert lines[-1]["generated_text"] == plain["generated_text"]


def test_a_bad_request_gets_400_and_the_server_keeps_serving(level4_server):
    server, _ = level4_server
    response = requests.post(server.url + "/invocations", data=b"{oops",
                             headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]
    assert requests.get(server.url + "/ping", timeout=2).status_code == 200
