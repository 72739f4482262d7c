"""The capacity model of one replica (cost.simulate.capacity): step semantics, the fit, the
throughput-only model, JSON, and reading files. Pure: no server."""
from __future__ import annotations

import json

import pytest

from cost.simulate.capacity import (CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS, COEFFICIENTS, MEASURED,
                                    CapacityModel, fit_capacity, load_capacity, point_terms, wave_terms)
from options.core import BadInput

LIMITS = {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "kv_cache_tokens": 2_097_152,
          "max_model_len": 1024}
# Roughly what the local tiny-model server measures (seconds).
TRUE = {"step_base_s": 1.1e-3, "step_per_seq_s": 5e-5, "step_per_kv_token_s": 1e-7,
        "prefill_per_token_s": 1.1e-5, "request_overhead_s": 4e-3}


def model(**changes) -> CapacityModel:
    return CapacityModel(**{**TRUE, **LIMITS, "source": "test", **changes})


def synthetic_points(truth: CapacityModel, noise: tuple[float, ...] = (0.0,)) -> list[dict]:
    """The points --profile capacity measures, with latencies the true model gives (times a
    deterministic noise factor cycling through ``noise``)."""
    points = [{"kind": "prefill", "prompt_tokens": p} for p in (16, 114, 228, 456, 912)]
    points += [{"kind": "decode", "requests": c, "prompt_tokens": 122, "output_tokens": 64}
               for c in (1, 2, 4, 8, 16, 32, 64)]
    points += [{"kind": "decode", "requests": c, "prompt_tokens": 610, "output_tokens": 64} for c in (1, 4, 16)]
    points.append({"kind": "mixed", "background_seqs": 8, "background_kv_tokens": 2600, "prompt_tokens": 456})
    coef = truth.coefficients()
    for n, p in enumerate(points):
        exact = sum(t * c for t, c in zip(point_terms(p, LIMITS), coef))
        p[MEASURED[p["kind"]]] = exact * (1 + noise[n % len(noise)])
    return points


# --- the step and its semantics ----------------------------------------------------------------

def test_step_time_is_the_sum_of_its_parts():
    m = model()
    assert m.step_s(8, 1000, 0) == pytest.approx(1.1e-3 + 8 * 5e-5 + 1000 * 1e-7)
    assert m.step_s(1, 500, 500) == pytest.approx(1.1e-3 + 5e-5 + 500 * 1e-7 + 500 * 1.1e-5)


def test_an_idle_ttft_is_the_overhead_plus_the_prefill_steps_chunked_by_the_budget():
    m = model()
    assert m.idle_ttft_s(500) == pytest.approx(4e-3 + m.step_s(1, 500, 500))
    # 5,000 prompt tokens with 2,048 a step: three steps, the cache growing by each chunk.
    expected = 4e-3 + m.step_s(1, 2048, 2048) + m.step_s(1, 4096, 2048) + m.step_s(1, 5000, 904)
    assert m.idle_ttft_s(5000) == pytest.approx(expected)


def test_a_burst_shares_the_prefill_budget_then_decodes_together():
    # Three 1,000-token prompts at once with 2,048 tokens a step: step 1 prefills the first two and
    # 48 tokens of the third (chunked prefill), step 2 the third's other 952 beside the first two's
    # decode. The first two's first token comes out of step 1, the third's out of step 2.
    ttft, per_token = wave_terms(3, 1000, 3, 2048, 128)
    step1 = [1, 3, 2048, 2048, 0]
    step2 = [1, 3, 1001 + 1001 + 1000, 952, 0]
    step3 = [1, 3, 1002 + 1002 + 1001, 0, 0]
    assert ttft[0] == [a + b for a, b in zip(step1, [0, 0, 0, 0, 1])]      # + the overhead term
    assert ttft[2] == [a + b + c for a, b, c in zip(step1, step2, [0, 0, 0, 0, 1])]
    # Request 0's two later tokens come out of steps 2 and 3.
    assert per_token[0] == pytest.approx([(a + b) / 2 for a, b in zip(step2, step3)])


def test_max_num_seqs_holds_a_burst_back():
    ttft, _ = wave_terms(3, 10, 2, 2048, 2)
    # The third request waits until one of the first two finishes (after 2 steps).
    assert ttft[2][0] == 3


