"""The trace simulator on scenarios worked by hand: one server's steps, queueing and batching;
each rung's autoscaler (SageMaker target tracking, zero copies, EKS queue depth); Bedrock's quota
and bill; and the CLI's answers and refusals."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from cost.simulate.bedrock import THROTTLED, BedrockSettings, simulate_bedrock
from cost.simulate.capacity import CapacityModel
from cost.simulate.fleet import NO_CAPACITY, SERVED, run_fleet
from cost.simulate.scaling import Fixed, QueueDepth, TargetTracking
from cost.traces import AZURE_CONV_TRACE
from engine_reference import step_by_step
from options.core import BadInput


def capacity(**overrides) -> CapacityModel:
    values = dict(step_base_s=0.01, step_per_seq_s=0.0, step_per_kv_token_s=0.0, prefill_per_token_s=0.001,
                  max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_tokens=1_000_000, max_model_len=None,
                  request_overhead_s=0.0, source="test", fit={})
    values.update(overrides)
    return CapacityModel(**values)


def serve(cap, arrivals, inputs, outputs, policy=None, span=None, **kw):
    a = np.asarray(arrivals, dtype=float)
    run = run_fleet(a, np.asarray(inputs, dtype=np.int64), np.asarray(outputs, dtype=np.int64), cap,
                    policy or Fixed(1), span_s=span or float(a.max()) + 1, **kw)
    return run, run.first_token_s - a, run.finish_s - a


# --- one server ---------------------------------------------------------------------------------

def test_a_request_alone_takes_a_prefill_step_then_one_step_per_token():
    cap = capacity(request_overhead_s=0.005)
    run, ttft, e2e = serve(cap, [1.0], [100], [5])
    # prefill step: 0.01 + 100 x 0.001 = 0.11 s; then 4 more steps of 0.01 s; plus the overhead
    assert ttft[0] == pytest.approx(0.115)
    assert e2e[0] == pytest.approx(0.11 + 4 * 0.01 + 0.005)
    assert run.status[0] == SERVED


def test_requests_arriving_together_share_their_steps():
    cap = capacity(step_per_seq_s=0.002)
    _, ttft, e2e = serve(cap, [0.0, 0.0], [50, 150], [3, 3])
    first = 0.01 + 2 * 0.002 + 200 * 0.001           # one step prefills both
    assert ttft == pytest.approx([first, first])
    assert e2e == pytest.approx([first + 2 * 0.014] * 2)


def test_a_full_batch_makes_the_next_request_wait_for_a_free_slot():
    cap = capacity(max_num_seqs=1)
    _, ttft, e2e = serve(cap, [0.0, 0.0], [100, 100], [10, 10])
    alone = 0.11 + 9 * 0.01
    assert e2e[0] == pytest.approx(alone)
    # the second is admitted at the step boundary where the first ends
    assert ttft[1] == pytest.approx(alone + 0.11)
    assert e2e[1] == pytest.approx(2 * alone)


def test_a_request_arriving_mid_step_joins_at_the_next_boundary():
    cap = capacity()
    # A: prefill 0.11 s then steps of 0.01 (0.11, 0.12, ...). B arrives at 0.125: admitted at 0.13.
    _, ttft, _ = serve(cap, [0.0, 0.125], [100, 10], [50, 2])
    assert ttft[1] == pytest.approx(0.13 + 0.01 + 10 * 0.001 - 0.125)


def test_with_async_scheduling_a_request_reaching_a_busy_engine_joins_one_step_later():
    """vLLM (0.14.0 on) schedules each step while the one before it runs: B, arriving during the
    step that starts at 0.12, misses the step starting at 0.13 (scheduled at 0.12) and joins the
    one at 0.14. A request reaching an idle engine is taken at once, as without it."""
    cap = capacity(async_scheduling=True)
    _, ttft, _ = serve(cap, [0.0, 0.125], [100, 10], [50, 2])
    assert ttft[0] == pytest.approx(0.11)
    assert ttft[1] == pytest.approx(0.14 + 0.01 + 10 * 0.001 - 0.125)


def test_async_scheduling_matches_a_step_by_step_engine():
    cap = capacity(step_per_seq_s=0.0003, step_per_kv_token_s=2e-6, prefill_per_token_s=2e-4, max_num_seqs=6,
                   max_num_batched_tokens=300, async_scheduling=True)
    rng = random.Random(11)
    arrivals = sorted(rng.uniform(0, 20) for _ in range(150))
    arrivals[10] = arrivals[11]
    inputs = [rng.randint(1, 700) for _ in arrivals]
    outputs = [rng.randint(1, 60) for _ in arrivals]
    ref_first, ref_last, _ = step_by_step(cap, arrivals, inputs, outputs, async_scheduling=True)
    run, _, _ = serve(cap, arrivals, inputs, outputs)
    assert run.first_token_s == pytest.approx(ref_first, rel=1e-9, abs=1e-9)
    assert run.finish_s == pytest.approx(ref_last, rel=1e-9, abs=1e-9)
    sync_first, _, _ = step_by_step(cap, arrivals, inputs, outputs)
    # The reference is not the synchronous engine: most first tokens come a step later.
    assert np.median(np.asarray(ref_first) - np.asarray(sync_first)) > 0.005


def test_async_scheduling_is_kept_in_a_saved_capacity_model_and_checked():
    cap = capacity(async_scheduling=True)
    assert CapacityModel.from_json(json.loads(json.dumps(cap.to_json()))).async_scheduling is True
    older = {k: v for k, v in capacity().to_json().items() if k != "async_scheduling"}
    assert CapacityModel.from_json(older).async_scheduling is False
    with pytest.raises(BadInput, match="async_scheduling = 'yes' must be true or false"):
        capacity(async_scheduling="yes")


def test_power_of_two_sends_each_request_to_the_less_busy_of_two_drawn_replicas():
    cap = capacity(step_base_s=0.02, max_num_seqs=4)
    rng = random.Random(3)
    arrivals = sorted(rng.uniform(0, 150) for _ in range(2000))
    inputs = [rng.randint(50, 400) for _ in arrivals]
    outputs = [rng.randint(20, 120) for _ in arrivals]
    # two replicas, one sequence each, two long requests 1 ms apart: the pair drawn is always both
    # replicas, so the second goes to the idle one whatever the draw; random doubles up on some seeds
    one_seq = capacity(max_num_seqs=1)
    waited = {}
    for routing in ("power_of_two", "random"):
        waited[routing] = [serve(one_seq, [0.0, 0.001], [10, 10], [100, 100], Fixed(2), routing=routing,
                                 seed=seed)[1][1] > 0.5 for seed in range(20)]
    assert not any(waited["power_of_two"]) and any(waited["random"])
    # eight replicas near saturation: its tail far below random's, and at least least outstanding's
    p99 = {routing: float(np.percentile(serve(cap, arrivals, inputs, outputs, Fixed(8), routing=routing)[2], 99))
           for routing in ("random", "power_of_two", "least_outstanding")}
    assert p99["least_outstanding"] <= p99["power_of_two"] < 0.8 * p99["random"], p99


def test_each_platform_routes_as_deployed_unless_told(capsys):
    from cost.__main__ import main

    base = ["simulate", "--trace", str(AZURE_CONV_TRACE), "--window", "0:300", "--model",
            "meta.llama3-1-8b-instruct-v1:0", "--instance", "g5.xlarge", "--capacity", "1500", "--rungs", "3,6",
            "--json", "--no-progress"]
    assert main([*base, "--rung6-autoscaler", "ray-serve"]) == 0
    said = " ".join(json.loads(capsys.readouterr().out)["assumptions"])
    assert "at random on SageMaker (its default), by Ray Serve's power of two choices on rung 6" in said
    assert main([*base, "--scale-to-zero"]) == 0
    said = " ".join(json.loads(capsys.readouterr().out)["assumptions"])
    assert "fewest outstanding requests on SageMaker" in said and "at random on rung 6" in said
    assert main([*base, "--rung6-autoscaler", "ray-serve", "--routing", "random"]) == 0
    assert "random on every self-hosted rung" in " ".join(json.loads(capsys.readouterr().out)["assumptions"])


def test_closed_form_jumps_match_a_step_by_step_engine():
    cap = capacity(step_per_seq_s=0.0003, step_per_kv_token_s=2e-6, prefill_per_token_s=2e-4, max_num_seqs=6,
                   max_num_batched_tokens=300)
    rng = random.Random(7)
    arrivals = sorted(rng.uniform(0, 20) for _ in range(150))
    arrivals[10] = arrivals[11]                   # two at the same instant share a step
    inputs = [rng.randint(0, 700) for _ in arrivals]
    outputs = [rng.randint(1, 60) for _ in arrivals]
    ref_first, ref_last, _ = step_by_step(cap, arrivals, inputs, outputs)
    run, _, _ = serve(cap, arrivals, inputs, outputs)
    assert run.first_token_s == pytest.approx(ref_first, rel=1e-9, abs=1e-9)
    assert run.finish_s == pytest.approx(ref_last, rel=1e-9, abs=1e-9)


def test_the_front_end_hands_requests_to_the_engine_in_turn_as_a_serial_queue_would():
    """A replica with ``frontend_request_s`` (a model built from specs) is a step-by-step engine
    whose arrivals first pass one at a time through a queue of that service time; the rest of
    the request overhead is added to both times. Bursts queue there: 6 requests at one instant
    reach the engine 2 ms apart, and the replica's jumps agree with the reference to 1e-9."""
    cap = capacity(step_per_seq_s=0.0003, step_per_kv_token_s=2e-6, prefill_per_token_s=2e-4, max_num_seqs=6,
                   max_num_batched_tokens=300, request_overhead_s=0.005, frontend_request_s=0.002)
    rng = random.Random(5)
    arrivals = sorted([3.0] * 6 + [rng.uniform(0, 20) for _ in range(100)])
    inputs = [rng.randint(1, 700) for _ in arrivals]
    outputs = [rng.randint(1, 60) for _ in arrivals]
    handed, free = [], 0.0
    for a in arrivals:
        free = max(a, free) + 0.002
        handed.append(free)
    burst = [h for a, h in zip(arrivals, handed) if a == 3.0]
    assert burst == pytest.approx([3.002 + 0.002 * k for k in range(6)])
    ref_first, ref_last, _ = step_by_step(cap, handed, inputs, outputs)
    run, _, _ = serve(cap, arrivals, inputs, outputs)
    assert run.first_token_s == pytest.approx(np.asarray(ref_first) + 0.003, rel=1e-9, abs=1e-9)
    assert run.finish_s == pytest.approx(np.asarray(ref_last) + 0.003, rel=1e-9, abs=1e-9)


