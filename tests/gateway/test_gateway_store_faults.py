"""Redis faults in the middle of requests, with a real redis-server: a concurrency slot is
never kept by a request whose end Redis missed, a dead worker's slots expire, and the usage
ledger stays bounded."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
import redis

from gateway_harness import Gateway, RedisServer, gateway_config, tcp_server, wait_for
from spectrum_gateway.config import TenantLimits, config_from_dict
from spectrum_gateway.errors import StoreUnavailable
from spectrum_gateway.store import RedisStore

HI = [{"role": "user", "content": "hi"}]
STREAM = {"model": "stream", "messages": HI, "max_tokens": 1}


def post(gw, key, body=STREAM):
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"})


def test_redis_killed_mid_stream_frees_the_slot_and_meters_once_it_is_back(
        tmp_path, upstreams, dead_port, jwt_keys):
    # Redis writes every command to its append-only file, so after SIGKILL and a restart it
    # has its data back, the stream's concurrency slot included: the case that leaked.
    store = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    store.start()
    config = gateway_config(store.url, upstreams, dead_port, jwt_keys["jwks_file"])
    config["concurrency_lease_s"] = 600       # so only settling, not the lease, can free it
    gw = Gateway(tmp_path, config).start()
    try:
        key = gw.create_key("conc1")          # max_concurrency: 1
        upstreams.set("slowstream", interval_s=0.1)
        stream = gw.client(key["key"]).chat.completions.create(
            model="stream", messages=HI, max_tokens=20, stream=True)
        chunks = iter(stream)
        text = next(chunks).choices[0].delta.content
        assert post(gw, key["key"]).status_code == 429        # the slot is held
        store.kill()
        text += "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "".join(f"slowstream:{i} " for i in range(20))   # the client saw it all
        assert post(gw, key["key"]).status_code == 503

        store.start()
        assert redis.Redis(port=store.port).hexists("spectrum:keys", key["id"])   # data kept
        # Well inside the 600 s lease: only the settle, retried once Redis is back, frees it.
        wait_for(lambda: post(gw, key["key"]).status_code == 200, 60,
                 "the tenant's only slot to be free again")
        entries = json.loads(gw.admin("usage", "--tenant", "conc1", "--json").stdout)["entries"]
        streamed = [e for e in entries if e["stream"]]
        assert len(streamed) == 1 and streamed[0]["status"] == 200
        assert streamed[0]["output_tokens"] == 20 and streamed[0]["usage_source"] == "upstream"
        assert "not metered yet" in gw.log()
        # The restarted Redis had lost the settle and counter scripts: both were loaded again,
        # so the counters agree with the ledger.
        counters = redis.Redis(port=store.port).hgetall("spectrum:metrics")
        answered = sum(float(v) for k, v in counters.items()
                       if k.startswith(b'spectrum_gateway_requests_total{tenant="conc1"')
                       and b'status="200"' in k)
        assert answered == len([e for e in entries if e["status"] == 200]) >= 2
    finally:
        gw.stop()
        store.stop()


def test_a_dead_workers_slot_expires_while_a_live_one_keeps_renewing(
        tmp_path, redis_server, upstreams, dead_port, jwt_keys):
    config = gateway_config(redis_server.url, upstreams, dead_port, jwt_keys["jwks_file"])
    config["concurrency_lease_s"] = 2
    config["tenants"]["lease"] = {"max_concurrency": 1, "models": ["stream"]}
    holder = Gateway(tmp_path, config).start()
    other = Gateway(tmp_path, config)         # same config and secret, its own port
    other.start()
    try:
        key = holder.create_key("lease")["key"]
        upstreams.set("slowstream", interval_s=0.1)
        stream = holder.client(key).chat.completions.create(
            model="stream", messages=HI, max_tokens=100, stream=True)
        next(iter(stream))
        time.sleep(3)                          # past the 2 s lease: renewed, so still held
        assert post(other, key).status_code == 429
        os.killpg(holder.process.pid, signal.SIGKILL)     # dies without settling
        holder.process.wait()
        # The lease frees it; a slot that were not a lease would be held for ever.
        wait_for(lambda: post(other, key).status_code == 200, 60, "the dead worker's slot to expire")
    finally:
        holder.stop()
        other.stop()


def test_the_ledger_is_trimmed_by_count_and_by_age(tmp_path, redis_server):
    db = redis_server.url.rsplit("/", 1)[0] + "/5"     # a database of its own
    config = config_from_dict({
        "store": db, "ledger_max_entries": 100, "ledger_retention_days": 30,
        "models": {"m": {"upstreams": [{"name": "u", "url": "http://127.0.0.1:9"}]}}},
        tmp_path / "gateway.yaml")
    client = redis.Redis(port=redis_server.port, db=5)
    client.delete("spectrum:ledger")
    now_ms = int(time.time() * 1000)
    old_ms = now_ms - 31 * 86400_000
    for i in range(3):                        # entries from 31 days ago
        client.xadd("spectrum:ledger", {"e": json.dumps({"request_id": f"old{i}"})},
                    id=f"{old_ms + i}-0")

    async def go():
        store = RedisStore(config)
        try:
            assert await store.trim_ledger() == 3
            for i in range(1000):
                await store.finish(None, f"r{i}", 0, 0.0, {"request_id": f"r{i}", "ts_ms": 0}, {})
            return await store.ledger()
        finally:
            await store.close()
    entries = asyncio.run(go())
    # ~ trims whole stream nodes (100 entries each by default): never far past the bound.
    assert 100 <= client.xlen("spectrum:ledger") <= 200
    assert entries[-1]["request_id"] == "r999" and not any(e["request_id"].startswith("old")
                                                            for e in entries)


def test_a_reservation_whose_reply_is_lost_is_given_back_once_redis_answers(
        tmp_path, redis_server):
    """Redis runs the reservation but its reply never arrives (cut off here by a proxy that
    passes the command on and drops the answer, then the connection): the request gets 503,
    and the slot it may hold is settled once Redis answers again, not kept for the lease.
    While the connection is open the give-back waits: the reply could still come late
    (test_gateway_failover.py)."""
    limits = TenantLimits("lost-reply", max_concurrency=1)
    drop_replies = False
    clients = []

    async def proxy(reader, writer, n):
        clients.append(writer)
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", redis_server.port)

        async def back():
            while data := await upstream_reader.read(65536):
                if not drop_replies:
                    writer.write(data)
        relay = asyncio.ensure_future(back())
        try:
            while data := await reader.read(65536):
                upstream_writer.write(data)
        finally:
            relay.cancel()
            upstream_writer.close()

    async def go():
        nonlocal drop_replies
        server, port = await tcp_server(proxy)
        config = config_from_dict({
            "store": f"redis://127.0.0.1:{port}/6", "store_command_timeout_ms": 300,
            "concurrency_lease_s": 600,
            "models": {"m": {"upstreams": [{"name": "u", "url": "http://127.0.0.1:9"}]}}},
            tmp_path / "gateway.yaml")
        store = RedisStore(config)
        try:
            warm = await store.reserve(TenantLimits("warm-up"), "w", 1, 0.0)   # scripts loaded
            assert warm.allowed
            drop_replies = True
            with pytest.raises(StoreUnavailable, match="no reply within 300 ms"):
                await store.reserve(limits, "lost", 10, 0.0)
            assert len(store.pending) == 1
            await store.flush_pending()
            assert len(store.pending) == 1          # the reply may still come: not yet
            drop_replies = False
            clients[0].close()                      # it never will
            await asyncio.sleep(0.2)
            taken = await store.reserve(limits, "second", 10, 0.0)    # Redis kept the first
            assert not taken.allowed and taken.reason == "concurrency"
            await store.flush_pending()                              # what upkeep does
            assert not store.pending
            third = await store.reserve(limits, "third", 10, 0.0)
            assert third.allowed and third.tokens == 10     # the lost one's tokens given back
        finally:
            await store.close()
            await asyncio.sleep(0.1)       # the proxy sees the client go and closes its side
            server.close()
    asyncio.run(go())


@pytest.mark.parametrize("value, message", [
    (10, "ledger_max_entries: must be a whole number >= 100"),
    (0, "ledger_retention_days: must be a number >= 0.001"),
    (0.5, "concurrency_lease_s: must be a number >= 1")])
def test_bounds_are_checked(tmp_path, value, message):
    from spectrum_gateway.config import ConfigError
    key = message.split(":")[0]
    with pytest.raises(ConfigError, match=message):
        config_from_dict({key: value, "models": {"m": {"upstreams": [
            {"name": "u", "url": "http://127.0.0.1:9"}]}}}, tmp_path / "gateway.yaml")
