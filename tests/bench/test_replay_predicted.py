"""The simulator's latency model proven against real replays (issue: traffic-true answers).

One bring-your-own server (vLLM on CPU, tiny model; the bench's shared one); a capacity profile
of it, then a 90-second slice of the Azure conversation trace replayed open-loop at each of three
offered loads (about 50 %, 90 % and 130 % of capacity), each re-predicted by ``cost simulate
--predict-replay`` from its profile. A profile ends by saturating the server with the replay's
own request mix (``--replay`` on the profile: the same window and clipping), the fit's measure
of capacity itself, then by sending that mix at a steady 60 % and 85 % of it (the steady
points: the regime a replay below capacity meets).

A run that records (``$SPECTRUM_VALIDATION_OUT`` set: every figure is written there as JSON, the
tables of benchmarks/latency-model/README.md come from it) profiles the server right before each replay, since this
machine's speed moves between minutes and a prediction is judged against a measurement of the
same spell, and again right after it, which says how far the speed moved meanwhile (that
prediction is recorded beside, not judged). CI paces all three from the one profile the
bench's tests share (conftest.py's ``trace_profile``, taken with this mix and checked by
test_capacity_profile.py): what it asserts at 90 % is the prediction at the replay's own speed,
which an older profile does not move, and each profile is 50-190 s of a suite on a budget.

What is asserted is what the model must get right on a machine whose speed moves 2-3× between
minutes (FACTS §4): at half the profile's capacity, p50 TTFT and E2E within a factor of 2 of the
measurement, so a wrong step model (10× off) or a wrong queue (no batching) fails; at 130 % a
queue that grows in the prediction (its TTFT p90), and a measured TTFT no better than at 50 %. At 90 % a
capacity 10-20 % off (as much as this machine's speed moves between minutes) doubles the
queue: that ratio is recorded, not asserted, and benchmarks/latency-model/README.md reports it against the ±15 % /
±25 % goal. What is asserted there is the prediction at the speed the replay's own requests
decoded at (``at_replay_speed``): the queue and batching apart from the speed. Each profile and
replay makes prompts of its own run (the bench's run tag), so none finds the one before it in
the server's prefix cache.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench_profiles import profile_with_trace_mix, replay_with_trace_mix
from cost.simulate.capacity import group_by_batch
from options.bench.capacity import STEADY_LOADS

pytestmark = pytest.mark.engine
LOADS = ("0.5", "0.9", "1.3")


def _run(*args, timeout=600):
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def validation(plain_server, trace_profile, tmp_path_factory):
    recording = bool(os.environ.get("SPECTRUM_VALIDATION_OUT"))
    folder = Path(os.environ.get("SPECTRUM_VALIDATION_OUT") or tmp_path_factory.mktemp("validation"))
    folder.mkdir(parents=True, exist_ok=True)
    results = {}
    server = plain_server

    def predict(replay: Path, bench: Path) -> dict:
        return json.loads(_run("cost", "simulate", "--predict-replay", str(replay), "--bench", str(bench),
                               "--json").stdout)

    for load in LOADS:
        bench, after = folder / f"capacity-{load}.json", folder / f"capacity-after-{load}.json"
        if recording:
            profile_with_trace_mix(server.url, bench)
        else:
            bench = trace_profile.path      # CI: the bench's shared profile paces all three
        replay = folder / f"replay-{load}.json"
        replay_with_trace_mix(server.url, load, bench, replay)
        results[load] = {"prediction": predict(replay, bench),
                         "replay": json.loads(replay.read_text())["replay"],
                         "capacity": json.loads(bench.read_text())}
        if recording:
            # The same server profiled again right after the replay: how far its speed moved
            # while the replay ran (recorded beside the prediction, which uses the profile before).
            profile_with_trace_mix(server.url, after)
            results[load]["after"] = predict(replay, after)
    if recording:
        shutil.copy(server.log_path, folder / "server.log")
    (folder / "validation.json").write_text(json.dumps(
        {load: {**r["prediction"], "replay_summary": r["replay"]["summary"],
                **({"profile_after": {k: r["after"][k] for k in ("predicted", "ratio", "saturated_output_tok_s")}}
                   if "after" in r else {})}
         for load, r in results.items()}, indent=2))
    for load, r in results.items():
        p, a = r["prediction"], r.get("after")
        band = p["sensitivity"]
        print(f"load {load} (saturated {p['saturated_output_tok_s']} tok/s before the replay"
              + (f", {a['saturated_output_tok_s']} after" if a else "") + "): " + "; ".join(
                  f"{m} {s} predicted {p['predicted'][m][s]}"
                  + (f" (profile after: {a['predicted'][m][s]})" if a else "")
                  + f" measured {p['measured'][m][s]:.1f} ratio {p['ratio'][m][s]}"
                  + (f" ({a['ratio'][m][s]})" if a else "")
                  + f" (capacity ±5 %: {band['predicted_faster'][m][s]}-{band['predicted_slower'][m][s]})"
                  + (f" (at the replay's speed x{p['at_replay_speed']['factor']}: {p['at_replay_speed']['ratio'][m][s]})"
                     if p["at_replay_speed"] else "")
                  for m in ("ttft_ms", "e2e_ms") for s in ("p50", "p99")))
    return results


def test_every_replay_was_sent_on_time_and_answered(validation):
    for load, r in validation.items():
        summary = r["replay"]["summary"]
        assert summary["lost"] == 0, load
        assert summary["failed"] == 0, load
        assert r["prediction"]["requests"] == summary["completed"], load


def test_each_profile_saturated_the_server_with_the_traces_mix_and_fits_it(validation):
    for load, r in validation.items():
        fit = r["capacity"]["capacity_model"]["fit"]
        (sat,) = [p for p in fit["points"] if p["kind"] == "saturation"]
        seqs = r["capacity"]["capacity_profile"]["limits"]["max_num_seqs"]
        # The batch was full, and stayed nearly so: on an AVX2 host emulating bfloat16 (a tenth of
        # the speed) the API server, sharing a core with the client, handed replacements on late
        # enough to hold it at 86 %.
        assert sat["running_seqs_max"] == seqs and sat["running_seqs"] >= 0.8 * seqs, (load, sat)
        assert sat["requests_failed"] == 0 and sat["requests_answered"] > 0, (load, sat)
        # the mix is the replay's: the same window and clipping, so the same mean sizes (the
        # prompts' as the server counted them, built from a words-to-tokens calibration)
        sent = r["replay"]["requests"]
        assert sat["output_tokens"] == pytest.approx(sum(q["output_tokens"] for q in sent) / len(sent))
        assert sat["input_tokens"] == pytest.approx(sum(q["input_tokens"] for q in sent) / len(sent), rel=0.03)
        # The fit holds it beside the steady points, which a spell of this machine can set 10-20 %
        # apart from it (7-12 % off in one run, 1-5 % in others).
        assert abs(sat["residual"]) < 0.2, (load, sat)


def test_each_profile_measured_the_steady_load_in_groups_by_batch(validation):
    for load, r in validation.items():
        fit = r["capacity"]["capacity_model"]["fit"]
        for share in STEADY_LOADS:
            steady = [p for p in fit["points"] if p["kind"] == "steady" and p["load"] == share]
            assert len(steady) >= 3, (load, share, steady)
            batches = [p["decoding_seqs"] for p in steady]
            assert batches == sorted(batches) and batches[-1] > batches[0], (load, share, batches)
            assert all(p["prefill_tokens_per_s"] > 0 for p in steady), (load, share, steady)
            # what a request's decode met grows with its batch: more sequences, more KV, longer steps
            assert steady[-1]["kv_tokens"] > steady[0]["kv_tokens"], (load, share, steady)
            assert steady[-1]["tpot_s"] > steady[0]["tpot_s"], (load, share, steady)
        # the higher load met the larger batches
        top = {share: max(p["decoding_seqs"] for p in fit["points"] if p.get("load") == share) for share in STEADY_LOADS}
        assert top[max(STEADY_LOADS)] > top[min(STEADY_LOADS)], (load, top)
        assert "each steady group as 3 points" in fit["method"]
        # each phase kept whole: its requests regroup into its points, and the server split their TTFT
        phases = r["capacity"]["capacity_profile"]["steady_phases"]
        assert [p["load"] for p in phases] == list(STEADY_LOADS), load
        for phase in phases:
            kept = phase["requests"]
            again = group_by_batch(kept["sent_s"], kept["ttft_s"], kept["e2e_s"], kept["input_tokens"],
                                   kept["output_tokens"])
            points = [p for p in fit["points"] if p["kind"] == "steady" and p["load"] == phase["load"]]
            assert [g["tpot_s"] for g in again] == pytest.approx([p["tpot_s"] for p in points], rel=1e-4), \
                (load, phase["load"])             # the same, to the kept rounding (µs)
            view = phase["server"]
            assert view["requests"] == len(kept["sent_s"]), (load, view)
            assert view["client_mean_ms"]["ttft"] > view["mean_ms"]["ttft"] > view["mean_ms"]["prefill"] > 0, view
        # One line through all of them. A spell of this machine moves one point (seen under load:
        # one group +0.32 in a phase otherwise at -0.17..0) or a whole phase (seen: a phase 15-44 %
        # slow), so each phase's median residual (its speed against the fit) has a looser bound
        # and each point must lie within 0.35 of the fit or of its phase's median: a form that
        # misses how TPOT follows the batch leaves points far from both.
        for share in STEADY_LOADS:
            residuals = sorted(p["residual"] for p in fit["points"] if p["kind"] == "steady" and p["load"] == share)
            offset = residuals[len(residuals) // 2]
            assert abs(offset) < 0.45, (load, share, residuals)
            assert all(min(abs(r), abs(r - offset)) < 0.35 for r in residuals), (load, share, residuals)


def test_at_half_capacity_the_prediction_is_within_a_factor_of_two_at_p50(validation):
    for load in ("0.5",):
        ratio = validation[load]["prediction"]["ratio"]
        for metric in ("ttft_ms", "e2e_ms"):
            assert 0.5 <= ratio[metric]["p50"] <= 2.0, (load, metric, validation[load]["prediction"])


def test_at_the_speed_the_replay_ran_at_the_queue_and_batching_predict_e2e(validation):
    """The server's speed moves between its profile and the replay (what the 90 % ratio above is
    left with); at the speed the replay's own requests decoded at, the rest of the model (queue,
    admission, batching) predicts E2E below capacity to the goal: p50 within 15 %, p99 within
    25 % (the 2026-12-04 recording: p50 0.995-1.058, p99 0.921-0.948), each widened by how far
    the replay's own speed moved inside it times how much that moves E2E at that load."""
    for load in ("0.5", "0.9"):
        prediction = validation[load]["prediction"]
        at_speed = prediction["at_replay_speed"]
        assert at_speed is not None and len(at_speed["groups"]) >= 3, (load, at_speed)
        for stat, goal in (("p50", 0.15), ("p99", 0.25)):
            bound = min(1.0, goal + e2e_sensitivity(prediction, stat) * replay_speed_spread(at_speed, stat))
            ratio = at_speed["ratio"]["e2e_ms"][stat]
            assert 1 / (1 + bound) <= ratio <= 1 + bound, (load, stat, bound, at_speed)


