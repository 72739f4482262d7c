"""Replica choice without an engine: the session hash spreads sessions evenly, keeps each on
its replica, moves few when a replica is added, respects the load bound and fails over.
Then the same through the real gateway over HTTP, with the fake upstream's named replicas."""
from __future__ import annotations

import collections
import math
import time

import httpx
import pytest

from gateway_harness import GATEWAY_DIR, Gateway  # noqa: F401   puts spectrum_gateway on the path
from options.core.affinity import bounded_order, load_cap, preference
from spectrum_gateway.config import Upstream
from spectrum_gateway.routing import Replicas

URLS = [f"http://10.0.0.{i}:8080" for i in range(1, 5)]
SESSIONS = [f"session-{i}" for i in range(4000)]


def replicas(urls=URLS, **kw) -> Replicas:
    return Replicas(Upstream(name="stable", weight=1, url=urls[0], urls=tuple(urls), **kw))


def test_sessions_spread_evenly_over_the_replicas():
    counts = collections.Counter(preference(s, URLS)[0] for s in SESSIONS)
    expected = len(SESSIONS) / len(URLS)
    # Binomial spread: 4 standard deviations is ~70 sessions here.
    assert all(abs(counts[i] - expected) < 4 * math.sqrt(expected) for i in range(len(URLS))), counts


def test_a_session_keeps_its_replica_and_every_worker_agrees():
    first = [preference(s, URLS)[0] for s in SESSIONS[:200]]
    again = [replicas().order(s, now=0.0)[0][0] for s in SESSIONS[:200]]   # a fresh worker
    assert first == again


def test_adding_a_replica_moves_only_the_sessions_that_now_prefer_it():
    before = {s: URLS[preference(s, URLS)[0]] for s in SESSIONS}
    grown = URLS + ["http://10.0.0.5:8080"]
    after = {s: grown[preference(s, grown)[0]] for s in SESSIONS}
    moved = [s for s in SESSIONS if before[s] != after[s]]
    assert all(after[s] == grown[-1] for s in moved)          # only to the new one
    assert abs(len(moved) / len(SESSIONS) - 1 / 5) < 0.03     # about 1/n of them


def test_the_load_bound_caps_a_replica_and_spills_to_the_next_choice():
    session = SESSIONS[0]
    prefs = preference(session, URLS)
    loads = [0] * 4
    loads[prefs[0]] = 5                 # the session's replica is busy, the rest idle
    # cap = ceil(1.25 × (5 + 1) / 4) = 2: five in flight is over it.
    assert load_cap(1.25, 5, 4) == 2
    order, own = bounded_order(session, URLS, loads, 1.25)
    assert not own and order[0] == prefs[1] and order[1:] == [p for p in prefs if p != prefs[1]]
    loads[prefs[0]] = 1                 # under the cap again: back to its own
    loads[prefs[1]] = 3
    order, own = bounded_order(session, URLS, loads, 1.25)
    assert own and order == prefs
    # The floor: below it a replica keeps its sessions whatever the mean.
    loads = [0] * 4
    loads[prefs[0]] = 5
    assert bounded_order(session, URLS, loads, 1.25, floor=8) == (prefs, True)
    assert bounded_order(session, URLS, loads, 1.25, floor=5)[1] is False


def test_bounded_load_holds_with_every_session_hashing_to_one_replica():
    """Sessions that all prefer replica 0, placed one after another, none finishing: no
    replica ever holds more than ceil(c × mean) (or the floor)."""
    r = replicas(load_bound=1.25, load_floor=8)
    alike = [s for s in SESSIONS if preference(s, URLS)[0] == 0][:400]
    assert len(alike) == 400
    for n, session in enumerate(alike):
        order, _ = r.order(session, now=0.0)
        r.in_flight[order[0]] += 1
        assert max(r.in_flight) <= max(8, math.ceil(1.25 * (n + 1) / 4))
    assert max(r.in_flight) <= math.ceil(1.25 * len(alike) / 4) and min(r.in_flight) > 0


def test_a_failed_replica_is_skipped_until_its_ejection_ends():
    r = replicas(eject_s=5)
    session = SESSIONS[1]
    own = r.order(session, now=0.0)[0][0]
    r.eject(own, now=10.0)
    order, how = r.order(session, now=11.0)
    assert order[0] != own and order[-1] == own and how == "affinity"
    assert order[0] == [p for p in preference(session, URLS) if p != own][0]   # its next choice
    assert r.order(session, now=15.1)[0][0] == own                             # back after 5 s


