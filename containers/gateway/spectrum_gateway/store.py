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
from dataclasses import dataclass
from pathlib import Path

import orjson

from . import meter
from .config import ConfigError, GatewayConfig, TenantLimits
from .errors import GatewayError, StoreUnavailable
from .quota import Decision, MemoryQuota, RedisQuota
from .resp import (UNKNOWN, Head, Misconfigured, PasswordFile, Redis, ReplyError, Script,
                   Unreachable)

PREFIX = "spectrum"
KEYS_RELOAD_S = 0.25     # the memory store re-reads keys.json at most this often
KEY_CACHE_S = 0.5        # a Redis worker trusts a key record this long: revocations land within it
UPKEEP_TICK_S = 0.5      # a worker retries its unfinished settles this often while Redis is away
LEDGER_TRIM_EVERY_S = 60  # each worker trims the ledger to its retention this often
IDLE_PING_S = 2.0        # a worker PINGs Redis when it has heard nothing from it this long
PENDING_MAX = 100_000    # settles kept for retry while Redis is away (the oldest dropped beyond)
# The ledger is read a page at a time (XRANGE ... COUNT), each page continuing after the last
# id of the one before: one XRANGE of millions of entries would make Redis build one reply of
# hundreds of MB (blocking every worker meanwhile) and the reader hold all of it at once.
LEDGER_PAGE_ENTRIES = 10_000
LEDGER_PAGE_TIMEOUT_S = 30.0   # a page is ~4 MB: far longer than a request's command may take
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


