"""Where the gateway keeps its state: API key records, quota counters, the usage ledger and
the metric counters.

``memory`` (the embedded default, one process): counters in the process; key records in
``<state_dir>/keys.json`` (written by ``admin``, re-read by the server when it changes, so a
revoked key stops working within a second) and the ledger appended to
``<state_dir>/usage.jsonl``.

``redis://…``: everything in Redis, so every worker and replica sees the same keys, the same
counters and one ledger (a Redis stream, whose ids are millisecond timestamps). A Redis that
cannot be reached within ``store_connect_timeout_ms`` turns into 503 naming it (``StoreUnavailable``),
never into a request that passes unmetered; the client (``resp.py``, one pipelined connection
per worker) connects again on the next request once it is back.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import OrderedDict, deque
from pathlib import Path

from . import meter
from .config import GatewayConfig, TenantLimits
from .errors import StoreUnavailable
from .quota import Decision, MemoryQuota, RedisQuota
from .resp import Head, Redis, ReplyError, Script, Unreachable

PREFIX = "spectrum"
KEYS_RELOAD_S = 0.25     # the memory store re-reads keys.json at most this often
KEY_CACHE_S = 0.5        # a Redis worker trusts a key record this long: revocations land within it
UPKEEP_TICK_S = 0.5      # a worker retries its unfinished settles this often while Redis is away
LEDGER_TRIM_EVERY_S = 60  # each worker trims the ledger to its retention this often
PENDING_MAX = 100_000    # settles kept for retry while Redis is away (the oldest dropped beyond)
SESSIONS_MAX = 1_000_000  # sessions the memory store remembers (least recently seen dropped)
log = logging.getLogger("spectrum_gateway")


class Sessions:
    """Each session's attained count (requests begun) in one process, forgotten ``ttl_s``
    after its last request."""

    def __init__(self) -> None:
        self._seen: OrderedDict = OrderedDict()      # key → (count, expires), oldest first

    def attained(self, key: str, ttl_s: float, now: float) -> int:
        while self._seen and (next(iter(self._seen.values()))[1] <= now
                              or len(self._seen) >= SESSIONS_MAX):
            self._seen.popitem(last=False)
        count, expires = self._seen.pop(key, (0, 0.0))
        if expires <= now:
            count = 0
        self._seen[key] = (count + 1, now + ttl_s)
        return count


def open_store(config: GatewayConfig):
    return RedisStore(config) if config.uses_redis else MemoryStore(config)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class MemoryStore:
    name = "memory"

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.dir = config.state_dir
        self.keys_path = self.dir / "keys.json"
        self.ledger_path = self.dir / "usage.jsonl"
        self.quota = MemoryQuota()
        self.counters: dict[str, float] = {}
        self.sessions = Sessions()
        self._keys: dict = {}
        self._keys_mtime: float | None = None
        self._keys_checked = 0.0
        self._ledger = None

    # --- keys
    def _load_keys(self) -> dict:
        now = time.monotonic()
        if now - self._keys_checked < KEYS_RELOAD_S:
            return self._keys
        self._keys_checked = now
        try:
            mtime = self.keys_path.stat().st_mtime_ns
        except FileNotFoundError:
            self._keys, self._keys_mtime = {}, None
            return self._keys
        if mtime != self._keys_mtime:
            self._keys = json.loads(self.keys_path.read_text() or "{}")
            self._keys_mtime = mtime
        return self._keys

    async def get_key(self, key_id: str) -> dict | None:
        return self._load_keys().get(key_id)

    async def put_key(self, record: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._keys_checked = 0.0
        keys = dict(self._load_keys())
        keys[record["id"]] = record
        _write_atomic(self.keys_path, json.dumps(keys, indent=1))
        self._keys_checked = 0.0

    async def all_keys(self) -> list[dict]:
        self._keys_checked = 0.0
        return list(self._load_keys().values())

    # --- quota
    async def reserve(self, limits: TenantLimits, request_id: str, tokens: int,
                      cost_usd: float) -> Decision:
        return await self.quota.reserve(limits, request_id, tokens, cost_usd)

    async def finish(self, limits: TenantLimits | None, request_id: str, tokens_delta: int,
                     cost_delta_usd: float, entry: dict | None, increments: dict) -> None:
        """Settle the reservation, append the ledger entry, count the metrics: one step."""
        if limits is not None:
            await self.quota.settle(limits, request_id, tokens_delta, cost_delta_usd)
        if entry is not None:
            if self._ledger is None:     # kept open; one append per entry, so each lands whole
                self.dir.mkdir(parents=True, exist_ok=True)
                self._ledger = os.open(self.ledger_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                       0o644)
            os.write(self._ledger, meter.ledger_line(entry))
        for field, value in increments.items():
            self.counters[field] = self.counters.get(field, 0) + value

    async def count(self, increments: dict) -> None:
        for field, value in increments.items():
            self.counters[field] = self.counters.get(field, 0) + value

    async def attained(self, tenant: str, session: str, ttl_s: float) -> int:
        """Requests the session began before this one (and this one counted)."""
        return self.sessions.attained(f"{tenant}\0{session}", ttl_s, time.monotonic())

    async def metric_counters(self) -> dict[str, float]:
        return dict(self.counters)

    async def ledger(self, since_ms: int | None = None) -> list[dict]:
        if not self.ledger_path.exists():
            return []
        out = []
        for line in self.ledger_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                if since_ms is None or entry["ts_ms"] >= since_ms:
                    out.append(entry)
        return out

    async def ping(self) -> None:
        return None

    async def warm(self) -> None:
        return None

    async def close(self) -> None:
        if self._ledger is not None:
            os.close(self._ledger)
            self._ledger = None


# KEYS: the metrics hash. ARGV: field, increment, field, increment, ...
# One command for a request's counters instead of one HINCRBYFLOAT each: a client spends more
# CPU sending a command and parsing its reply than Redis spends running it.
COUNT_LUA = """
for i = 1, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
"""


def _flat(increments: dict) -> list:
    return [item for pair in increments.items() for item in pair]


class RedisStore:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.name = config.store_name
        # One pipelined connection, no retries: an unreachable store answers 503 within the
        # connect timeout, and the next request connects again.
        self.redis = Redis(config.store, config.store_connect_timeout_ms / 1000,
                           config.store_command_timeout_ms / 1000)
        self.quota = RedisQuota(self.redis, PREFIX, int(config.concurrency_lease_s * 1000))
        self.keys_key = f"{PREFIX}:keys"
        self.ledger_key = f"{PREFIX}:ledger"
        self.metrics_key = f"{PREFIX}:metrics"
        self._count = Script(COUNT_LUA)
        # The ledger's XADD up to the entry: the same for every request, encoded once.
        self._ledger_head = Head("XADD", self.ledger_key, "MAXLEN", "~",
                                 config.ledger_max_entries, "*", "e")
        self._key_cache: dict[str, tuple] = {}     # id → (record, when read)
        # Slots this worker holds (request id → tenant), renewed while their requests run;
        # and the settles Redis did not take, retried until it does (see upkeep).
        self.held: dict[str, str] = {}
        self.pending: deque = deque(maxlen=PENDING_MAX)
        self._upkeep_task = None

    async def _call(self, coro):
        try:
            return await coro
        except Unreachable as e:
            raise StoreUnavailable(self.name, str(e)) from None

    async def get_key(self, key_id: str) -> dict | None:
        now = time.monotonic()
        cached = self._key_cache.get(key_id)
        if cached is not None and now - cached[1] < KEY_CACHE_S:
            return cached[0]
        raw = await self._call(self.redis.command("HGET", self.keys_key, key_id))
        record = json.loads(raw) if raw else None
        if record is not None:            # unknown ids are not cached: a new key works at once
            if len(self._key_cache) > 100_000:
                self._key_cache.clear()
            self._key_cache[key_id] = (record, now)
        return record

    async def put_key(self, record: dict) -> None:
        await self._call(self.redis.command("HSET", self.keys_key, record["id"],
                                            json.dumps(record)))

    async def all_keys(self) -> list[dict]:
        flat = await self._call(self.redis.command("HGETALL", self.keys_key))
        return [json.loads(v) for v in flat[1::2]]

    async def reserve(self, limits: TenantLimits, request_id: str, tokens: int,
                      cost_usd: float) -> Decision:
        try:
            decision = await self.quota.reserve(limits, request_id, tokens, cost_usd)
        except Unreachable as e:
            if e.sent:
                # Redis may have taken the slot and only its reply was lost: give it back
                # once Redis answers (settling a slot that was never taken does nothing).
                self.pending.append((limits, request_id, -tokens, -cost_usd, None, {}))
            raise StoreUnavailable(self.name, str(e)) from None
        if decision.allowed:
            self.held[request_id] = limits.name
        return decision

    async def finish(self, limits: TenantLimits | None, request_id: str, tokens_delta: int,
                     cost_delta_usd: float, entry: dict | None, increments: dict) -> None:
        """Settle, append to the ledger, count. If Redis is away the settle is kept and
        retried until it answers (so the slot is freed and the request metered then), and
        StoreUnavailable raised; the slot's lease frees it anyway if this worker dies."""
        self.held.pop(request_id, None)
        try:
            await self._finish(limits, request_id, tokens_delta, cost_delta_usd, entry, increments)
        except StoreUnavailable:
            if limits is not None:    # admitted, so it must be metered (a refusal need not)
                self.pending.append((limits, request_id, tokens_delta, cost_delta_usd, entry,
                                     increments))
            raise

    async def flush_pending(self) -> None:
        """Settle what Redis did not take, oldest first; StoreUnavailable if it still won't."""
        while self.pending:
            await self._finish(*self.pending[0])
            self.pending.popleft()

    async def _finish(self, limits, request_id, tokens_delta, cost_delta_usd, entry,
                      increments) -> None:
        async def run():
            # One round trip: the settle script, the ledger entry, the counters' script, the
            # scripts by their SHA. One that a restarted Redis lost goes again with its source
            # (the rest of the pipeline has run by then).
            commands, scripts = [], {}      # scripts: index → (script, keys, args)

            def add_script(script, keys, args):
                scripts[len(commands)] = script, keys, args
                commands.append(script.by_sha(keys, args))
            if limits is not None:
                add_script(*self.quota.settle_call(limits, request_id, tokens_delta,
                                                   cost_delta_usd))
            if entry is not None:     # bounded: ~ trims whole stream nodes, so it is cheap
                commands.append((self._ledger_head, meter.ledger_json(entry)))
            if increments:
                add_script(self._count, [self.metrics_key], _flat(increments))
            replies = await self.redis.pipeline(commands)
            lost = [i for i, reply in enumerate(replies)
                    if isinstance(reply, ReplyError) and reply.no_script and i in scripts]
            if lost:
                replies = [reply for i, reply in enumerate(replies) if i not in lost]
                replies += await self.redis.pipeline(
                    [script.whole(keys, args) for script, keys, args in map(scripts.get, lost)])
            for reply in replies:
                if isinstance(reply, ReplyError):
                    raise reply
        await self._call(run())

    async def count(self, increments: dict) -> None:
        await self._call(self._count.run(self.redis, [self.metrics_key], _flat(increments)))

    async def attained(self, tenant: str, session: str, ttl_s: float) -> int:
        """Requests the session began before this one (and this one counted), shared by
        every worker and replica; the count expires ``ttl_s`` after the last request."""
        key = f"{PREFIX}:session:{{{tenant}}}:{session}"

        count, _ = await self._call(self.redis.pipeline([("INCR", key),
                                                          ("PEXPIRE", key, int(ttl_s * 1000))]))
        if isinstance(count, ReplyError):
            raise count
        return count - 1

    async def metric_counters(self) -> dict[str, float]:
        flat = await self._call(self.redis.command("HGETALL", self.metrics_key))
        return {k.decode(): float(v) for k, v in zip(flat[::2], flat[1::2])}

    async def ledger(self, since_ms: int | None = None) -> list[dict]:
        start = f"{since_ms}-0" if since_ms is not None else "-"
        rows = await self._call(self.redis.command("XRANGE", self.ledger_key, start, "+"))
        entries, seen = [], set()
        for _, fields in rows:     # a settle retried after a lost reply may have written twice
            entry = json.loads(dict(zip(fields[::2], fields[1::2]))[b"e"])
            if entry.get("request_id") not in seen:
                seen.add(entry.get("request_id"))
                entries.append(entry)
        return entries

    async def trim_ledger(self) -> int:
        """Drop ledger entries older than ``ledger_retention_days``; how many went."""
        oldest_ms = int((time.time() - self.config.ledger_retention_days * 86400) * 1000)
        return await self._call(self.redis.command("XTRIM", self.ledger_key, "MINID",
                                                   f"{oldest_ms}-0"))

    async def upkeep(self) -> None:
        """Runs for the worker's life: retries settles Redis did not take, renews the leases
        of the slots this worker holds, and trims the ledger by age."""
        lease_s = self.config.concurrency_lease_s
        renewed = trimmed = 0.0
        while True:
            await asyncio.sleep(UPKEEP_TICK_S)
            now = time.monotonic()
            try:
                await self.flush_pending()
                if self.held and now - renewed >= lease_s / 3:
                    by_tenant: dict[str, list] = {}
                    for request_id, tenant in list(self.held.items()):
                        by_tenant.setdefault(tenant, []).append(request_id)
                    for tenant, ids in by_tenant.items():
                        await self._call(self.quota.renew(tenant, ids))
                    renewed = now
                if now - trimmed >= LEDGER_TRIM_EVERY_S:
                    await self.trim_ledger()
                    trimmed = now
            except StoreUnavailable:
                continue            # still away: the next tick tries again
            except Exception:       # never let upkeep die: it frees slots
                log.exception("store upkeep")

    async def ping(self) -> None:
        await self._call(self.redis.command("PING"))

    async def warm(self) -> None:
        """Connect while the worker is idle, so the first requests find the connection ready;
        a store that is down is no reason not to start (``/readyz`` says so)."""
        try:
            await self.redis.connect()
        except Unreachable:       # requests will say so, with a 503
            pass
        if self._upkeep_task is None:
            self._upkeep_task = asyncio.ensure_future(self.upkeep())

    async def close(self) -> None:
        if self._upkeep_task is not None:
            self._upkeep_task.cancel()
            self._upkeep_task = None
        if self.pending:      # one last try, so a clean shutdown loses no entry
            try:
                await self.flush_pending()
            except StoreUnavailable:
                log.error("%d requests not metered: the store %s is unreachable at shutdown",
                          len(self.pending), self.name)
        self.redis.close()
