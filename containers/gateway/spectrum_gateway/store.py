"""Where the gateway keeps its state: API key records, quota counters, the usage ledger and
the metric counters.

``memory`` (the embedded default, one process): counters in the process; key records in
``<state_dir>/keys.json`` (written by ``admin``, re-read by the server when it changes, so a
revoked key stops working within a second) and the ledger appended to
``<state_dir>/usage.jsonl``.

``redis://…``: everything in Redis, so every worker and replica sees the same keys, the same
counters and one ledger (a Redis stream, whose ids are millisecond timestamps). A Redis that
cannot be reached within ``store_connect_timeout_ms`` turns into 503 naming it (``StoreUnavailable``),
never into a request that passes unmetered; the client reconnects by itself once it is back.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .config import GatewayConfig, TenantLimits
from .errors import StoreUnavailable
from .quota import Decision, MemoryQuota, RedisQuota

PREFIX = "spectrum"
KEYS_RELOAD_S = 0.25     # the memory store re-reads keys.json at most this often
KEY_CACHE_S = 0.5        # a Redis worker trusts a key record this long: revocations land within it
POOL_CONNECTIONS = 16    # Redis connections per worker


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
            if self._ledger is None:     # kept open, line-buffered: each entry lands whole
                self.dir.mkdir(parents=True, exist_ok=True)
                self._ledger = open(self.ledger_path, "a", buffering=1)
            self._ledger.write(json.dumps(entry, separators=(",", ":")) + "\n")
        for field, value in increments.items():
            self.counters[field] = self.counters.get(field, 0) + value

    async def count(self, increments: dict) -> None:
        for field, value in increments.items():
            self.counters[field] = self.counters.get(field, 0) + value

    async def metric_counters(self) -> dict[str, float]:
        return dict(self.counters)

    async def ledger(self, since_ms: int | None = None) -> list[dict]:
        if not self.ledger_path.exists():
            return []
        out = []
        for line in self.ledger_path.read_text().splitlines():
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
            self._ledger.close()


class RedisStore:
    def __init__(self, config: GatewayConfig) -> None:
        import redis.asyncio as aioredis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        self.config = config
        self.name = config.store
        # No retries with backoff: an unreachable store must answer 503 within the timeout.
        # A bounded pool: a burst of requests waits for a warm connection instead of opening
        # dozens at once (each connect racing the connect timeout on a busy event loop).
        pool = aioredis.BlockingConnectionPool.from_url(
            config.store, max_connections=POOL_CONNECTIONS,
            timeout=config.store_command_timeout_ms / 1000,
            socket_connect_timeout=config.store_connect_timeout_ms / 1000,
            socket_timeout=config.store_command_timeout_ms / 1000,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self.redis = aioredis.Redis(connection_pool=pool)
        self.quota = RedisQuota(self.redis, PREFIX)
        self.keys_key = f"{PREFIX}:keys"
        self.ledger_key = f"{PREFIX}:ledger"
        self.metrics_key = f"{PREFIX}:metrics"
        self._key_cache: dict[str, tuple] = {}     # id → (record, when read)

    async def _call(self, coro):
        import redis.exceptions as rex
        try:
            return await coro
        except (rex.ConnectionError, rex.TimeoutError, OSError) as e:
            raise StoreUnavailable(self.name, type(e).__name__ + (f": {e}" if str(e) else "")) from None

    async def get_key(self, key_id: str) -> dict | None:
        now = time.monotonic()
        cached = self._key_cache.get(key_id)
        if cached is not None and now - cached[1] < KEY_CACHE_S:
            return cached[0]
        raw = await self._call(self.redis.hget(self.keys_key, key_id))
        record = json.loads(raw) if raw else None
        if record is not None:            # unknown ids are not cached: a new key works at once
            if len(self._key_cache) > 100_000:
                self._key_cache.clear()
            self._key_cache[key_id] = (record, now)
        return record

    async def put_key(self, record: dict) -> None:
        await self._call(self.redis.hset(self.keys_key, record["id"], json.dumps(record)))

    async def all_keys(self) -> list[dict]:
        raw = await self._call(self.redis.hgetall(self.keys_key))
        return [json.loads(v) for v in raw.values()]

    async def reserve(self, limits: TenantLimits, request_id: str, tokens: int,
                      cost_usd: float) -> Decision:
        return await self._call(self.quota.reserve(limits, request_id, tokens, cost_usd))

    async def finish(self, limits: TenantLimits | None, request_id: str, tokens_delta: int,
                     cost_delta_usd: float, entry: dict | None, increments: dict) -> None:
        async def run():
            import redis.exceptions as rex
            # One round trip: the settle script, the ledger entry, the counters.
            pipe = self.redis.pipeline(transaction=False)
            if limits is not None:
                self.quota.settle_in(pipe, limits, request_id, tokens_delta, cost_delta_usd)
            if entry is not None:
                pipe.xadd(self.ledger_key, {"e": json.dumps(entry, separators=(",", ":"))})
            for field, value in increments.items():
                pipe.hincrbyfloat(self.metrics_key, field, value)
            results = await pipe.execute(raise_on_error=False)
            for i, result in enumerate(results):
                if i == 0 and limits is not None and isinstance(result, rex.NoScriptError):
                    # A Redis that lost its scripts (restarted): settle through the script
                    # object, which loads it; the rest of the pipeline has already run.
                    await self.quota.settle(limits, request_id, tokens_delta, cost_delta_usd)
                elif isinstance(result, Exception):
                    raise result
        await self._call(run())

    async def count(self, increments: dict) -> None:
        async def run():
            pipe = self.redis.pipeline(transaction=False)
            for field, value in increments.items():
                pipe.hincrbyfloat(self.metrics_key, field, value)
            await pipe.execute()
        await self._call(run())

    async def metric_counters(self) -> dict[str, float]:
        raw = await self._call(self.redis.hgetall(self.metrics_key))
        return {k.decode(): float(v) for k, v in raw.items()}

    async def ledger(self, since_ms: int | None = None) -> list[dict]:
        start = f"{since_ms}-0" if since_ms is not None else "-"
        rows = await self._call(self.redis.xrange(self.ledger_key, min=start, max="+"))
        return [json.loads(fields[b"e"]) for _, fields in rows]

    async def ping(self) -> None:
        await self._call(self.redis.ping())

    async def warm(self) -> None:
        """Open the pool's connections while the worker is idle, so a burst of requests finds
        them ready rather than racing the connect timeout; a store that is down is no reason
        not to start (``/readyz`` says so)."""
        pool = self.redis.connection_pool
        connections = []
        try:
            for _ in range(POOL_CONNECTIONS):
                connection = await pool.get_connection()
                connections.append(connection)
                await connection.connect()
        except Exception:     # unreachable now: requests will say so, with a 503
            pass
        finally:
            for connection in connections:
                await pool.release(connection)

    async def close(self) -> None:
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()