def _within(ts_ms: int, since_ms: int | None, until_ms: int | None) -> bool:
    return (since_ms is None or ts_ms >= since_ms) and (until_ms is None or ts_ms < until_ms)


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

    async def ledger_pages(self, since_ms: int | None = None, until_ms: int | None = None,
                           page_entries: int = LEDGER_PAGE_ENTRIES):
        """The entries from ``since_ms`` (included) to ``until_ms`` (not), oldest first, in
        lists of up to ``page_entries``: the file is read a line at a time."""
        if not self.ledger_path.exists():
            return
        page = []
        with open(self.ledger_path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    entry = orjson.loads(line)
                    if _within(entry["ts_ms"], since_ms, until_ms):
                        page.append(entry)
                        if len(page) >= page_entries:
                            yield page
                            page = []
        if page:
            yield page

    async def ledger(self, since_ms: int | None = None, until_ms: int | None = None) -> list[dict]:
        return [entry async for page in self.ledger_pages(since_ms, until_ms) for entry in page]

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


@dataclass
class Settle:
    """The end of a request as Redis must record it, in up to three parts: ``settle`` (its
    slot freed and its reservation corrected: ``limits``), ``entry`` (its ledger entry) and
    ``count`` (its counters). Kept while Redis has not taken all of it. ``outcome`` and
    ``sent``: the late replies of a round trip that timed out and the parts it carried
    (``("reserve",)``: the reservation to give back, whose reply was lost)."""
    limits: TenantLimits | None
    request_id: str
    tokens_delta: int
    cost_delta_usd: float
    entry: dict | None
    increments: dict
    outcome: asyncio.Future | None = None
    sent: tuple = ()

    def parts(self) -> list[str]:
        return [part for part, present in (("settle", self.limits is not None),
                                           ("entry", self.entry is not None),
                                           ("count", bool(self.increments))) if present]

    def keep(self, parts, outcome=None, also=()) -> "Settle":
        """Only ``parts`` and ``also``; ``outcome``, if given, the fate of ``parts``."""
        kept = set(parts) | set(also)
        return Settle(self.limits if "settle" in kept else None, self.request_id,
                      self.tokens_delta, self.cost_delta_usd,
                      self.entry if "entry" in kept else None,
                      self.increments if "count" in kept else {},
                      outcome, tuple(parts) if outcome is not None else ())

    def resolved(self) -> "Settle | None":
        """What is left to send once ``outcome`` is done: the parts its replies say did not
        run (an error reply), those whose reply never came (UNKNOWN) and those it did not
        carry."""
        replies = self.outcome.result()
        if self.sent == ("reserve",):      # not run: nothing was reserved to give back
            return None if isinstance(replies[0], ReplyError) else self.keep(self.parts())
        left = [part for part in self.parts() if part not in self.sent
                or replies[self.sent.index(part)] is UNKNOWN
                or isinstance(replies[self.sent.index(part)], ReplyError)]
        return self.keep(left) if left else None


class StoreMisconfigured(StoreUnavailable, ConfigError):
    """Redis refuses how the config says to use it: 503 to a request (as any store that will
    not serve), a config error (exit 2) to ``admin``, and a failed start to ``serve``."""

    def __init__(self, store: str, why: str) -> None:
        GatewayError.__init__(self, 503, f"the gateway's store {store} refuses its configuration: "
                                         f"{why}", "store_misconfigured", {"Retry-After": "1"})


class NotTaken(StoreUnavailable):
    """Redis did not take, or may not have taken, all of a settle: ``remaining`` is the rest."""

    def __init__(self, cause: StoreUnavailable, remaining: Settle) -> None:
        GatewayError.__init__(self, cause.status, cause.message, cause.code, cause.headers)
        self.remaining = remaining


class RedisStore:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.name = config.store_name
        # One pipelined connection, no retries: an unreachable store answers 503 within the
        # connect timeout, and the next request connects again.
        options = config.store_options
        self.redis = Redis(config.store, config.store_connect_timeout_ms / 1000,
                           config.store_command_timeout_ms / 1000, ca_file=options.ca_file,
                           password=os.environ.get(options.password_env) if options.password_env
                           else PasswordFile(options.password_file) if options.password_file
                           else None)
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
        self.kept: set = set()        # ids of the requests whose settles are in pending
        self._upkeep_task = None

    def _unavailable(self, error: Exception) -> StoreUnavailable:
        if isinstance(error, Misconfigured):
            return StoreMisconfigured(self.name, str(error))
        if isinstance(error, Unreachable):
            return StoreUnavailable(self.name, str(error))
        return StoreUnavailable(self.name, f"it answered {str(error)[:120]!r}: the command did "
                                           "not run, and will once Redis takes commands again")

    async def _call(self, coro):
        """The store's own Redis call: no answer, or an answer that says the command did not
        run because the server cannot take it now (a replica after a failover, a server
        loading its data), is ``StoreUnavailable`` (503 with Retry-After)."""
        try:
            return await coro
        except Unreachable as e:
            raise self._unavailable(e) from None
        except ReplyError as e:
            if e.unavailable:
                raise self._unavailable(e) from None
            raise

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
                # once Redis answers (settling a slot that was never taken does nothing),
                # and, while that reply may still come, once it has or never will.
                self._keep(Settle(limits, request_id, -tokens, -cost_usd, None, {},
                                  e.outcome, ("reserve",) if e.outcome else ()), metered=False)
            raise self._unavailable(e) from None
        except ReplyError as e:           # not run: nothing to give back
            if e.unavailable:
                raise self._unavailable(e) from None
            raise
        if decision.allowed:
            self.held[request_id] = limits.name
        return decision

    async def finish(self, limits: TenantLimits | None, request_id: str, tokens_delta: int,
                     cost_delta_usd: float, entry: dict | None, increments: dict) -> None:
        """Settle, append to the ledger, count. If Redis is away the settle is kept and
        retried until it answers (so the slot is freed and the request metered then), and
        StoreUnavailable raised; the slot's lease frees it anyway if this worker dies."""
        self.held.pop(request_id, None)
        if request_id in self.kept:
            # Its first settle is kept and will land: a request is metered once. (A whole
            # answer whose settle Redis did not take is answered 503, and the gateway then
            # settles it again as that 503; the first, with the upstream's usage, stands.)
            return
        try:
            await self._finish(Settle(limits, request_id, tokens_delta, cost_delta_usd, entry,
                                      increments))
        except NotTaken as e:
            if limits is not None:    # admitted, so it must be metered (a refusal need not)
                self._keep(e.remaining)
            raise

    def _keep(self, settle: Settle, metered: bool = True) -> None:
        """Keep ``settle`` to retry (``metered``: a request's own, not a give-back)."""
        if len(self.pending) == self.pending.maxlen:     # the oldest goes
            self.kept.discard(self.pending.popleft().request_id)
        self.pending.append(settle)
        if metered:
            self.kept.add(settle.request_id)

    async def flush_pending(self) -> None:
        """Settle what Redis did not take, oldest first; StoreUnavailable if it still won't.
        A settle whose round trip timed out is not sent again until that round trip's late
        replies say what Redis did with it (or its connection gives up waiting for them):
        a server that was only slow runs what it had read, so a retry sent meanwhile would
        meter the request twice."""
        waiting = []
        try:
            while self.pending:
                settle = self.pending.popleft()
                if settle.outcome is not None:
                    if not settle.outcome.done():
                        waiting.append(settle)
                        continue
                    left = settle.resolved()
                    if left is None:
                        self.kept.discard(settle.request_id)
                        continue
                    settle = left
                try:
                    await self._finish(settle)
                except NotTaken as e:
                    self.pending.appendleft(e.remaining)
                    raise
                except BaseException:
                    self.pending.appendleft(settle)
                    raise
                self.kept.discard(settle.request_id)
        finally:
            self.pending.extendleft(reversed(waiting))

    async def _finish(self, settle: Settle) -> None:
        """One round trip: the settle script, the ledger entry, the counters' script (the
        scripts by their SHA; one that a restarted or promoted Redis does not know goes again
        with its source). ``NotTaken`` says what of it Redis did not take, or may not have."""
        parts = settle.parts()
        commands, scripts = [], {}            # scripts: part → (script, keys, args)
        for part in parts:
            if part == "settle":
                script, keys, args = scripts[part] = self.quota.settle_call(
                    settle.limits, settle.request_id, settle.tokens_delta, settle.cost_delta_usd)
                commands.append(script.by_sha(keys, args))
            elif part == "entry":         # bounded: ~ trims whole stream nodes, so it is cheap
                commands.append((self._ledger_head, meter.ledger_json(settle.entry)))
            else:
                script, keys, args = scripts[part] = (self._count, [self.metrics_key],
                                                      _flat(settle.increments))
                commands.append(script.by_sha(keys, args))
        try:
            replies = dict(zip(parts, await self.redis.pipeline(commands)))
        except Unreachable as e:
            raise NotTaken(self._unavailable(e), settle.keep(parts, e.outcome)) from None
        again = [part for part in parts if part in scripts
                 and isinstance(replies[part], ReplyError) and replies[part].no_script]
        if again:
            try:
                replies.update(zip(again, await self.redis.pipeline(
                    [scripts[part][0].whole(*scripts[part][1:]) for part in again])))
            except Unreachable as e:
                failed = [p for p in parts if p not in again and isinstance(replies[p], ReplyError)]
                raise NotTaken(self._unavailable(e), settle.keep(again, e.outcome, failed)) from None
        failed = [part for part in parts if isinstance(replies[part], ReplyError)]
        for part in failed:
            if not replies[part].unavailable:
                raise replies[part]            # a bug, not an outage: loud, as before
        if failed:
            raise NotTaken(self._unavailable(replies[failed[0]]), settle.keep(failed))

    async def count(self, increments: dict) -> None:
        await self._call(self._count.run(self.redis, [self.metrics_key], _flat(increments)))

    async def attained(self, tenant: str, session: str, ttl_s: float) -> int:
        """Requests the session began before this one (and this one counted), shared by
        every worker and replica; the count expires ``ttl_s`` after the last request."""
        key = f"{PREFIX}:session:{{{tenant}}}:{session}"

        async def run():
            count, _ = await self.redis.pipeline([("INCR", key), ("PEXPIRE", key, int(ttl_s * 1000))])
            if isinstance(count, ReplyError):
                raise count
            return count
        return await self._call(run()) - 1

    async def metric_counters(self) -> dict[str, float]:
        flat = await self._call(self.redis.command("HGETALL", self.metrics_key))
        return {k.decode(): float(v) for k, v in zip(flat[::2], flat[1::2])}

    async def ledger_pages(self, since_ms: int | None = None, until_ms: int | None = None,
                           page_entries: int = LEDGER_PAGE_ENTRIES):
        """The entries from ``since_ms`` (included) to ``until_ms`` (not), oldest first, in
        lists of up to ``page_entries``: one ``XRANGE key start end COUNT n`` per page, the
        next starting just after the last id read (``(id``, Redis 6.2 and later). An entry
        written twice (a settle retried after its reply was lost) is given once."""
        start = f"{since_ms}-0" if since_ms is not None else "-"
        end = "+" if until_ms is None else str(until_ms - 1)   # ms alone: that ms's last id
        if until_ms is not None and since_ms is not None and until_ms <= since_ms:
            return
        seen = set()
        while True:
            rows = await self._call(self.redis.command(
                "XRANGE", self.ledger_key, start, end, "COUNT", page_entries,
                timeout_s=max(LEDGER_PAGE_TIMEOUT_S, self.redis.command_timeout_s)))
            page = []
            for _, fields in rows:
                raw = fields[1] if fields[0] == b"e" else dict(zip(fields[::2], fields[1::2]))[b"e"]
                entry = orjson.loads(raw)
                request_id = entry.get("request_id")
                if request_id not in seen:
                    seen.add(request_id)
                    page.append(entry)
            if page:
                yield page
            if len(rows) < page_entries:
                return
            start = b"(" + rows[-1][0]

    async def ledger(self, since_ms: int | None = None, until_ms: int | None = None) -> list[dict]:
        return [entry async for page in self.ledger_pages(since_ms, until_ms) for entry in page]

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
                await self._call(self.redis.reauthenticate())
                await self._call(self.redis.ping_if_idle(IDLE_PING_S))
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
        except Misconfigured as e:     # no point serving 503s until someone edits the config
            raise StoreMisconfigured(self.name, str(e)) from None
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
