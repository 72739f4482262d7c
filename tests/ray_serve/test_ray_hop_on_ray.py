"""The Ray hop's measurement (options/bench/ray_hop.py) on the test run's own Ray and
application (no engine of its own): one short run gives every figure, exact token counts, and
front-end CPU read from the Ray cluster's processes with vLLM's engine processes left out.
The comparison logic without engines: tests/bench/test_ray_hop.py."""
from __future__ import annotations

import contextlib
import os

import psutil
import pytest

pytestmark = pytest.mark.engine


def test_one_short_run_on_the_ray_application_measures_every_figure(byo_ray_app):
    from options.bench import ray_hop
    from options.bench.cpu import frontend_cpu_s, is_engine_process
    from options.bench.profile import Profile, parse_lengths
    from options.bench.runner import http_target
    from options.contract import Request
    from options.core import OPENAI_CHAT

    # The cluster runs in this process (the session's local_ray): its tree without the test
    # process itself, whose threads are the client.
    ray = ray_hop.Contender("ray", byo_ray_app["url"], os.getpid(), include_root=False)
    send = http_target(ray.url, OPENAI_CHAT, timeout_s=120)
    template = Request(prompt="-", ignore_eos=True, stream=True)
    profile = Profile(requests=3, prompt_tokens=parse_lengths("16", "p", ()),
                      output_tokens=parse_lengths("8", "o", ()), concurrency=1)
    row = ray_hop.measure(ray, send, template, profile, None, 1)
    assert row["completed"] == 3 and row["errors"] == {} and row["output_tokens"] == 3 * 8
    assert row["ttft_ms_p50"] > 0 and row["tpot_ms_p50"] > 0
    assert row["output_tokens_per_second"] > 0
    assert row["cpu_ms_per_token"] > 0           # the proxy, ingress and engine replicas worked
    by_process = row["cpu_s_by_process"]
    assert any(k.startswith("ray::ServeReplica") for k in by_process), by_process
    assert {"raylet", "gcs_server"} <= set(by_process), by_process
    assert sum(by_process.values()) == pytest.approx(row["frontend_cpu_s"], abs=0.01)
    idle = ray_hop.measure_idle(ray, 2.0)      # nothing in flight: what the cluster costs to keep up
    assert idle["cpu_s_per_s"] >= 0 and "raylet" in idle["cpu_s_by_process"]

    tree = psutil.Process(os.getpid()).children(recursive=True)
    engines = set()
    for p in tree:
        with contextlib.suppress(psutil.Error):      # one that ended while being read
            if is_engine_process(p):
                engines.add(p.pid)
    assert engines, "the engine replica's vLLM engine core runs under this process's Ray"
    assert not engines & set(frontend_cpu_s(os.getpid(), include_root=False))
