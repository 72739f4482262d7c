"""What the bring-your-own server's tests share: its environment, a started server with what it
saw while starting, a server of a module's own, and readers of its metrics and streams. A
module of its own name, not conftest.py: a test imports it by that name whichever folders'
conftests pytest loaded last."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests

from options.local_server import LocalServer

# The tiny model's whole context (2048 positions): long enough that a stream outlasts a
# client hanging up, small enough that prompt-too-long cases are cheap to build.
MAX_MODEL_LEN = 2048
# How long the module's server waits for a request's headers or the next part of its body:
# short enough for the slow-client test, long enough for a client this machine deschedules.
READ_TIMEOUT_S = 10
GRACEFUL_TIMEOUT_S = 600
# SageMaker's health checker gives each /ping this long (FACTS §1): the bound the server's /ping
# keeps under any load, the one a test of it must beat.
SAGEMAKER_PING_TIMEOUT_S = 2.0


def server_env(model_dir: Path, **extra: str) -> dict[str, str]:
    return {"HF_MODEL_ID": str(model_dir), "SM_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
            "SM_VLLM_ENFORCE_EAGER": "", **extra}


class StartedServer:
    """A LocalServer plus what was seen while it started."""

    def __init__(self, server: LocalServer, states: list[tuple[float, str]], log: Path) -> None:
        self.server = server
        self.url = server.url
        self.states = states
        self.log = log

    def post(self, path: str, body, **kw) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 60), **kw)

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as {"name{labels}": value}."""
        out = {}
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, prefix: str) -> float:
        """The sum of every sample whose name starts with ``prefix``."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))


@contextmanager
def serving(env: dict[str, str], tmp_path_factory, name: str) -> Iterator[StartedServer]:
    """A server of its own for a module that needs an engine set up differently."""
    log = tmp_path_factory.mktemp(name) / "server.log"
    server = LocalServer(env, log_path=log)
    server.start()
    try:
        server.wait_ready()
        yield StartedServer(server, [], log)
    finally:
        server.stop()


def engine_info(server: StartedServer) -> dict[str, str]:
    """What /metrics says the engine runs as: the labels of its byo_engine_info sample."""
    (key,) = [k for k, v in server.metrics().items() if k.startswith("byo_engine_info{") and v == 1]
    return dict(pair.replace('"', "").split("=", 1)
                for pair in key[len("byo_engine_info{"):-1].split(","))


def sse_events(response: requests.Response) -> list:
    """The JSON payloads of a server-sent-event stream (``[DONE]`` kept as a string)."""
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            data = line[6:]
            events.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return events


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
