"""Front-end CPU of a server: user+sys CPU seconds of every process in its tree except vLLM's
engine processes (titled ``VLLM::EngineCore`` / ``VLLM::Worker``), which busy-wait and so
cost the same whatever serves in front of them.

    before = frontend_cpu_s(server_pid)
    ...load...
    cpu_s = cpu_used(before, frontend_cpu_s(server_pid))

    with cpu_by_process(server_pid) as by_process:   # or by what each process is
        ...load...

Used by ``benchmarks/server-vs-vllm/run.py`` (this server against vLLM's own) and by the
bench's Ray hop (``options/bench/ray_hop.py``: a local Ray cluster against the plain server).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

# What vLLM titles its engine processes (the kernel's 15-character comm cuts the first short).
ENGINE_PROCESS_TITLES = ("VLLM::EngineCore", "VLLM::Worker", "VLLM::EngineCor")


def is_engine_process(proc) -> bool:
    """Whether a ``psutil.Process`` is one of vLLM's engine processes."""
    title = " ".join(proc.cmdline()) or proc.name()
    return title.startswith(ENGINE_PROCESS_TITLES) or proc.name().startswith("VLLM::")


def process_role(proc) -> str:
    """What a process of a server's tree is, in a few words: Ray titles its workers
    ``ray::<actor class or task>`` (``ray::ServeReplica:default:engine``, ``ray::IDLE``); its
    agents are Python scripts (the script's name); the rest by executable (raylet, gcs_server,
    haproxy, gunicorn's python)."""
    cmd = proc.cmdline()
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    for arg in cmd[1:3]:
        if arg.endswith(".py"):
            return os.path.basename(arg)
    if cmd[1:3] and cmd[1] == "-m":
        return cmd[2]
    return os.path.basename(cmd[0]) if cmd else proc.name()


def frontend_cpu_s(root_pid: int, include_root: bool = True,
                   roles: dict[int, str] | None = None) -> dict[int, float]:
    """CPU seconds (user+sys) per process of ``root_pid``'s tree, engine processes left out
    (and the root itself with ``include_root=False``: a test process whose own threads are the
    client). Processes that end while being read are skipped. ``roles``, where given, gets
    each process's ``process_role``."""
    import psutil
    try:
        root = psutil.Process(root_pid)
        procs = ([root] if include_root else []) + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            if is_engine_process(p):
                continue
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
            if roles is not None:
                roles[p.pid] = process_role(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two ``frontend_cpu_s`` readings: processes started in between count
    from zero; those gone by the second reading are not counted."""
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())


def cpu_by_role(before: dict[int, float], after: dict[int, float], roles: dict[int, str]
                ) -> dict[str, float]:
    """``cpu_used`` split by what each process is (``roles`` from the second reading), the
    largest first."""
    out: dict[str, float] = {}
    for pid, t in after.items():
        role = roles.get(pid, "?")
        out[role] = out.get(role, 0.0) + max(0.0, t - before.get(pid, 0.0))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@contextlib.contextmanager
def cpu_by_process(root_pid: int, include_root: bool = True) -> Iterator[dict[str, float]]:
    """Yields a dict that, once the block ends, holds ``cpu_by_role`` over the block."""
    out: dict[str, float] = {}
    before = frontend_cpu_s(root_pid, include_root)
    yield out
    roles: dict[int, str] = {}
    after = frontend_cpu_s(root_pid, include_root, roles)
    out.update(cpu_by_role(before, after, roles))
