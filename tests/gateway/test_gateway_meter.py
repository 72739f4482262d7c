"""Step 6 and the faults: the ledger, /metrics, health, and a store that goes away."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from gateway_harness import Gateway, RedisServer, gateway_config, wait_for

HI = [{"role": "user", "content": "one two three"}]


def test_every_request_is_in_the_ledger_and_the_metrics(gateway, upstreams):
    key = gateway.create_key("acme")
    client = gateway.client(key["key"])
    upstreams.set("slowstream", interval_s=0.005)
    client.chat.completions.create(model="stream", messages=HI, max_tokens=4)
    list(client.chat.completions.create(model="stream", messages=HI, max_tokens=5, stream=True))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HI, max_tokens=5)

    # Ledger order is the order requests finished in: compare them in request order.
    order = {"False200": 0, "True200": 1, "False404": 2}
    mine = sorted(gateway.ledger(lambda e: e["key_id"] == key["id"], 3, tenant="acme"),
                  key=lambda e: order.get(f"{e['stream']}{e['status']}", 3))
    assert [(e["model"], e["upstream"], e["status"], e["stream"]) for e in mine] == [
        ("stream", "slowstream", 200, False), ("stream", "slowstream", 200, True),
        ("nope", None, 404, False)]
    # Tokens are the upstream's own count (3 prompt words), not the gateway's estimate.
    assert [(e["input_tokens"], e["output_tokens"], e["usage_source"]) for e in mine[:2]] == [
        (3, 4, "upstream"), (3, 5, "upstream")]
    assert all(e["latency_ms"] > 0 and e["tenant"] == "acme" for e in mine)

    labels = dict(model="stream", tenant="acme", upstream="slowstream")
    assert gateway.metric("spectrum_gateway_requests_total", status="200", **labels) >= 2
    assert gateway.metric("spectrum_gateway_tokens_total", direction="output", **labels) >= 9
    assert gateway.metric("spectrum_gateway_request_seconds_count", tenant="acme",
                          upstream="slowstream") >= 2


def test_aborted_stream_is_metered_as_499(gateway, upstreams):
    key = gateway.create_key("acme")
    upstreams.set("abortme", interval_s=0.05)
    with gateway.client(key["key"]).chat.completions.with_streaming_response.create(
            model="abort", messages=HI, max_tokens=100, stream=True) as response:
        next(iter(response.parse()))

    [aborted] = gateway.ledger(lambda e: e["key_id"] == key["id"], tenant="acme")
    assert aborted["status"] == 499 and aborted["upstream"] == "abortme"


def test_keys_never_reach_logs_metrics_or_the_ledger(gateway, redis_server):
    key = gateway.create_key("acme")
    gateway.client(key["key"]).chat.completions.create(model="chat", messages=HI, max_tokens=2)
    wrong = key["key"][:-6] + "WRONG1"
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.client(wrong).chat.completions.create(model="chat", messages=HI, max_tokens=2)
    assert wrong not in info.value.message
    import redis
    dump = repr(redis.Redis(port=redis_server.port).xrange("spectrum:ledger"))
    metrics_text = httpx.get(gateway.url + "/metrics").text
    # The secret follows the key id; token_urlsafe may put "-" inside it, so split once after the id.
    secret_part = key["key"].split(f"{key['id']}-", 1)[1]
    assert len(secret_part) >= 40, key
    for text in (gateway.log(), metrics_text, dump):
        assert secret_part not in text and "WRONG1" not in text
    assert 'spectrum_gateway_auth_failures_total{reason="invalid_api_key"}' in metrics_text


def test_health_and_readiness(gateway):
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(gateway.url + "/readyz").json()["status"] == "ready"


def test_store_down_is_503_fast_naming_it_and_recovers_without_restart(
        tmp_path, upstreams, dead_port, jwt_keys):
    store = RedisServer(tmp_path)
    store.start()
    config = gateway_config(store.url, upstreams, dead_port, jwt_keys["jwks_file"])
    config["store_connect_timeout_ms"] = 5000     # fast means refused, not timed out
    gw = Gateway(tmp_path, config)
    gw.start()
    try:
        key = gw.create_key("acme")
        body = {"model": "chat", "messages": HI, "max_tokens": 2}
        headers = {"Authorization": f"Bearer {key['key']}"}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=10) as http:
            assert http.post("/v1/chat/completions", json=body).status_code == 200
            store.stop()                 # saves its data, as a restarted Redis would have it
            timings = []
            for _ in range(5):
                started = time.perf_counter()
                r = http.post("/v1/chat/completions", json=body)
                timings.append(time.perf_counter() - started)
                assert r.status_code == 503
                assert r.json()["error"]["message"].startswith(f"the gateway's store {store.url} is unreachable")
            # A stopped server refuses the connection: answered without waiting the 5 s out.
            assert max(timings) < 5, timings
            ready = http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["store"] == store.url
            # The OpenAI SDK sees a 503 it can retry, not a hang.
            with pytest.raises(openai.InternalServerError) as info:
                gw.client(key["key"]).chat.completions.create(**body)
            assert info.value.status_code == 503

            store.start()
            wait_for(lambda: http.post("/v1/chat/completions", json=body).status_code == 200, 10,
                     "the gateway to use the store again")
        usage = json.loads(gw.admin("usage", "--json").stdout)
        # Requests refused while the store was down were not answered, so not metered as served.
        assert [e["status"] for e in usage["entries"]].count(200) >= 2
        assert 503 not in [e["status"] for e in usage["entries"]]
    finally:
        gw.stop()
        store.stop()


def test_a_killed_worker_is_replaced_while_the_other_serves(tmp_path, redis_server, upstreams,
                                                            dead_port, jwt_keys):
    import os
    import signal

    import psutil
    gw = Gateway(tmp_path, gateway_config(redis_server.url, upstreams, dead_port,
                                          jwt_keys["jwks_file"]), workers=2).start()
    try:
        key = gw.create_key("acme")
        headers = {"Authorization": f"Bearer {key['key']}"}
        body = {"model": "chat", "messages": HI, "max_tokens": 1}

        def workers():
            """The live worker processes: gunicorn's arbiter has no other children (a killed
            worker is a zombie until it is reaped)."""
            live = set()
            for p in psutil.Process(gw.process.pid).children():
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        live.add(p.pid)
                except psutil.Error:
                    pass
            return live
        before = wait_for(lambda: len(workers()) == 2 and workers(), 30, "two workers")
        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10) as fresh:
            # The survivor answers meanwhile; a connection the dead worker accepted may reset.
            codes = []
            for _ in range(10):
                try:
                    codes.append(fresh.post(gw.url + "/v1/chat/completions", json=body,
                                            headers=headers).status_code)
                except httpx.TransportError:
                    codes.append("reset")
            assert codes.count(200) >= 8, codes
            after = wait_for(lambda: len(workers()) == 2 and workers(), 60, "a new worker")
            assert victim not in after
            wait_for(lambda: gw.log().count("Application startup complete") >= 3, 60,
                     "the new worker to start")
            assert {fresh.post(gw.url + "/v1/chat/completions", json=body, headers=headers).status_code
                    for _ in range(10)} == {200}
    finally:
        gw.stop()
