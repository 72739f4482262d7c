"""How ``LocalServer`` places the server's processes: a process group of their own (one
``stop`` ends them all), in the caller's session (one scheduling autogroup with its client:
see ``own_process_group``)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from options.local_server import LocalServer

# A stand-in server: a parent that spawns a child, as the server spawns the engine's processes.
PARENT_AND_CHILD = ("import subprocess, sys, time\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    "time.sleep(60)\n")


class StandInServer(LocalServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", PARENT_AND_CHILD]


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def test_the_server_shares_the_callers_session_in_a_group_of_its_own(tmp_path):
    server = StandInServer({}, log_path=tmp_path / "server.log").start()
    try:
        pid = server.process.pid
        deadline = time.monotonic() + 30
        while not _children(pid):
            assert time.monotonic() < deadline, "the stand-in never spawned its child"
            time.sleep(0.05)
        (child,) = _children(pid)
        assert os.getsid(pid) == os.getsid(0), "the server got a session of its own"
        assert os.getpgid(pid) == pid != os.getpgid(0), "the server is not its group's leader"
        assert os.getpgid(child) == pid
    finally:
        server.stop(timeout_s=5)
    # stop() ends the whole group: the child too, not only the process it started.
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
        assert time.monotonic() < deadline, f"the server's child {child} outlived stop()"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_without_a_checkout_the_server_runs_the_installed_byo_vllm(monkeypatch):
    # A wheel carries byo_vllm but not containers/byo-vllm/serve: the command runs the same main.
    import options.local_server as local_server
    monkeypatch.setattr(local_server, "SERVE_SCRIPT", local_server.REPO_ROOT / "no-such-serve-script")
    command = local_server.LocalServer({}, python=sys.executable).command()
    assert command[-1] == "serve" and "no-such-serve-script" not in " ".join(command)
    done = subprocess.run(command[:-1] + ["train"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unexpected arguments ['train']" in done.stderr, done.stderr[-2000:]
