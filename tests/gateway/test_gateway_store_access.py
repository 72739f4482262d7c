"""Reaching Redis as ElastiCache asks: TLS (``rediss://``) verified against a CA file, an ACL
user, a password or IAM auth token from an environment variable or from a file that is read
again when it changes, and database 0 only where the server has no other (Serverless, a
cluster). Against real redis-server processes; the CA and the server's certificate are made
here with ``cryptography``.
"""
from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
import yaml

from gateway_harness import GATEWAY_DIR, Gateway, RedisServer, free_port, gateway_config
from spectrum_gateway.config import ConfigError, config_from_dict
from spectrum_gateway.errors import StoreUnavailable
from spectrum_gateway.store import RedisStore, StoreMisconfigured

HI = [{"role": "user", "content": "hi"}]
MODELS = {"m": {"upstreams": [{"name": "u", "url": "http://127.0.0.1:9"}]}}


def make_ca_and_server_cert(directory: Path) -> dict[str, Path]:
    """A CA, and a certificate for 127.0.0.1 / localhost that it signed: PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject, issuer, public_key, signing_key, *, ca: bool, san=None):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spectrum test CA")])
    ca_cert = certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = certificate(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), ca_name,
        server_key.public_key(), ca_key, ca=False,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    files = {"ca": directory / "ca.pem", "cert": directory / "server.pem",
             "key": directory / "server.key"}
    files["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return files


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """A redis-server speaking TLS on ``tls_port`` (and plain RESP on ``port``, for the test's
    own checks), with an ACL user ``gw`` whose password is ``first``."""
    directory = tmp_path_factory.mktemp("tls-redis")
    files = make_ca_and_server_cert(directory)
    tls_port = free_port()
    server = RedisServer(directory, "--tls-port", str(tls_port), "--tls-cert-file", str(files["cert"]),
                         "--tls-key-file", str(files["key"]), "--tls-ca-cert-file", str(files["ca"]),
                         "--tls-auth-clients", "no")
    server.start()
    redis.Redis(port=server.port).execute_command("ACL", "SETUSER", "gw", "on", ">first", "~*",
                                                  "&*", "+@all")
    server.tls_port, server.files = tls_port, files
    yield server
    server.kill()


def store_with(tmp_path: Path, store) -> RedisStore:
    return RedisStore(config_from_dict({"store": store, "store_command_timeout_ms": 2000,
                                        "store_connect_timeout_ms": 2000, "models": MODELS},
                                       tmp_path / "gateway.yaml"))


async def _round_trip(store: RedisStore) -> tuple[bytes, bytes]:
    """A key made and read back through the store's own client, and who it is to Redis."""
    try:
        key = f"access-{uuid.uuid4().hex[:8]}"
        await store.redis.command("SET", key, "v")
        return await store.redis.command("GET", key), await store.redis.command("ACL", "WHOAMI")
    finally:
        await store.close()


def test_tls_verified_against_the_ca_file_with_an_acl_user(tmp_path, tls_redis, monkeypatch):
    monkeypatch.setenv("SPECTRUM_TEST_REDIS_PASSWORD", "first")
    store = store_with(tmp_path, {"url": f"rediss://gw@127.0.0.1:{tls_redis.tls_port}/0",
                                  "ca_file": str(tls_redis.files["ca"]),
                                  "password_env": "SPECTRUM_TEST_REDIS_PASSWORD"})
    assert asyncio.run(_round_trip(store)) == (b"v", b"gw")


def test_tls_without_the_ca_is_refused_saying_what_to_give(tmp_path, tls_redis):
    store = store_with(tmp_path, f"rediss://gw:first@127.0.0.1:{tls_redis.tls_port}/0")

    async def go():
        try:
            await store.ping()
        finally:
            await store.close()
    with pytest.raises(StoreUnavailable) as refused:
        asyncio.run(go())
    assert "TLS certificate of 127.0.0.1" in refused.value.message
    assert "not trusted" in refused.value.message and "give store.ca_file" in refused.value.message


def test_a_token_file_is_read_again_when_it_changes(tmp_path, tls_redis):
    """A rotated token (an ElastiCache IAM token lives 15 minutes; a sidecar rewrites the file)
    is sent on the open connection (``AUTH`` again, as the worker's upkeep does) and used by
    the next one; a file that was not rotated in time gets WRONGPASS, a 503 naming it."""
    admin = redis.Redis(port=tls_redis.port)
    user = f"rot{uuid.uuid4().hex[:6]}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">token-1", "~*", "&*", "+@all")
    token = tmp_path / "token"
    token.write_text("token-1\n")
    store = store_with(tmp_path, {"url": f"rediss://{user}@127.0.0.1:{tls_redis.tls_port}/0",
                                  "ca_file": str(tls_redis.files["ca"]),
                                  "password_file": str(token)})

    async def go():
        try:
            await store.ping()
            first = store.redis._connection
            await store.redis.reauthenticate()              # unchanged: nothing sent
            admin.execute_command("ACL", "SETUSER", user, ">token-2", "<token-1")
            token.write_text("token-2\n")
            await store.redis.reauthenticate()
            assert store.redis._connection is first and first.password == "token-2"
            admin.execute_command("CLIENT", "KILL", "USER", user)
            await asyncio.sleep(0.1)
            await store.ping()                              # a new connection, the new token
            assert store.redis._connection is not first
            admin.execute_command("ACL", "SETUSER", user, ">token-3", "<token-2")
            admin.execute_command("CLIENT", "KILL", "USER", user)
            await asyncio.sleep(0.1)
            with pytest.raises(StoreUnavailable, match="Redis refused AUTH: WRONGPASS"):
                await store.ping()
            token.write_text("token-3")
            await store.ping()
        finally:
            await store.close()
            admin.execute_command("ACL", "DELUSER", user)
    asyncio.run(go())