def replay_speed_spread(at_speed: dict, stat: str) -> float:
    """How far the replay's own speed moved within it, at most 0.3 (0 for a server that held its
    speed): the model's time per token over the measured one, per group of the replay's
    requests, against the one factor the prediction runs at.

    Two cuts are used, and the larger deviation counts:
    - By batch: a server whose speed depends on its batch otherwise than the profile's line says.
    - By send order (``over_time``): a spell of another process's CPU inside the replay (a noisy
      neighbour), which the batch groups mix with the rest.

    A median mixes the groups, so it moves by half the spread from the slowest group to the
    fastest. A p99 is set by the slowest (or fastest) sixth, which holds far more than 1 % of
    the requests, so it moves by that group's distance from the factor. Two full runs on
    2026-12-05 had a 50 % replay decode 2-3x slower for 3-4 s of its 17 s, with the second
    worker long done:
    - one at 8-12 s: its fourth sixth ran at 0.69 against a factor of 0.90, its slowest batch
      group at 0.77;
    - one at 0-3 s: its first sixth ran at 0.80 against 1.05.
    The E2E p99 came out at 0.61 and 0.55 of the prediction."""
    factor = at_speed["factor"]
    spreads = []
    for groups in (at_speed["groups"], at_speed.get("over_time") or []):
        factors = [g["model_over_measured"] for g in groups]
        if not factors:
            continue
        if stat == "p50":
            spreads.append((max(factors) / min(factors) - 1) / 2)
        else:
            spreads.append(max(factor / min(factors) - 1, max(factors) / factor - 1))
    return min(0.3, max(spreads))