def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks():
    cap = capacity(max_num_batched_tokens=100)
    _, ttft, e2e = serve(cap, [0.0], [250], [3])
    # 100 + 100 + 50 prompt tokens over three steps, the first token at the end of the third
    assert ttft[0] == pytest.approx(3 * 0.01 + 250 * 0.001)
    assert e2e[0] == pytest.approx(ttft[0] + 2 * 0.01)


def test_kv_cache_bounds_admission():
    # 300 tokens of cache: the first request reserves 100 + 150, so the second (60 + 10) waits.
    cap = capacity(kv_cache_tokens=300)
    _, ttft, e2e = serve(cap, [0.0, 0.0], [100, 60], [150, 10])
    assert ttft[1] == pytest.approx(e2e[0] + 0.01 + 0.06)


# --- autoscalers --------------------------------------------------------------------------------

def steady(rate_per_min: float, start: float, end: float) -> list[float]:
    gap = 60.0 / rate_per_min
    return list(np.arange(start + gap / 2, end, gap))


def test_sagemaker_adds_its_first_instance_after_three_datapoints_and_the_launch():
    """1x then 4x the target: the scale-out alarm needs 3 one-minute datapoints above the target,
    then the new instances serve after the instance start time."""
    target, start_s = 60.0, 240.0
    arrivals = steady(30, 0, 600) + steady(240, 600, 1800)
    policy = TargetTracking("invocations", target, min_instances=1, max_instances=8, start_s=start_s)
    run, _, _ = serve(capacity(), arrivals, [10] * len(arrivals), [2] * len(arrivals), policy, span=1800)
    decision = run.decisions[0]
    assert decision["t"] == pytest.approx(600 + 3 * 60)     # datapoints of minutes 10, 11, 12
    assert decision["to"] == 4                              # ceil(1 x 240 / 60)
    first_added = next(t for t, serving, _ in run.timeline if serving > 1)
    assert first_added == pytest.approx(600 + 3 * 60 + start_s)


