"""Failover, as ElastiCache does it to a client, with real redis-server processes: the primary
endpoint (one address; here a proxy written in the test, whose new connections go to the
current primary) moves to a promoted replica while the old primary, made a replica, answers
``READONLY``; a server loading its data answers ``LOADING``; a replica cut off from its primary
``MASTERDOWN``; a server that stops answering (``DEBUG SLEEP``) is silent. Every one of them is
a 503 with Retry-After (never a 500), the connection is replaced, and the settles Redis did
not take are retried so that each request is metered once: not lost, not twice.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from gateway_harness import Gateway, RedisServer, gateway_config, ledger_entry, store_at, wait_for
from spectrum_gateway import meter
from spectrum_gateway.config import TenantLimits
from spectrum_gateway.errors import StoreUnavailable

HI = [{"role": "user", "content": "hi"}]


class Endpoint:
    """One address whose connections reach the current primary, as ElastiCache's primary
    endpoint (a DNS name) does: ``target`` moved by a failover applies to new connections;
    those already open stay with the server they reached. Runs in a thread of its own, so
    gateway processes and synchronous tests can use it alike."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._relay, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.tasks: set = set()

    async def _relay(self, reader, writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return

        async def pipe(source, sink):
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()
        task = asyncio.ensure_future(asyncio.gather(pipe(reader, upstream_writer),
                                                    pipe(upstream_reader, writer)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        async def stop():
            self.server.close()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def replication(port: int) -> dict:
    return redis.Redis(port=port).info("replication")


def synced(primary: RedisServer, replica: RedisServer) -> bool:
    of_replica = replication(replica.port)
    return (of_replica.get("master_link_status") == "up"
            and of_replica["slave_repl_offset"] == replication(primary.port)["master_repl_offset"])


def fail_over(old: RedisServer, new: RedisServer, endpoint: Endpoint | None,
              hold_s: float = 0.0) -> None:
    """A planned failover that loses no write: the old primary's writers paused (for at
    least ``hold_s``), the replica caught up and promoted, the endpoint moved, the old primary
    made the new one's replica, its writers released (they now get READONLY)."""
    primary = redis.Redis(port=old.port)
    primary.execute_command("CLIENT", "PAUSE", 20000, "WRITE")
    time.sleep(hold_s)
    wait_for(lambda: synced(old, new), 15, "the replica to catch up")
    redis.Redis(port=new.port).execute_command("REPLICAOF", "NO", "ONE")
    if endpoint is not None:
        endpoint.target = new.port
    primary.execute_command("REPLICAOF", "127.0.0.1", new.port)
    primary.execute_command("CLIENT", "UNPAUSE")


def halt(*servers: RedisServer) -> None:
    """Stopped by their pids at once: a primary's SHUTDOWN waits seconds for its replicas."""
    for server in servers:
        if server.process is not None and server.process.poll() is None:
            server.kill()


def pair(tmp_path: Path, *extra: str) -> tuple[RedisServer, RedisServer]:
    """A primary and its replica, in sync."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    primary = RedisServer(tmp_path / "primary", "--repl-diskless-sync-delay", "0", *extra)
    primary.start()
    replica = RedisServer(tmp_path / "replica", "--repl-diskless-sync-delay", "0",
                          "--replicaof", "127.0.0.1", str(primary.port), *extra)
    replica.start()
    wait_for(lambda: synced(primary, replica), 15, "the replica's first sync")
    return primary, replica


def raw_ledger(port: int) -> list[dict]:
    """Every entry in the stream, duplicates included (the store's reader drops them)."""
    return [json.loads(fields[b"e"]) for _, fields in redis.Redis(port=port).xrange("spectrum:ledger")]


def counted(port: int, tenant: str) -> float:
    fields = redis.Redis(port=port).hgetall("spectrum:metrics")
    return sum(float(v) for k, v in fields.items()
               if k.startswith(f'spectrum_gateway_requests_total{{tenant="{tenant}"'.encode()))


# --- the store against each failure --------------------------------------------------------------

def test_the_old_primary_answers_readonly_and_the_store_moves_to_the_new_one(tmp_path):
    primary, replica = pair(tmp_path)
    endpoint = Endpoint(primary.port)
    limits = TenantLimits("ro", max_concurrency=2)

    async def go():
        store = store_at(f"redis://127.0.0.1:{endpoint.port}/0", tmp_path)
        try:
            assert (await store.reserve(limits, "a", 10, 0.0)).allowed
            old = store.redis._connection
            fail_over(primary, replica, endpoint)
            entry = ledger_entry("a", "ro")
            # The old primary, resynced as a replica, knows no script (NOSCRIPT) and takes no
            # write (READONLY): the connection retires; the scripts go again, whole, on a new
            # connection, which the endpoint takes to the new primary; the ledger entry, which
            # the old one refused, is kept.
            with pytest.raises(StoreUnavailable, match="READONLY") as refused:
                await store.finish(limits, "a", -6, 0.0, entry, meter.increments(entry))
            assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
            assert old.retiring and old.lost is not None      # retired, closed once drained
            assert [(s.request_id, s.parts()) for s in store.pending] == [("a", ["entry"])]
            assert (await store.reserve(limits, "b", 10, 0.0)).allowed
            await store.flush_pending()
            assert not store.pending
            # The reservation made on the old primary reached the new one: a is settled there.
            third = await store.reserve(limits, "c", 10, 0.0)
            assert third.allowed and third.tokens == 10 + 4 + 10
        finally:
            await store.close()
    try:
        asyncio.run(go())
        assert [e["request_id"] for e in raw_ledger(replica.port)] == ["a"]
        assert counted(replica.port, "ro") == 1
    finally:
        endpoint.close()
        halt(primary, replica)


def test_a_server_loading_its_data_is_503_until_it_is_loaded(tmp_path):
    server = RedisServer(tmp_path, "--enable-debug-command", "yes")
    server.start()
    client = redis.Redis(port=server.port)
    client.execute_command("DEBUG", "POPULATE", 3000)
    server.stop()                                   # saves: the next start loads 3,000 keys
    slow = subprocess.Popen(                         # a millisecond a key: ~3 s of LOADING
        [shutil.which("redis-server"), "--port", str(server.port), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--save", "", "--key-load-delay", "1000",
         "--loading-process-events-interval-bytes", "1024", "--logfile", "redis.log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.process = slow

    async def go():
        store = store_at(server.url, tmp_path, command_timeout_ms=1000)
        try:
            deadline = time.monotonic() + 5
            while True:             # until it listens
                try:
                    await store.reserve(TenantLimits("loading"), "x", 1, 0.0)
                    raise AssertionError("served while loading")
                except StoreUnavailable as e:
                    message = e.message
                    if "LOADING" in message:
                        break
                    assert time.monotonic() < deadline, message
                    await asyncio.sleep(0.05)
            assert "the command did not run" in message and not store.pending
            deadline = time.monotonic() + 30
            while True:
                try:
                    return await store.reserve(TenantLimits("loading"), "y", 1, 0.0)
                except StoreUnavailable as e:
                    assert "LOADING" in e.message and time.monotonic() < deadline
                    await asyncio.sleep(0.1)
        finally:
            await store.close()
    try:
        assert asyncio.run(go()).allowed
    finally:
        halt(server)


def test_a_replica_cut_off_from_its_primary_is_503_masterdown(tmp_path):
    primary, replica = pair(tmp_path, "--replica-serve-stale-data", "no")
    primary.kill()

    async def go():
        store = store_at(replica.url, tmp_path)
        try:
            wait = time.monotonic() + 10
            while True:
                try:
                    await store.reserve(TenantLimits("md"), "x", 1, 0.0)
                except StoreUnavailable as e:
                    if "MASTERDOWN" in e.message:
                        return e
                    assert time.monotonic() < wait, e.message
                await asyncio.sleep(0.1)
        finally:
            await store.close()
    try:
        assert asyncio.run(go()).status == 503
    finally:
        halt(replica)


def _sleep_server(port: int, seconds: float) -> subprocess.Popen:
    """DEBUG SLEEP on another connection: the server answers nobody meanwhile."""
    return subprocess.Popen([shutil.which("redis-cli"), "-p", str(port), "DEBUG", "SLEEP",
                             str(seconds)], stdout=subprocess.DEVNULL)


def test_a_silent_server_is_503_and_what_it_ran_late_is_not_sent_again(tmp_path):
    """A settle sent to a server that then says nothing times out (503); the server, once
    awake, runs what it had read. The store waits for those late replies before retrying:
    retrying at once would have metered the request twice."""
    server = RedisServer(tmp_path, "--enable-debug-command", "yes")
    server.start()
    limits = TenantLimits("silent", max_concurrency=1)

    async def go():
        store = store_at(server.url, tmp_path)
        try:
            assert (await store.reserve(limits, "a", 10, 0.0)).allowed
            sleeper = _sleep_server(server.port, 1.5)
            await asyncio.sleep(0.3)
            entry = ledger_entry("a", "silent")
            # Refused by the 300 ms timeout: waiting for the asleep server would have had its
            # reply (1.2 s on), not this error.
            with pytest.raises(StoreUnavailable, match="no reply within 300 ms"):
                await store.finish(limits, "a", -6, 0.0, entry, meter.increments(entry))
            with pytest.raises(StoreUnavailable):       # a reservation lost the same way
                await store.reserve(limits, "b", 10, 0.0)
            assert len(store.pending) == 2
            await store.flush_pending()                 # their fate unknown: nothing resent
            assert len(store.pending) == 2
            await asyncio.get_running_loop().run_in_executor(None, sleeper.wait)
            await asyncio.sleep(0.3)                    # the late replies
            await store.flush_pending()
            assert not store.pending and not store.kept
            third = await store.reserve(limits, "c", 10, 0.0)   # a's and b's slots both free
            assert third.allowed
        finally:
            await store.close()
    try:
        asyncio.run(go())
        assert [e["request_id"] for e in raw_ledger(server.port)] == ["a"]
        assert counted(server.port, "silent") == 1
    finally:
        halt(server)


def test_an_idle_connection_is_probed_and_replaced_when_silent(tmp_path):
    server = RedisServer(tmp_path, "--enable-debug-command", "yes")
    server.start()

    async def go():
        store = store_at(server.url, tmp_path)
        try:
            await store.ping()
            connection = store.redis._connection
            sock = connection.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            await store.redis.ping_if_idle(10)          # heard from just now: nothing sent
            sleeper = _sleep_server(server.port, 1.0)
            await asyncio.sleep(0.2)
            with pytest.raises(StoreUnavailable, match="no reply"):
                await store._call(store.redis.ping_if_idle(0.1))
            assert connection.retiring
            await asyncio.get_running_loop().run_in_executor(None, sleeper.wait)
            await store.ping()
            assert store.redis._connection is not connection
        finally:
            await store.close()
    try:
        asyncio.run(go())
    finally:
        halt(server)


# --- the gateway under load through a failover ------------------------------------------------------

def test_a_failover_under_load_is_503s_never_500s_and_every_answer_metered_once(
        tmp_path, upstreams, dead_port, jwt_keys):
    primary, replica = pair(tmp_path)
    endpoint = Endpoint(primary.port)
    config = gateway_config(f"redis://127.0.0.1:{endpoint.port}/0", upstreams, dead_port,
                            jwt_keys["jwks_file"])
    config["store_command_timeout_ms"] = 300
    config["tenants"]["failover"] = {"models": ["chat"]}
    (tmp_path / "gw").mkdir()
    gw = Gateway(tmp_path / "gw", config, workers=2).start()
    answers: list[tuple[int, str, dict]] = []
    stop = threading.Event()

    def load(key: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                r = client.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                json={"model": "chat", "messages": HI, "max_tokens": 2})
                answers.append((r.status_code, r.headers.get("x-request-id"),
                                {"retry-after": r.headers.get("retry-after"),
                                 "code": r.json().get("error", {}).get("code") if r.status_code >= 400 else None}))
    try:
        key = gw.create_key("failover")["key"]
        threads = [threading.Thread(target=load, args=(key,)) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        # Paused past the command timeout: the requests then in flight time out (their
        # settles wait for the late replies), those that follow get READONLY.
        fail_over(primary, replica, endpoint, hold_s=0.5)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
        statuses = {status for status, _, _ in answers}
        assert statuses <= {200, 503}, [a for a in answers if a[0] not in (200, 503)][:3]
        unavailable = [extra for status, _, extra in answers if status == 503]
        assert unavailable, f"no request met the failover: {len(answers)} answers"
        assert all(e == {"retry-after": "1", "code": "store_unavailable"} for e in unavailable)
        answered = sorted(rid for status, rid, _ in answers if status == 200)
        assert len(answered) > 20
        # Every answer in the new primary's ledger, once (the stream as written, not the
        # reader's deduplicated view), and counted once; kept settles land within seconds.
        def metered():
            entries = [e for e in raw_ledger(replica.port) if e["tenant"] == "failover"]
            ids = [e["request_id"] for e in entries if e["status"] == 200]
            return entries if set(answered) <= set(ids) else None
        entries = wait_for(metered, 15, "every answer in the ledger")
        ids = [e["request_id"] for e in entries]
        assert len(ids) == len(set(ids)), "an entry written twice"
        assert counted(replica.port, "failover") == len(entries)
        assert "Traceback" not in gw.log()
    finally:
        stop.set()
        gw.stop()
        endpoint.close()
        halt(primary, replica)
