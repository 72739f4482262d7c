"""Every rung's front-door timeout, worked by hand on one replica overloaded with long prompts.

The server takes one sequence at a time; each request is a 10,000-token prompt (one 10.01 s
prefill step: 0.01 + 10,000 x 0.001) and 2,001 tokens (2,000 decode steps of 0.01 s = 20 s), so
30.01 s alone. Six arrive at 0, 1, ..., 5 s and a seventh at 95 s. Served one after another,
request i (i < 6) starts at 30.01 i, has its first token 10.01 s later and ends at 30.01 (i + 1):
TTFT 29.01 i + 10.01, E2E 29.01 i + 30.01.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from cost.simulate.bedrock import BedrockSettings, simulate_bedrock
from cost.simulate.capacity import CapacityModel
from cost.simulate.fleet import SERVED, TIMED_OUT, run_fleet
from cost.simulate.scaling import Fixed
from cost.simulate.timeouts import FrontDoor, default_front_doors, front_doors, timeout_defaults
from engine_reference import step_by_step
from options.core import BadInput

ARRIVALS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 95.0]
PROMPT, ANSWER = 10_000, 2_001
MODEL = "meta.llama3-1-8b-instruct-v1:0"


def one_at_a_time() -> CapacityModel:
    return CapacityModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_kv_token_s=0.0, prefill_per_token_s=0.001,
                         max_num_seqs=1, max_num_batched_tokens=100_000, kv_cache_tokens=1_000_000,
                         max_model_len=None, request_overhead_s=0.0, source="one sequence at a time", fit={})


def serve(door: FrontDoor | None):
    a = np.array(ARRIVALS)
    run = run_fleet(a, np.full(len(a), PROMPT), np.full(len(a), ANSWER), one_at_a_time(), Fixed(1),
                    span_s=100.0, front_door=door)
    return run, run.first_token_s - a, run.finish_s - a


def test_sagemaker_fails_past_60_s_end_to_end_and_its_engine_keeps_working():
    """E2E 30.01, 59.02, then 88.03 ... > 60: requests 2-5 fail; the engine still serves each
    in turn, so the one at 95 s starts at 180.06 and fails too (E2E 115.07)."""
    run, ttft, e2e = serve(default_front_doors()["sagemaker"])
    assert run.status.tolist() == [SERVED, SERVED] + [TIMED_OUT] * 5
    assert e2e[:2] == pytest.approx([30.01, 59.02])
    assert e2e[6] == pytest.approx(30.01 * 7 - 95)                # the capacity stayed spent
    # the override changes the count: at 120 s requests 2, 3 and the last are within it
    run, _, _ = serve(FrontDoor(None, 120.0))
    assert run.status.tolist() == [SERVED] * 4 + [TIMED_OUT] * 2 + [SERVED]


def test_eks_drops_a_request_past_the_load_balancers_idle_timeout_with_its_first_token():
    """Without limits request 5 would wait 150 s for its first token (the case that once counted
    a 48-minute wait as served). Rung 6's load balancer closes a connection silent for 60 s; the
    byo server notices when it writes the first token: request 2's comes at 70.03 (68.03 s after
    it arrived), so it is dropped then and request 3 starts at once: each doomed request costs
    only its prefill. The freed engine serves the one at 95 s from 100.06 (request 5's prefill
    ends there): TTFT 15.07, E2E 35.07."""
    run, ttft, e2e = serve(None)
    assert ttft[5] == pytest.approx(29.01 * 5 + 10.01)             # 155.06 s: served, unlimited
    run, ttft, e2e = serve(default_front_doors("hpa")["eks"])
    assert run.status.tolist() == [SERVED, SERVED] + [TIMED_OUT] * 4 + [SERVED]
    assert int((run.status == TIMED_OUT).sum()) == 4
    assert np.isnan(e2e[2:6]).all()
    assert (ttft[6], e2e[6]) == pytest.approx((100.06 + 10.01 - 95, 100.06 + 30.01 - 95))
    # without the idle limit, the 300 s request timeout alone lets every one through
    run, _, e2e = serve(front_doors(["eks.ttft=none"])["eks"])
    assert (run.status == SERVED).all() and e2e.max() < 300


def test_ray_serve_drops_timed_out_requests_where_they_wait():
    """Serve cancels a request wherever it is: requests 3-5 (deadlines 63-65 s) leave the queue
    at the boundary of request 2's prefill step (70.03 s), unprefilled, and the engine is idle
    when the one at 95 s comes: it starts at once."""
    run, ttft, e2e = serve(default_front_doors("ray-serve")["eks"])
    assert run.status.tolist() == [SERVED, SERVED] + [TIMED_OUT] * 4 + [SERVED]
    assert (ttft[6], e2e[6]) == pytest.approx((10.01, 30.01))


def test_a_request_timed_out_while_decoding_frees_its_slot_at_the_next_step():
    """Two sequences at once: A and B (at 0 s) prefill together in one 20.01 s step and would
    decode until 40.01 s; C (at 15 s) waits for a slot. With an E2E limit of 30 s the engine
    drops A and B at the first step boundary at or after 30 s (999 decode steps of 10 ms after
    20.01: 30.00) and C starts there: first token 30.11, done 30.21. An engine that keeps
    working (SageMaker's) starts C only at 40.01."""
    cap = CapacityModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_kv_token_s=0.0, prefill_per_token_s=0.001,
                        max_num_seqs=2, max_num_batched_tokens=100_000, kv_cache_tokens=1_000_000,
                        max_model_len=None, request_overhead_s=0.0, source="two at a time", fit={})

    def run(stops: str):
        return run_fleet(np.array([0.0, 0.0, 15.0]), np.array([10_000, 10_000, 100]), np.array([2_001, 2_001, 11]),
                         cap, Fixed(1), span_s=20.0, front_door=FrontDoor(None, 30.0, stops))

    for stops in ("at_next_token", "at_next_step"):
        r = run(stops)
        assert r.status.tolist() == [TIMED_OUT, TIMED_OUT, SERVED]
        assert (r.first_token_s[2], r.finish_s[2]) == pytest.approx((30.11, 30.21), abs=1e-6)
    r = run("no")
    assert r.status.tolist() == [TIMED_OUT, TIMED_OUT, SERVED]
    assert (r.first_token_s[2], r.finish_s[2]) == pytest.approx((40.12, 40.22), abs=1e-6)