def test_saturated_throughput_follows_the_binding_limit():
    m = model(step_per_kv_token_s=0.0, prefill_per_token_s=0.0)
    # Nothing binds but max_num_seqs: 128 sequences a step.
    assert m.saturated_output_tok_s(100, 100) == pytest.approx(128 / m.step_s(128, 0, 0))
    # The KV cache binds: 10,000 tokens hold 5 requests of 1,000 + 1,000.
    small = model(kv_cache_tokens=10_000, step_per_kv_token_s=0.0, prefill_per_token_s=0.0)
    assert small.saturated_output_tok_s(1000, 1000) == pytest.approx(5 / small.step_s(5, 0, 0))
    # The token budget binds: 2,048 tokens a step, each sequence needing 1 + 20 (20:1 in:out).
    tight = model(step_per_kv_token_s=0.0, prefill_per_token_s=0.0)
    batch = 2048 / 21
    assert tight.saturated_output_tok_s(1000, 50) == pytest.approx(batch / tight.step_s(batch, 0, 0))


# --- the fit -------------------------------------------------------------------------------------

def test_the_fit_recovers_the_coefficients_its_points_were_made_from():
    truth = model()
    fitted = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth)}, "synthetic.json")
    for name in COEFFICIENTS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fitted.fit["within_tolerance"] and fitted.fit["rms_residual"] < 1e-9
    assert {p["kind"] for p in fitted.fit["points"]} == {"prefill", "decode", "mixed"}
    assert all(abs(p["residual"]) < 1e-9 for p in fitted.fit["points"])
    assert fitted.source == "bench synthetic.json (fitted from 16 points)"
    assert (fitted.max_num_seqs, fitted.kv_cache_tokens, fitted.max_model_len) == (128, 2_097_152, 1024)


def test_the_fit_with_noise_stays_close_and_reports_its_residuals():
    truth = model()
    noise = (0.04, -0.03, 0.02, -0.04, 0.0, 0.03, -0.02)
    fitted = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth, noise)}, "noisy")
    assert fitted.step_base_s + fitted.step_per_seq_s == pytest.approx(truth.step_base_s + truth.step_per_seq_s, rel=0.1)
    assert fitted.prefill_per_token_s == pytest.approx(truth.prefill_per_token_s, rel=0.15)
    assert fitted.request_overhead_s == pytest.approx(truth.request_overhead_s, rel=0.15)
    assert fitted.fit["check"]["decode"]["ok"] and fitted.fit["check"]["prefill"]["ok"]
    assert 0 < fitted.fit["worst_residual"]["decode"] <= 0.1


def test_coefficients_are_kept_non_negative():
    # Decode steps that get faster with more KV would need a negative KV cost: it is held at 0.
    points = synthetic_points(model())
    for p in points:
        if p["kind"] == "decode" and p["prompt_tokens"] > 500:
            p["step_s"] *= 0.7
    fitted = fit_capacity({"limits": LIMITS, "points": points}, "odd")
    assert all(getattr(fitted, name) >= 0 for name in COEFFICIENTS)
    assert fitted.step_per_kv_token_s == 0


def saturation_point(truth: CapacityModel, slower: float = 1.0) -> dict:
    """The server saturated with a mix of 450-token prompts and 104-token answers, 128 running:
    its time per output token as ``truth`` gives it, times ``slower``."""
    point = {"kind": "saturation", "running_seqs": 128, "input_tokens": 450.0, "output_tokens": 104.0}
    exact = sum(t * c for t, c in zip(point_terms(point, LIMITS), truth.coefficients()))
    return {**point, "token_s": exact * slower, "output_tokens_per_second": 1 / (exact * slower)}


def test_the_saturation_point_is_the_batch_full_with_the_mix_and_agrees_with_the_model():
    truth = model()
    point = saturation_point(truth)
    # One step: 128 sequences, 128 x (450 + 52) KV tokens, 128 x 450 / 104 prompt tokens.
    step = truth.step_s(128, 128 * (450 + 52), 128 * 450 / 104)
    assert point["token_s"] == pytest.approx(step / 128)
    assert 1 / point["token_s"] == pytest.approx(truth.saturated_output_tok_s(450, 104))
    fitted = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth) + [point]}, "s")
    for name in COEFFICIENTS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert "saturation point weighted" in fitted.fit["method"]


