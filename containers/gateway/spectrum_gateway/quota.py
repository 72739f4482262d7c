"""Per-tenant quota: requests and tokens per minute, concurrent requests, a monthly budget.

Both windows slide (the last 60 s, not the current clock minute), so a burst that straddles
a minute boundary cannot pass twice the limit. A request reserves 1 request, its prompt
estimate + ``max_tokens`` tokens, a concurrency slot and its worst-case cost, all or none;
``settle`` afterwards gives back what the upstream did not use, so a tenant never
overshoots its tpm and a short answer does not waste it.

With Redis, check-and-reserve is one Lua script, so it is exact across every worker and
replica (the limit is the tenant's, not "limit × replicas"), and the clock is Redis's own.
The in-memory quota is the same algorithm for one process.
"""
from __future__ import annotations

import functools
import math
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone

from .config import TenantLimits
from .resp import Script

WINDOW_MS = 60_000
# A concurrency slot in Redis is a lease: the worker holding it renews it while the request
# runs (RedisStore's upkeep), so a worker that dies, or loses Redis for longer than the lease,
# cannot hold its tenant's slots for ever. The config's concurrency_lease_s overrides this.
CONCURRENCY_LEASE_MS = 30_000
MICRO = 1_000_000   # budgets are counted in micro-dollars: integers, exact in Redis


@dataclass
class Decision:
    """The quota's answer, and what the ``x-ratelimit-*`` headers say."""
    allowed: bool
    reason: str                 # "ok", "requests", "tokens", "tokens_exceed_limit", "concurrency", "budget"
    limits: TenantLimits
    requests: int               # in the window, this request included when allowed
    tokens: int
    requests_reset_ms: int      # until the oldest request in the window leaves it
    tokens_reset_ms: int
    retry_after_ms: int         # when denied: until the request would fit
    spent_usd: float = 0.0

    def headers(self) -> dict:
        h = {}
        if self.limits.rpm is not None:
            h["x-ratelimit-limit-requests"] = str(self.limits.rpm)
            h["x-ratelimit-remaining-requests"] = str(max(0, self.limits.rpm - self.requests))
            h["x-ratelimit-reset-requests"] = duration(self.requests_reset_ms)
        if self.limits.tpm is not None:
            h["x-ratelimit-limit-tokens"] = str(self.limits.tpm)
            h["x-ratelimit-remaining-tokens"] = str(max(0, self.limits.tpm - self.tokens))
            h["x-ratelimit-reset-tokens"] = duration(self.tokens_reset_ms)
        if not self.allowed and self.retry_after_ms > 0:
            # Whole seconds, rounded up so the retry lands after the reset; the SDK prefers the
            # exact milliseconds when given.
            h["retry-after"] = str(max(1, math.ceil(self.retry_after_ms / 1000)))
            h["retry-after-ms"] = str(self.retry_after_ms + 5)
        return h

    def message(self) -> str:
        lim = self.limits
        wait = f"retry after {self.retry_after_ms / 1000:.3g} s"
        if self.reason == "requests":
            return f"tenant {lim.name!r} is over its {lim.rpm} requests per minute; {wait}"
        if self.reason == "tokens":
            return (f"tenant {lim.name!r} would pass its {lim.tpm} tokens per minute with this "
                    f"request (prompt + max_tokens are reserved); {wait}")
        if self.reason == "tokens_exceed_limit":
            return (f"this request's prompt + max_tokens exceed tenant {lim.name!r}'s {lim.tpm} "
                    "tokens per minute; lower max_tokens")
        if self.reason == "concurrency":
            return (f"tenant {lim.name!r} already has {lim.max_concurrency} requests in flight, "
                    f"its max_concurrency; {wait}")
        if self.reason == "budget":
            return (f"tenant {lim.name!r} has spent ${self.spent_usd:.2f} of its "
                    f"${lim.budget_usd_month:.2f} this month; the budget resets on the 1st (UTC)")
        return "over quota"


def duration(ms: int) -> str:
    """OpenAI's reset format: ``250ms``, ``1.5s``, ``6m0s``."""
    if ms < 1000:
        return f"{max(0, int(ms))}ms"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{int(minutes)}m{seconds:.3g}s" if minutes else f"{seconds:.3g}s"