def test_without_a_session_least_in_flight_then_round_robin():
    r = replicas()
    r.in_flight[:] = [3, 0, 2, 1]
    assert r.order(None, now=0.0) == ([1, 3, 2, 0], "least_in_flight")
    r.in_flight[:] = [0, 0, 0, 0]
    firsts = [r.order(None, now=0.0)[0][0] for _ in range(8)]
    assert sorted(firsts) == [0, 0, 1, 1, 2, 2, 3, 3]                      # an idle set is shared
    rr = replicas(balance="round_robin")
    firsts = [rr.order(s, now=0.0)[0][0] for s in SESSIONS[:8]]
    assert sorted(firsts) == [0, 0, 1, 1, 2, 2, 3, 3]                      # sessions ignored


# --- through the gateway, over HTTP ------------------------------------------------------------

REPLICAS = ("r0", "r1", "r2")
EJECT_S = 3
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def replica_gateway(tmp_path_factory, upstreams):
    """One worker, in-memory store: replica state and session counts are per process anyway."""
    config = {
        "store": "memory",
        "tenants": {"acme": {"models": ["*"]}},
        "models": {
            "sticky": {"upstreams": [{"name": "stable", "urls": [upstreams.url(r) for r in REPLICAS],
                                      "eject_s": EJECT_S}]},
            "rr": {"upstreams": [{"name": "stable", "urls": [upstreams.url(r) for r in REPLICAS],
                                  "balance": "round_robin"}]},
            "programs": {"upstreams": [{"name": "vllm", "url": upstreams.url("prio")}],
                         "priority": {"later_steps_first": True, "session_ttl_s": 2}},
        },
    }
    gw = Gateway(tmp_path_factory.mktemp("replicas"), config).start()
    yield gw, gw.create_key("acme")["key"]
    gw.stop()


def ask(gw, key, model="sticky", session=None, user=None):
    body = {"model": model, "messages": HI, "max_tokens": 1}
    if user is not None:
        body["user"] = user
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["x-session-id"] = session
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def test_each_session_stays_on_one_replica_by_header_or_user(replica_gateway):
    gw, key = replica_gateway
    seen = collections.defaultdict(set)
    for step in range(3):
        for i in range(12):
            by_header = ask(gw, key, session=f"s{i}")
            by_user = ask(gw, key, user=f"u{i}")
            seen[f"s{i}"].add(by_header.headers["x-spectrum-replica"])
            seen[f"u{i}"].add(by_user.headers["x-spectrum-replica"])
            # The replica named is the one that answered (the fake upstream signs its tokens).
            answer = by_header.json()["choices"][0]["message"]["content"]
            assert answer.startswith(REPLICAS[int(by_header.headers["x-spectrum-replica"][-1])])
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    assert len({r for replicas in seen.values() for r in replicas}) == 3     # all are used
    affine = sum(gw.metric("spectrum_gateway_replica_requests_total", model="sticky", upstream="stable",
                           replica=f"stable/{i}", routing="affinity") for i in range(3))
    assert affine >= 72


def test_round_robin_ignores_sessions(replica_gateway):
    gw, key = replica_gateway
    names = [ask(gw, key, model="rr", session="one").headers["x-spectrum-replica"]
             for _ in range(6)]
    assert sorted(names) == sorted([f"stable/{i}" for i in range(3)] * 2)


def test_a_failing_replica_is_skipped_and_its_sessions_come_back(replica_gateway, upstreams):
    gw, key = replica_gateway
    sessions = {f"f{i}": ask(gw, key, session=f"f{i}").headers["x-spectrum-replica"]
                for i in range(12)}
    # The upstreams' ports are drawn per run, so which replica a session hashes to is too: fail
    # the one holding the most sessions (at least 4 of 12 by pigeonhole), never one holding none.
    victim = collections.Counter(sessions.values()).most_common(1)[0][0]
    upstream = REPLICAS[int(victim.rsplit("/", 1)[1])]
    moved = [s for s, r in sessions.items() if r == victim]
    assert len(moved) >= 4
    upstreams.set(upstream, mode="fail500")
    try:
        first = ask(gw, key, session=moved[0])       # tried, failed, answered by the next
        failed_at = time.monotonic()
        assert first.headers["x-spectrum-replica"] != victim
        assert first.headers["x-spectrum-fallback"].startswith(f"{victim} status 500")
        tried = upstreams.stats(upstream)["requests"]
        for s in moved:
            r = ask(gw, key, session=s)
            assert r.headers["x-spectrum-replica"] != victim
            if time.monotonic() - failed_at < EJECT_S - 0.5:     # still ejected: not tried
                assert "x-spectrum-fallback" not in r.headers
                assert upstreams.stats(upstream)["requests"] == tried
        if time.monotonic() - failed_at < EJECT_S - 0.5:
            assert gw.metric("spectrum_gateway_replica_ejected", model="sticky",
                             upstream="stable", replica=victim) == 1
        for s, replica in sessions.items():            # the other sessions did not move
            if replica != victim:
                assert ask(gw, key, session=s).headers["x-spectrum-replica"] == replica
    finally:
        upstreams.set(upstream, mode="ok")
    time.sleep(max(0.0, EJECT_S - (time.monotonic() - failed_at)) + 0.1)
    assert all(ask(gw, key, session=s).headers["x-spectrum-replica"] == victim for s in moved)


