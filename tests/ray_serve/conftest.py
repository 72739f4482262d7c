"""One local Ray for the whole test run (its own temp dir and ports, stopped with
ray.shutdown(), never `ray stop`), and on it the application rung 6 renders by default, with
three LoRA adapters (--adapter) multiplexed two per engine replica."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

# The tiny model's LoRA adapters in peft's layout, as the byo server's adapter tests build them.
_BYO_TESTS = str(Path(__file__).resolve().parents[1] / "byo_vllm")
if _BYO_TESTS not in sys.path:
    sys.path.append(_BYO_TESTS)
from test_byo_adapters_guards import write_peft_adapter  # noqa: E402

ADAPTERS = ("a1", "a2", "a3")
ADAPTERS_PER_REPLICA = 2


@pytest.fixture(scope="session")
def local_ray_cluster():
    pytest.importorskip("ray.serve", reason="Ray Serve is in the project's ray extra")
    from options.eks.ray_local import local_ray

    with local_ray(num_cpus=2) as cluster:
        yield cluster


# Small delays, so one test sees 1 -> 2 -> 1 replicas; a replica's start is an engine load.
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
               "upscale_delay_s": 1, "downscale_delay_s": 6, "look_back_period_s": 2,
               "metrics_interval_s": 0.5}
MAX_MODEL_LEN = "1024"


def rendered_serve_config(model: str, adapters_dir: Path) -> dict:
    """The serveConfigV2 rung 6 renders by default (--engine rayservice), with --adapter for
    each of ADAPTERS, parsed: only what ties it to a GPU cluster is set for this machine (the
    model, GPUs, CPUs, autoscaling, and the adapters' folder, which a worker pod's init
    container fills from S3)."""
    from infra.eks.render import render
    from infra.eks.spec import EksSpec

    rendered = render(EksSpec(
        engine="rayservice", image="registry.example/byo:1.0", max_model_len=int(MAX_MODEL_LEN),
        adapters=tuple((a, f"s3://acme-adapters/llm/{a}") for a in ADAPTERS),
        max_loras=ADAPTERS_PER_REPLICA, max_cpu_loras=ADAPTERS_PER_REPLICA, max_lora_rank=8))
    (ray,) = [m.doc for m in rendered.manifests if m.doc["kind"] == "RayService"]
    config = yaml.safe_load(ray["spec"]["serveConfigV2"])
    args = config["applications"][0]["args"]
    args.update(model=model, engine_num_gpus=0, engine_num_cpus=1,
                autoscaling_config=AUTOSCALING)
    # VLLM_CPU_OMP_THREADS_BIND: vLLM on CPU binds each engine's worker to the NUMA node's
    # first free core ("auto"): every replica on this one node to core 0, so a second replica
    # loaded on the core the first one generates on (a scale-up took over 11 minutes against a
    # 4-minute deploy). Unbound, the OS spreads them over the cores Ray offers.
    args["settings"].update(SM_VLLM_ENFORCE_EAGER="", VLLM_CPU_KVCACHE_SPACE="1",
                            VLLM_CPU_OMP_THREADS_BIND="nobind",
                            SPECTRUM_SERVER_ADAPTERS_DIR=str(adapters_dir))
    return config


def wait_for_app(name: str, timeout_s: float = 600) -> None:
    """Waits for the application to run: its deploy is an engine load, the first this machine
    makes, so nothing measured bounds it yet; the wait ends as soon as Serve says RUNNING (or
    DEPLOY_FAILED). On a shared 2-core machine a deploy has taken from 90 s to over 300 s."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = serve.status().applications.get(name)
        status = str(app.status) if app else "absent"
        if status.endswith("RUNNING"):
            return
        if status.endswith("DEPLOY_FAILED"):
            raise AssertionError(f"application {name} failed to deploy: {app.message}")
        time.sleep(0.5)
    raise AssertionError(f"application {name} was not running after {timeout_s} s")


@pytest.fixture(scope="session")
def byo_ray_app(local_ray_cluster, tiny_model, tmp_path_factory):
    """The default rendered serve config, deployed as written through Serve's own
    deploy-from-config path (the controller imports the builder and calls it with the args)."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    adapters_dir = tmp_path_factory.mktemp("ray-adapters")
    for seed, name in enumerate(ADAPTERS, start=1):
        write_peft_adapter(adapters_dir / name, seed)
    config = rendered_serve_config(str(tiny_model), adapters_dir)
    started = time.monotonic()
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    wait_for_app("llm")
    return {"url": local_ray_cluster.url, "config": config,
            "ready_s": time.monotonic() - started, "adapters": ADAPTERS,
            "adapters_per_replica": ADAPTERS_PER_REPLICA}
