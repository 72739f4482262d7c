"""Rung 6 with Ray Serve's autoscaler (``--rung6-autoscaler ray-serve``) on scenarios worked by
hand: the look-back mean of what replicas have pushed, the upscale and downscale delays, the
smoothing factors, the cold start and the replica start; then the HPA and Ray Serve on the
shipped conversation trace, where the two policies must differ the way their rules say."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cost.simulate.capacity import CapacityModel
from cost.simulate.fleet import FleetState, run_fleet
from cost.simulate.scaling import QueueDepth, RayServe, ray_serve_from_config, scaling_defaults
from cost.traces import AZURE_CONV_TRACE, read_trace
from options.core import BadInput


def ray(**kw) -> RayServe:
    # look_back 50 s, metrics every 10 s: Ray records every min(50 x 0.2, 10) = 10 s, so every
    # record is pushed at once and the controller's mean is over the last 5 records.
    values = dict(target_ongoing_requests=2, min_replicas=1, max_replicas=8, upscale_delay_s=30,
                  downscale_delay_s=60, look_back_period_s=50, metrics_interval_s=10, start_s=60)
    values.update(kw)
    return RayServe(**values)


def feed(policy: RayServe, ongoing: dict[float, int], serving: int, starting: int = 0) -> dict[float, int]:
    """Evaluate at each time with that many requests ongoing; the fleet held at ``serving``."""
    return {t: policy.evaluate(FleetState(t, serving, starting, 0, policy.period_s, n, 0, 0))
            for t, n in sorted(ongoing.items())}


def test_defaults_are_ray_2_60s_with_their_sources():
    doc = scaling_defaults()["ray_serve"]
    p = RayServe()
    assert (p.target_ongoing_requests, p.upscale_delay_s, p.downscale_delay_s, p.look_back_period_s,
            p.metrics_interval_s) == (2, 30, 600, 30, 10)
    assert p.period_s == pytest.approx(6.0)          # records every min(30 x 0.2, 10) s
    assert p.start_s == 120 + 300 + 120              # the HPA path's node + image pull + model load
    assert all(row["source"] for row in doc.values())


def test_upscale_waits_for_its_delay_on_the_look_back_mean():
    """Idle, then 20 requests ongoing from t=60. The mean of the last five records climbs 4, 8,
    12, 16: the wish (mean / 2) passes 1 replica at t=60, and 30 s later (t=90) Serve scales to
    16 / 2 = 8."""
    policy = ray()
    decided = feed(policy, {t: (0 if t < 60 else 20) for t in range(10, 110, 10)}, serving=1)
    assert [decided[t] for t in (60, 70, 80)] == [1, 1, 1]
    assert decided[90] == 8


def test_upscaling_factor_smooths_the_step():
    # the same scenario: at t=90 the wish is 8, smoothed to ceil(1 + 0.5 x (8 - 1)) = 5
    policy = ray(upscaling_factor=0.5)
    decided = feed(policy, {t: (0 if t < 60 else 20) for t in range(10, 110, 10)}, serving=1)
    assert decided[90] == 5


def test_a_wish_that_lapses_restarts_the_delay():
    """2 replicas, target 2: a wish above 2 replicas needs a look-back mean above 4. Means of the
    last five records: 3 until t=50; 5 at t=60 and 4.4 at 70 (wish 3: the clock starts at 60); 3.8 at
    t=80 (wish 2 = current: the clock stops); 7.2 at t=90 (wish 4: it starts again). Without the
    lapse Serve would scale at t=90 (to 4); with it, at t=120, to 16 / 2 = 8."""
    records = {10: 3, 20: 3, 30: 3, 40: 3, 50: 3, 60: 13, 70: 0, 80: 0, 90: 20, 100: 20, 110: 20, 120: 20}
    decided = feed(ray(), records, serving=2)
    assert all(decided[t] == 2 for t in range(10, 120, 10))
    assert decided[120] == 8
    steady = feed(ray(), {**records, 70: 3, 80: 3}, serving=2)   # no lapse: 60 + 30 s
    assert steady[90] == 5                 # mean (3+13+3+3+20)/5 = 8.4 -> wish 4.2 -> 5


def test_downscale_waits_for_its_delay_and_a_spike_restarts_it():
    """4 replicas, 4 requests ongoing: the wish is 2. Without a spike Serve drops to 2 after the
    60 s delay (t=70). A spike of 40 at t=40 makes the wish go up while it is in the 50 s
    window (t=40..80); the down wish starts again at t=90 and acts at t=150."""
    calm = feed(ray(upscale_delay_s=1000), {t: 4 for t in range(10, 200, 10)}, serving=4)
    assert [calm[t] for t in (60, 70)] == [4, 2]
    spiky = feed(ray(upscale_delay_s=1000), {t: (40 if t == 40 else 4) for t in range(10, 200, 10)}, serving=4)
    assert all(spiky[t] == 4 for t in range(10, 150, 10))
    assert spiky[150] == 2


def test_downscaling_factor_and_the_stall_rule():
    # wish 2 of 4 running: factor 0.5 -> ceil(4 - 1) = 3; factor 0.1 -> ceil(3.8) = 4 would stall,
    # so Serve takes one: 3
    for factor in (0.5, 0.1):
        decided = feed(ray(downscaling_factor=factor), {t: 4 for t in range(10, 80, 10)}, serving=4)
        assert decided[70] == 3


def test_the_controller_sees_only_what_has_been_pushed():
    """look_back 30 s, metrics every 10 s: records every 6 s, pushes every 10 s. 10 requests
    ongoing from t=12: at t=12 and 18 only the record of t=6 has been pushed (mean 0); at t=24
    the records of 6, 12 and 18 have (mean 20/3)."""
    policy = ray(look_back_period_s=30, metrics_interval_s=10, upscale_delay_s=0)
    assert policy.period_s == pytest.approx(6.0)
    decided = feed(policy, {6: 0, 12: 10, 18: 10, 24: 10}, serving=1)
    assert policy.ongoing(18) == 0 and decided[18] == 1
    assert policy.ongoing(24) == pytest.approx(20 / 3)
    assert decided[24] == 4             # ceil(6.67 / 2), no delay


def test_cold_start_from_zero_replicas_skips_the_delay():
    policy = ray(min_replicas=0, upscale_delay_s=300)
    assert policy.initial == 0
    assert policy.evaluate(FleetState(10, 0, 0, 3, 10, 3, 3, 0)) == 1


def test_on_a_fleet_new_replicas_serve_after_the_delay_and_the_start():
    """One request a second that never finishes within the window: at each record the ongoing
    count is the arrivals so far (10, 20, 30, ...). Target 10: the look-back means 15, 20, 25, 30
    wish 2, 2, 3, 3 replicas from t=20; 30 s later (t=50) Serve asks for 3; they serve 60 s after
    (t=110). Next wish: 4 from t=60, acted at t=90 on a mean of 70: 7, bounded to 5."""
    cap = CapacityModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_kv_token_s=0.0, prefill_per_token_s=0.0,
                        max_num_seqs=256, max_num_batched_tokens=4096, kv_cache_tokens=10 ** 9,
                        max_model_len=None, request_overhead_s=0.0, source="test", fit={})
    arrivals = np.arange(0.5, 200, 1.0)
    policy = ray(target_ongoing_requests=10, max_replicas=5)
    run = run_fleet(arrivals, np.full(len(arrivals), 10), np.full(len(arrivals), 100_000), cap, policy,
                    span_s=200)
    assert (run.decisions[0]["t"], run.decisions[0]["from"], run.decisions[0]["to"]) == (50, 1, 3)
    assert (run.decisions[1]["t"], run.decisions[1]["from"], run.decisions[1]["to"]) == (90, 3, 5)
    assert next(t for t, serving, _ in run.timeline if serving == 3) == pytest.approx(110)
    assert next(t for t, serving, _ in run.timeline if serving == 5) == pytest.approx(150)


def test_a_config_from_a_mapping_and_bad_values_named():
    p = ray_serve_from_config({"target_ongoing_requests": 8, "min_replicas": 1, "max_replicas": 4,
                               "upscale_delay_s": 10})
    assert p.autoscaling_config() == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8,
                                      "upscale_delay_s": 10, "downscale_delay_s": 600.0,
                                      "look_back_period_s": 30.0}
    with pytest.raises(BadInput, match="upscale_delay_s -1 must be a number >= 0"):
        RayServe(upscale_delay_s=-1)
    with pytest.raises(BadInput, match="min_replicas 5 > max_replicas 2"):
        RayServe(min_replicas=5, max_replicas=2)
    with pytest.raises(BadInput, match="upscale_delay not modelled"):
        ray_serve_from_config({"upscale_delay": 3})


# --- the shipped trace: where the two policies must differ -----------------------------------

def test_hpa_and_ray_serve_differ_where_their_rules_say_on_the_conversation_trace():
    """Same trace, capacity and ceiling. The HPA adds at most 2 pods a minute and removes one
    per 5 minutes; Ray Serve jumps to its wish once the 30 s delay has passed, and removes
    only after 600 s of a continuous wish to, then as many as it wishes at once."""
    trace = read_trace(AZURE_CONV_TRACE)
    cap = CapacityModel.from_throughput(1500, "test")
    runs = {}
    for name, policy in (("hpa", QueueDepth(2, 1, 4)), ("ray", RayServe(16, 1, 4))):
        runs[name] = run_fleet(trace.arrival_s, trace.input_tokens, trace.output_tokens, cap, policy,
                               span_s=float(trace.span_s))
    hpa, ray_run = runs["hpa"].decisions, runs["ray"].decisions
    assert all(d["to"] - d["from"] <= 2 for d in hpa if d["to"] > d["from"])
    assert all(d["from"] - d["to"] == 1 for d in hpa if d["to"] < d["from"])
    assert any(d["to"] - d["from"] > 2 for d in ray_run)                # a jump the HPA cannot make
    first_up = next(d for d in ray_run if d["to"] > d["from"])
    assert first_up["t"] >= 30                                          # not before the upscale delay
    for before, down in zip(ray_run, ray_run[1:]):
        if down["to"] < down["from"]:
            assert down["t"] - before["t"] >= 600 - 1e-6                 # the downscale delay held
    assert runs["hpa"].instance_seconds(trace.span_s) != runs["ray"].instance_seconds(trace.span_s)


def cli(capsys, *args):
    from cost.__main__ import main
    code = main(["simulate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


BASE = ["--trace", str(AZURE_CONV_TRACE), "--window", "0:600", "--model", "meta.llama3-1-8b-instruct-v1:0",
        "--instance", "g5.xlarge", "--capacity", "1500", "--rungs", "6", "--slo-ttft-ms", "3000"]


def test_simulate_says_which_autoscaler_ran_and_gives_the_autoscaling_config(capsys):
    code, out, _ = cli(capsys, *BASE, "--rung6-autoscaler", "ray-serve", "--target-ongoing", "16",
                       "--max-instances", "4", "--ray-autoscaling", "upscale_delay_s=12", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["rung6_autoscaler"] == "ray-serve"
    row = doc["rungs"][0]
    assert row["policy"]["kind"] == "ray_serve_ongoing_requests"
    assert doc["ray_serve_autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                                   "target_ongoing_requests": 16.0, "upscale_delay_s": 12.0,
                                                   "downscale_delay_s": 600.0, "look_back_period_s": 30.0}
    code, out, _ = cli(capsys, *BASE, "--rung6-autoscaler", "ray-serve", "--target-ongoing", "16")
    assert code == 0 and "Ray Serve" in out and "autoscaling_config" in out
    code, out, _ = cli(capsys, *BASE, "--target-waiting", "2", "--json")
    doc = json.loads(out)
    assert doc["rung6_autoscaler"] == "hpa" and "ray_serve_autoscaling_config" not in doc


@pytest.mark.parametrize("args, message", [
    (["--target-ongoing", "8"], "add --rung6-autoscaler ray-serve"),
    (["--rung6-autoscaler", "ray-serve", "--target-waiting", "2"], "give --target-ongoing X instead"),
    (["--rung6-autoscaler", "ray-serve", "--ray-autoscaling", "upscale_delay=3"], "KEY one of upscale_delay_s"),
    (["--rung6-autoscaler", "ray-serve", "--ray-autoscaling", "upscale_delay_s=soon"], "'soon' is not a number"),
    (["--rung6-autoscaler", "ray-serve", "--ray-autoscaling", "downscale_delay_s=-5"], "downscale_delay_s -5.0 must be"),
    (["--rung6-autoscaler", "ray-serve", "--ray-autoscaling", "max_replicas=3"], "give max_replicas as --max-instances"),
    (["--rung6-autoscaler", "ray-serve", "--target-ongoing", "0"], "target_ongoing_requests 0.0 must be"),
])
def test_ray_serve_flags_refuse_bad_input_naming_it(capsys, args, message):
    code, _, err = cli(capsys, *BASE, *args)
    assert code == 2, err
    assert message in err and "Traceback" not in err
