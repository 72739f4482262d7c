"""A trace's shared prompt blocks (Mooncake's ``hash_ids``) as each replica's prefix cache sees
them: hits are the leading blocks that replica has computed and still holds, counted as vLLM's
prefix_cache_hits / queries are; prompts prefilled side by side do not share; a flat
--prefix-cache-hit-rate cannot be given beside them. Simulation and the real CLI: no server."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from cost_cli import cost, cost_json

from cost.simulate.capacity import CapacityModel
from cost.simulate.fleet import SERVED, run_fleet
from cost.simulate.prefix import PrefixBlocks, PrefixCache, prefix_of
from cost.simulate.scaling import Fixed
from cost.traces import read_trace
from options.core import BadInput

BLOCK = 512
ROOMY = CapacityModel(step_base_s=5e-3, step_per_seq_s=1e-4, step_per_kv_token_s=1e-8, prefill_per_token_s=2e-5,
                      max_num_seqs=64, max_num_batched_tokens=8192, kv_cache_tokens=1_000_000, max_model_len=None,
                      request_overhead_s=2e-3, source="test")
SESSIONS, TURNS = 4, 6


def chat_sessions(path, gap_ms: int = 3000):
    """Multi-turn chats as Mooncake lines: turn k of a session re-sends its k earlier blocks and adds
    one (prompt (k + 1) × 512 tokens), sessions interleaved, one request every ``gap_ms``."""
    lines, t = [], 0
    for turn in range(TURNS):
        for session in range(SESSIONS):
            ids = [session * 1000 + b for b in range(turn + 1)]
            lines.append(json.dumps({"timestamp": t, "input_length": (turn + 1) * BLOCK, "output_length": 20,
                                     "hash_ids": ids}))
            t += gap_ms
    path.write_text("\n".join(lines) + "\n")
    return path


def expected_hits() -> tuple[int, int]:
    """(hit, queried) tokens with one replica that forgets nothing: turn k hits its k earlier blocks."""
    queried = SESSIONS * sum((k + 1) * BLOCK for k in range(TURNS))
    hit = SESSIONS * sum(k * BLOCK for k in range(TURNS))
    return hit, queried


def simulate(trace, capacity=ROOMY, replicas=1, prefix=True, routing="random"):
    return run_fleet(trace.arrival_s, trace.input_tokens, trace.output_tokens, capacity, Fixed(replicas),
                     span_s=trace.span_s, prefix=prefix_of(trace, BLOCK) if prefix else None, routing=routing)


def test_a_cache_hits_the_leading_run_it_holds_and_never_the_last_token():
    cache = PrefixCache(PrefixBlocks([(1, 2, 3), (1, 2, 9), (7, 2, 3), (1, 2)], BLOCK))
    assert cache.admit(0, 3 * BLOCK) == 0                  # nothing computed yet
    cache.store(0)
    cache.release(0)
    assert cache.admit(1, 3 * BLOCK) == 2 * BLOCK          # 1, 2 held; 9 not
    assert cache.admit(2, 3 * BLOCK) == 0                  # a different first block: no run
    assert cache.admit(3, 2 * BLOCK) == 2 * BLOCK - 1      # all of it held: the last token is computed
    assert (cache.hit, cache.queried) == (4 * BLOCK - 1, 11 * BLOCK)


def test_the_least_recently_used_free_blocks_go_and_blocks_in_use_stay():
    cache = PrefixCache(PrefixBlocks([(1, 2), (3, 4), (1, 2), (5, 6)], BLOCK))
    for request in (0, 1):
        cache.admit(request, 2 * BLOCK)
        cache.store(request)
        cache.release(request)
    cache.fit(3 * BLOCK)                                   # room for three of the four
    assert cache.admit(2, 2 * BLOCK) == 0                  # block 1, the oldest, went
    cache.store(2)                                         # 1 and 2 again, in use by request 2
    cache.fit(0)                                           # no room: every free block goes ...
    assert list(cache.lru) == [1, 2]                       # ... but not those a running request uses
    cache.release(2)
    cache.fit(0)
    assert not cache.lru and cache.free_cached == 0


def test_one_replica_serves_every_later_turn_its_earlier_blocks(tmp_path):
    trace = read_trace(chat_sessions(tmp_path / "chats.jsonl"))
    reused, fresh = simulate(trace), simulate(trace, prefix=False)
    hit, queried = expected_hits()
    assert reused.prefix_cache == {"queried_tokens": queried, "hit_tokens": hit, "hit_rate": round(hit / queried, 4)}
    assert fresh.prefix_cache is None
    assert (reused.status == SERVED).all() and (fresh.status == SERVED).all()
    ttft, plain = reused.first_token_s - trace.arrival_s, fresh.first_token_s - trace.arrival_s
    first_turns = np.arange(len(trace)) < SESSIONS
    assert np.allclose(ttft[first_turns], plain[first_turns])          # nothing to reuse yet
    # a later turn computes one block, not k + 1, so its first token comes sooner
    assert (ttft[~first_turns] < plain[~first_turns]).all()
    last = len(trace) - 1
    assert ttft[last] == pytest.approx(2e-3 + ROOMY.step_s(1, TURNS * BLOCK, BLOCK), rel=1e-6)


def test_each_replica_has_its_own_cache_and_a_small_cache_forgets(tmp_path):
    trace = read_trace(chat_sessions(tmp_path / "chats.jsonl"))
    one = simulate(trace).prefix_cache["hit_rate"]
    spread = simulate(trace, replicas=3).prefix_cache["hit_rate"]     # random routing splits sessions
    assert spread < one
    # a KV cache of six blocks: a session's earlier turns are gone before it comes back
    assert simulate(trace, capacity=dataclasses.replace(ROOMY, kv_cache_tokens=6 * BLOCK)).prefix_cache["hit_rate"] < one


def test_prompts_prefilled_side_by_side_do_not_share(tmp_path):
    path = tmp_path / "twins.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 4 * BLOCK, "output_length": 5,
                                        "hash_ids": [1, 2, 3, 4]}) + "\n" for _ in range(2)))
    run = simulate(read_trace(path))
    assert run.prefix_cache["hit_tokens"] == 0             # the second was admitted before the first was computed


def test_a_flat_rate_beside_the_traces_blocks_is_refused(tmp_path):
    trace = read_trace(chat_sessions(tmp_path / "chats.jsonl"))
    with pytest.raises(BadInput, match=r"would count them twice"):
        simulate(trace, capacity=ROOMY.with_prefix_cache(0.5))
    with pytest.raises(BadInput, match=r"--block-tokens 0 must be a whole number >= 1"):
        prefix_of(trace, 0)


def test_predict_and_simulate_report_the_hits_of_a_trace_with_blocks(tmp_path):
    chats = str(chat_sessions(tmp_path / "chats.jsonl"))
    bench = tmp_path / "cap.json"
    bench.write_text(json.dumps(ROOMY.to_json()))
    hit, queried = expected_hits()
    predicted = cost_json("predict", "--trace", chats, "--bench", str(bench))
    assert predicted["prefix_cache"]["hit_rate"] == round(hit / queried, 4)
    # at half the block size, the same ids stand for half the tokens
    halved = cost_json("predict", "--trace", chats, "--bench", str(bench), "--block-tokens", "256")
    assert halved["prefix_cache"]["hit_tokens"] == hit // 2
    simulated = cost_json("simulate", "--trace", chats, "--model", "meta.llama3-1-8b-instruct-v1:0", "--instance",
                          "ml.g5.xlarge", "--bench", str(bench), "--rungs", "3", "--no-progress",
                          "--slo-ttft-ms", "2000", "--slo-e2e-ms", "60000")
    assert simulated["rungs"][0]["prefix_cache"]["hit_rate"] == round(hit / queried, 4)
    table = cost("simulate", "--trace", chats, "--model", "meta.llama3-1-8b-instruct-v1:0", "--instance",
                 "ml.g5.xlarge", "--bench", str(bench), "--rungs", "3", "--no-progress", "--slo-ttft-ms", "2000",
                 "--slo-e2e-ms", "60000")
    assert table.returncode == 0 and f"rung 3 {hit / queried:.1%}" in table.stdout
    done = cost("predict", "--trace", chats, "--bench", str(bench), "--prefix-cache-hit-rate", "0.3")
    assert done.returncode == 2 and "would count them twice" in done.stderr and "Traceback" not in done.stderr


def test_the_search_bounds_its_floors_by_the_most_reuse_the_blocks_allow(tmp_path):
    chats = str(chat_sessions(tmp_path / "chats.jsonl"))
    hit, queried = expected_hits()
    args = ("recommend", "--trace", chats, "--model", "meta.llama3-1-8b-instruct-v1:0", "--hf-model",
            "meta-llama/Llama-3.1-8B-Instruct", "--instances", "g6e", "--slo-ttft-ms", "3000", "--slo-e2e-ms",
            "60000", "--no-progress")
    found = cost_json(*args)["search"]
    # one cache that forgets nothing serves every later turn its earlier blocks: the bound is exact here
    assert found["prefix_reuse_bound"] == round(hit / queried, 4)
    assert found["best"]["status"] == "simulated" and "prompt blocks allow" in found["note"]
    done = cost(*args, "--prefix-cache-hit-rate", "0.2")
    assert done.returncode == 2 and "would count them twice" in done.stderr


def test_the_gateways_affinity_keeps_each_session_on_its_replica_and_its_hits_with_it(tmp_path):
    """Three replicas: random routing scatters a session's turns and their hits; the gateway's
    affinity (its session the first prompt block) sends each session to one replica, which then
    serves every later turn its earlier blocks, as one replica did."""
    trace = read_trace(chat_sessions(tmp_path / "chats.jsonl"))
    one = simulate(trace).prefix_cache["hit_rate"]
    assert simulate(trace, replicas=3, routing="affinity").prefix_cache["hit_rate"] == one
    assert simulate(trace, replicas=3).prefix_cache["hit_rate"] < one
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,10\n")
    with pytest.raises(BadInput, match=r"--routing affinity .* give a trace that names them"):
        simulate(read_trace(azure), replicas=2, prefix=False, routing="affinity")
    # and through the CLI, every rung routed so and said so
    data = cost_json("simulate", "--trace", str(tmp_path / "chats.jsonl"), "--model", "meta.llama3-1-8b-instruct-v1:0",
                     "--instance", "ml.g5.xlarge", "--capacity", "1500", "--routing", "affinity", "--no-progress",
                     "--slo-ttft-ms", "2000", "--slo-e2e-ms", "60000")
    assert any("gateway's session affinity" in a for a in data["assumptions"])
    assert all(r["prefix_cache"]["hit_rate"] == round(one, 4) for r in data["rungs"] if "prefix_cache" in r)
