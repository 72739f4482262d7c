"""The Redis store on a Redis Cluster: 3 primaries and 3 replicas of Debian's redis-server,
made once per test session by the fixture below (``redis-cli --cluster create``), the store
given any one node as ``redis://HOST:PORT/0``. It finds out it is a cluster (``CLUSTER SLOTS``
when it connects, or the first ``MOVED``), sends each command to its slot's primary (a
tenant's quota keys share a hash tag, so one Lua script holds them all), follows ``MOVED`` and
``ASK``, and asks for the slot map again after a failover. Under load, with a primary failed
over (``CLUSTER FAILOVER`` on its replica), two gateway workers keep the tenant's rpm exact,
meter every answer once, and answer nothing worse than 503.
"""
from __future__ import annotations

import asyncio
import json
import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import RedisCluster

from gateway_harness import Gateway, gateway_config, ledger_entry, store_at, wait_for
from spectrum_gateway import meter
from spectrum_gateway.config import ConfigError, TenantLimits
from spectrum_gateway.resp import key_slot
from spectrum_gateway.store import StoreMisconfigured

HI = [{"role": "user", "content": "hi"}]
NODES = 6
LEDGER_KEY = "spectrum:ledger"


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (+10,000) are free too: each ≤ 55,535."""
    chosen: list[int] = []
    rng = random.Random()
    while len(chosen) < count:
        port = rng.randrange(20000, 45000)
        if port not in chosen and port + 10000 not in chosen and _free(port) and _free(port + 10000):
            chosen.append(port)
    return chosen


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root, self.ports, self.processes = root, cluster_ports(NODES), []

    def start(self) -> "Cluster":
        binary = shutil.which("redis-server")
        for port in self.ports:
            directory = self.root / str(port)
            directory.mkdir()
            self.processes.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "3000", "--save", "", "--appendonly", "no",
                 "--repl-diskless-sync-delay", "0", "--logfile", "redis.log"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in self.ports:
            wait_for(lambda: self._answers(port), 15, f"cluster node {port} to start")
        create = subprocess.run(
            [shutil.which("redis-cli"), "--cluster", "create",
             *[f"127.0.0.1:{p}" for p in self.ports], "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=120)
        assert create.returncode == 0, create.stdout + create.stderr
        wait_for(self.settled, 60, "the cluster to be ok and its replicas in sync", interval_s=0.2)
        return self

    @staticmethod
    def _answers(port: int) -> bool:
        try:
            return redis.Redis(port=port).ping()
        except redis.RedisError:
            return False

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True)

    def settled(self) -> bool:
        """Every node says cluster_state:ok and knows 3 primaries, each with a synced replica."""
        try:
            for port in self.ports:
                if self.node(port).cluster("info")["cluster_state"] != "ok":
                    return False
            roles = [self.node(port).info("replication") for port in self.ports]
        except redis.RedisError:
            return False
        replicas = [r for r in roles if r["role"] == "slave"]
        if not (len(replicas) == NODES // 2
                and all(r["master_link_status"] == "up" for r in replicas)
                and all(r["master_repl_offset"] == r["slave_repl_offset"] for r in replicas)):
            return False
        for port in self.ports:          # every node's map: 3 primaries, each with its replica
            ranges = self.node(port).execute_command("CLUSTER", "SLOTS")
            if len({int(p[1]) for _, _, p, *_ in ranges}) != NODES // 2 or any(
                    len(r) < 4 for r in ranges):
                return False
        return True

    def slots(self) -> dict[int, int]:
        """Each primary's port → its replica's port (as the cluster says now)."""
        out = {}
        for start, end, primary, *replicas in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            out[int(primary[1])] = int(replicas[0][1]) if replicas else None
        return out

    def primaries(self) -> list[int]:
        return sorted({int(p[1]) for _, _, p, *_ in
                       self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS")})

    def primary_of(self, key: str) -> int:
        slot = key_slot(key)
        for start, end, primary, *_ in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise AssertionError(f"slot {slot} is served by no node")

    def replica_of(self, primary: int) -> int:
        return self.slots()[primary]

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0])

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_key_slots_are_the_clusters(redis_cluster):
    node = redis_cluster.node(redis_cluster.ports[0])
    keys = ["spectrum:ledger", "spectrum:metrics", "spectrum:q:{acme}:rq", "{}x", "a{b}c{d}",
            "foo{{bar}}zap", "é{ü}", *[f"k{random.random()}" for _ in range(200)]]
    for key in keys:
        assert key_slot(key) == node.execute_command("CLUSTER", "KEYSLOT", key), key


def _tenants_on_every_primary(cluster: Cluster) -> list[str]:
    """Tenant names whose quota keys (hash tag {tenant}) fall on each primary in turn."""
    by_primary: dict[int, str] = {}
    for i in range(1000):
        name = f"tenant{i}"
        by_primary.setdefault(cluster.primary_of(f"{{{name}}}"), name)
        if len(by_primary) == NODES // 2:
            return list(by_primary.values())
    raise AssertionError("no tenant name for some primary")


@pytest.mark.parametrize("seed", ["primary without the ledger", "replica"])
def test_any_node_leads_the_store_to_the_whole_cluster(tmp_path, redis_cluster, seed):
    ledger_primary = redis_cluster.primary_of(LEDGER_KEY)
    if seed == "replica":
        port = redis_cluster.replica_of(redis_cluster.primaries()[0])
    else:
        port = next(p for p in redis_cluster.primaries() if p != ledger_primary)
    url = f"redis://127.0.0.1:{port}/0"
    tenants = _tenants_on_every_primary(redis_cluster)
    run = f"{seed.split()[0]}-{random.randrange(10**9)}"

    async def serve():
        store = store_at(url, tmp_path, command_timeout_ms=2000)
        try:
            await store.warm()
            assert store.redis.cluster
            for tenant in tenants:
                limits = TenantLimits(tenant, rpm=1000, max_concurrency=1)
                for n in range(3):
                    request_id = f"{run}-{tenant}-{n}"
                    assert (await store.reserve(limits, request_id, 10, 0.0)).allowed
                    entry = ledger_entry(request_id, tenant)
                    await store.finish(limits, request_id, -3, 0.0, entry, meter.increments(entry))
                assert await store.attained(tenant, run, 60) == 0   # INCR and PEXPIRE: one key
                assert await store.attained(tenant, run, 60) == 1
        finally:
            await store.close()

    async def read():
        # A store that never called warm: the first MOVED tells it (the seed serves no ledger).
        store = store_at(url, tmp_path, command_timeout_ms=2000)
        try:
            entries = await store.ledger()
            return entries, store.redis.cluster
        finally:
            await store.close()
    asyncio.run(serve())
    entries, found = asyncio.run(read())
    assert found
    mine = [e["request_id"] for e in entries if e["request_id"].startswith(run)]
    assert mine == [f"{run}-{t}-{n}" for t in tenants for n in range(3)]
    # Each tenant's quota keys on the primary of its hash tag, nowhere else.
    for tenant in tenants:
        primary = redis_cluster.primary_of(f"{{{tenant}}}")
        assert redis_cluster.node(primary).exists(f"spectrum:q:{{{tenant}}}:rq")


def test_a_database_other_than_0_is_a_config_error(tmp_path, redis_cluster):
    store = store_at(f"redis://127.0.0.1:{redis_cluster.ports[1]}/2", tmp_path, command_timeout_ms=2000)

    async def go():
        try:
            await store.warm()
        finally:
            await store.close()
    with pytest.raises(StoreMisconfigured) as refused:
        asyncio.run(go())
    assert isinstance(refused.value, ConfigError)
    assert "refused SELECT 2 (ERR SELECT is not allowed in cluster mode)" in refused.value.message
    assert "end the store URL with /0" in refused.value.message


def test_ask_during_a_slot_migration_is_followed(tmp_path, redis_cluster):
    """A slot being migrated answers ASK for a key it no longer has: the command goes, after
    ASKING, to the importing node; once the slot has moved, MOVED sends it there for good."""
    key = next(k for k in (f"ask-{i}" for i in range(10_000))
               if redis_cluster.node(redis_cluster.primary_of(k))
               .execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(k)) == 0)
    slot, source = key_slot(key), redis_cluster.primary_of(key)
    target = next(p for p in redis_cluster.primaries() if p != source)
    ids = {p: redis_cluster.node(p).execute_command("CLUSTER", "MYID") for p in (source, target)}
    src, dst = redis_cluster.node(source), redis_cluster.node(target)

    async def go():
        store = store_at(f"redis://127.0.0.1:{source}/0", tmp_path, command_timeout_ms=2000)
        try:
            await store.warm()
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
            await store.redis.command("SET", key, "moved-along")         # ASK → target
            assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            for node in (src, dst):
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
            assert await store.redis.command("GET", key) == b"moved-along"     # MOVED → target
            assert store.redis._slots[slot].port == target
            await store.redis.command("DEL", key)
        finally:
            await store.close()
            for node in (src, dst):          # the slot back where it was, empty
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[source])
    asyncio.run(go())
    wait_for(redis_cluster.settled, 30, "the cluster to settle")


def test_a_primary_failed_over_under_load_keeps_rpm_exact_and_meters_each_answer_once(
        tmp_path, redis_cluster, upstreams, dead_port, jwt_keys):
    # A tenant whose quota keys live on the ledger's primary: the failover moves both.
    ledger_primary = redis_cluster.primary_of(LEDGER_KEY)
    tenant = next(t for t in (f"fo{i}" for i in range(5000))
                  if redis_cluster.primary_of(f"{{{t}}}") == ledger_primary)
    replica = redis_cluster.replica_of(ledger_primary)
    rpm = 300
    seed = next(p for p in redis_cluster.ports if p not in (ledger_primary, replica))
    config = gateway_config(f"redis://127.0.0.1:{seed}/0", upstreams, dead_port, jwt_keys["jwks_file"])
    config["tenants"][tenant] = {"rpm": rpm, "models": ["chat"]}
    gw = Gateway(tmp_path, config, workers=2).start()
    answers: list[tuple[int, str, dict]] = []
    stop, failed_over = threading.Event(), threading.Event()

    def load(key: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                r = client.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                json={"model": "chat", "messages": HI, "max_tokens": 2})
                answers.append((r.status_code, r.headers.get("x-request-id"),
                                {"retry-after": r.headers.get("retry-after")}))

    def fail_over() -> None:
        while sum(1 for a in answers if a[0] == 200) < rpm // 2:     # mid-load, mid-quota
            time.sleep(0.01)
        redis_cluster.node(replica).execute_command("CLUSTER", "FAILOVER")
        wait_for(lambda: redis_cluster.node(replica).info("replication")["role"] == "master",
                 30, "the replica to take over")
        failed_over.set()
    try:
        key = gw.create_key(tenant)["key"]
        threads = [threading.Thread(target=load, args=(key,)) for _ in range(4)]
        switch = threading.Thread(target=fail_over)
        for t in [*threads, switch]:
            t.start()
        wait_for(lambda: failed_over.is_set() and sum(1 for a in answers if a[0] == 429) >= 20,
                 40, "the failover and the tenant's rpm reached")
        stop.set()
        for t in [*threads, switch]:
            t.join(30)
        assert redis_cluster.primary_of(LEDGER_KEY) == replica      # it did move
        by_status: dict[int, int] = {}
        for status, _, _ in answers:
            by_status[status] = by_status.get(status, 0) + 1
        assert set(by_status) <= {200, 429, 503}, by_status
        assert all(extra["retry-after"] for status, _, extra in answers if status in (429, 503))
        # Exact: no more than rpm answered in the window; fewer only by requests answered 503
        # whose reservation Redis may have taken (a reply lost: counted, as the quota says).
        assert rpm - by_status.get(503, 0) <= by_status[200] <= rpm, by_status
        answered = {rid for status, rid, _ in answers if status == 200}
        client = redis_cluster.client()

        def metered():
            entries = [json.loads(fields[b"e"]) for _, fields in client.xrange(LEDGER_KEY)]
            entries = [e for e in entries if e["tenant"] == tenant]
            ids = {e["request_id"] for e in entries if e["status"] == 200}
            return entries if answered <= ids else None
        entries = wait_for(metered, 15, "every answer in the ledger")
        ids = [e["request_id"] for e in entries]
        assert len(ids) == len(set(ids)), "an entry written twice"
        counters = client.hgetall("spectrum:metrics")
        counted = sum(float(v) for k, v in counters.items()
                      if k.startswith(f'spectrum_gateway_requests_total{{tenant="{tenant}"'.encode()))
        assert counted == len(entries)
        assert "Traceback" not in gw.log()
    finally:
        stop.set()
        gw.stop()
        wait_for(redis_cluster.settled, 60, "the cluster to settle")


def test_a_pipeline_across_nodes_says_which_commands_ran_when_one_node_is_silent():
    """Two nodes written in the test: one answers, one reads the command and says nothing,
    then hangs up. The round trip fails within the timeout, and its outcome tells the reply
    that came from the one that never did (UNKNOWN: it may have run), so that a settle
    sends again only what may not have run."""
    from gateway_harness import tcp_server
    from spectrum_gateway.resp import UNKNOWN, Redis, Unreachable

    async def answers(reader, writer, n):
        while data := await reader.read(65536):
            writer.write(b":1\r\n" * data.count(b"INCR"))
            await writer.drain()

    async def silent(reader, writer, n):
        await reader.read(65536)
        await asyncio.sleep(0.5)            # then the connection closes: no reply ever

    async def go():
        server_a, port_a = await tcp_server(answers)
        server_b, port_b = await tcp_server(silent)
        redis = Redis(f"redis://127.0.0.1:{port_a}/0", 1.0, 0.2)
        node_b = redis._node("127.0.0.1", port_b)
        redis._slots = [redis._seed] * 8192 + [node_b] * 8192      # as CLUSTER SLOTS would say
        key_a = next(k for k in (f"a{i}" for i in range(1000)) if key_slot(k) < 8192)
        key_b = next(k for k in (f"b{i}" for i in range(1000)) if key_slot(k) >= 8192)
        try:
            with pytest.raises(Unreachable, match="no reply within 200 ms") as failed:
                await redis.pipeline([("INCR", key_a), ("INCR", key_b), ("INCR", key_a)])
            assert failed.value.sent and failed.value.outcome is not None
            assert await asyncio.wait_for(failed.value.outcome, 5) == [1, UNKNOWN, 1]
        finally:
            redis.close()
            server_a.close()
            server_b.close()
    asyncio.run(go())
