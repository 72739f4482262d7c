"""The metric maths on synthetic timings, and the traffic profile's determinism and arrivals."""
from __future__ import annotations

import json
import random
import statistics

import pytest

from options.bench.metrics import RequestRecord, percentile, summarize
from options.bench.profile import Profile, PromptTokens, parse_lengths
from options.bench.report import bench_json
from options.core import BadInput


def _record(ttft, itls, out, inp=10):
    return RequestRecord(ttft_s=ttft, itl_s=list(itls), e2e_s=ttft + sum(itls),
                         input_tokens=inp, output_tokens=out)


def test_summary_follows_the_vllm_definitions():
    recs = [_record(0.100, [0.010] * 9, out=10), _record(0.300, [0.020, 0.040], out=3),
            RequestRecord(error="http_503"), RequestRecord(error="timeout"),
            RequestRecord(error="http_503")]
    s = summarize(recs, duration_s=2.0)
    assert s.completed == 2 and s.errors == {"http_503": 2, "timeout": 1}
    assert (s.input_tokens, s.output_tokens) == (20, 13)
    assert s.output_tokens_per_second == pytest.approx(13 / 2.0)     # output tokens only
    assert s.requests_per_second == pytest.approx(1.0)
    # E2E = TTFT + Σ ITL per request
    assert s.e2e_ms["mean"] == pytest.approx(((0.1 + 0.09) + (0.3 + 0.06)) / 2 * 1000)
    # TPOT = (E2E - TTFT) / (out - 1): 10 ms and 30 ms
    assert s.tpot_ms["mean"] == pytest.approx(20.0) and s.tpot_ms["p50"] == pytest.approx(20.0)
    # ITL pools every gap: nine of 10 ms, one of 20, one of 40
    assert s.itl_ms["mean"] == pytest.approx((90 + 20 + 40) / 11)
    assert s.itl_ms["p50"] == pytest.approx(10.0)
    assert s.ttft_ms["p90"] == pytest.approx(100 + 0.9 * 200)


def test_single_token_answers_have_no_tpot_and_empty_runs_have_no_latency():
    s = summarize([_record(0.05, [], out=1)], duration_s=1.0)
    assert s.tpot_ms == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert s.e2e_ms["p99"] == pytest.approx(50.0)
    s = summarize([RequestRecord(error="connection")], duration_s=1.0)
    assert s.completed == 0 and s.output_tokens_per_second == 0 and s.ttft_ms["mean"] is None
    with pytest.raises(ValueError):
        summarize([], duration_s=0)


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    rng = random.Random(3)
    for n in (1, 2, 7, 100):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None


def _profile(**kw):
    base = dict(requests=200, prompt_tokens=parse_lengths("uniform:5:50", "--prompt-tokens", ()),
                output_tokens=parse_lengths("64", "--output-tokens", ()), concurrency=None,
                request_rate=10.0, seed=7)
    return Profile(**{**base, **kw})


def test_profile_is_reproducible_and_arrivals_have_the_asked_rate_and_burstiness():
    a, b = _profile().plan(), _profile().plan()
    assert a == b and _profile(seed=8).plan() != a
    assert all(out == 64 for _, _, out in a)
    assert all(5 <= len(p.split()) <= 50 for _, p, _ in a)
    assert len({p.split()[0] for _, p, _ in a}) == 200          # no two prompts share a prefix
    for burst in (1.0, 0.25, 4.0):
        times = [t for t, _, _ in _profile(requests=4000, burstiness=burst).plan()]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.1)
        # gamma(shape k): coefficient of variation 1/sqrt(k)
        cv = statistics.pstdev(gaps) / statistics.mean(gaps)
        assert cv == pytest.approx(burst ** -0.5, rel=0.15)
    assert all(t == 0 for t, _, _ in _profile(request_rate=None, concurrency=4).plan())


def test_jsonl_lengths_and_bad_specs(tmp_path):
    f = tmp_path / "traffic.jsonl"
    f.write_text('{"prompt": "one two three", "output_tokens": 5}\n\n{"prompt": "four", "output_tokens": 7}\n')
    out = parse_lengths(f"jsonl:{f}", "--output-tokens", ("output_tokens", "max_tokens"))
    prompts = parse_lengths(f"jsonl:{f}", "--prompt-tokens", ("prompt_tokens",))
    p = Profile(3, prompts, out, concurrency=2)
    assert [(t, prompt, n) for t, prompt, n in p.plan()] == \
        [(0.0, "one two three", 5), (0.0, "four", 7), (0.0, "one two three", 5)]
    assert out.to_json() == {"kind": "jsonl", "path": str(f), "count": 2, "mean": 6.0}
    for spec, match in [("uniform:9:3", "LOW <= HIGH"), ("fixed:0", "at least 1"), ("gauss:3", "must be N"),
                        (f"jsonl:{tmp_path}/none.jsonl", "cannot be read")]:
        with pytest.raises(BadInput, match=match):
            parse_lengths(spec, "--output-tokens", ("output_tokens",))
    with pytest.raises(BadInput, match="give --concurrency, --request-rate"):
        Profile(1, out, out, concurrency=None)


def test_bench_json_has_the_interface_shape():
    s = summarize([_record(0.1, [0.01], out=2)], duration_s=1.0)
    doc = json.loads(json.dumps(bench_json(s, _profile(requests=1), level=5, target="local", model="m",
                                           started_at="2026-11-29T12:00:00+00:00")))
    assert set(doc) == {"schema", "level", "target", "model", "profile", "metrics", "counts",
                        "started_at", "duration_s"}
    assert doc["schema"] == "spectrum.bench/1"
    assert set(doc["profile"]) == {"requests", "concurrency", "request_rate", "burstiness",
                                   "prompt_tokens", "output_tokens", "seed"}
    assert set(doc["metrics"]) == {"output_tokens_per_second", "requests_per_second",
                                   "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}
    assert all(set(doc["metrics"][k]) == {"mean", "p50", "p90", "p99"}
               for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"))
    assert set(doc["counts"]) == {"completed", "errors", "input_tokens", "output_tokens"}


def test_prompt_calibration_fits_the_targets_token_counts():
    t = PromptTokens.fit((16, 40), (96, 200))          # 2 tokens a word, 8 added per prompt
    assert (t.per_word, t.overhead) == (2.0, 8.0)
    assert t.words_for(208) == 100 and t.words_for(3) == 1
    p = _profile(requests=5, prompt_tokens=parse_lengths("108", "--prompt-tokens", ()))
    assert all(len(prompt.split()) == 50 for _, prompt, _ in p.plan(t))
    assert PromptTokens.fit((16, 5), (96, 5)) == PromptTokens()     # no signal: one word, one token
