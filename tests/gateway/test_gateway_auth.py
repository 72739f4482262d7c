"""Step 1 and 2 of the path: who is calling (API keys, JWTs) and which tenant that is."""
from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx
import openai
import pytest

from gateway_harness import mint, unsigned_jwt, wait_for
from spectrum_gateway.store import KEYS_RELOAD_S

CHAT = dict(model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=3)


def test_bearer_api_key_is_answered_with_rate_limit_headers(gateway, acme_key):
    raw = gateway.client(acme_key["key"]).chat.completions.with_raw_response.create(**CHAT)
    answer = raw.parse()
    assert answer.choices[0].message.content.count(":") == 3
    assert answer.usage.completion_tokens == 3
    for h in ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
              "x-ratelimit-reset-requests"):
        assert raw.headers[h]
    assert raw.headers["x-ratelimit-limit-requests"] == "100000"
    assert "server" not in raw.headers        # a public endpoint need not name its software


def test_x_api_key_header_works_too(gateway, acme_key):
    answer = gateway.client("unused").chat.completions.create(
        **CHAT, extra_headers={"Authorization": openai.Omit(), "x-api-key": acme_key["key"]})
    assert answer.usage.completion_tokens == 3


@pytest.mark.parametrize("key", ["", "sk-not-ours", "sk-spg-000000000000-" + "A" * 43])
def test_wrong_keys_get_401_in_openai_shape(gateway, key):
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.client(key or "x").chat.completions.create(**CHAT)
    body = info.value.response.json()
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["code"] == "invalid_api_key"


def test_a_key_differing_in_its_secret_part_is_refused(gateway, acme_key):
    forged = acme_key["key"][:-4] + ("AAAA" if not acme_key["key"].endswith("AAAA") else "BBBB")
    with pytest.raises(openai.AuthenticationError):
        gateway.client(forged).chat.completions.create(**CHAT)


def test_store_holds_only_the_hmac(gateway, redis_server, acme_key):
    import redis
    raw = redis.Redis(port=redis_server.port).hget("spectrum:keys", acme_key["id"])
    record = json.loads(raw)
    assert acme_key["key"] not in raw.decode()
    secret = (gateway.dir / "gateway.state" / "secret").read_text().strip().encode()
    assert record["hash"] == hmac.new(secret, acme_key["key"].encode(), hashlib.sha256).hexdigest()


def test_revoked_key_stops_on_every_worker_within_a_second(gateway):
    key = gateway.create_key("acme")
    headers = {"Authorization": f"Bearer {key['key']}"}
    # No keep-alive: a fresh connection per request, so both workers get some of them.
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as fresh:
        def code():
            r = fresh.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers)
            return r.status_code, (r.json().get("error") or {}).get("code")
        assert {code() for _ in range(8)} == {(200, None)}      # both workers know the key
        gateway.admin("keys", "revoke", key["id"])
        revoked_at = time.monotonic()
        wait_for(lambda: code() == (401, "revoked_api_key"), 5, "the revoke to land",
                 interval_s=0.02)
        time.sleep(max(0.0, 1 - (time.monotonic() - revoked_at)))
        # One second after the revoke, no worker serves it (each trusts a record 0.5 s).
        assert {code() for _ in range(12)} == {(401, "revoked_api_key")}


def test_key_restricted_to_models(gateway):
    key = gateway.create_key("acme", models="chat")
    client = gateway.client(key["key"])
    client.chat.completions.create(**CHAT)
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(**{**CHAT, "model": "flaky"})
    assert f"API key {key['id']} may not use model 'flaky'" in info.value.message


# --- JWTs

def test_rs256_and_es256_jwts_name_the_tenant(gateway, jwt_keys):
    for alg in ("RS256", "ES256"):
        raw = gateway.client(mint(jwt_keys, "acme", alg)).chat.completions.with_raw_response.create(**CHAT)
        assert raw.headers["x-ratelimit-limit-requests"] == "100000"   # acme's, not default's


def test_jwt_tenant_not_listed_gets_default(gateway, jwt_keys):
    raw = gateway.client(mint(jwt_keys, "newcomer")).chat.completions.with_raw_response.create(**CHAT)
    assert raw.headers["x-ratelimit-limit-requests"] == "1000"


