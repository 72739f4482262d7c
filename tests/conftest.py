"""Fixtures shared by the whole suite, among them the servers tests in several folders share
(shared_servers.py: each stops after its last test)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from shared_servers import after_test, note_collected, plain_server_env, shared_server

from options.local_server import LocalServer


# tests/run.sh runs the suite on two pytest-xdist workers (--dist loadgroup): every module is a
# group of its own, so its module fixtures start once, except these, whose modules share what is
# costly to start twice or to run twice at once. Listed longest first (minutes, measured one
# worker at a time on this 2-core machine): the scheduler hands groups out in collection order,
# and the longest ones starting first keep both workers busy to the end.
SHARED_GROUPS = {
    # one shared server profiled once (tests/bench/conftest.py's trace_profile): ~12 min
    "plain-server-profile": ("tests/bench/test_capacity_profile.py", "tests/bench/test_replay_predicted.py",
                             "tests/bench/test_bench_program.py", "tests/bench/test_bench_server.py"),
    # a local Ray each, and Serve's proxies: one Ray at a time on two cores: ~9 min
    "ray": ("tests/ray_serve/",),
    # podman builds the images once (tests/images.py)
    "containers": ("tests/byo_vllm/test_container.py", "tests/gateway/test_gateway_image.py"),
    # the pooling server (tests/conftest.py)
    "pooling-server": ("tests/agent/test_agent_embeddings_engine.py", "tests/byo_vllm/test_byo_embeddings.py"),
}
LONGEST_FIRST = ["plain-server-profile", "ray", "tests/e2e/test_deploy_local.py", "tests/agent/test_agent.py",
                 "containers", "tests/byo_vllm/test_openai_differential.py", "tests/byo_vllm/test_byo_server.py",
                 "tests/gateway/test_gateway_affinity_engine.py", "tests/byo_vllm/test_byo_adapters.py",
                 "pooling-server"]


def xdist_group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    for group, prefixes in SHARED_GROUPS.items():
        if path.startswith(prefixes):
            return group
    return path


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item.nodeid)))
    # Longest groups first, the rest in collection order; within a group the collected order
    # stands (a module's tests may build on each other's fixtures).
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group_of(item.nodeid), len(rank)))


def pytest_collection_finish(session):
    note_collected(session.items)


def pytest_runtest_teardown(item, nextitem):
    after_test(item)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The folder of the tiny random-weight Llama (built once, cached across runs)."""
    from options.tiny_model import tiny_model_dir
    return tiny_model_dir()


@pytest.fixture(scope="session")
def plain_server(request, tiny_model, tmp_path_factory) -> Iterator[LocalServer]:
    """The bring-your-own server generating with the tiny model, eager, configured as a user who
    sets nothing but its context would: what the agent's completions test and the bench's tests
    that need no special server use (tests/bench/conftest.py profiles it once)."""
    with shared_server(request, plain_server_env(tiny_model),
                       tmp_path_factory.mktemp("plain-server") / "server.log") as server:
        yield server


@pytest.fixture(scope="session")
def pooling_server(request, tiny_model, tmp_path_factory) -> Iterator[LocalServer]:
    """The bring-your-own server running the tiny model as a pooling model (embeddings) with its
    whole 2,048-token context, eager: test_byo_embeddings.py's server and the agent's retrieval's."""
    env = {"HF_MODEL_ID": str(tiny_model), "SM_VLLM_RUNNER": "pooling", "SM_VLLM_MAX_MODEL_LEN": "2048",
           "SM_VLLM_ENFORCE_EAGER": ""}
    with shared_server(request, env, tmp_path_factory.mktemp("pooling-server") / "server.log") as server:
        yield server


@pytest.fixture
def botocore_events():
    """Handlers registered on boto3's default session (the one ``options.aws.Target``'s clients
    come from) reach every client it makes, until the test ends: how tests answer or inspect
    AWS calls at botocore's level."""
    import boto3

    boto3.setup_default_session()
    registered = []

    def register(event, handler):
        boto3.DEFAULT_SESSION.events.register(event, handler)
        registered.append((event, handler))
    yield register
    for event, handler in registered:
        boto3.DEFAULT_SESSION.events.unregister(event, handler)