def test_a_request_held_for_a_first_replica_past_its_deadline_is_dropped_there():
    """Ray Serve from zero replicas: the first request (at 1 s) makes Serve start one at its
    first record (6 s), serving 100 s later (106 s). Its client left at 61 s (the 60 s idle
    limit), so it fails; the one at 50 s (deadline 110 s) is served by the new replica."""
    from cost.simulate.scaling import RayServe

    policy = RayServe(2, min_replicas=0, max_replicas=1, start_s=100.0)
    r = run_fleet(np.array([1.0, 50.0]), np.array([100, 100]), np.array([11, 11]), one_at_a_time(), policy,
                  span_s=200.0, front_door=default_front_doors("ray-serve")["eks"])
    assert r.status.tolist() == [TIMED_OUT, SERVED]
    assert r.first_token_s[1] == pytest.approx(106 + 0.01 + 0.1)


def test_bedrock_bills_the_requests_its_read_timeout_failed():
    """TTFT on Bedrock = 0.45 s + input / 20,000 tok/s: 0.95 s for 10,000 tokens, 1.95 s for
    30,000. With a 1.5 s read timeout the long prompts fail, and are billed all the same."""
    arrivals = np.array([0.0, 1.0, 2.0, 3.0])
    inputs = np.array([10_000, 30_000, 10_000, 30_000])
    outputs = np.array([100, 100, 100, 100])
    run = simulate_bedrock(arrivals, inputs, outputs, BedrockSettings(tpm=None, rpm=None),
                           front_door=front_doors(["bedrock=1.5"])["bedrock"])
    assert run.status.tolist() == [SERVED, TIMED_OUT, SERVED, TIMED_OUT]
    # a client on the unary Converse, with botocore's 60 s: 100 outputs at 80 tok/s fit, 8,001 do not
    run = simulate_bedrock(arrivals, inputs, np.array([100, 8_001, 100, 100]), BedrockSettings(tpm=None, rpm=None),
                           front_door=front_doors(["bedrock.e2e=60"])["bedrock"])
    assert run.status.tolist() == [SERVED, TIMED_OUT, SERVED, SERVED]


