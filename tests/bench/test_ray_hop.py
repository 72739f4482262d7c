"""The Ray hop's comparison (options/bench/ray_hop.py) without engines: medians and spreads
over rounds, the added TTFT and CPU ratio judged against the goal only beyond the noise, the
alternated order, the front-end CPU that leaves vLLM's engine processes out, and bad input.
The measurement itself on the test run's Ray: tests/ray_serve/test_ray_hop_on_ray.py."""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def busy_tree(bash_line: str):
    """A bash running ``bash_line``; yields (its pid, each process's CPU seconds 1.5 s apart
    as (before, after, roles)); the whole tree is killed after."""
    import psutil

    parent = subprocess.Popen(["bash", "-c", bash_line])
    try:
        before = frontend_cpu_s(parent.pid)
        time.sleep(1.5)
        roles: dict[int, str] = {}
        yield parent.pid, (before, frontend_cpu_s(parent.pid, roles=roles), roles)
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n" \
       "time.sleep(30)"


def test_front_end_cpu_leaves_the_engine_processes_out():
    """A tree of two busy children, one titled as vLLM's engine core: only the other counts."""
    with busy_tree(f"(exec -a VLLM::EngineCore {sys.executable} -c '{BURN.format(s=0.6)}') & "
                   f"{sys.executable} -c '{BURN.format(s=0.3)}' & wait") as (pid, (before, after, _)):
        used = cpu_used(before, after)
        assert 0.2 <= used <= 0.5, used          # the 0.3 s child, not the engine's 0.6 s
        assert len(after) == 2                   # bash and the plain child
        assert len(frontend_cpu_s(pid, include_root=False)) == 1


def test_front_end_cpu_is_split_by_what_each_process_is(tmp_path):
    """Ray's worker titles, a script's name and a module's: each process's CPU under its role."""
    from options.bench.cpu import cpu_by_role

    script = tmp_path / "agent.py"
    script.write_text(BURN.format(s=0.3))
    with busy_tree(f"(exec -a 'ray::IDLE' {sys.executable} -c '{BURN.format(s=0.3)}') & "
                   f"{sys.executable} {script} & {sys.executable} -m http.server 0 & wait") as (_, reading):
        by_role = cpu_by_role(*reading)
        assert set(by_role) == {"bash", "ray::IDLE", "agent.py", "http.server"}, by_role
        assert 0.2 <= by_role["ray::IDLE"] <= 0.5 and 0.2 <= by_role["agent.py"] <= 0.5, by_role
        assert sum(by_role.values()) == pytest.approx(cpu_used(*reading[:2]))
        assert list(by_role)[0] in ("ray::IDLE", "agent.py")      # the largest first


def test_the_serving_path_leaves_ray_s_control_plane_out():
    by_process = {"ray::ServeReplica:llm:engine": 2.0, "haproxy": 0.1, "ray::ProxyActor": 0.05,
                  "ray::ServeController": 0.3, "gcs_server": 0.1, "raylet": 0.05, "log_monitor.py": 0.05}
    assert ray_hop.serving_cpu_s("ray", by_process) == pytest.approx(2.15)
    assert ray_hop.serving_cpu_s("plain", {"gunicorn: worker [byo-vllm]": 2.0, "python": 0.1}) == \
        pytest.approx(2.1)
    runs = _runs(1, plain=[(10, 1.0), (10, 1.0)], ray=[(11, 1.5), (11, 1.5)])
    for r in runs:
        r["serving_cpu_ms_per_token"] = 1.0 if r["contender"] == "plain" else 1.05
    e = ray_hop.compare(runs)["by_concurrency"]["1"]
    assert e["cpu_ratio"]["verdict"] == "not met" and e["serving_cpu_ratio"]["verdict"] == "met"
    assert e["serving_cpu_ratio"]["value"] == pytest.approx(1.05)


def test_the_idle_share_is_ray_s_extra_idle_cpu_over_its_extra_run_cpu():
    runs = [{"contender": k, "concurrency": 8, "round": 1, "frontend_cpu_s": cpu, "duration_s": 10.0}
            for k, cpu in (("plain", 1.0), ("ray", 3.0))]
    idle = ray_hop.idle_summary([{"contender": "plain", "cpu_s_per_s": 0.01, "round": 1},
                                 {"contender": "ray", "cpu_s_per_s": 0.11, "round": 1}])
    doc = {"runs": runs, "idle": idle}
    assert ray_hop.idle_share(doc, "8") == pytest.approx(0.1 * 10 / 2)
    assert ray_hop.idle_share({"runs": runs}, "8") is None           # a document without idle readings


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