def test_sagemaker_scale_in_waits_for_fifteen_quiet_minutes_and_its_cooldown():
    target, start_s = 60.0, 120.0
    arrivals = steady(30, 0, 600) + steady(240, 600, 1200) + steady(30, 1200, 4000)
    policy = TargetTracking("invocations", target, min_instances=1, max_instances=8, start_s=start_s,
                            scale_out_cooldown_s=2000)
    run, _, _ = serve(capacity(), arrivals, [10] * len(arrivals), [2] * len(arrivals), policy, span=4000)
    out, back = run.decisions[0], run.decisions[1]
    assert (out["t"], out["to"]) == (780, 4)
    # 15 quiet datapoints end at 1200 + 15 x 60 = 2100, but the scale-out cooldown holds until
    # 780 + 2000 = 2780: the first evaluation after it is at 2820.
    assert back["t"] == pytest.approx(2820)
    assert back["to"] == 1


def test_zero_copies_fail_the_first_requests_while_a_copy_starts():
    start_s = 180.0
    arrivals = steady(30, 10, 900)
    policy = TargetTracking("invocations", 60.0, min_instances=0, max_instances=2, start_s=start_s,
                            initial_instances=0)
    run, _, _ = serve(capacity(), arrivals, [10] * len(arrivals), [2] * len(arrivals), policy, span=900)
    a = np.asarray(arrivals)
    # The one-minute NoCapacityInvocationFailures alarm fires at 60 s; the copy serves from 60 + start.
    ready = 60 + start_s
    assert (run.status[a < ready] == NO_CAPACITY).all()
    assert (run.status[a >= ready] == SERVED).all()
    assert run.decisions[0]["t"] == 60 and run.decisions[0]["to"] == 1


