"""Fixtures shared by the whole suite, among them the servers tests in several folders share
(shared_servers.py: each stops after its last test)."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from shared_servers import (ENGINE_SERVER_FIXTURES, after_test, note_collected, plain_server_env,
                            shared_server, stop_all)

from options.local_server import LocalServer


# Tests that start or use a vLLM engine, or build or run an image (which runs one): tests/run.sh
# runs them in one worker, in their collected order, while a second worker runs the rest (a
# whole CLI without an engine, marked e2e only, among them).
SERIAL_MARKS = ("engine", "container")


@pytest.hookimpl(wrapper=True)        # before any plugin's: pytest-xdist turns the group into the node id
def pytest_collection_modifyitems(config, items):
    """Two workers (``-n 2 --dist loadgroup``): the engine tests are one group, so they run one
    at a time as they always have (two at once would share this machine's two cores, and an
    engine's start and step times are what several of them measure); every other folder is a
    group of its own for the second worker. A test that uses a shared engine server is an
    engine test whether or not it says so. The whole CLIs of tests/e2e go first (an engine start
    is mostly one core's imports, which leaves the second worker a core), and the agent's and
    the bench's tests last, on the plain server they share: the bench's profiles and the
    validation measure the engine's speed, so they run last and wait for the second worker to
    be done (``other_workers_done``)."""
    items.sort(key=_engine_order)       # stable: within each part, as collected
    for item in items:
        if ENGINE_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        serial = any(item.get_closest_marker(mark) for mark in SERIAL_MARKS)
        folder = item.nodeid.split("::")[0].rsplit("/", 1)[0]      # the test file's folder
        item.add_marker(pytest.mark.xdist_group("engine" if serial else folder))
    return (yield)


def _engine_order(item) -> int:
    if item.nodeid.startswith("tests/e2e/"):
        return 0
    return 2 if item.nodeid.startswith(("tests/agent/", "tests/bench/")) else 1


def pytest_collection_finish(session):
    note_collected(session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """A worker asked for groups (tests/run.sh) that did not get them would run two engine tests
    at once on this machine's two cores: stop, saying so, rather than run that way."""
    if node.config.getoption("dist") == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit("pytest-xdist did not group the tests (--dist loadgroup): install the versions "
                    "pyproject.toml's [dev] extra names, or run with SPECTRUM_TEST_WORKERS=0",
                    returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_runtest_teardown(item, nextitem):
    after_test(item)


def pytest_sessionfinish(session, exitstatus):
    stop_all()
    done = _worker_done_file(session.config)
    if done is not None:            # after its servers stopped: this worker takes no more CPU
        done.parent.mkdir(parents=True, exist_ok=True)
        done.touch()


# How long the tests that measure the engine's speed wait for the other workers to finish: far
# longer than a worker's share of the suite, so reaching it means one of them hung.
OTHER_WORKERS_WAIT_S = 1800


def _worker_done_file(config) -> Path | None:
    """Where an xdist worker marks that it has finished (None outside xdist): one folder per run,
    named by the run id xdist gives every worker of it."""
    worker = getattr(config, "workerinput", None)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if worker is None or not run:
        return None
    return Path(tempfile.gettempdir()) / f"spectrum-tests-{run}" / f"{worker['workerid']}.done"


@pytest.fixture(scope="session")
def other_workers_done(request) -> float:
    """Waits until every other xdist worker has finished its tests and stopped its servers, and
    returns how long that took (s). The bench's profiles and the validation measure the engine's
    speed on two cores, where a second worker still running beside them (a server starting, a
    CLI's imports) would take its share; running them last in the engine worker made that
    likely, not certain."""
    done = _worker_done_file(request.config)
    if done is None:
        return 0.0
    others = request.config.workerinput["workercount"] - 1
    start = time.monotonic()
    while len([p for p in done.parent.glob("*.done") if p != done]) < others:
        if time.monotonic() - start > OTHER_WORKERS_WAIT_S:
            pytest.fail(f"the other {others} pytest-xdist worker(s) did not finish within "
                        f"{OTHER_WORKERS_WAIT_S} s (no {done.parent}/gw*.done): one of them hung")
        time.sleep(1.0)
    return time.monotonic() - start


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The folder of the tiny random-weight Llama (built once, cached across runs)."""
    from options.tiny_model import tiny_model_dir
    return tiny_model_dir()


@pytest.fixture(scope="session")
def plain_server(request, tiny_model, tmp_path_factory) -> Iterator[LocalServer]:
    """The bring-your-own server generating with the tiny model, eager, configured as a user who
    sets nothing but its context would: what the agent's completions test and the bench's tests
    that need no special server use (tests/bench/conftest.py profiles it once). The pooling
    server starts alongside it: the agent's tests use one, then the other."""
    with shared_server(request, plain_server_env(tiny_model),
                       tmp_path_factory.mktemp("plain-server") / "server.log",
                       alongside={"pooling_server": pooling_server_spec(tiny_model, tmp_path_factory)}) as server:
        yield server


def pooling_server_spec(tiny_model: Path, tmp_path_factory) -> tuple[dict[str, str], Path]:
    """The pooling server's environment and log: the tiny model as a pooling model (embeddings)
    with its whole 2,048-token context, eager."""
    env = {"HF_MODEL_ID": str(tiny_model), "SM_VLLM_RUNNER": "pooling", "SM_VLLM_MAX_MODEL_LEN": "2048",
           "SM_VLLM_ENFORCE_EAGER": ""}
    return env, tmp_path_factory.mktemp("pooling-server") / "server.log"


@pytest.fixture(scope="session")
def pooling_server(request, tiny_model, tmp_path_factory) -> Iterator[LocalServer]:
    """The bring-your-own server running the tiny model as a pooling model: test_byo_embeddings.py's
    server and the agent's retrieval's (started alongside the plain server where both are used)."""
    with shared_server(request, *pooling_server_spec(tiny_model, tmp_path_factory)) as server:
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
