"""Helpers for the gateway tests: real redis-server, fake upstreams, the gateway's own
``serve`` and ``admin`` scripts as subprocesses, JWTs minted with keys made here."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from options.local_server import free_port, own_process_group

REPO = Path(__file__).resolve().parents[2]
GATEWAY_DIR = REPO / "containers" / "gateway"
sys.path.insert(0, str(GATEWAY_DIR))      # the routing and quota logic, tested directly too
FAKE_UPSTREAM = Path(__file__).with_name("fake_upstream.py")
START_TIMEOUT_S = 60


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def store_at(url: str, tmp_path: Path, command_timeout_ms: int = 300, **extra):
    """The gateway's Redis store on ``url``, as a worker opens it (one model, a long concurrency
    lease), for tests that drive the store directly."""
    from spectrum_gateway.config import config_from_dict
    from spectrum_gateway.store import RedisStore

    return RedisStore(config_from_dict({
        "store": url, "store_command_timeout_ms": command_timeout_ms, "concurrency_lease_s": 600, **extra,
        "models": {"m": {"upstreams": [{"name": "u", "url": "http://127.0.0.1:9"}]}}},
        tmp_path / "gateway.yaml"))


def ledger_entry(request_id: str, tenant: str) -> dict:
    """A whole answer's ledger entry: 3 tokens in, 4 out."""
    from spectrum_gateway import meter

    return meter.ledger_entry(request_id=request_id, tenant=tenant, key_id="k", model="m",
                              upstream="u", fallback_from=[], input_tokens=3, output_tokens=4,
                              usage_source="upstream", status=200, latency_s=0.01, stream=False,
                              cost_usd=0.0)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class RedisServer:
    """A redis-server on a free port with its own directory; ``stop`` saves, ``start`` loads."""

    def __init__(self, directory: Path, *extra_args: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: the gateway's shared-state tests need "
                        "it; tests/run.sh installs it (Debian: apt-get install redis-server)")
        self.binary, self.dir, self.port = binary, directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.extra_args = list(extra_args)       # e.g. --appendonly yes: survives a SIGKILL
        self.process = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "redis.log",
             *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        client = redis.Redis(port=self.port)
        wait_for(lambda: self._ping(client), 10, "redis-server to answer")

    @staticmethod
    def _ping(client) -> bool:
        import redis
        try:
            return client.ping()
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: gone at once, mid-command, as a crashed or unplugged Redis is."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            import redis
            try:
                redis.Redis(port=self.port).shutdown(save=True)
            except redis.RedisError:
                pass
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class FakeUpstreams:
    def __init__(self, port: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def url(self, name: str) -> str:
        return f"{self.base}/u/{name}/v1"

    def set(self, name: str, **behaviour) -> dict:
        return httpx.post(f"{self.base}/control/{name}", json=behaviour, timeout=5).json()

    def stats(self, name: str) -> dict:
        return httpx.get(f"{self.base}/control/{name}", timeout=5).json()


class Gateway:
    """``containers/gateway/serve`` in a subprocess, with its config and its log."""

    def __init__(self, directory: Path, config: dict, workers: int = 1) -> None:
        self.dir, self.workers = directory, workers
        self.config_path = directory / "gateway.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = directory / "gateway.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = None

    def start(self) -> "Gateway":
        # Bedrock and SageMaker upstreams are the fake server behind endpoint_url: botocore
        # signs with these made-up credentials, as it would with real ones.
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        env.pop("AWS_PROFILE", None)
        with open(self.log_path, "a") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(GATEWAY_DIR / "serve"), "--config", str(self.config_path),
                 "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)],
                stdout=out, stderr=subprocess.STDOUT, env=env, **own_process_group())
        wait_for(lambda: self.process.poll() is not None or answers(self.url + "/readyz"),
                 START_TIMEOUT_S, "the gateway to answer /readyz")
        assert self.process.poll() is None, self.log()
        if self.workers > 1:     # every worker up, not just the first
            wait_for(lambda: self.log().count("Application startup complete") >= self.workers,
                     START_TIMEOUT_S, "every worker to start")
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def admin(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, str(GATEWAY_DIR / "admin"), "--config",
                                 str(self.config_path), *args], capture_output=True, text=True,
                                timeout=60)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def ledger(self, where=lambda entry: True, at_least: int = 1, tenant: str | None = None,
               timeout_s: float = 10) -> list[dict]:
        """The usage entries ``where`` selects, once there are ``at_least`` of them: a stream
        read to its ``[DONE]`` is in the ledger by then, but one its client or upstream cut
        short is metered when the gateway notices, which can be later."""
        args = ["usage", "--json"] + (["--tenant", tenant] if tenant else [])

        def entries():
            found = [e for e in json.loads(self.admin(*args).stdout)["entries"] if where(e)]
            return found if len(found) >= at_least else None
        return wait_for(entries, timeout_s, f"{at_least} ledger entries", interval_s=0.3)

    def create_key(self, tenant: str, models: str | None = None) -> dict:
        args = ["keys", "create", "--tenant", tenant, "--json"]
        if models:
            args += ["--models", models]
        return json.loads(self.admin(*args).stdout)

    def client(self, key: str, **kw):
        import openai
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, **kw)

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics, read with Prometheus's own parser (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families
        text = httpx.get(self.url + "/metrics", timeout=10).text
        samples = {(s.name, frozenset(s.labels.items())): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        return samples.get((name, frozenset(labels.items())), 0.0)


def models_config(up: FakeUpstreams, dead_port: int) -> dict:
    return {
        "chat": {"upstreams": [{"name": "stable", "url": up.url("stable"), "weight": 90},
                               {"name": "canary", "url": up.url("canary"), "weight": 10},
                               {"name": "backup", "url": up.url("backup"), "weight": 0}],
                 "tenants": {"pinned": "canary"}, "fallback": ["backup"]},
        "flaky": {"upstreams": [{"name": "flaky", "url": up.url("flaky"), "weight": 1},
                                {"name": "backup", "url": up.url("backup"), "weight": 0}],
                  "fallback": ["backup"]},
        "dead": {"upstreams": [{"name": "refused", "url": f"http://127.0.0.1:{dead_port}/v1"},
                               {"name": "refused2", "url": f"http://127.0.0.1:{dead_port}/v2",
                                "weight": 0}],
                 "fallback": ["refused2"]},
        "slow": {"upstreams": [{"name": "hang", "url": up.url("hang")}]},
        "stream": {"upstreams": [{"name": "slowstream", "url": up.url("slowstream")}]},
        "abort": {"upstreams": [{"name": "abortme", "url": up.url("abortme")}]},
        # The issue's shape: a self-hosted upstream first, a managed rung as its fallback.
        "managed": {"upstreams": [{"name": "selfhosted", "url": f"http://127.0.0.1:{dead_port}/v1"},
                                  {"name": "bedrock", "weight": 0, "bedrock": {
                                      "model_id": "fake.model-v1", "region": "us-east-1",
                                      "endpoint_url": up.base}}],
                    "fallback": ["bedrock"]},
        "endpoint": {"upstreams": [{"name": "sagemaker", "sagemaker": {
            "endpoint": "byo-ep", "dialect": "openai-chat", "region": "us-east-1",
            "endpoint_url": up.base}}]},
        "priced": {"upstreams": [{"name": "pricey", "url": up.url("pricey"),
                                  "usd_per_mtok_input": 1000, "usd_per_mtok_output": 1000}]},
    }


ISSUER, AUDIENCE = "https://idp.example", "spectrum"


def mint(jwt_keys, tenant: str | None = "acme", alg: str = "RS256", **claims) -> str:
    import jwt
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300}
    if tenant is not None:
        payload["tenant"] = tenant
    payload.update(claims)
    payload = {k: v for k, v in payload.items() if v is not None}
    key, kid = (jwt_keys["rsa"], "rsa1") if alg == "RS256" else (jwt_keys["ec"], "ec1")
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})