def test_eks_scales_as_the_rendered_hpa_behaviour_allows():
    """A flood, then a trickle: the HPA adds 2 pods a minute (the rendered scaleUp policy), then
    removes one pod per 300 s once the 600 s stabilisation window has seen no higher need."""
    from options.core.autoscaling import HPA_BEHAVIOUR as b

    cap = capacity(max_num_seqs=2, step_base_s=0.05)
    arrivals = steady(600, 0, 300) + steady(6, 300, 3000)
    policy = QueueDepth(2.0, min_replicas=1, max_replicas=6, start_s=60.0)
    run, _, _ = serve(cap, arrivals, [10] * len(arrivals), [20] * len(arrivals), policy, span=3000)
    ups = [d for d in run.decisions if d["to"] > d["from"]]
    downs = [d for d in run.decisions if d["to"] < d["from"]]
    assert ups[0]["t"] == 15 and ups[0]["to"] - ups[0]["from"] == b.scale_up_pods   # first sync: +2 only
    assert ups[1]["t"] == 15 + b.scale_up_period_s                                  # next 2 a minute later
    assert max(d["to"] for d in ups) == 6
    assert all(d["from"] - d["to"] == b.scale_down_pods for d in downs)
    gaps = [y["t"] - x["t"] for x, y in zip(downs, downs[1:])]
    assert all(g >= b.scale_down_period_s for g in gaps)
    # the queue empties after the flood; the window still holds the flood's need for 600 s
    assert downs[0]["t"] >= 300 + b.scale_down_stabilization_s - 15


# --- Bedrock --------------------------------------------------------------------------------------

def test_bedrock_bills_exactly_what_it_served_and_throttles_over_the_quota():
    arrivals = np.array([1.0, 2.0, 3.0, 61.0])
    inputs = np.array([400, 300, 500, 100])
    outputs = np.array([100, 200, 100, 50])
    settings = BedrockSettings(tpm=1_000, rpm=None, attempts=1)
    run = simulate_bedrock(arrivals, inputs, outputs, settings)
    # minute 0: 500 + 500 = 1,000 fit; the third (600 more) is over; minute 1 starts afresh
    assert run.status.tolist() == [SERVED, SERVED, THROTTLED, SERVED]
    assert run.throttled_requests == 1