_month = ("", 0.0, 0.0)   # this month, its first and the next month's first instant (epoch s)


def month_now() -> tuple[str, int]:
    """This month as ``YYYY-MM`` and the milliseconds until the next one starts (UTC).
    Worked out once a month, not per request: datetime arithmetic was ~4 % of a request's CPU."""
    global _month
    now = time.time()
    name, starts, next_starts = _month
    if not starts <= now < next_starts:           # a new month (or the clock was set back)
        today = datetime.fromtimestamp(now, timezone.utc)
        first = datetime(today.year, today.month, 1, tzinfo=timezone.utc)
        nxt = datetime(today.year + (today.month == 12), today.month % 12 + 1, 1,
                       tzinfo=timezone.utc)
        _month = name, starts, next_starts = today.strftime("%Y-%m"), first.timestamp(), nxt.timestamp()
    return name, int((next_starts - now) * 1000)


def _limit(value) -> int:
    return -1 if value is None else int(value)


class _Window:
    """One tenant's last minute in one process: each step costs what expired, not the window."""

    def __init__(self) -> None:
        self.requests: deque = deque()        # ms of each request, oldest first
        self.token_order: deque = deque()     # (ms, id) of each reservation, oldest first
        self.token_amounts: dict = {}         # id → tokens, while in the window
        self.tokens = 0
        self.inflight: set = set()

    def expire(self, cutoff: int) -> None:
        while self.requests and self.requests[0] <= cutoff:
            self.requests.popleft()
        while self.token_order and self.token_order[0][0] <= cutoff:
            _, rid = self.token_order.popleft()
            self.tokens -= self.token_amounts.pop(rid, 0)

    def tokens_fit_ms(self, need: int, limit: int, now: int) -> int:
        """Until enough reservations leave the window for ``need`` tokens to fit."""
        freed = 0
        for ms, rid in self.token_order:
            freed += self.token_amounts.get(rid, 0)
            if self.tokens - freed + need <= limit:
                return ms + WINDOW_MS - now
        return WINDOW_MS


class MemoryQuota:
    """The quota for one process (``store: memory``)."""

    def __init__(self) -> None:
        self.windows: dict[str, _Window] = {}
        self.spent: dict[tuple, int] = {}         # (tenant, month) → micro-dollars

    async def reserve(self, limits: TenantLimits, request_id: str, tokens: int,
                      cost_usd: float) -> Decision:
        now = int(time.time() * 1000)
        w = self.windows.setdefault(limits.name, _Window())
        w.expire(now - WINDOW_MS)
        month, month_left_ms = month_now()
        spent = self.spent.get((limits.name, month), 0)
        cost = int(round(cost_usd * MICRO))

        reason, retry = "ok", 0
        if limits.rpm is not None and len(w.requests) + 1 > limits.rpm:
            reason, retry = "requests", w.requests[0] + WINDOW_MS - now
        elif limits.tpm is not None and tokens > limits.tpm:
            reason = "tokens_exceed_limit"
        elif limits.tpm is not None and w.tokens + tokens > limits.tpm:
            reason, retry = "tokens", w.tokens_fit_ms(tokens, limits.tpm, now)
        elif limits.max_concurrency is not None and len(w.inflight) + 1 > limits.max_concurrency:
            reason, retry = "concurrency", 1000
        elif limits.budget_usd_month is not None and spent + cost > limits.budget_usd_month * MICRO:
            reason, retry = "budget", month_left_ms
        if reason == "ok":
            w.requests.append(now)
            w.token_order.append((now, request_id))
            w.token_amounts[request_id] = tokens
            w.tokens += tokens
            w.inflight.add(request_id)
            self.spent[(limits.name, month)] = spent + cost
        return Decision(
            allowed=reason == "ok", reason=reason, limits=limits, requests=len(w.requests),
            tokens=w.tokens,
            requests_reset_ms=(w.requests[0] + WINDOW_MS - now) if w.requests else 0,
            tokens_reset_ms=(w.token_order[0][0] + WINDOW_MS - now) if w.token_order else 0,
            retry_after_ms=max(0, retry), spent_usd=spent / MICRO)

    async def settle(self, limits: TenantLimits, request_id: str, tokens_delta: int,
                     cost_delta_usd: float) -> None:
        w = self.windows.get(limits.name)
        if w is None:
            return
        if request_id in w.token_amounts:
            amount = max(0, w.token_amounts[request_id] + tokens_delta)
            w.tokens += amount - w.token_amounts[request_id]
            w.token_amounts[request_id] = amount
        w.inflight.discard(request_id)
        month, _ = month_now()
        key = (limits.name, month)
        self.spent[key] = self.spent.get(key, 0) + int(round(cost_delta_usd * MICRO))


