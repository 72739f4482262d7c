"""Rung 6 on Ray, on this machine: ``--level 6 --engine rayservice --target local``.

A Ray of this process's own (``ray.init`` in a fresh temp folder, its ports chosen free,
Serve's HTTP proxy on a free port of 127.0.0.1), the bring-your-own server's Serve
application (``byo_vllm.ray_serve``) run on it, one sample request, then serving until Ctrl-C.
Ray is stopped with ``ray.shutdown()`` when the command ends, however it ends: never with
``ray stop``, which kills every Ray process on the host by name.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterator

from options.local_server import free_port

APP_NAME = "llm"
# Engine replicas ask Ray for this many CPUs each; a local Ray offers the machine's cores
# (at least this many, so one replica always fits).
LOCAL_ENGINE_CPUS = 1.0
LOG_TO_DRIVER = False
# A lighter control plane for a Ray that shares a laptop's cores with the engine: Serve's
# controller checks its deployments every 0.5 s instead of 0.1 s (autoscaling and replica
# replacement react within half a second more), the raylet reports its resources every second,
# and metrics are exported every minute. Measured against Ray's defaults, alternated in one run
# (benchmarks/ray-hop/ray-control-plane-ab-2026-12-03.json): idle 75 against 113 ms of CPU
# a second (the controller 36 -> 14, the GCS 19 -> 8), CPU per token ~15 % less at 8 and 32
# streams, throughput within the spread. A variable already set in the environment wins.
LOCAL_CONTROL_PLANE_ENV = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_raylet_report_resources_period_milliseconds": "1000",
    "RAY_metrics_report_interval_ms": "60000",
}


@dataclass
class LocalRay:
    url: str                 # Serve's HTTP proxy
    temp_dir: str
    started_s: float         # ray.init + serve.start
    proxy: str = "serve"     # options.core.ray_proxy: what answers on url


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None, http_port: int | None = None,
              proxy: str = "serve") -> Iterator[LocalRay]:
    """A Ray cluster of this process (head only) with Serve started, for the block, ``proxy``
    (``options.core.ray_proxy``) in front of the ingress replicas, its control plane lightened
    (LOCAL_CONTROL_PLANE_ENV): that environment is set before ``ray.init`` (Ray's processes
    read it as they start) and put back after."""
    import ray
    from ray import serve

    from options.core.ray_proxy import ray_proxy_env

    env = {**{k: v for k, v in LOCAL_CONTROL_PLANE_ENV.items() if k not in os.environ},
           **ray_proxy_env(proxy, local=True)}
    temp_dir = tempfile.mkdtemp(prefix="spectrum-ray-")
    started = time.monotonic()
    saved_env = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    # address="local": always a new cluster, never one RAY_ADDRESS points at.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
             namespace="spectrum", logging_level=logging.WARNING, log_to_driver=LOG_TO_DRIVER)
    try:
        port = http_port or free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port},
                    logging_config={"log_level": "WARNING"})
        yield LocalRay(f"http://127.0.0.1:{port}", temp_dir, time.monotonic() - started, proxy)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def run_app(args: dict[str, Any], name: str = APP_NAME):
    """Runs ``byo_vllm.ray_serve:build_app(args)`` on the connected Ray; returns its handle
    once every replica is up (each engine has loaded)."""
    from byo_vllm.ray_serve import build_app
    from ray import serve

    return serve.run(build_app(args), name=name, route_prefix="/")


def local_app_args(model: str, options: tuple[tuple[str, str], ...],
                   autoscaling: dict[str, Any] | None = None,
                   ingress_replicas: int | None = None) -> dict[str, Any]:
    """build_app's args for this machine: one engine replica (or Serve's autoscaling with
    ``autoscaling``, e.g. what --autoscaling-from took from cost simulate), the options as its
    settings, and ``ingress_replicas`` where given (0: the engine as its own ingress)."""
    settings = dict(options)
    settings.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # else most of a NUMA node
    sizing: dict[str, Any] = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": 1}
    if ingress_replicas is not None:
        sizing["ingress_replicas"] = ingress_replicas
    return {"model": model, "settings": settings, **sizing, "engine_num_cpus": LOCAL_ENGINE_CPUS}


@contextlib.contextmanager
def adapters_folder(adapters) -> Iterator[str | None]:
    """``adapters`` (options.eks.LocalAdapters, or None) copied into one fresh folder, each as
    its name, the layout the server registers (a cluster's init container fills /adapters the
    same way); removed after the block."""
    if adapters is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="spectrum-adapters-")
    try:
        for name, source in adapters.folders:
            shutil.copytree(source, os.path.join(folder, name))
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_local(source, options: tuple[tuple[str, str], ...], adapters, args: argparse.Namespace, *,
              autoscaling: dict[str, Any] | None) -> int:
    """Start a local Ray, run the application (with ``adapters``, options.eks.LocalAdapters,
    where --adapter gave any, and Serve's ``autoscaling`` config, where --autoscaling-from or
    --ray-autoscaling gave one), send the sample request, serve until Ctrl-C (or stop after the
    sample with --once)."""
    from options.local_target import announce_model, send_sample, wait_for_ctrl_c
    from options.output import Console

    say = Console(args.json)
    model = str(source.local_folder()) if source.path or source.tiny else source.hub_id
    app_args = local_app_args(model, options, autoscaling,
                              getattr(args, "ray_ingress_replicas", None))
    summary: dict[str, Any] = {"level": 6, "target": "local", "engine": "rayservice",
                               "model": source.label}
    say("Level 6 — EKS with --engine rayservice, on this machine: the byo server as a Ray Serve "
        "application (ingress + engine deployments) on a local Ray")
    announce_model(source, say)
    if adapters is not None:
        say("adapters: " + ", ".join(f"{name} ({folder})" for name, folder in adapters.folders)
            + f"; {adapters.max_cpu_loras} per engine replica (Serve's multiplexing)")
        summary["adapters"] = [name for name, _ in adapters.folders]
    try:
        with adapters_folder(adapters) as folder, local_ray(num_cpus=max(int(LOCAL_ENGINE_CPUS), os.cpu_count() or 1),
                       http_port=args.port, proxy=getattr(args, "ray_proxy", None) or "serve"
                       ) as cluster:
            summary["ray_start_s"] = round(cluster.started_s, 1)
            say(f"Ray started in {cluster.started_s:.1f} s (temp dir {cluster.temp_dir}); "
                "deploying the application (the engine loads in its replica) ...")
            started = time.monotonic()
            if folder is not None:
                app_args["settings"].update(adapters.settings(folder))
                app_args["max_adapters_per_replica"] = adapters.max_cpu_loras
            run_app(app_args)
            summary["ready_s"] = round(time.monotonic() - started, 1)
            summary["url"] = cluster.url
            say(f"ready after {summary['ready_s']} s on {cluster.url}")
            send_sample(cluster.url, args, 6, source, say, summary)
            if args.once:
                summary["stopped"] = "after the sample (--once)"
            else:
                say(f"serving on {cluster.url}: POST /v1/chat/completions, /v1/completions, "
                    "/invocations; Ctrl-C stops the application and Ray")
                wait_for_ctrl_c(say)
    except Exception as exc:
        say(f"error: the Ray application failed: {type(exc).__name__}: {exc}")
        return 1
    if args.json:
        import json
        print(json.dumps(summary, indent=2, default=str))
    return 0