def test_a_slower_saturation_pulls_the_fitted_capacity_to_it():
    # Bursts of short prompts say one capacity; the server saturated with the trace's mix
    # measured 25 % less. The fit follows the measurement of capacity itself.
    truth = model()
    plain = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth)}, "p")
    point = saturation_point(truth, slower=1.25)
    pulled = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth) + [point]}, "s")
    measured = point["output_tokens_per_second"]
    assert plain.saturated_output_tok_s(450, 104) == pytest.approx(1.25 * measured, rel=1e-6)
    assert pulled.saturated_output_tok_s(450, 104) == pytest.approx(measured, rel=0.08)
    assert abs(pulled.fit["worst_residual"]["saturation"]) < 0.08
    bad = {**point, "running_seqs": 0}
    with pytest.raises(BadInput, match=r"\(saturation\) needs running_seqs >= 1"):
        fit_capacity({"limits": LIMITS, "points": synthetic_points(truth) + [bad]}, "x")


def steady_point(truth: CapacityModel, decoding: float, kv: float, prefill_per_s: float,
                 faster: float = 1.0) -> dict:
    """Requests decoding beside ``decoding`` sequences that hold ``kv`` KV tokens while prompts
    are prefilled at ``prefill_per_s``: their time per output token as ``truth`` gives it (each
    step carries ``prefill_per_s`` × the step of prompt), divided by ``faster``."""
    decode = truth.step_s(decoding, kv, 0)
    tpot = decode / (1 - truth.prefill_per_token_s * prefill_per_s) / faster
    return {"kind": "steady", "decoding_seqs": decoding, "kv_tokens": kv, "prefill_tokens_per_s": prefill_per_s,
            "tpot_s": tpot}


def test_steady_points_agree_with_the_model_and_pull_the_fit_to_them():
    truth = model()
    steady = [steady_point(truth, b, b * 500, 20 * b * 45) for b in (5, 10, 20, 30)]
    for point in steady:          # the row's terms reproduce the step semantics exactly
        assert sum(t * c for t, c in zip(point_terms(point, LIMITS), truth.coefficients())) == \
            pytest.approx(point["tpot_s"])
    exact = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth) + steady}, "s")
    for name in COEFFICIENTS:
        assert getattr(exact, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert "each steady group as 3 points" in exact.fit["method"]
    # The server decodes 15 % faster at a steady load than its bursts say: the fit moves toward
    # the steady points (weighted 3 each), and says how far each is off.
    faster = [steady_point(truth, b, b * 500, 20 * b * 45, faster=1.15) for b in (5, 10, 20, 30)]
    plain = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth)}, "p")
    pulled = fit_capacity({"limits": LIMITS, "points": synthetic_points(truth) + faster}, "s")
    at_ten = [p for p in pulled.fit["points"] if p["kind"] == "steady"][1]
    plain_at_ten = sum(t * c for t, c in zip(point_terms(faster[1], LIMITS), plain.coefficients()))
    assert abs(at_ten["residual"]) < abs(plain_at_ten / faster[1]["tpot_s"] - 1) / 2
    with pytest.raises(BadInput, match=r"\(steady\) needs decoding_seqs >= 1"):
        fit_capacity({"limits": LIMITS, "points": synthetic_points(truth) + [{**steady[0], "decoding_seqs": 0.5}]}, "x")
    with pytest.raises(BadInput, match=r"\(steady\) has no number 'prefill_tokens_per_s'"):
        fit_capacity({"limits": LIMITS, "points": synthetic_points(truth)
                      + [{k: v for k, v in steady[0].items() if k != "prefill_tokens_per_s"}]}, "x")


def test_a_profile_without_prefill_or_decode_points_is_bad_input():
    decode_only = [p for p in synthetic_points(model()) if p["kind"] == "decode"]
    with pytest.raises(BadInput, match="needs prefill and decode points"):
        fit_capacity({"limits": LIMITS, "points": decode_only}, "x")
    broken = synthetic_points(model())
    del broken[3]["ttft_s"]
    with pytest.raises(BadInput, match=r"points\[3\] \(prefill\) has no number 'ttft_s'"):
        fit_capacity({"limits": LIMITS, "points": broken}, "x")
    with pytest.raises(BadInput, match="limits has no 'kv_cache_tokens'"):
        fit_capacity({"limits": {k: v for k, v in LIMITS.items() if k != "kv_cache_tokens"},
                      "points": synthetic_points(model())}, "x")


# --- from a throughput alone ---------------------------------------------------------------------

