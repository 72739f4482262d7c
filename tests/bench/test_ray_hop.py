"""The Ray hop's comparison (options/bench/ray_hop.py) without engines: medians and spreads
over rounds, the added TTFT and CPU ratio judged against the goal only beyond the noise, the
alternated order, the front-end CPU that leaves vLLM's engine processes out, and bad input.
The measurement itself on the test run's Ray: tests/ray_serve/test_ray_hop_on_ray.py."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from options.bench import ray_hop
from options.bench.__main__ import main
from options.bench.cpu import cpu_used, frontend_cpu_s


def _runs(concurrency: int, plain: list[tuple[float, float]], ray: list[tuple[float, float]]):
    """Runs of (TTFT p50 ms, CPU ms/token) per round for each contender."""
    out = []
    for name, rounds in (("plain", plain), ("ray", ray)):
        for n, (ttft, cpu) in enumerate(rounds, start=1):
            out.append({"contender": name, "round": n, "concurrency": concurrency,
                        "ttft_ms_p50": ttft, "ttft_ms_p99": 2 * ttft, "tpot_ms_p50": 3.0,
                        "output_tokens_per_second": 100.0, "cpu_ms_per_token": cpu})
    return out


def test_a_small_hop_within_the_spread_meets_the_goal_and_claims_no_gap():
    doc = ray_hop.compare(_runs(8, plain=[(10, 1.0), (12, 1.1), (11, 0.9)],
                                ray=[(13, 1.05), (14, 1.0), (12, 1.1)]))
    e = doc["by_concurrency"]["8"]
    assert e["plain"]["ttft_ms_p50"] == {"median": 11, "min": 10, "max": 12}
    added = e["added_ttft_ms_p50"]
    assert added["value"] == pytest.approx(2.0) and added["noise"] == pytest.approx(2.0)
    assert added["gap"] == "none measured" and added["verdict"] == "met"
    cpu = e["cpu_ratio"]
    assert cpu["value"] == pytest.approx(1.05 / 1.0)
    assert cpu["gap"] == "none measured" and cpu["verdict"] == "met"
    assert doc["verdict"] == "met" and e["rounds"] == {"plain": 3, "ray": 3}


def test_a_hop_past_the_goal_by_more_than_the_noise_is_not_met():
    doc = ray_hop.compare(_runs(1, plain=[(10, 1.0), (10.5, 1.0), (11, 1.0)],
                                ray=[(30, 3.0), (31, 3.1), (29, 2.9)]))
    e = doc["by_concurrency"]["1"]
    assert e["added_ttft_ms_p50"]["value"] == pytest.approx(19.5)
    assert e["added_ttft_ms_p50"]["gap"] == "ray slower"
    assert e["added_ttft_ms_p50"]["verdict"] == "not met"
    assert e["cpu_ratio"]["value"] == pytest.approx(3.0)
    assert e["cpu_ratio"]["verdict"] == "not met" and doc["verdict"] == "not met"


def test_past_the_goal_but_within_the_noise_is_unclear_and_one_round_claims_nothing():
    noisy = ray_hop.compare(_runs(32, plain=[(10, 1.0), (30, 1.0), (20, 1.0)],
                                  ray=[(12, 1.0), (40, 1.0), (27, 1.0)]))
    e = noisy["by_concurrency"]["32"]
    assert e["added_ttft_ms_p50"]["value"] == pytest.approx(7.0)     # past 5 ms, noise 24 ms
    assert e["added_ttft_ms_p50"]["verdict"] == "unclear" and noisy["verdict"] == "unclear"
    single = ray_hop.compare(_runs(1, plain=[(10, 1.0)], ray=[(40, 4.0)]))
    s = single["by_concurrency"]["1"]
    assert s["added_ttft_ms_p50"]["gap"] == "unknown (one round)"
    assert s["added_ttft_ms_p50"]["verdict"] == "unclear"
    assert s["cpu_ratio"]["noise"] is None and s["cpu_ratio"]["verdict"] == "unclear"


def test_rounds_alternate_which_contender_goes_first():
    assert ray_hop.round_order(3) == [["plain", "ray"], ["ray", "plain"], ["plain", "ray"]]


def test_the_ray_application_gets_the_level5_servers_model_and_engine_settings():
    model, settings = ray_hop.engine_settings(
        {"SM_VLLM_MODEL": "/m", "SM_VLLM_MAX_MODEL_LEN": "1024", "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert model == "/m" and settings == {"SM_VLLM_MAX_MODEL_LEN": "1024",
                                          "VLLM_CPU_KVCACHE_SPACE": "1"}


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n" \
       "time.sleep(30)"


def test_front_end_cpu_leaves_the_engine_processes_out():
    """A tree of two busy children, one titled as vLLM's engine core: only the other counts."""
    parent = subprocess.Popen(
        ["bash", "-c", f"(exec -a VLLM::EngineCore {sys.executable} -c '{BURN.format(s=0.6)}') & "
                       f"{sys.executable} -c '{BURN.format(s=0.3)}' & wait"])
    try:
        before = frontend_cpu_s(parent.pid)
        time.sleep(1.5)
        after = frontend_cpu_s(parent.pid)
        used = cpu_used(before, after)
        assert 0.2 <= used <= 0.5, used          # the 0.3 s child, not the engine's 0.6 s
        assert len(after) == 2                   # bash and the plain child
        assert len(frontend_cpu_s(parent.pid, include_root=False)) == 1
    finally:
        import psutil
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("extra", [["--adapters", "a1"], ["--profile", "agent"],
                                   ["--request-rate", "2"], ["--rounds", "0"],
                                   ["--endpoint", "e"], ["--ray-ingress-replicas", "-1"]])
def test_bad_input_exits_2_before_anything_starts(extra, capsys):
    assert main(["--level", "6", "--target", "local", "--no-progress", *extra]) == 2


@pytest.mark.parametrize("flag, said", [(["--ray-ingress-replicas", "0"], "--ray-ingress-replicas 0"),
                                        (["--ray-proxy", "haproxy"], "--ray-proxy haproxy")])
def test_the_ray_layout_flags_are_refused_where_no_ray_application_starts(flag, said, capsys):
    assert main(["--level", "5", "--url", "http://127.0.0.1:9", "--no-progress", *flag]) == 2
    assert f"{said}: only the Ray hop" in capsys.readouterr().out
