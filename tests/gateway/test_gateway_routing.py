"""Step 4: which upstream answers. Sticky weighted canary, tenant override, fallback."""
from __future__ import annotations

import collections

import openai
import pytest

from gateway_harness import mint
from spectrum_gateway.config import Model, Upstream
from spectrum_gateway.routing import attempts, canary_choice

CHAT = dict(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_canary_split_follows_the_weights_and_moves_few_tenants():
    model = Model("chat", (Upstream("stable", 90, url="http://a"), Upstream("canary", 10, url="http://b")))
    tenants = [f"tenant-{i}" for i in range(4000)]
    picks = {t: canary_choice(model, t).name for t in tenants}
    share = collections.Counter(picks.values())["canary"] / len(tenants)
    assert 0.08 < share < 0.12
    # Raising the canary to 20 only moves tenants onto it, never between other upstreams.
    wider = Model("chat", (Upstream("stable", 80, url="http://a"), Upstream("canary", 20, url="http://b")))
    moved = {t for t in tenants if canary_choice(wider, t).name != picks[t]}
    assert all(picks[t] == "stable" and canary_choice(wider, t).name == "canary" for t in moved)
    assert 0.08 < len(moved) / len(tenants) < 0.12
    # Weight 0 never gets traffic of its own; it is there to be a fallback.
    model3 = Model("chat", model.upstreams + (Upstream("backup", 0, url="http://c"),), fallback=("backup",))
    assert {canary_choice(model3, t).name for t in tenants[:500]} == {"stable", "canary"}
    assert [u.name for u in attempts(model3, "x")][-1] == "backup"


def test_the_same_tenant_lands_on_the_same_upstream_on_every_worker(gateway, jwt_keys):
    from spectrum_gateway.config import load_config
    model = load_config(gateway.config_path).models["chat"]
    seen = {}
    for i in range(24):
        tenant = f"team-{i}"
        client = gateway.client(mint(jwt_keys, tenant))
        answers = {client.chat.completions.with_raw_response.create(**CHAT).headers["x-spectrum-upstream"]
                   for _ in range(3)}
        assert answers == {canary_choice(model, tenant).name}    # sticky, and the same rule
        seen[tenant] = answers.pop()
    assert set(seen.values()) == {"stable", "canary"}


def test_tenant_override_wins(gateway):
    client = gateway.client(gateway.create_key("pinned")["key"])
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(**CHAT)
        assert raw.headers["x-spectrum-upstream"] == "canary"
        assert raw.parse().choices[0].message.content.startswith("canary:0")


@pytest.mark.parametrize("mode, status", [("fail500", 500), ("fail429", 429)])
def test_failing_upstream_falls_back_and_says_so(gateway, acme_key, upstreams, mode, status):
    upstreams.set("flaky", mode=mode)
    try:
        client = gateway.client(acme_key["key"])
        raw = client.chat.completions.with_raw_response.create(**{**CHAT, "model": "flaky"})
        assert raw.headers["x-spectrum-upstream"] == "backup"
        assert raw.headers["x-spectrum-fallback"] == f"flaky status {status}"
        assert raw.parse().choices[0].message.content.startswith("backup:0")
        # Streams fall back too: nothing had been sent when the first upstream failed.
        with client.chat.completions.with_streaming_response.create(
                **{**CHAT, "model": "flaky"}, stream=True) as response:
            assert response.headers["x-spectrum-upstream"] == "backup"
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
        assert text == "backup:0 backup:1 "
    finally:
        upstreams.set("flaky", mode="ok")


def test_unknown_model_404_and_not_allowed_403(gateway, acme_key):
    client = gateway.client(acme_key["key"])
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(**{**CHAT, "model": "nope"})
    assert "model 'nope' does not exist; models you may use: chat, flaky" in info.value.message
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(**{**CHAT, "model": "priced"})
    assert "tenant 'acme' may not use model 'priced'" in info.value.message
    assert [m.id for m in client.models.list()][:2] == ["chat", "flaky"]