def test_later_steps_of_a_program_get_a_better_priority(replica_gateway, upstreams):
    gw, key = replica_gateway

    def priority(**kw):
        ask(gw, key, model="programs", **kw)
        return upstreams.stats("prio")["last_body"]["priority"]
    assert [priority(session="p1") for _ in range(4)] == [0, -1, -2, -3]
    assert priority(user="p2") == 0                   # a new program starts behind them
    assert priority(session="p1") == -4
    assert priority() == 0                            # no session: vLLM's default
    time.sleep(2.1)                                   # session_ttl_s: 2, then forgotten
    assert priority(session="p1") == 0


# --- the config --------------------------------------------------------------------------------

REPLICATED = """\
models:
  chat:
    upstreams:
      - {name: stable, urls: ["http://a:8080", "http://b:8080"], weight: 90}
      - {name: managed, bedrock: {model_id: "amazon.nova-lite-v1:0"}, weight: 0}
    priority: {later_steps_first: true}
"""


def config_error(tmp_path, text: str) -> str:
    from spectrum_gateway.config import ConfigError, load_config
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def test_replicas_and_priority_load_with_their_defaults(tmp_path):
    from spectrum_gateway.config import load_config
    path = tmp_path / "gateway.yaml"
    path.write_text(REPLICATED)
    chat = load_config(path).models["chat"]
    stable = chat.upstream("stable")
    assert stable.urls == ("http://a:8080", "http://b:8080") and stable.url == "http://a:8080"
    assert (stable.balance, stable.load_bound, stable.load_floor, stable.eject_s) == \
        ("affinity", 1.25, 8, 5.0)
    assert chat.priority.later_steps_first and chat.priority.session_ttl_s == 900


@pytest.mark.parametrize("old, new, message", [
    ('urls: ["http://a:8080", "http://b:8080"]', 'urls: ["http://a:8080", "http://a:8080/"]',
     "line 4: models.chat.upstreams[0].urls[1]: 'http://a:8080/' is listed twice"),
    ('urls: ["http://a:8080", "http://b:8080"]', 'urls: ["http://a:8080", "ftp://b"]',
     "line 4: models.chat.upstreams[0].urls[1]: 'ftp://b' is not an http(s) URL"),
    ('urls: ["http://a:8080", "http://b:8080"]', 'urls: []',
     "line 4: models.chat.upstreams[0].urls: must be a list of the replicas' URLs"),
    ('urls: ["http://a:8080", "http://b:8080"]', 'url: "http://c:1", urls: ["http://a:8080"]',
     "line 4: models.chat.upstreams[0]: upstream 'stable' needs exactly one of url, urls"),
    ("weight: 90}", "weight: 90, balance: sticky}",
     "line 4: models.chat.upstreams[0].balance: 'sticky' is not a balance; choose one of "
     "affinity, least_in_flight, round_robin"),
    ("weight: 90}", "weight: 90, load_bound: 1}",
     "line 4: models.chat.upstreams[0].load_bound: must be a number >= 1.01, got 1"),
    ("weight: 0}", "weight: 0, balance: affinity}",
     "line 5: models.chat.upstreams[1].balance: applies to replicas of an OpenAI-compatible"),
    ("later_steps_first: true", "later_steps_first: yes please",
     "line 6: models.chat.priority.later_steps_first: must be true or false"),
    ("later_steps_first: true", "later_steps_first: true, ttl: 5",
     "line 6: models.chat.priority.ttl: unknown key; known keys: later_steps_first, session_ttl_s"),
])
def test_bad_replica_and_priority_settings_name_their_line(tmp_path, old, new, message):
    assert message in config_error(tmp_path, REPLICATED.replace(old, new))
