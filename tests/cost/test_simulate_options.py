"""Rung 1's batch and Provisioned Throughput forms and rung 6 on spot nodes, worked by hand:
the PT's capacity throttling requests at known times and its whole-hour bill, batch at exactly
the batch price and refused by a TTFT SLO, spot interruptions failing what a node still holds at
reclaim, and the CLI's refusals."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cost.simulate.bedrock import THROTTLED, BedrockSettings, ProvisionedThroughput
from cost.simulate.capacity import CapacityModel
from cost.simulate.fleet import INTERRUPTED, SERVED, run_fleet
from cost.simulate.scaling import Fixed
from cost.traces import AZURE_CONV_TRACE

MODEL = "meta.llama3-1-8b-instruct-v1:0"
BASE = ["--trace", str(AZURE_CONV_TRACE), "--window", "0:600", "--model", MODEL, "--instance", "g5.xlarge",
        "--capacity", "1500", "--bedrock-tpm", "100000000", "--json"]


def cli(capsys, *args):
    from cost.__main__ import main
    code = main(["simulate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def simulate(capsys, *args) -> dict:
    code, out, err = cli(capsys, *BASE, *args)
    assert code == 0, err
    return json.loads(out)


def option(doc: dict, name: str) -> dict:
    return next(o for o in doc["rungs"][0]["options"] if o["option"] == name)


# --- Provisioned Throughput ------------------------------------------------------------------------

def test_provisioned_throughput_throttles_what_exceeds_its_units_in_a_minute():
    """1 unit of 1,000 tokens/min: three requests reserving 500 each in minute 0. The third is
    throttled at t = 3 s; its five retries back off at most 2 + 4 + 8 + 16 + 20 = 50 s, all still in
    minute 0, so it fails after 6 attempts. Two units hold all three."""
    pt = ProvisionedThroughput(unit_tpm=1_000, unit_usd_hour=20.0)
    arrivals, inputs, outputs = np.array([1.0, 2.0, 3.0]), np.array([400, 300, 400]), np.array([100, 200, 100])
    settings = BedrockSettings(tpm=10 ** 9, rpm=5, attempts=6)      # the PT replaces the on-demand quotas
    one = pt.run(arrivals, inputs, outputs, settings, units=1, seed=7)
    assert one.status.tolist() == [SERVED, SERVED, THROTTLED]
    assert one.throttle_events == 6
    assert one.throttle_times[0] == 3.0 and all(3.0 <= t <= 53.0 for t in one.throttle_times)
    two = pt.run(arrivals, inputs, outputs, settings, units=2, seed=7)
    assert two.status.tolist() == [SERVED] * 3 and two.throttle_events == 0
    assert pt.units_without_throttling(inputs, outputs, arrivals) == 2        # 1,500 tokens in minute 0


def test_provisioned_throughput_bills_every_started_hour_per_unit():
    pt = ProvisionedThroughput(unit_tpm=1_000, unit_usd_hour=21.18, term="1month")
    assert pt.window_usd(3, 3601.0) == pytest.approx(3 * 2 * 21.18)
    assert pt.window_usd(3, 3600.0) == pytest.approx(3 * 1 * 21.18)
    assert pt.monthly_usd(3, 730) == pytest.approx(3 * 730 * 21.18)
    assert pt.commitment_usd(3) == pytest.approx(3 * 730 * 21.18)
    assert ProvisionedThroughput(1_000, 21.18).commitment_usd(3) is None


def test_simulate_picks_the_least_units_that_meet_the_slo(capsys):
    pt = ["--rungs", "1", "--slo-e2e-ms", "40000", "--bedrock-pt-unit-tpm", "20000",
          "--bedrock-pt-unit-usd-hour", "20"]
    doc = simulate(capsys, *pt)
    chosen = option(doc, "provisioned_throughput")
    units = chosen["model_units"]
    assert 1 < units <= chosen["units_without_throttling"]
    assert chosen["meets_slo"] and chosen["slo_attainment"] >= 0.99
    assert chosen["window_usd"] == pytest.approx(units * 1 * 20)          # 600 s: one started hour
    assert chosen["monthly_usd"] == pytest.approx(units * 730 * 20)
    assert chosen["policy"]["capacity_tpm"] == units * 20000
    fewer = option(simulate(capsys, *pt, "--bedrock-pt-units", str(units - 1)), "provisioned_throughput")
    assert fewer["slo_attainment"] < 0.99 and fewer["throttled"] > chosen["throttled"]
    # The on-demand row is untouched by the options beside it.
    plain = simulate(capsys, "--rungs", "1", "--slo-e2e-ms", "40000")
    assert {k: v for k, v in doc["rungs"][0].items() if k != "options"} == plain["rungs"][0]


# --- batch -------------------------------------------------------------------------------------------

def test_batch_bills_half_of_on_demand_and_answers_within_the_window(capsys):
    from cost.prices import load_prices
    from cost.traces import read_trace

    doc = simulate(capsys, "--rungs", "1", "--bedrock-batch")
    batch, on_demand = option(doc, "batch"), doc["rungs"][0]
    trace = read_trace(AZURE_CONV_TRACE, window=(0, 600))
    price = load_prices().bedrock(MODEL)
    exact = (int(trace.input_tokens.sum()) * price.batch_input_per_million
             + int(trace.output_tokens.sum()) * price.batch_output_per_million) / 1e6
    assert batch["window_usd"] == pytest.approx(exact, rel=1e-12)
    assert on_demand["throttled"] == 0 and batch["window_usd"] == pytest.approx(on_demand["window_usd"] / 2)
    assert batch["throttled"] == 0 and batch["served"] == len(trace)
    assert batch["e2e_ms"]["p50"] == 86_400_000                  # the window's end, the worst case
    assert doc["cheapest_meeting_slo"] == 1 and doc["cheapest_bedrock_form"] == "batch"


def test_batch_is_left_out_with_a_ttft_slo_and_the_table_says_why(capsys):
    code, out, _ = cli(capsys, *BASE[:-1], "--rungs", "1", "--bedrock-batch", "--slo-ttft-ms", "3000")
    assert code == 0
    assert "batch left out: --slo-ttft-ms 3000" in " ".join(out.split())
    doc = simulate(capsys, "--rungs", "1", "--bedrock-batch", "--slo-ttft-ms", "3000")
    batch = option(doc, "batch")
    assert not batch["meets_slo"] and batch["slo_attainment"] == 0 and "--slo-ttft-ms 3000" in batch["excluded"]
    assert doc["cheapest_bedrock_form"] != "batch"


def test_batch_says_when_the_model_has_no_batch_price(capsys):
    base = [a if a != MODEL else "mistral.mistral-7b-instruct-v0:2" for a in BASE]
    code, out, err = cli(capsys, *base, "--rungs", "1", "--bedrock-batch")
    assert code == 0, err
    batch = option(json.loads(out), "batch")
    assert batch["window_usd"] is None and "no batch price for mistral.mistral-7b-instruct-v0:2" in batch["excluded"]


# --- spot ---------------------------------------------------------------------------------------------

def test_spot_without_interruptions_is_on_demand_at_the_spot_price(capsys):
    fleet = ["--rungs", "6", "--target-waiting", "2", "--max-instances", "4"]
    on_demand = simulate(capsys, *fleet)["rungs"][0]
    spot = simulate(capsys, *fleet, "--spot", "--spot-discount", "0.6", "--spot-interruptions-per-hour", "0")
    row = spot["rungs"][0]
    for key in ("served", "failed", "instance_hours", "ttft_ms", "e2e_ms", "replicas", "cold_starts"):
        assert row[key] == on_demand[key]
    fixed = on_demand["window_usd"] - on_demand["instance_hours"] * 1.006          # control plane + system nodes
    assert row["window_usd"] - fixed == pytest.approx(on_demand["instance_hours"] * 1.006 * 0.4, abs=2e-4)
    assert row["spot_interruptions"] == {"notices": 0, "requests_failed": 0, "replacements": 0}
    assert row["policy"]["spot"]["discount"] == 0.6 and row["policy"]["spot"]["interruptions_per_node_hour"] == 0
    assert "spot" not in on_demand["policy"]


def test_a_spot_notice_drains_the_node_replaces_it_and_fails_what_it_holds_at_reclaim():
    """Node 0 gets its notice at 100 s: it takes nothing more, a replacement launches (ready at
    100 + 30 s) and at 220 s EC2 reclaims node 0. The long request (50 s + 0.02 s prefill + 19,999
    steps of 10 ms ≈ 250 s) is still running then and fails; the short one finished at ~90 s; one
    arriving at 110 s waits for the replacement."""
    cap = CapacityModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_kv_token_s=0.0, prefill_per_token_s=0.001,
                        max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_tokens=1_000_000, max_model_len=None,
                        request_overhead_s=0.0, source="test", fit={})
    arrivals = np.array([50.0, 90.0, 110.0, 150.0])
    run = run_fleet(arrivals, np.array([10, 10, 10, 10]), np.array([20_000, 10, 10, 10]), cap,
                    Fixed(1, start_s=30.0), span_s=400.0, notice_s=120.0,
                    interruption_notice=lambda node, launched: 100.0 if node == 0 else math.inf)
    assert run.status.tolist() == [INTERRUPTED, SERVED, SERVED, SERVED]
    assert run.interruptions == [{"node": 0, "notice_s": 100.0, "reclaimed_s": 220.0, "replaced": True}]
    old, new = run.instances
    assert old.ended_s == 220.0 and (new.launched_s, new.ready_s) == (100.0, 130.0)
    assert run.first_token_s[2] == pytest.approx(130.0 + 0.01 + 10 * 0.001)     # waited for the replacement
    assert run.instance_seconds(400.0, 60.0) == pytest.approx(220.0 + 300.0)


def test_frequent_notices_on_an_autoscaled_fleet_reach_the_nodes_they_name(capsys):
    """Nodes the HPA launches together have equal fields; each notice must drain the node it
    names, not a twin (a twin's removal once lost a node from the fleet's lists mid-run)."""
    trace = [a if a != "0:600" else "0:1800" for a in BASE]
    code, out, err = cli(capsys, *trace, "--rungs", "6", "--target-waiting", "2", "--max-instances", "4",
                         "--spot", "--spot-discount", "0.6", "--spot-interruptions-per-hour", "20")
    assert code == 0, err
    row = json.loads(out)["rungs"][0]
    assert row["spot_interruptions"]["notices"] >= 10
    assert row["spot_interruptions"]["replacements"] >= 1
    assert row["served"] + row["failed"] == json.loads(out)["trace"]["requests"]


# --- refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--bedrock-pt-unit-tpm", "-5", "--bedrock-pt-unit-usd-hour", "20"], "--bedrock-pt-unit-tpm -5"),
    (["--bedrock-pt-unit-tpm", "5000", "--bedrock-pt-unit-usd-hour", "0"], "--bedrock-pt-unit-usd-hour 0"),
    (["--bedrock-pt-unit-tpm", "5000", "--bedrock-pt-unit-usd-hour", "20", "--bedrock-pt-units", "0"],
     "--bedrock-pt-units 0"),
    (["--bedrock-pt-units", "2"], "without --bedrock-pt-unit-tpm and --bedrock-pt-unit-usd-hour"),
    (["--bedrock-batch", "--rungs", "6"], "add 1 to --rungs"),
    (["--spot"], "--spot needs --spot-discount and --spot-interruptions-per-hour"),
    (["--spot", "--spot-discount", "1.5", "--spot-interruptions-per-hour", "0"], "--spot-discount 1.5"),
    (["--spot", "--spot-discount", "0.5", "--spot-interruptions-per-hour", "-1"], "--spot-interruptions-per-hour -1"),
    (["--spot-discount", "0.5"], "add --spot"),
    (["--spot", "--spot-discount", "0.5", "--spot-interruptions-per-hour", "0", "--rungs", "1"], "add 6 to --rungs"),
])
def test_bad_option_values_exit_2_naming_them(capsys, args, message):
    code, _, err = cli(capsys, *BASE[:-1], *args)
    assert code == 2
    assert message in " ".join(err.split()) and "Traceback" not in err