@pytest.mark.parametrize("tok_s", [150.0, 1500.0, 12_000.0])
def test_from_throughput_hits_its_tokens_per_second_at_the_chat_mix(tok_s):
    m = CapacityModel.from_throughput(tok_s, f"--capacity {tok_s:g}")
    assert m.saturated_output_tok_s(CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS) == pytest.approx(tok_s)
    assert (m.max_num_seqs, m.max_num_batched_tokens) == (256, 8192)
    assert m.source.startswith(f"--capacity {tok_s:g}") and "defaults for a GPU replica" in m.source
    assert "max_num_seqs 256" in m.source and "8,192" in m.source
    assert m.request_overhead_s == pytest.approx(3e-3)          # the overhead is not scaled


def test_from_throughput_refuses_a_non_positive_figure():
    with pytest.raises(BadInput, match="must be a number > 0"):
        CapacityModel.from_throughput(0, "--capacity 0")


# --- JSON and files ------------------------------------------------------------------------------

def test_to_json_and_back_is_the_same_model():
    fitted = fit_capacity({"limits": LIMITS, "points": synthetic_points(model())}, "rt")
    doc = json.loads(json.dumps(fitted.to_json()))
    assert doc["schema"] == "spectrum.capacity/1"
    again = CapacityModel.from_json(doc)
    assert again == fitted and again.fit == fitted.fit and again.source == fitted.source
    plain = CapacityModel.from_throughput(900, "--capacity 900")
    assert CapacityModel.from_json(plain.to_json()) == plain


def test_invalid_values_are_bad_input_naming_the_field():
    with pytest.raises(BadInput, match="step_per_seq_s = -1"):
        model(step_per_seq_s=-1)
    with pytest.raises(BadInput, match="max_num_seqs = 0"):
        model(max_num_seqs=0)


def _bench_doc(**extra) -> dict:
    return {"schema": "spectrum.bench/1", "level": 5, "target": "local", "model": "tiny",
            "profile": {"concurrency": 64, "request_rate": None},
            "metrics": {"output_tokens_per_second": 5000.0}, "counts": {}, **extra}


def test_load_capacity_reads_a_bench_file_every_way(tmp_path):
    points = synthetic_points(model())
    profile = {"schema": "spectrum.capacity_profile/1", "limits": LIMITS, "points": points}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_bench_doc(capacity_profile=profile)))
    from_profile = load_capacity(path)                           # fitted on reading
    assert from_profile.step_base_s == pytest.approx(TRUE["step_base_s"], rel=1e-6)
    path.write_text(json.dumps(_bench_doc(capacity_profile=profile, capacity_model=from_profile.to_json())))
    from_model = load_capacity(path)                             # the stored model
    assert from_model.coefficients() == from_profile.coefficients()
    assert from_model.source == f"bench {path} (fitted from 16 points)"
    path.write_text(json.dumps(_bench_doc()))                    # an older bench: throughput only
    old = load_capacity(path)
    assert old.saturated_output_tok_s(CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS) == pytest.approx(5000)
    assert "concurrency 64" in old.source and "no capacity_profile" in old.source
    saved = tmp_path / "model.json"                              # a saved model alone
    saved.write_text(json.dumps(from_profile.to_json()))
    assert load_capacity(saved) == from_profile


def test_load_capacity_errors_name_the_file_and_what_is_missing(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(BadInput, match=r"nope\.json.*does not exist"):
        load_capacity(missing)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(BadInput, match=r"garbage\.json.*not readable JSON"):
        load_capacity(garbage)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/9"}))
    with pytest.raises(BadInput, match=r"other\.json.*neither a bench result.*'something/9'"):
        load_capacity(other)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**_bench_doc(), "metrics": {}}))
    with pytest.raises(BadInput, match=r"empty\.json has no 'capacity_model', 'capacity_profile'"):
        load_capacity(empty)
    partial = tmp_path / "partial.json"
    broken = model().to_json()
    del broken["step_base_s"]
    partial.write_text(json.dumps(_bench_doc(capacity_model=broken)))
    with pytest.raises(BadInput, match=r"partial\.json: capacity_model has no 'step_base_s'"):
        load_capacity(partial)
    no_limits = tmp_path / "no_limits.json"
    no_limits.write_text(json.dumps(_bench_doc(capacity_profile={"points": []})))
    with pytest.raises(BadInput, match=r"no_limits\.json: capacity_profile has no 'limits'"):
        load_capacity(no_limits)
