"""The gateway's test bench, all real processes on 127.0.0.1: a redis-server of its own, the
fake OpenAI-compatible upstreams, and the gateway started through its own ``serve`` script
(two uvicorn workers sharing Redis), called with the official OpenAI SDK.

One Redis-backed gateway serves the whole session: its config has a tenant per limit under
test, so tests do not share counters and need no restarts.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gateway_harness import (FAKE_UPSTREAM, START_TIMEOUT_S, Gateway, RedisServer, FakeUpstreams,
                             answers, free_port, gateway_config, wait_for)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("upstream") / "upstream.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, str(FAKE_UPSTREAM), str(port)],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or answers(f"http://127.0.0.1:{port}/control/x"),
                 START_TIMEOUT_S, "the fake upstream to start")
        assert process.poll() is None, log.read_text()
        yield FakeUpstreams(port)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def dead_port():
    return free_port()        # nothing listens there: an upstream that refuses connections


@pytest.fixture(scope="session")
def jwt_keys(tmp_path_factory):
    """An RSA and an EC key pair, and a JWKS file with their public halves."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks = {"keys": []}
    for kid, key, alg in (("rsa1", rsa_key, "RS256"), ("ec1", ec_key, "ES256")):
        algorithm = jwt.get_algorithm_by_name(alg)
        jwk = json.loads(algorithm.to_jwk(key.public_key()))
        jwks["keys"].append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps(jwks))
    return {"rsa": rsa_key, "ec": ec_key, "jwks_file": str(path)}


@pytest.fixture(scope="session")
def gateway(tmp_path_factory, redis_server, upstreams, dead_port, jwt_keys):
    """Two uvicorn workers sharing the session's Redis."""
    config = gateway_config(redis_server.url, upstreams, dead_port, jwt_keys["jwks_file"])
    gw = Gateway(tmp_path_factory.mktemp("gateway"), config, workers=2).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def acme_key(gateway) -> dict:
    return gateway.create_key("acme")