@pytest.fixture(scope="module")
def one_database_redis(tmp_path_factory):
    """A Redis with database 0 only, as ElastiCache Serverless and Redis Cluster are."""
    server = RedisServer(tmp_path_factory.mktemp("one-db"), "--databases", "1")
    server.start()
    yield server
    server.kill()


def test_a_server_refusing_select_is_a_config_error(tmp_path, one_database_redis):
    url = f"redis://127.0.0.1:{one_database_redis.port}/3"
    store = store_with(tmp_path, url)

    async def go():
        try:
            with pytest.raises(StoreMisconfigured) as at_start:
                await store.warm()                  # serve: the worker does not start
            with pytest.raises(StoreUnavailable) as per_request:
                await store.ping()                  # a request: 503 saying why
            return at_start.value, per_request.value
        finally:
            await store.close()
    at_start, per_request = asyncio.run(go())
    for error in (at_start, per_request):
        assert isinstance(error, ConfigError) and error.status == 503
        assert (f"127.0.0.1:{one_database_redis.port} refused SELECT 3 (ERR DB index is out of "
                "range): it has only database 0") in error.message
        assert "end the store URL with /0" in error.message
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"store": url, "models": MODELS}))
    result = subprocess.run([sys.executable, str(GATEWAY_DIR / "admin"), "--config", str(config),
                             "usage", "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "refused SELECT 3" in result.stderr


def test_serve_refuses_to_start_on_a_database_the_server_does_not_have(
        tmp_path, one_database_redis, upstreams, dead_port, jwt_keys):
    config = gateway_config(f"redis://127.0.0.1:{one_database_redis.port}/2", upstreams,
                            dead_port, jwt_keys["jwks_file"])
    gw = Gateway(tmp_path, config)
    with pytest.raises(AssertionError):
        gw.start()
    gw.process.wait(30)
    assert gw.process.returncode != 0 and "refused SELECT 2" in gw.log()


@pytest.mark.parametrize("store, message", [
    ({"url": "rediss://h:6379/3", "serverless": True},
     "store.url: database 3: ElastiCache Serverless has only database 0; end the URL with /0"),
    ({"url": "redis://h:6379/0", "serverless": True},
     "store.url: ElastiCache Serverless speaks only TLS: write rediss://"),
    ({"url": "redis://h:6379/0", "ca_file": "ca.pem"},
     "store.ca_file: the store URL 'redis://h:6379/0' is not TLS: write rediss://"),
    ({"url": "rediss://h:6379/0", "ca_file": "nope.pem"}, "nope.pem' is not a file"),
    ({"url": "rediss://u:p@h:6379/0", "password_env": "HOME"},
     "store.password_env: give the password one way: in the URL, password_env or password_file"),
    ({"url": "rediss://h:6379/0", "password_env": "SPECTRUM_SURELY_UNSET"},
     "store.password_env: the variable 'SPECTRUM_SURELY_UNSET' is not set"),
    ({"url": "rediss://h:6379/0", "password_file": "missing-token"},
     "missing-token' is not a readable file"),
    ({"url": "memory", "ca_file": "ca.pem"}, "store.ca_file: applies to a Redis store"),
    ({"url": "rediss://h:6379/0", "serverles": True}, "store.serverles: unknown key; did you mean 'serverless'?"),
    ({"url": "rediss://h:6379/0", "serverless": "yes"}, "store.serverless: must be true or false"),
])
def test_store_options_are_checked(tmp_path, store, message):
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        config_from_dict({"store": store, "models": MODELS}, tmp_path / "gateway.yaml")


def test_store_options_are_read(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    (tmp_path / "token").write_text("t")
    config = config_from_dict({"store": {"url": "rediss://gw@h:6379/0", "ca_file": "ca.pem",
                                         "password_file": "token", "serverless": True},
                               "models": MODELS}, tmp_path / "gateway.yaml")
    assert config.store == "rediss://gw@h:6379/0" and config.uses_redis
    assert config.store_options.ca_file == str(tmp_path / "ca.pem")
    assert config.store_options.password_file == str(tmp_path / "token")
    assert config.store_options.serverless is True


def test_the_gateway_serves_through_tls_with_an_acl_user_and_a_token_file(
        tmp_path, tls_redis, upstreams, dead_port, jwt_keys):
    token = tmp_path / "token"
    token.write_text("first")
    config = gateway_config(f"rediss://gw@127.0.0.1:{tls_redis.tls_port}/0", upstreams,
                            dead_port, jwt_keys["jwks_file"])
    config["store"] = {"url": config["store"], "ca_file": str(tls_redis.files["ca"]),
                       "password_file": str(token)}
    gw = Gateway(tmp_path, config, workers=2).start()
    try:
        key = gw.create_key("pinned")
        answer = gw.client(key["key"]).chat.completions.create(model="chat", messages=HI, max_tokens=2)
        assert answer.choices[0].message.content
        entries = json.loads(gw.admin("usage", "--tenant", "pinned", "--json").stdout)["entries"]
        assert [e["key_id"] for e in entries] == [key["id"]]
    finally:
        gw.stop()