# --- the CLI ------------------------------------------------------------------------------------

@pytest.fixture
def files(tmp_path):
    trace = tmp_path / "long-prompts.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": int(t * 1000), "input_length": PROMPT,
                                         "output_length": ANSWER}) + "\n" for t in ARRIVALS))
    bench = tmp_path / "capacity.json"
    bench.write_text(json.dumps(one_at_a_time().to_json()))
    return ["--trace", str(trace), "--model", MODEL, "--instance", "g5.xlarge", "--bench", str(bench),
            "--min-instances", "1", "--max-instances", "1", "--json", "--no-progress"]


def simulate(capsys, *args):
    from cost.__main__ import main
    code = main(["simulate", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_each_rung_fails_at_its_own_front_door_and_the_flags_move_them(capsys, files):
    doc = simulate(capsys, *files, "--rungs", "3,6")
    rows = {r["level"]: r for r in doc["rungs"]}
    assert rows[3]["failures"] == {"timed_out": 5} and rows[3]["served"] == 2
    assert rows[6]["failures"] == {"timed_out": 4} and rows[6]["served"] == 3
    assert rows[3]["timeout"] == {"ttft_s": None, "e2e_s": 60, "engine_stops": "no", "timed_out_billed": False}
    assert rows[6]["timeout"]["ttft_s"] == 60 and rows[6]["timeout"]["e2e_s"] == 300
    assert any("rung 6: TTFT over 60 s or E2E over 300 s times out" in a for a in doc["assumptions"])
    doc = simulate(capsys, *files, "--rungs", "3,6", "--timeout-s", "sagemaker=120", "--timeout-s", "eks.ttft=none")
    rows = {r["level"]: r for r in doc["rungs"]}
    assert rows[3]["failures"] == {"timed_out": 2} and rows[6]["failures"] == {}


def test_bedrock_bill_keeps_the_timed_out_requests_tokens(capsys, files, tmp_path):
    from cost.prices import load_prices

    trace = tmp_path / "two-sizes.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 100}) + "\n"
                             for t, n in ((0, 10_000), (1000, 30_000), (2000, 10_000))))
    doc = simulate(capsys, *files[:files.index("--model")], "--trace", str(trace), "--model", MODEL, "--instance",
                   "g5.xlarge", "--capacity", "1500", "--rungs", "1", "--timeout-s", "bedrock=1.5", "--json")
    row = doc["rungs"][0]
    assert row["failures"] == {"timed_out": 1} and row["served"] == 2
    price = load_prices().bedrock(MODEL)
    assert row["billed_input_tokens"] == 50_000 and row["billed_output_tokens"] == 300
    assert row["window_usd"] == pytest.approx((50_000 * price.input_per_million + 300 * price.output_per_million) / 1e6)


