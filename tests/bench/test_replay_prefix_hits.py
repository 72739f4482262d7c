"""The simulator's prefix-cache hits against a real vLLM's own counters, on one replay.

A Mooncake trace of multi-turn chats (each turn re-sends its session's earlier blocks and adds
one) replayed at an easy pace on the shared server (vLLM on CPU, tiny model, prefix caching on
by default); the replay reads the server's ``prefix_cache_hits`` / ``prefix_cache_queries``
before and after. ``cost predict`` on the same trace gives the hits its replica's cache would
serve. The two count different blocks: the simulator the trace's (``--block-tokens`` tokens an
id), vLLM its own (128 tokens on CPU) over the text the replay built, whose words only
approximate tokens, so each request's measured hit may fall short of the predicted by up to one
of vLLM's blocks (and the template tokens every prompt shares may add a little). The assertion
is that band, no wider: a simulator crediting no reuse (0) or every token is outside it.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

BLOCK = 128             # the trace's block; vLLM's CPU block is 128 tokens too
VLLM_BLOCK = 128
SESSIONS, TURNS = 3, 5  # the longest prompt (5 blocks, 640 tokens) fits the server's 1,024-token context


def chats(path):
    rows, t = [], 0
    for turn in range(TURNS):
        for session in range(SESSIONS):
            rows.append({"timestamp": t, "input_length": (turn + 1) * BLOCK, "output_length": 4,
                         "hash_ids": [session * 100 + b for b in range(turn + 1)]})
            t += 400         # ms: a session's next turn comes 1.2 s after its last, long done by then
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(*args, timeout=300):
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_simulated_hits_are_the_servers_within_one_of_its_blocks_a_request(plain_server, tmp_path):
    trace = chats(tmp_path / "chats.jsonl")
    replay = tmp_path / "replay.json"
    run("options.bench", "--no-progress", "--url", plain_server.url, "--level", "5", "--replay", str(trace),
        "--block-tokens", str(BLOCK), "--json", str(replay))
    doc = json.loads(replay.read_text())
    measured = doc["replay"]["summary"]["prefix_cache_hit_rate"]
    assert doc["replay"]["summary"]["lost"] == 0 and all(r["status"] == "ok" for r in doc["replay"]["requests"])
    capacity = tmp_path / "capacity.json"
    from cost.simulate.capacity import CapacityModel
    capacity.write_text(json.dumps(CapacityModel.from_throughput(200.0, "an easy pace").to_json()))
    predicted = json.loads(run("cost", "predict", "--trace", str(trace), "--block-tokens", str(BLOCK), "--bench",
                               str(capacity), "--json").stdout)["prefix_cache"]
    served = sum(r["input_tokens"] for r in doc["replay"]["requests"])      # the server's own prompt counts
    hits_expected = SESSIONS * sum(turn * BLOCK for turn in range(TURNS))
    assert predicted["hit_tokens"] == hits_expected
    requests_with_hits = SESSIONS * (TURNS - 1)
    low = (hits_expected - requests_with_hits * VLLM_BLOCK) / served
    high = (hits_expected + requests_with_hits * VLLM_BLOCK) / served
    print(f"prefix-cache hit rate: predicted {predicted['hit_rate']:.3f} (of the trace's tokens), measured "
          f"{measured:.3f} (of the {served:,} tokens served); band {low:.3f}-{high:.3f}")
    assert measured is not None and low <= measured <= high
