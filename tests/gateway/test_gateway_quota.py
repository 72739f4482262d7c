"""Step 3: quotas exact across two workers sharing Redis, and the headers clients act on."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

CHAT = dict(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=1)


def test_rpm_30_exact_over_two_workers(gateway):
    client = gateway.client(gateway.create_key("rpm30")["key"])
    start = threading.Barrier(60)

    def one(_):
        start.wait()
        try:
            raw = client.chat.completions.with_raw_response.create(**CHAT)
            return 200, raw.headers
        except openai.RateLimitError as e:
            return 429, e.response.headers

    with ThreadPoolExecutor(60) as pool:
        results = list(pool.map(one, range(60)))
    codes = [code for code, _ in results]
    assert codes.count(200) == 30 and codes.count(429) == 30
    remaining = sorted(int(h["x-ratelimit-remaining-requests"]) for code, h in results if code == 200)
    assert remaining == list(range(30))        # each of the 30 saw its own place in the window
    for code, headers in results:
        assert headers["x-ratelimit-limit-requests"] == "30"
        assert "server" not in headers             # the workers do not name their software
        if code == 429:
            assert headers["x-ratelimit-remaining-requests"] == "0"
            reset_s = _seconds(headers["x-ratelimit-reset-requests"])
            retry_after = int(headers["retry-after"])
            # The window slides: the first slot frees ~60 s after the first request.
            assert 50 <= reset_s <= 60 and reset_s <= retry_after <= reset_s + 1
            assert int(headers["retry-after-ms"]) <= reset_s * 1000 + 1000


def _seconds(text: str) -> float:
    """OpenAI's reset format back to seconds (1m0s, 59.2s, 250ms)."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    minutes, _, rest = text.rpartition("m")
    return float(minutes or 0) * 60 + float(rest.rstrip("s"))


def test_tpm_reserves_prompt_plus_max_tokens_and_refunds_the_unused(gateway, upstreams):
    client = gateway.client(gateway.create_key("tpm200")["key"])
    upstreams.set("stable", stop_after=5)
    upstreams.set("canary", stop_after=5)
    try:
        big = dict(CHAT, max_tokens=150)
        raw = client.chat.completions.with_raw_response.create(**big)
        # Reserved: the prompt estimate (ceil((2 + 24) / 3) = 9) + 150, out of 200.
        assert raw.headers["x-ratelimit-limit-tokens"] == "200"
        assert raw.headers["x-ratelimit-remaining-tokens"] == str(200 - 159)
        used = raw.parse().usage.total_tokens           # the upstream's count: 1 + 5
        assert used == 6
        # Refunded after: the next reservation sees only what was used.
        raw = client.chat.completions.with_raw_response.create(**big)
        assert raw.headers["x-ratelimit-remaining-tokens"] == str(200 - used - 159)
        # 12 used + 9 + 190 would pass 200: refused before any upstream is called.
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(**dict(CHAT, max_tokens=190))
        assert "would pass its 200 tokens per minute" in info.value.message
        headers = info.value.response.headers
        assert headers["x-ratelimit-remaining-tokens"] == str(200 - 2 * used)
        assert int(headers["retry-after"]) <= 61
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(**dict(CHAT, max_tokens=500))
        assert "exceed tenant 'tpm200''s 200 tokens per minute" in info.value.message
    finally:
        upstreams.set("stable", stop_after=None)
        upstreams.set("canary", stop_after=None)


def test_concurrency_limit_and_the_sdk_retrying_after_retry_after(gateway, upstreams):
    upstreams.set("slowstream", interval_s=0.05)
    key = gateway.create_key("conc1")["key"]
    client = gateway.client(key)
    # 40 tokens 50 ms apart: the stream holds the tenant's one slot for about 2 s.
    stream = client.chat.completions.create(model="stream", stream=True, max_tokens=40,
                                            messages=[{"role": "user", "content": "hi"}])
    next(iter(stream))                          # one request in flight: the tenant's maximum
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="stream", max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    assert "already has 1 requests in flight" in info.value.message
    assert info.value.response.headers["retry-after"] == "1"
    # The SDK's own retries wait for Retry-After and succeed once the stream has finished:
    # counted by the SDK, not timed, so a slow machine cannot make it pass or fail.
    retrying = gateway.client(key, max_retries=5)
    raw = retrying.chat.completions.with_raw_response.create(
        model="stream", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert raw.retries_taken >= 1
    assert raw.parse().usage.completion_tokens == 2
    list(stream)


def test_a_stream_is_settled_before_its_done_reaches_the_client(gateway, upstreams):
    # The upstream ends its body 0.3 s after its [DONE]. The SDK stops reading at [DONE] and
    # hangs up: had [DONE] been passed on at once, the gateway would meter a whole answer as
    # the client's 499 and hold the tenant's only slot while the client asked again.
    upstreams.set("slowstream", interval_s=0.001, linger_s=0.3)
    before = upstreams.stats("slowstream")
    try:
        key = gateway.create_key("conc1")
        client = gateway.client(key["key"])
        for _ in range(3):           # each one asked the moment the last one's [DONE] came
            chunks = list(client.chat.completions.create(
                model="stream", stream=True, max_tokens=5, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "hi"}]))
            assert chunks[-1].usage.completion_tokens == 5
        # In the ledger by the time the client had [DONE]: read once, not waited for.
        entries = [e for e in json.loads(gateway.admin("usage", "--tenant", "conc1", "--json")
                                         .stdout)["entries"] if e["key_id"] == key["id"]]
        assert [(e["status"], e["output_tokens"]) for e in entries] == [(200, 5)] * 3
        # And the upstream's answers were read to their end, not cut off (its connection kept).
        after = upstreams.stats("slowstream")
        assert (after["completed"] - before["completed"], after["aborted"] - before["aborted"]) \
            == (3, 0)
    finally:
        upstreams.set("slowstream", linger_s=0)


def test_monthly_budget(gateway):
    """$1000 per million tokens both ways: each 2-token-prompt, 100-token answer costs $0.102."""
    client = gateway.client(gateway.create_key("budget")["key"])
    done = 0
    with pytest.raises(openai.RateLimitError) as info:
        for _ in range(10):
            client.chat.completions.create(model="priced", max_tokens=100,
                                           messages=[{"role": "user", "content": "two words"}])
            done += 1
    # The worst case (prompt estimate 11 + 100 tokens = $0.111) is reserved before each call:
    # 4 × $0.102 spent + $0.111 ≤ $0.50, the fifth would pass it.
    assert done == 4
    assert "has spent $0.41 of its $0.50 this month" in info.value.message