def test_when_no_rung_meets_the_slo_the_closest_candidate_is_named(capsys, files):
    """TTFT within 60 s for 99 %: rung 3 serves 2 of 7 in time, rung 6 3 of 7, each at its one
    instance, its ceiling."""
    doc = simulate(capsys, *files, "--rungs", "3,6", "--slo-ttft-ms", "60000")
    assert doc["cheapest_meeting_slo"] is None
    closest = doc["closest_to_slo"]
    assert [c["levels"] for c in closest] == [[6], [3]]
    assert closest[0]["slo_attainment"] == pytest.approx(3 / 7, abs=1e-5)
    assert closest[0]["setting"]["max"] == 1 and closest[0]["replicas_reached"] == 1 and closest[0]["at_ceiling"]
    assert closest[0]["failures"] == {"timed_out": 4}
    from cost.__main__ import main
    assert main(["simulate", *[a for a in files if a != "--json"], "--rungs", "3,6", "--slo-ttft-ms", "60000"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "closest, rung 6: 42.9% of requests within the SLO" in text
    assert "waiting/replica 0.5, 1-1: reached 1 = its ceiling, so a higher --max-instances may meet it" in text
    # a looser SLO that rung 6 meets: no closest
    doc = simulate(capsys, *files, "--rungs", "6", "--slo-ttft-ms", "60000", "--slo-attainment", "0.4")
    assert doc["cheapest_meeting_slo"] == 6 and doc["closest_to_slo"] is None


@pytest.mark.parametrize("pair, message", [
    ("eks=30", "name one: eks.ttft=SECONDS"),
    ("3=30", "rungs 2-5 are one SageMaker real-time endpoint limit"),
    ("sagemaker.idle=30", "the limit is ttft or e2e"),
    ("bedrock=-1", "must be seconds > 0, or none"),
    ("nonsense", "must be RUNG=SECONDS"),
])
def test_bad_timeouts_are_refused_naming_them(pair, message):
    with pytest.raises(BadInput, match=message):
        front_doors([pair])


def test_the_defaults_are_what_the_project_deploys():
    """The limits in the dated file are the ones rung 6's manifests render and rung 1's client sets."""
    import yaml

    from infra.eks.render import render
    from infra.eks.spec import EksSpec
    from options.bedrock.client import READ_TIMEOUT_S

    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0"
    doc = timeout_defaults()
    for engine in ("deployment", "rayservice"):
        docs = render(EksSpec(image=image, engine=engine)).documents()
        route = next(d for d in docs if d["kind"] == "HTTPRoute")
        assert route["spec"]["rules"][0]["timeouts"]["request"] == f"{doc['eks']['e2e_s']['value']}s"
        assert not any(d["kind"] == "Service" and d["spec"].get("type") == "LoadBalancer" for d in docs)
    serve = yaml.safe_load(next(d for d in docs if d["kind"] == "RayService")["spec"]["serveConfigV2"])
    assert "http_options" not in serve and doc["ray_serve"]["request_timeout_s"]["value"] is None
    assert doc["bedrock"]["ttft_s"]["value"] == READ_TIMEOUT_S
    for section in ("sagemaker", "eks", "ray_serve", "bedrock"):
        assert all(row["source"] for row in doc[section].values())


@pytest.mark.parametrize("stops", ["at_next_token", "at_next_step"])
def test_the_replicas_jumps_drop_requests_as_a_step_by_step_engine_does(stops):
    import random

    cap = CapacityModel(step_base_s=0.01, step_per_seq_s=0.0003, step_per_kv_token_s=2e-6,
                        prefill_per_token_s=2e-4, max_num_seqs=6, max_num_batched_tokens=300,
                        kv_cache_tokens=10 ** 9, max_model_len=None, request_overhead_s=0.0, source="test", fit={})
    rng = random.Random(11)
    arrivals = sorted(rng.uniform(0, 20) for _ in range(120))
    inputs = [rng.randint(1, 700) for _ in arrivals]
    outputs = [rng.randint(1, 120) for _ in arrivals]
    ttft, e2e = 2.0, 3.5
    ref_first, ref_last, ref_dropped = step_by_step(cap, arrivals, inputs, outputs, ttft, e2e,
                                                    stops == "at_next_step")
    run = run_fleet(np.array(arrivals), np.array(inputs), np.array(outputs), cap, Fixed(1), span_s=20.0,
                    front_door=FrontDoor(ttft, e2e, stops))
    a = np.array(arrivals)
    late = (ref_first - a > ttft) | (ref_last - a > e2e)
    assert 30 < ref_dropped.sum() < 60 and (~ref_dropped & ~late).sum() > 60      # both outcomes, often
    assert ((run.status == TIMED_OUT) == (ref_dropped | late)).all()
    kept = ~ref_dropped
    assert run.first_token_s[kept] == pytest.approx(ref_first[kept], rel=1e-9, abs=1e-9)
    assert run.finish_s[kept] == pytest.approx(ref_last[kept], rel=1e-9, abs=1e-9)
