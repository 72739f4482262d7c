"""Level 4 through the same image: a model folder with a model.py (or OPTION_ENTRYPOINT
naming a .py file) is served by the user's handler, not by vLLM. No engine starts here."""
from __future__ import annotations

import requests

from options.local_server import LocalServer

HANDLER = '''
try:
    from djl_python import Input, Output
except ImportError:
    from byo_vllm.djl_standin import Input, Output

def handle(inputs):
    if inputs.is_empty():          # the warm-up request: load here
        return None
    out = Output()
    out.add_as_json({"echo": inputs.get_as_json(), "handler": __file__.rsplit("/", 1)[-1]})
    return out
'''


def _serve(model_dir, tmp_path, **env):
    server = LocalServer({"HF_MODEL_ID": str(model_dir), **env},
                         log_path=tmp_path / "server.log")
    server.start()
    server.wait_ready(60)
    return server


def test_model_py_in_the_model_folder_serves_invocations(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.py").write_text(HANDLER)
    server = _serve(model, tmp_path)
    try:
        r = requests.post(server.url + "/invocations", json={"inputs": "hi"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json() == {"echo": {"inputs": "hi"}, "handler": "model.py"}
        r = requests.post(server.url + "/v1/completions", json={"prompt": "hi"}, timeout=30)
        assert r.status_code == 404 and "/invocations" in r.json()["error"]["message"]
    finally:
        assert server.stop() == 0


def test_option_entrypoint_names_the_handler_file(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "custom.py").write_text(HANDLER)
    server = _serve(model, tmp_path, OPTION_ENTRYPOINT="custom.py")
    try:
        r = requests.post(server.url + "/invocations", json={"x": 1}, timeout=30)
        assert r.json()["handler"] == "custom.py"
        assert requests.get(server.url + "/ping", timeout=2).status_code == 200
    finally:
        assert server.stop() == 0
