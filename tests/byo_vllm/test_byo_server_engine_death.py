"""When the engine process dies, the server says so instead of dying with it: /ping turns 503
(so SageMaker or Kubernetes replaces the container) and requests get a 503 naming the cause.
The engine killed is conftest.py's ``priority_server``'s, once test_byo_priority.py is done with it:
this module sorts after that one, and the kill is that server's last use."""
from __future__ import annotations

import psutil
import requests

from byo_servers import StartedServer, wait_for


def _engine_processes(server: StartedServer) -> list[psutil.Process]:
    """vLLM titles its engine processes VLLM::EngineCore / VLLM::Worker."""
    found = []
    for p in psutil.Process(server.server.process.pid).children(recursive=True):
        try:
            title = p.name() + " " + " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "VLLM::EngineCor" in title or "VLLM::Worker" in title:
            found.append(p)
    return found


def _ping(url: str) -> int:
    return requests.get(url + "/ping", timeout=2).status_code


def test_ping_503_and_requests_503_after_the_engine_died(priority_server):
    server = priority_server
    assert _ping(server.url) == 200
    engines = _engine_processes(server)
    assert engines, "no VLLM::EngineCore process under the server"
    for p in engines:
        p.kill()

    wait_for(lambda: _ping(server.url) == 503, 60, "/ping to report the dead engine")
    r = requests.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                      timeout=30)
    assert r.status_code == 503, r.text
    assert "engine" in r.json()["error"]["message"].lower(), r.text
    assert server.server.process.poll() is None, "the server itself must keep answering"
    assert _ping(server.url) == 503