def test_bedrock_retries_with_backoff_until_the_next_minute_frees_the_quota():
    arrivals = np.array([50.0, 58.0])
    settings = BedrockSettings(tpm=1_000, rpm=None, attempts=6)
    run = simulate_bedrock(arrivals, np.array([800, 800]), np.array([100, 100]), settings, seed=3)
    assert run.status.tolist() == [SERVED, SERVED]
    assert run.throttle_events >= 1
    assert run.first_token_s[1] - 58.0 > 2.0          # it waited into minute 1


def cli(capsys, *args):
    from cost.__main__ import main
    code = main(["simulate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulate_answers_every_rung_and_bills_bedrock_exactly(capsys):
    code, out, _ = cli(capsys, "--trace", str(AZURE_CONV_TRACE), "--window", "0:600", "--model",
                       "meta.llama3-1-8b-instruct-v1:0", "--instance", "g5.xlarge", "--capacity", "1500",
                       "--slo-ttft-ms", "3000", "--slo-e2e-ms", "40000", "--bedrock-tpm", "10000000", "--json")
    assert code == 0
    doc = json.loads(out)
    rows = {r["level"]: r for r in doc["rungs"]}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for r in doc["rungs"]:
        for key in ("window_usd", "monthly_usd", "served", "throttled", "failed", "billed_input_tokens",
                    "billed_output_tokens", "slo_attainment", "ttft_ms", "e2e_ms", "replicas", "cold_starts",
                    "idle_share", "policy"):
            assert key in r
        assert r["served"] + r["failed"] == doc["trace"]["requests"]
    from cost.prices import load_prices
    from cost.traces import read_trace
    trace = read_trace(AZURE_CONV_TRACE, window=(0, 600))
    price = load_prices().bedrock("meta.llama3-1-8b-instruct-v1:0")
    exact = (int(trace.input_tokens.sum()) * price.input_per_million
             + int(trace.output_tokens.sum()) * price.output_per_million) / 1e6
    assert rows[1]["throttled"] == 0 and rows[1]["window_usd"] == pytest.approx(exact, rel=1e-9)
    assert doc["cheapest_meeting_slo"] in (None, 1, 2, 3, 4, 5, 6)
    meeting = [r for r in doc["rungs"] if r["slo_attainment"] >= 0.99]
    if meeting:
        assert doc["cheapest_meeting_slo"] == min(meeting, key=lambda r: (r["window_usd"], r["level"]))["level"]
    assert set(doc["break_even_scale"]) == {"2", "3", "4", "5", "6"}
    assert rows[2]["policy"]["kind"] == "sagemaker_target_tracking"
    assert rows[6]["policy"]["kind"] == "hpa_keda_queue_depth"


@pytest.mark.parametrize("args, message", [
    (["--rungs", "1,7"], "--rungs '1,7'"),
    (["--autoscale-metric", "invocations"], "--autoscale-target"),
    (["--slo-attainment", "1.5"], "--slo-attainment 1.5"),
    (["--capacity", "-3"], "--capacity -3"),
    (["--mix", "3:1"], "--mix does not apply"),
])
def test_simulate_refuses_bad_input_naming_it(capsys, args, message):
    base = ["--trace", str(AZURE_CONV_TRACE), "--window", "0:60", "--model", "meta.llama3-1-8b-instruct-v1:0",
            "--instance", "g5.xlarge", "--capacity", "1500"]
    if "--capacity" in args:
        base = base[:-2]
    code, _, err = cli(capsys, *base, *args)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_predict_replay_needs_a_bench(capsys, tmp_path):
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"replay": {"spec": {"trace": {}}, "summary": {}}}))
    code, _, err = cli(capsys, "--predict-replay", str(replay))
    assert code == 2 and "was not paced from a capacity file" in err and "--bench" in err


