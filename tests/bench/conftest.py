"""One bring-your-own server (vLLM on CPU, tiny model) shared by the bench's tests that need a
plain one: a server start is ~25 s on this machine, and the bench's modules would otherwise
start three alike. It starts with the first test that asks for it and stops as soon as the run
leaves this folder, so it holds no memory while the rest of the suite starts servers of its own.
Each bench run tags its prompts (the bench's run tag), so none finds another's in the prefix
cache. Tests that need a server configured otherwise (adapters, a shorter context, the bench
starting the server itself) keep their own."""
from __future__ import annotations

from pathlib import Path

import pytest

from options.local_server import LocalServer

MAX_MODEL_LEN = 1024
HERE = Path(__file__).parent
_started: list[LocalServer] = []


@pytest.fixture(scope="session")
def bench_server(tiny_model, tmp_path_factory) -> LocalServer:
    env = {"HF_MODEL_ID": str(tiny_model), "SM_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN), "SM_VLLM_ENFORCE_EAGER": ""}
    server = LocalServer(env, log_path=tmp_path_factory.mktemp("bench-server") / "server.log")
    _started.append(server)
    with server:
        server.wait_ready()
        yield server


def pytest_runtest_teardown(item, nextitem):
    """Stop the shared server once the next test is outside this folder (or there is none)."""
    if _started and (nextitem is None or HERE not in Path(nextitem.path).parents):
        _started.pop().stop()
