"""Session affinity against the real engine: two replicas of the bring-your-own server (vLLM
on CPU, the tiny model, prefix caching on as vLLM's default) behind the gateway.

16 programs of 4 serial steps, each prompt the previous one plus its answer plus the next
instruction (an agent's transcript). Run once through an upstream with ``balance: affinity``
and once, with other programs, through the same replicas with ``balance: round_robin``; each
replica's vLLM prefix-cache counters are read before step 2 and after step 4. Every session
must stay on one replica with affinity, and the hit rate of steps 2-4 must be higher with
it. Steps run in lock-step (every program's step k, 4 at a time, then step k+1) so the
counters cover exactly steps 2-4; each step's programs are sent in a shuffled order, so
round robin does not pin a session to a replica by accident of the arrival order.
"""
from __future__ import annotations

import collections
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway_harness import Gateway
from options.bench.program import hit_rate, read_prefix_cache
from options.local_server import LocalServer

pytestmark = pytest.mark.engine

SESSIONS, STEPS, CONCURRENCY = 16, 4, 4
MAX_TOKENS = 4
# vLLM on CPU caches whole blocks of 128 tokens: each program's own context (~400 tokens of
# the tiny model's byte-level tokens) spans three, so the prefix a replica may hold matters.
CONTEXT_WORDS = 120
SYSTEM = "You are a careful research agent. Answer from the context.\n"


@pytest.fixture(scope="module")
def replica_pair(tiny_model, tmp_path_factory):
    """Two engines started together (their start-up overlaps), stopped together."""
    logs = tmp_path_factory.mktemp("replicas")
    env = {"HF_MODEL_ID": str(tiny_model), "SM_VLLM_MAX_MODEL_LEN": "2048",
           "SM_VLLM_ENFORCE_EAGER": ""}
    servers = [LocalServer(env, log_path=logs / f"replica{i}.log") for i in range(2)]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(600)
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def gateway(replica_pair, tmp_path_factory):
    urls = [s.url for s in replica_pair]
    config = {"store": "memory", "upstream_timeout_s": 300,
              "tenants": {"acme": {"models": ["*"]}},
              "models": {"affine": {"upstreams": [{"name": "vllm", "urls": urls}]},
                         "rr": {"upstreams": [{"name": "vllm", "urls": urls,
                                               "balance": "round_robin"}]}}}
    gw = Gateway(tmp_path_factory.mktemp("gateway"), config).start()
    yield gw, gw.create_key("acme")["key"]
    gw.stop()


def context(seed: str) -> str:
    rng = random.Random(seed)
    words = ("alpha beta gamma delta kernel cache token replica session latency program "
             "planner summary vector index prefix block engine batch").split()
    return " ".join(rng.choice(words) for _ in range(CONTEXT_WORDS))


def run_programs(gw, key, model: str, servers) -> tuple[dict, float, list]:
    """Every program's steps in lock-step; the replicas each session's steps went to, the
    prefix-cache hit rate of steps 2..STEPS over both replicas, and per replica."""
    client = gw.client(key, timeout=300)
    prompts = {f"{model}-{i}": f"{SYSTEM}Context: {context(f'{model}-{i}')}\nStep 1: plan."
               for i in range(SESSIONS)}
    replicas = collections.defaultdict(list)
    order = random.Random(model)

    def step(session: str, k: int) -> None:
        by_header = int(session.rsplit("-", 1)[1]) % 2 == 0    # half by header, half by `user`
        raw = client.completions.with_raw_response.create(
            model=model, prompt=prompts[session], max_tokens=MAX_TOKENS, temperature=0,
            **({"extra_headers": {"x-session-id": session}} if by_header else {"user": session}))
        answer = raw.parse().choices[0].text
        replicas[session].append(raw.headers["x-spectrum-replica"])
        prompts[session] += f"{answer}\nStep {k + 1}: continue from the result above."

    before = None
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for k in range(1, STEPS + 1):
            if k == 2:
                before = [read_prefix_cache(s.url) for s in servers]
            sessions = list(prompts)
            order.shuffle(sessions)
            list(pool.map(lambda s: step(s, k), sessions))
    after = [read_prefix_cache(s.url) for s in servers]
    assert all(r is not None for r in before + after), "a replica's /metrics has no prefix-cache counters"
    total = hit_rate(tuple(map(sum, zip(*before))), tuple(map(sum, zip(*after))))
    return dict(replicas), total, [hit_rate(b, a) for b, a in zip(before, after)]


def test_affinity_keeps_sessions_on_one_replica_and_raises_the_prefix_hit_rate(gateway, replica_pair):
    gw, key = gateway
    sticky, sticky_rate, sticky_each = run_programs(gw, key, "affine", replica_pair)
    spread, spread_rate, spread_each = run_programs(gw, key, "rr", replica_pair)
    moved = sum(len(set(r)) > 1 for r in spread.values())
    each = lambda rates: " / ".join(f"{r:.3f}" for r in rates)    # noqa: E731
    print(f"\nprefix-cache hit rate, steps 2-{STEPS}, {SESSIONS} programs x {STEPS} steps over 2 "
          f"replicas: affinity {sticky_rate:.3f} (replicas {each(sticky_each)}), round robin "
          f"{spread_rate:.3f} ({each(spread_each)}); round robin moved {moved} of "
          f"{SESSIONS} sessions between replicas")
    assert all(len(r) == STEPS for r in sticky.values()) and len(sticky) == SESSIONS
    assert all(len(set(r)) == 1 for r in sticky.values()), sticky        # (a) never moved
    assert {r[0] for r in sticky.values()} == {"vllm/0", "vllm/1"}       # both replicas used
    assert moved > 0                              # round robin did scatter the programs
    assert sticky_rate > spread_rate, (sticky_rate, spread_rate)         # (b)
    affine = sum(gw.metric("spectrum_gateway_replica_requests_total", model="affine",
                           upstream="vllm", replica=f"vllm/{i}", routing="affinity")
                 for i in range(2))
    assert affine == SESSIONS * STEPS             # no request spilled or failed over