def test_predict_replay_defaults_to_the_capacity_file_each_replay_was_paced_from(capsys, tmp_path):
    """Two replays paced from two profiles: each re-predicted on its own."""
    from cost.simulate.capacity import CapacityModel
    from cost.traces import read_trace

    replays = []
    for n, tok_s in enumerate((800.0, 3000.0)):
        bench = tmp_path / f"capacity-{n}.json"
        bench.write_text(json.dumps(CapacityModel.from_throughput(tok_s, f"test {tok_s:g}").to_json()))
        spec = {"trace": read_trace(AZURE_CONV_TRACE, window=(0.0, 60.0)).spec, "time_scale": 1.0,
                "load": 0.5 + n, "capacity_file": str(bench)}
        replay = tmp_path / f"replay-{n}.json"
        replay.write_text(json.dumps({"replay": {"spec": spec, "summary": {
            "ttft_ms": {"p50": 100.0, "p90": 200.0, "p99": 300.0},
            "e2e_ms": {"p50": 1000.0, "p90": 2000.0, "p99": 3000.0}}}}))
        replays.append(str(replay))
    code, out, err = cli(capsys, "--predict-replay", *replays, "--json")
    assert code == 0, err
    docs = json.loads(out)["replays"]
    assert [d["capacity"]["source"].split(":")[0] for d in docs] == ["test 800", "test 3000"]
    # The slower replica queues more of the same minute of traffic.
    assert docs[0]["predicted"]["e2e_ms"]["p99"] > docs[1]["predicted"]["e2e_ms"]["p99"]
    # Each prediction is bracketed by the same server 5 % faster and 5 % slower.
    for d in docs:
        band = d["sensitivity"]
        assert band["capacity_change"] == 0.05
        for metric in ("ttft_ms", "e2e_ms"):
            assert band["predicted_faster"][metric]["p99"] <= d["predicted"][metric]["p99"] \
                <= band["predicted_slower"][metric]["p99"]
            measured = d["measured"][metric]["p50"]
            low, high = sorted((band["predicted_faster"][metric]["p50"], band["predicted_slower"][metric]["p50"]))
            assert band["measured_within"][metric]["p50"] == (low <= measured <= high)


def test_a_faster_step_model_is_the_same_server_scaled():
    from cost.simulate.capacity import CapacityModel

    base = CapacityModel.from_throughput(1500.0, "test")
    faster = base.with_step_speed(1.05)
    assert faster.saturated_output_tok_s(1000, 200) == pytest.approx(1.05 * 1500.0)
    assert faster.request_overhead_s == base.request_overhead_s and faster.max_num_seqs == base.max_num_seqs
    assert base.saturated_output_tok_s(1000, 200) == pytest.approx(1500.0)


@pytest.mark.parametrize("speed", [1.25, 0.8])
def test_predict_replay_finds_the_speed_the_replay_ran_at_and_predicts_at_it(capsys, tmp_path, speed):
    """A replay recorded on a server 25 % faster (or 20 % slower) than its bench says (here:
    simulated on it, so the queue and batching are exactly the model's): the requests' per-batch
    time per token gives that speed back within 3 % (1 % when written), and the prediction at it
    matches what that server did, where the prediction from the bench alone is 30-45 % off."""
    replay, bench_file = simulated_replay(tmp_path, speed)
    code, out, err = cli(capsys, "--predict-replay", str(replay), "--bench", str(bench_file), "--json")
    assert code == 0, err
    doc = json.loads(out)
    at_speed = doc["at_replay_speed"]
    assert len(at_speed["groups"]) >= 3
    assert at_speed["factor"] == pytest.approx(speed, rel=0.03), at_speed
    for metric in ("ttft_ms", "e2e_ms"):
        for s in ("p50", "p99"):
            assert abs(doc["ratio"][metric][s] - 1) > 0.15, (metric, s, doc["ratio"])      # the bench alone
            assert at_speed["ratio"][metric][s] == pytest.approx(1.0, abs=0.08), (metric, s, at_speed["ratio"])
    # The table says it too.
    code, out, _ = cli(capsys, "--predict-replay", str(replay), "--bench", str(bench_file))
    assert code == 0 and f"decoded x{at_speed['factor']:.2f} as fast" in " ".join(out.split()), out


