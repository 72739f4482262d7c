"""Servers that tests share across modules and folders: an engine start is the expensive part of
this suite (25-50 s by host), so such a server starts once, for the session fixture that asks for
it, and stops right after the last collected test that uses that fixture (directly or through
another fixture), so that it holds no memory while the rest of the suite starts servers of its
own. A fixture may name servers to start alongside its own (``alongside``): a start is mostly one
core's imports, so two on this machine's two cores take little longer than one, and the later
fixture finds its server ready. tests/conftest.py's hooks call ``note_collected``,
``after_test`` and, when the session ends, ``stop_all``."""
from __future__ import annotations

from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from options.local_server import LocalServer, ServerFailed

# The plain server's context: room for the bench's and the validation's prompts (512 + 128 tokens)
# and the agent's, in a KV cache the CPU engine fills fast.
PLAIN_MAX_MODEL_LEN = 1024


def plain_server_env(model_dir: Path) -> dict[str, str]:
    """The plain server's: the tiny model, eager, configured as a user who sets nothing but its
    context would (tests/conftest.py's plain_server; tests/bench/repeat_replays.py)."""
    return {"HF_MODEL_ID": str(model_dir), "SM_VLLM_MAX_MODEL_LEN": str(PLAIN_MAX_MODEL_LEN),
            "SM_VLLM_ENFORCE_EAGER": ""}

# The session fixtures that start a shared engine server (tests/conftest.py, tests/byo_vllm/conftest.py).
ENGINE_SERVER_FIXTURES = frozenset({"plain_server", "pooling_server", "priority_server"})

# fixture name -> the node id of the last collected test that uses it
_last_user: dict[str, str] = {}
# fixture name -> its server, while it runs
_running: dict[str, LocalServer] = {}


@contextmanager
def shared_server(request, env: dict[str, str], log_path: Path,
                  alongside: dict[str, tuple[dict[str, str], Path]] | None = None) -> Iterator[LocalServer]:
    """Start a server for the session fixture whose ``request`` this is (or take the one started
    alongside another); it stops after that fixture's last test, or when the session ends if the
    run stops before that test (``-x``, a failed start, an interrupt). ``alongside``: the fixture
    names of shared servers to start with this one, each with its environment and log, where a
    collected test uses that fixture; every one started is ready (or has failed, which its own
    fixture then reports) before this one is yielded, so no start overlaps a test."""
    name = request.fixturename
    server = _running.get(name) or _start(name, env, log_path)
    together = [_start(other, *spec) for other, spec in (alongside or {}).items()
                if other in _last_user and other not in _running]
    try:
        server.wait_ready()
        for other in together:
            with suppress(ServerFailed):
                other.wait_ready()
        yield server
    finally:
        if _running.pop(name, None) is not None:
            server.stop()


def _start(name: str, env: dict[str, str], log_path: Path) -> LocalServer:
    server = LocalServer(env, log_path=log_path)
    _running[name] = server
    server.start()
    return server


def note_collected(items) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            _last_user[name] = item.nodeid


def after_test(item) -> None:
    for name in [n for n in _running if _last_user.get(n) == item.nodeid]:
        _running.pop(name).stop()


def stop_all() -> None:
    """Stop what is still running: a server started alongside whose fixture the run never
    reached (``-x``, an interrupt)."""
    while _running:
        _running.popitem()[1].stop()