# KEYS: requests zset, tokens zset, token amounts hash, token total, in-flight zset, month's spend
# ARGV: id, rpm, tpm, tokens, max concurrency, lease ms, budget µ$, cost µ$, ms to next month
RESERVE_LUA = """
local rq, tq, tamount, ttotal, inflight_key, spent_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id = ARGV[1]
local rpm, tpm, need = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_conc, lease = tonumber(ARGV[5]), tonumber(ARGV[6])
local budget, cost, month_left = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = 60000
local cutoff = now - window

redis.call('ZREMRANGEBYSCORE', rq, '-inf', cutoff)
local requests = redis.call('ZCARD', rq)
local expired = redis.call('ZRANGEBYSCORE', tq, '-inf', cutoff)
if #expired > 0 then
  local amounts = redis.call('HMGET', tamount, unpack(expired))
  local freed = 0
  for i = 1, #amounts do freed = freed + (tonumber(amounts[i]) or 0) end
  redis.call('DECRBY', ttotal, freed)
  redis.call('HDEL', tamount, unpack(expired))
  redis.call('ZREMRANGEBYSCORE', tq, '-inf', cutoff)
end
local used = tonumber(redis.call('GET', ttotal) or '0')
redis.call('ZREMRANGEBYSCORE', inflight_key, '-inf', now)
local inflight = redis.call('ZCARD', inflight_key)
local spent = tonumber(redis.call('GET', spent_key) or '0')

local function oldest_reset(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return tonumber(first[2]) + window - now
end
local function tokens_fit(n)
  local entries = redis.call('ZRANGE', tq, 0, -1, 'WITHSCORES')
  local freed = 0
  for i = 1, #entries, 2 do
    freed = freed + (tonumber(redis.call('HGET', tamount, entries[i])) or 0)
    if used - freed + n <= tpm then return tonumber(entries[i + 1]) + window - now end
  end
  return window
end

local reason, retry = 'ok', 0
if rpm >= 0 and requests + 1 > rpm then reason, retry = 'requests', oldest_reset(rq)
elseif tpm >= 0 and need > tpm then reason = 'tokens_exceed_limit'
elseif tpm >= 0 and used + need > tpm then reason, retry = 'tokens', tokens_fit(need)
elseif max_conc >= 0 and inflight + 1 > max_conc then reason, retry = 'concurrency', 1000
elseif budget >= 0 and spent + cost > budget then reason, retry = 'budget', month_left
end
if reason == 'ok' then
  redis.call('ZADD', rq, now, id)
  redis.call('PEXPIRE', rq, window + 1000)
  redis.call('ZADD', tq, now, id)
  redis.call('HSET', tamount, id, need)
  redis.call('INCRBY', ttotal, need)
  for _, k in ipairs({tq, tamount, ttotal}) do redis.call('PEXPIRE', k, window + 1000) end
  redis.call('ZADD', inflight_key, now + lease, id)
  redis.call('PEXPIRE', inflight_key, lease)
  if cost ~= 0 then redis.call('INCRBY', spent_key, cost) end
  redis.call('PEXPIRE', spent_key, 40 * 86400000)
  requests, used = requests + 1, used + need
end
return {reason, requests, used, oldest_reset(rq), oldest_reset(tq), retry, spent}
"""