def simulated_replay(tmp_path, speed: float, spell=None):
    """A replay file recorded on a server ``speed`` times as fast as its bench (simulated on it,
    so the queue and batching are exactly the model's), and the bench file. ``spell`` (from_s,
    to_s, slower): the requests sent in that span decode ``slower`` times as slowly, as under
    another process's CPU."""
    import numpy as np

    from cost.simulate.capacity import CapacityModel
    from cost.simulate.cli import replay_trace
    from cost.simulate.fleet import run_fleet
    from cost.simulate.scaling import Fixed
    from cost.traces import read_trace

    bench = CapacityModel.from_throughput(800.0, "test bench")
    bench_file = tmp_path / "capacity.json"
    bench_file.write_text(json.dumps(bench.to_json()))
    spec = {"trace": read_trace(AZURE_CONV_TRACE, window=(0.0, 120.0)).spec, "time_scale": 2.0, "load": 0.8}
    trace = replay_trace(spec)
    run = run_fleet(trace.arrival_s, trace.input_tokens, trace.output_tokens, bench.with_step_speed(speed),
                    Fixed(1), span_s=trace.span_s, seed=0)
    ttft, e2e = (run.first_token_s - trace.arrival_s) * 1000, (run.finish_s - trace.arrival_s) * 1000
    if spell is not None:
        start, end, slower = spell
        inside = (trace.arrival_s >= start) & (trace.arrival_s < end)
        e2e = np.where(inside, ttft + (e2e - ttft) * slower, e2e)
    requests = [{"arrival_s": float(a), "sent_s": float(a), "input_tokens": int(i), "output_tokens": int(o),
                 "ttft_ms": float(t), "e2e_ms": float(e), "status": "ok"}
                for a, i, o, t, e in zip(trace.arrival_s, trace.input_tokens, trace.output_tokens, ttft, e2e)]
    summary = {k: {f"p{q}": float(np.percentile(v, q)) for q in (50, 90, 99)} for k, v in
               (("ttft_ms", ttft), ("e2e_ms", e2e))}
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"replay": {"spec": spec, "summary": summary, "requests": requests}}))
    return replay, bench_file


def test_predict_replay_shows_a_spell_in_the_order_requests_were_sent(capsys, tmp_path):
    """A replay whose server decoded 2.5x slower for the requests sent in its third sixth (another
    process's CPU for a few seconds): cut in send order (``over_time``, six spans one after
    another), that sixth stands out and the rest stay near the model's speed; the factor the
    prediction runs at is still the batch groups' (what the validation widens its bound by is
    the larger spread of the two)."""
    replay, bench_file = simulated_replay(tmp_path, 1.0)
    sent = sorted(r["sent_s"] for r in json.loads(replay.read_text())["replay"]["requests"])
    third = (sent[len(sent) * 2 // 6], sent[len(sent) * 3 // 6])
    replay, bench_file = simulated_replay(tmp_path, 1.0, spell=(*third, 2.5))
    code, out, err = cli(capsys, "--predict-replay", str(replay), "--bench", str(bench_file), "--json")
    assert code == 0, err
    at_speed = json.loads(out)["at_replay_speed"]
    over_time = at_speed["over_time"]
    assert len(over_time) == 6
    assert all(a["sent_to_s"] <= b["sent_from_s"] for a, b in zip(over_time, over_time[1:])), over_time
    factors = [g["model_over_measured"] for g in over_time]
    # the slowed sixth is the slowest, well under the model's speed (its requests, decoding
    # longer, also met larger batches, where the model is slower itself: 0.6, not 0.4)
    assert min(factors) == factors[2] < 0.75, factors
    assert all(abs(f - 1) < 0.3 for i, f in enumerate(factors) if i != 2), factors
    assert at_speed["factor"] == pytest.approx(sum(g["model_over_measured"] * g["requests"] for g in at_speed["groups"])
                                               / sum(g["requests"] for g in at_speed["groups"]), abs=2e-3)


def test_predict_replay_without_requests_says_no_replay_speed(capsys, tmp_path):
    from cost.simulate.capacity import CapacityModel
    from cost.traces import read_trace

    bench = tmp_path / "capacity.json"
    bench.write_text(json.dumps(CapacityModel.from_throughput(800.0, "test").to_json()))
    spec = {"trace": read_trace(AZURE_CONV_TRACE, window=(0.0, 30.0)).spec, "time_scale": 1.0}
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"replay": {"spec": spec, "summary": {
        "ttft_ms": {"p50": 100.0, "p90": 200.0, "p99": 300.0}, "e2e_ms": {"p50": 1000.0, "p90": 2000.0, "p99": 3000.0}}}}))
    code, out, err = cli(capsys, "--predict-replay", str(replay), "--bench", str(bench), "--json")
    assert code == 0, err
    assert json.loads(out)["at_replay_speed"] is None
