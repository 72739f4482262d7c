"""One real server (``serve`` → gunicorn → vLLM on CPU with the tiny model) for the module
that needs it: engine starts are the expensive part of this suite. The helpers the tests share
are in byo_servers.py."""
from __future__ import annotations

import pytest
from byo_servers import GRACEFUL_TIMEOUT_S, READ_TIMEOUT_S, StartedServer, server_env
from shared_servers import shared_server

from options.local_server import LocalServer


@pytest.fixture(scope="module")
def byo_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("byo") / "server.log"
    # The graceful window outlasts the SIGTERM test's streams however loaded the machine: the
    # test is that requests in flight finish, not how fast (SageMaker's 25 s is the default).
    server = LocalServer(server_env(tiny_model, SPECTRUM_SERVER_READ_TIMEOUT=str(READ_TIMEOUT_S),
                                    SPECTRUM_SERVER_GRACEFUL_TIMEOUT=str(GRACEFUL_TIMEOUT_S)),
                         log_path=log)
    states: list[tuple[float, str]] = []
    server.start()
    try:
        server.wait_ready(on_progress=lambda elapsed, state: states.append((elapsed, state)))
        yield StartedServer(server, states, log)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def priority_server(request, tiny_model, tmp_path_factory):
    """A server started with ``SM_VLLM_SCHEDULING_POLICY=priority`` and one request at a time in
    the engine (``SM_VLLM_MAX_NUM_SEQS=1``): test_byo_priority.py's, then the engine it runs is
    what test_byo_server_engine_death.py kills, its last user (one engine start for both)."""
    log = tmp_path_factory.mktemp("byo-priority") / "server.log"
    with shared_server(request, server_env(tiny_model, SM_VLLM_SCHEDULING_POLICY="priority",
                                           SM_VLLM_MAX_NUM_SEQS="1"), log) as server:
        yield StartedServer(server, [], log)
