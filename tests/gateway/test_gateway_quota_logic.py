"""The two quota implementations (one process; Redis's Lua) give the same answers."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway_harness import GATEWAY_DIR  # noqa: F401   puts spectrum_gateway on the path
from spectrum_gateway.config import TenantLimits
from spectrum_gateway.quota import MemoryQuota, RedisQuota, duration
from spectrum_gateway.resp import Redis


@pytest.fixture(params=["memory", "redis"])
def quota(request, redis_server):
    """Runs ``steps(quota)`` on a fresh quota of each kind, in one event loop."""
    def run(steps):
        async def go():
            if request.param == "memory":
                return await steps(MemoryQuota())
            client = Redis(f"redis://127.0.0.1:{redis_server.port}/0", 1.0, 5.0)
            try:
                return await steps(RedisQuota(client, prefix=f"test-{uuid.uuid4().hex[:8]}"))
            finally:
                client.close()
        return asyncio.run(go())
    return run


def test_requests_per_minute(quota):
    limits = TenantLimits("t", rpm=3)

    async def go(q):
        return [await q.reserve(limits, f"r{i}", 1, 0.0) for i in range(5)]
    decisions = quota(go)
    assert [d.allowed for d in decisions] == [True, True, True, False, False]
    assert [d.headers()["x-ratelimit-remaining-requests"] for d in decisions] == ["2", "1", "0", "0", "0"]
    denied = decisions[3]
    assert denied.reason == "requests" and 59_000 < denied.retry_after_ms <= 60_000
    assert denied.headers()["retry-after"] == "60"


def test_tokens_reserved_then_settled(quota):
    limits = TenantLimits("t", tpm=100)

    async def go(q):
        first = await q.reserve(limits, "a", 80, 0.0)
        refused = await q.reserve(limits, "b", 30, 0.0)
        await q.settle(limits, "a", -70, 0.0)            # used 10 of its 80
        second = await q.reserve(limits, "b", 30, 0.0)
        too_big = await q.reserve(limits, "c", 101, 0.0)
        await q.settle(limits, "b", +5, 0.0)             # used 35: more than reserved
        third = await q.reserve(limits, "d", 55, 0.0)
        return first, refused, second, too_big, third
    first, refused, second, too_big, third = quota(go)
    assert first.allowed and first.headers()["x-ratelimit-remaining-tokens"] == "20"
    assert not refused.allowed and refused.reason == "tokens" and refused.retry_after_ms > 59_000
    assert second.allowed and second.tokens == 40
    assert too_big.reason == "tokens_exceed_limit"
    assert third.allowed and third.tokens == 100


def test_concurrency_and_budget(quota):
    limits = TenantLimits("t", max_concurrency=1, budget_usd_month=1.0)

    async def go(q):
        one = await q.reserve(limits, "a", 1, 0.6)
        busy = await q.reserve(limits, "b", 1, 0.1)
        await q.settle(limits, "a", 0, -0.1)              # cost 0.5 in the end
        over = await q.reserve(limits, "c", 1, 0.6)
        fits = await q.reserve(limits, "d", 1, 0.5)
        return one, busy, over, fits
    one, busy, over, fits = quota(go)
    assert one.allowed and busy.reason == "concurrency" and busy.headers()["retry-after"] == "1"
    assert over.reason == "budget" and over.spent_usd == pytest.approx(0.5)
    assert "has spent $0.50 of its $1.00 this month" in over.message()
    assert fits.allowed


def test_reset_format():
    assert [duration(ms) for ms in (250, 1500, 60_000, 61_500)] == ["250ms", "1.5s", "1m0s", "1m1.5s"]


def test_the_month_turns_at_midnight_utc_and_follows_a_clock_set_back(monkeypatch):
    """The budget's month is worked out once a month: the cached answer must still change at
    the first instant of the next month, count down to it, and follow a clock set back."""
    from datetime import datetime, timezone

    from spectrum_gateway import quota
    def at(*when) -> float:
        return datetime(*when, tzinfo=timezone.utc).timestamp()
    clock = [at(2026, 11, 30, 23, 59, 59, 500000)]
    monkeypatch.setattr(quota.time, "time", lambda: clock[0])
    assert quota.month_now() == ("2026-11", 500)
    clock[0] = at(2026, 12, 1, 0, 0, 0, 250000)
    assert quota.month_now() == ("2026-12", 31 * 86_400_000 - 250)
    clock[0] = at(2026, 12, 31, 23, 59, 59)
    assert quota.month_now() == ("2026-12", 1000)
    clock[0] = at(2027, 1, 1)
    assert quota.month_now() == ("2027-01", 31 * 86_400_000)
    clock[0] = at(2026, 11, 15)                              # set back: recomputed, not cached
    assert quota.month_now() == ("2026-11", 16 * 86_400_000)