def unsigned_jwt(header: dict, payload: dict, signature: bytes = b"") -> str:
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()   # noqa: E731
    return ".".join([enc(json.dumps(header).encode()), enc(json.dumps(payload).encode()),
                     enc(signature)])


def gateway_config(store: str, up: FakeUpstreams, dead_port: int, jwks_file: str) -> dict:
    return {
        "store": store,
        "upstream_timeout_s": 1.5,
        "connect_timeout_s": 1,
        "jwt": {"jwks_file": jwks_file, "issuer": ISSUER, "audience": AUDIENCE,
                "tenant_claim": "tenant"},
        "tenants": {
            "acme": {"rpm": 100000, "models": ["chat", "flaky", "dead", "slow", "stream", "abort",
                                                "managed", "endpoint"]},
            "rpm30": {"rpm": 30, "models": ["chat"]},
            "tpm200": {"tpm": 200, "models": ["chat"]},
            "conc1": {"max_concurrency": 1, "models": ["stream"]},
            "budget": {"budget_usd_month": 0.5, "models": ["priced"]},
            "pinned": {"models": ["chat"]},
            "default": {"rpm": 1000, "models": ["chat"]},
        },
        "models": models_config(up, dead_port),
    }


async def tcp_server(handler, tls: ssl.SSLContext | None = None) -> tuple[asyncio.AbstractServer, int]:
    """A server on a free 127.0.0.1 port running ``handler(reader, writer, connection_number)``
    for each client (over TLS with ``tls``): a peer written byte by byte in a test, for what a
    real server will not do on request (silence, garbage, a connection cut mid-answer)."""
    count = 0

    async def on_connect(reader, writer):
        nonlocal count
        count += 1
        try:
            await handler(reader, writer, count)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()
    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]