# Times are offsets from when the test runs, not from when pytest collected it: a long suite
# can run this many minutes after collection.
@pytest.mark.parametrize("claims, fragment", [
    (lambda now: {"exp": now - 10}, "Signature has expired"),
    (lambda now: {"nbf": now + 600}, "not yet valid"),
    (lambda now: {"iss": "https://evil.example"}, "Invalid issuer"),
    (lambda now: {"aud": "someone-else"}, "Audience doesn't match"),
    (lambda now: {"exp": None}, 'Token is missing the "exp" claim'),
], ids=["expired", "not-yet-valid", "issuer", "audience", "no-exp"])
def test_jwt_claims_are_checked(gateway, jwt_keys, claims, fragment):
    claims = claims(int(time.time()))
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.client(mint(jwt_keys, "acme", **claims)).chat.completions.create(**CHAT)
    assert fragment in info.value.message


def test_alg_none_is_refused(gateway):
    token = unsigned_jwt({"alg": "none", "typ": "JWT"},
                         {"iss": "https://idp.example", "aud": "spectrum", "tenant": "acme",
                          "exp": int(time.time()) + 300})
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.client(token).chat.completions.create(**CHAT)
    assert "alg 'none' is not accepted" in info.value.message


def test_hs256_signed_with_the_public_key_is_refused(gateway, jwt_keys):
    from cryptography.hazmat.primitives import serialization
    public_pem = jwt_keys["rsa"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": "rsa1"}
    payload = {"iss": "https://idp.example", "aud": "spectrum", "tenant": "acme",
               "exp": int(time.time()) + 300}
    unsigned = unsigned_jwt(header, payload).rsplit(".", 1)[0]
    signature = hmac.new(public_pem, unsigned.encode(), hashlib.sha256).digest()
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.client(unsigned_jwt(header, payload, signature)).chat.completions.create(**CHAT)
    assert "alg 'HS256' is not accepted" in info.value.message


def test_jwt_signed_by_a_key_outside_the_jwks_is_refused(gateway, jwt_keys):
    from cryptography.hazmat.primitives.asymmetric import rsa
    stranger = {**jwt_keys, "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.client(mint(stranger, "acme")).chat.completions.create(**CHAT)
    assert "Signature verification failed" in info.value.message


def test_jwt_without_tenant_claim_is_403(gateway, jwt_keys):
    with pytest.raises(openai.PermissionDeniedError) as info:
        gateway.client(mint(jwt_keys, None)).chat.completions.create(**CHAT)
    assert "no 'tenant' claim" in info.value.message


def test_unknown_tenant_without_default_is_403_and_jwks_from_a_url(tmp_path, upstreams, dead_port, jwt_keys):
    from gateway_harness import Gateway, gateway_config
    config = gateway_config("memory", upstreams, dead_port, jwt_keys["jwks_file"])
    del config["tenants"]["default"]
    # This gateway fetches its keys from the identity provider's URL instead of a file.
    with open(jwt_keys["jwks_file"]) as f:
        upstreams.set("jwks", keys=json.load(f)["keys"])
    del config["jwt"]["jwks_file"]
    config["jwt"]["jwks_url"] = upstreams.base + "/jwks"
    gw = Gateway(tmp_path, config).start()
    try:
        with pytest.raises(openai.PermissionDeniedError) as info:
            gw.client(mint(jwt_keys, "stranger")).chat.completions.create(**CHAT)
        assert "tenant 'stranger' is not configured and this gateway has no default tenant" \
            in info.value.message
        # A refused request is metered under the names the identity provider gave, in any
        # script: the ledger line is UTF-8 and reads back as sent.
        with pytest.raises(openai.PermissionDeniedError):
            gw.client(mint(jwt_keys, "étranger-東京", sub="utilisateur-ü")).chat.completions \
                .create(**CHAT)
        [refused_entry] = gw.ledger(lambda e: e["tenant"] == "étranger-東京")
        assert (refused_entry["key_id"], refused_entry["status"]) == ("jwt:utilisateur-ü", 403)
        assert gw.client(mint(jwt_keys, "acme", "ES256")).chat.completions.create(**CHAT).usage
        with pytest.raises(openai.AuthenticationError):
            gw.client(mint(jwt_keys, "acme", aud="other")).chat.completions.create(**CHAT)
        # The embedded default store: a key made by admin works on the one-process server.
        key = gw.create_key("acme")
        assert gw.client(key["key"]).chat.completions.create(**CHAT).usage.completion_tokens == 3
        gw.admin("keys", "revoke", key["id"])
        # The one process re-reads its key file at most every KEYS_RELOAD_S: past that, the
        # next request is refused, however busy the machine.
        time.sleep(KEYS_RELOAD_S)
        with pytest.raises(openai.AuthenticationError, match="was revoked"):
            gw.client(key["key"]).chat.completions.create(**CHAT)
    finally:
        gw.stop()
