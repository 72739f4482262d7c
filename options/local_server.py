"""Run the bring-your-own server (``containers/byo-vllm/serve``, the image's own entrypoint)
as a local subprocess: what levels 3-5 use for ``--target local``, and what the tests start.

    with LocalServer({"HF_MODEL_ID": str(tiny_model_dir())}) as server:
        server.wait_ready(120)
        requests.post(server.url + "/v1/completions", json={...})

``serve_here`` is how a CLI (bench, agent) starts one for the length of a command: log file,
start, progress while it loads, stop at the end.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVE_SCRIPT = REPO_ROOT / "containers" / "byo-vllm" / "serve"
# The CPU engine reserves most of a NUMA node for its KV cache unless told otherwise.
DEFAULT_CPU_KVCACHE_GIB = "1"


# How long a server may take to answer /ping 200: an engine start is 20-100 s on 2 idle cores,
# and was seen past 300 s on a machine loaded 4-5 times over.
READY_TIMEOUT_S = 600.0


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message carries the end of its log."""


def own_process_group() -> dict:
    """Popen's arguments for a child that spawns processes of its own (a server and its
    engine): a process group of its own, so that one ``killpg`` stops them all, but this
    session kept. On Linux a new session is a new scheduling autogroup
    (``kernel.sched_autogroup_enabled``). On 2 cores, while vLLM's engine processes (which
    busy-poll each other with ``sched_yield``) generated in a session of their own, every
    other session's processes were kept off the CPU for up to 3 s at a time, the client
    reading the stream included; ``benchmarks/server-vs-vllm/stream_gaps.py`` measures it."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    def __init__(self, env: Mapping[str, str], port: int | None = None,
                 log_path: str | os.PathLike | None = None,
                 python: str | None = None) -> None:
        self.env = dict(env)
        self.port = port or free_port()
        self.log_path = Path(log_path) if log_path else None
        self.python = python or sys.executable
        self.process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if SERVE_SCRIPT.exists():
            return [self.python, str(SERVE_SCRIPT), "serve"]
        # Installed from a wheel, with no checkout: the script's own two lines, on the installed byo_vllm.
        return [self.python, "-c", "import sys; from byo_vllm.entrypoint import main; sys.exit(main(sys.argv[1:]))",
                "serve"]

    def spawn_options(self) -> dict:
        """How the server's process is placed (see ``own_process_group``)."""
        return own_process_group()

    def start(self) -> "LocalServer":
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
        env.update(self.env)
        env["SAGEMAKER_BIND_TO_PORT"] = str(self.port)
        env.setdefault("SPECTRUM_SERVER_HOST", "127.0.0.1")
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "wb")
            out = self._log_file
        else:
            out = None                      # inherit: the server logs to our stderr
        self.process = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT if out else None,
                                        **self.spawn_options())
        return self

    def ping(self, timeout_s: float = 2.0) -> str:
        """``"ready"``, ``"loading"`` (503) or ``"down"`` (no answer)."""
        try:
            with urllib.request.urlopen(self.url + "/ping", timeout=timeout_s) as r:
                return "ready" if r.status == 200 else f"http {r.status}"
        except urllib.error.HTTPError as e:
            return "loading" if e.code == 503 else f"http {e.code}"
        except (urllib.error.URLError, OSError):
            return "down"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S,
                   on_progress: Callable[[float, str], None] | None = None) -> None:
        """Polls /ping until 200; ServerFailed if the server exits or time runs out."""
        started = time.monotonic()
        while True:
            state = self.ping()
            elapsed = time.monotonic() - started
            if on_progress is not None:
                on_progress(elapsed, state)
            if state == "ready":
                return
            code = self.process.poll() if self.process else None
            if code is not None:
                raise ServerFailed(f"the server exited with code {code} before it was ready"
                                   + self._log_tail())
            if elapsed > timeout_s:
                raise ServerFailed(f"the server was not ready after {timeout_s:.0f} s "
                                   f"(last /ping: {state})" + self._log_tail())
            time.sleep(0.25)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s`` (then SIGKILL); returns the exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # The engine's processes are in the server's process group: none may outlive it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return proc.returncode

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        if self._log_file is not None:
            self._log_file.flush()
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n--- server log (last lines) ---\n" + "\n".join(tail)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def log_path(name: str) -> str:
    """A new log file for a server a command starts: ``$SPECTRUM_CACHE/logs/NAME-<unix time>.log``."""
    logs = os.path.join(os.environ.get("SPECTRUM_CACHE", os.path.expanduser("~/.cache/spectrum")), "logs")
    os.makedirs(logs, exist_ok=True)
    return os.path.join(logs, f"{name}-{int(time.time())}.log")


@contextlib.contextmanager
def serve_here(env: Mapping[str, str], what: str, say: Callable[[str], None], *, log_name: str,
               timeout_s: float = 600.0) -> Iterator[str]:
    """Start the server with ``env`` for the block, say what runs and each /ping state once while it
    loads; yields its URL once ready, and stops it (and its engine) when the block ends."""
    path = log_path(log_name)
    seen: set[str] = set()

    def progress(elapsed_s: float, state: str) -> None:
        if state not in seen:            # each state once, not every poll
            seen.add(state)
            say(f"  {elapsed_s:5.0f} s  {state}")

    with LocalServer(env, log_path=path) as server:
        say(f"starting the local server: {what} (log: {path}; stopped when the command ends)")
        server.wait_ready(timeout_s, on_progress=progress)
        say(f"ready at {server.url}")
        yield server.url