def e2e_sensitivity(prediction: dict, stat: str) -> float:
    """How many per cent an E2E statistic moves for one per cent of server speed, at this load, by
    the prediction's own ±5 % band (at least 1). Near capacity a few per cent of speed decide how
    long the queue grows: 3.9 for p50 at 90 % on the AVX2 host (5.8 in the 2026-12-04 recording),
    where a replay of 2026-12-05 met batches of 24-96 sequences whose speeds the one factor missed
    by -10 to +3 % (E2E p50 1.247 at the replay's speed, 1.066 as profiled; another run 1.241); at
    50 % it is 1.7-2.2."""
    band = prediction["sensitivity"]
    spread = band["predicted_slower"]["e2e_ms"][stat] - band["predicted_faster"]["e2e_ms"][stat]
    return max(1.0, spread / prediction["predicted"]["e2e_ms"][stat] / (2 * band["capacity_change"]))


def test_overload_grows_a_queue(validation):
    """At 130 % the predicted queue grows through the replay: the later requests wait, so its
    TTFT p90 is many times the 50 % replay's. The p50 is not asked for: in a replay of 7-17 s
    the backlog reaches the median request only as far as the overload has run by then (one full
    run predicted 57 ms at p50 and 1,268 ms at p90 against 14 and 18.5 at 50 %)."""
    low, high = validation["0.5"]["prediction"], validation["1.3"]["prediction"]
    assert high["predicted"]["ttft_ms"]["p90"] > 5 * low["predicted"]["ttft_ms"]["p90"], (low, high)
    assert high["measured"]["ttft_ms"]["p50"] >= low["measured"]["ttft_ms"]["p50"], (low, high)