# KEYS: token amounts hash, token total, in-flight zset, month's spend; ARGV: id, Δtokens, Δµ$
# The corrections apply only while the request still holds its slot, so a settle sent twice
# (retried after a reply lost to a dropped connection) corrects once. A slot whose lease ran
# out keeps the reservation's worst case: the tenant is never under-counted.
SETTLE_LUA = """
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
  redis.call('INCRBY', KEYS[2], ARGV[2])
end
if tonumber(ARGV[3]) ~= 0 then redis.call('INCRBY', KEYS[4], ARGV[3]) end
return 1
"""

# KEYS: in-flight zset; ARGV: lease ms, then the ids this worker still serves. XX: a slot
# already settled (or expired) is not brought back.
RENEW_LUA = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', until_ms, ARGV[i]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return renewed
"""


@functools.lru_cache(maxsize=4096)
def _quota_keys(prefix: str, tenant: str, month: str) -> tuple[str, ...]:
    """A tenant's quota keys in one month, named once (not on every request). One hash tag per
    tenant: a Redis Cluster keeps a tenant's keys on one shard."""
    p = f"{prefix}:q:{{{tenant}}}"
    return (f"{p}:rq", f"{p}:tq", f"{p}:tamount", f"{p}:ttotal", f"{p}:inflight",
            f"{p}:spent:{month}")


class RedisQuota:
    """The quota shared by every worker and replica, one Lua call per step."""

    def __init__(self, redis, prefix: str = "spectrum",
                 lease_ms: int = CONCURRENCY_LEASE_MS) -> None:
        """``redis``: a ``resp.Redis``."""
        self.redis, self.prefix, self.lease_ms = redis, prefix, int(lease_ms)
        self._reserve = Script(RESERVE_LUA)
        self._settle = Script(SETTLE_LUA)
        self._renew = Script(RENEW_LUA)

    def _keys(self, tenant: str, month: str) -> tuple[str, ...]:
        return _quota_keys(self.prefix, tenant, month)

    async def reserve(self, limits: TenantLimits, request_id: str, tokens: int,
                      cost_usd: float) -> Decision:
        month, month_left = month_now()
        budget = -1 if limits.budget_usd_month is None else int(limits.budget_usd_month * MICRO)
        reason, requests, used, rq_reset, tq_reset, retry, spent = await self._reserve.run(
            self.redis, self._keys(limits.name, month),
            [request_id, _limit(limits.rpm), _limit(limits.tpm), tokens,
                  _limit(limits.max_concurrency), self.lease_ms, budget,
                  int(round(cost_usd * MICRO)), month_left])
        reason = reason.decode() if isinstance(reason, bytes) else reason
        return Decision(allowed=reason == "ok", reason=reason, limits=limits,
                        requests=int(requests), tokens=int(used),
                        requests_reset_ms=int(rq_reset), tokens_reset_ms=int(tq_reset),
                        retry_after_ms=max(0, int(retry)), spent_usd=int(spent) / MICRO)

    def _settle_keys(self, limits: TenantLimits) -> tuple[str, ...]:
        return self._keys(limits.name, month_now()[0])[2:6]

    def settle_call(self, limits: TenantLimits, request_id: str, tokens_delta: int,
                    cost_delta_usd: float) -> tuple:
        """``(script, keys, args)`` of the settle, for a pipeline of the caller's (see
        ``RedisStore.finish``)."""
        return (self._settle, self._settle_keys(limits),
                [request_id, int(tokens_delta), int(round(cost_delta_usd * MICRO))])

    async def settle(self, limits: TenantLimits, request_id: str, tokens_delta: int,
                     cost_delta_usd: float) -> bool:
        """Free the slot and correct the reservation; False if the slot was already gone."""
        script, keys, args = self.settle_call(limits, request_id, tokens_delta, cost_delta_usd)
        return bool(await script.run(self.redis, keys, args))

    async def renew(self, tenant: str, request_ids: list[str]) -> int:
        """Extend the leases of the slots ``request_ids`` hold; how many were still held."""
        inflight = self._keys(tenant, month_now()[0])[4]
        return int(await self._renew.run(self.redis, [inflight], [self.lease_ms, *request_ids]))
