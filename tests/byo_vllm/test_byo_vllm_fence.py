"""The server depends on vLLM's engine API: when the vLLM it finds lacks that API, it stays up
and says why on /ping (503) instead of serving a wrong stream or dying silently. The vLLM
seen by the server here is a stand-in package put ahead of the real one on PYTHONPATH: the
dependency is what changes, the server is the real one."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
import requests

from byo_servers import server_env
from options.local_server import LocalServer

FILES_WITHOUT_GENERATE = {
    "vllm/__init__.py": '__version__ = "0.99.0"\n',
    "vllm/sampling_params.py": """
        import enum
        class RequestOutputKind(enum.Enum):
            CUMULATIVE = 0
            DELTA = 1
            FINAL_ONLY = 2
        class SamplingParams:
            output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
        """,
    "vllm/lora/__init__.py": "",
    "vllm/lora/request.py": "class LoRARequest:\n    pass\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    # An engine whose API changed: no generate(), so the adapter cannot drive it.
    "vllm/v1/engine/async_llm.py": """
        class AsyncLLM:
            errored = False
            dead_error = None
            @classmethod
            def from_engine_args(cls, *a, **k): raise AssertionError("must not be called")
            async def abort(self, request_id): pass
            def get_tokenizer(self): pass
            def shutdown(self): pass
        """,
}


def _stand_in(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _ping_until_it_says_why(server: LocalServer, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = requests.get(server.url + "/ping", timeout=2)
        except requests.ConnectionError:
            time.sleep(0.2)
            continue
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        if "still loading" not in message:
            return r.json()["error"]
        time.sleep(0.2)
    raise AssertionError(f"/ping never said why the engine cannot load{server._log_tail()}")


@pytest.mark.parametrize("files,words", [
    ({"vllm/__init__.py": '__version__ = "0.99.0"\n'},
     ["could not be imported", "0.32."]),
    (FILES_WITHOUT_GENERATE, ["vLLM 0.99.0 lacks", "generate", "0.32."]),
], ids=["no-engine-api", "engine-without-generate"])
def test_a_vllm_without_the_engine_api_leaves_ping_503_naming_why(tiny_model, tmp_path, files,
                                                                  words):
    env = server_env(tiny_model, PYTHONPATH=str(_stand_in(tmp_path / "site", files)))
    server = LocalServer(env, log_path=tmp_path / "server.log")
    server.start()
    try:
        error = _ping_until_it_says_why(server)
        for word in words:
            assert word in error["message"], (word, error["message"])
        r = requests.post(server.url + "/v1/completions", json={"prompt": "hi"}, timeout=10)
        assert r.status_code == 503 and ("lacks" in r.text or "imported" in r.text), r.text
        assert server.process.poll() is None, "the server must stay up to say why"
    finally:
        server.stop()
