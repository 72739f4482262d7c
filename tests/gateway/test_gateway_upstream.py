"""Step 5: the call. Streams pass through as they arrive, a client hanging up aborts the
upstream call, and upstream faults and bad bodies get the right status in OpenAI's shape."""
from __future__ import annotations

import time

import httpx
import openai
import pytest

from gateway_harness import Gateway, gateway_config, wait_for

HI = [{"role": "user", "content": "hi"}]


def test_stream_passes_through_as_it_arrives(tmp_path, upstreams, dead_port, jwt_keys):
    # The upstream sends 6 of its 12 tokens, then goes quiet for longer than the client waits
    # (and less than the gateway's upstream timeout): a gateway passing the stream through has
    # delivered those 6 meanwhile; one buffering the answer delivers none.
    config = gateway_config("memory", upstreams, dead_port, jwt_keys["jwks_file"])
    config["upstream_timeout_s"] = 120
    gw = Gateway(tmp_path, config).start()
    upstreams.set("slowstream", interval_s=0.01, stall_after=6)
    try:
        client = gw.client(gw.create_key("acme")["key"], timeout=60)
        text = ""
        with client.chat.completions.with_streaming_response.create(
                model="stream", messages=HI, max_tokens=12, stream=True) as response:
            chunks = iter(response.parse())
            while text.count(" ") < 6:
                chunk = next(chunks)
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
        assert text == "".join(f"slowstream:{i} " for i in range(6))
    finally:
        gw.stop()
        upstreams.set("slowstream", stall_after=None)


@pytest.mark.parametrize("usage_nulls", [False, True])
def test_stream_usage_reaches_the_client_only_when_asked(gateway, upstreams, usage_nulls):
    # usage_nulls: the upstream puts "usage": null in every chunk, as OpenAI's API does.
    upstreams.set("slowstream", interval_s=0.005, usage_nulls=usage_nulls)
    key = gateway.create_key("acme")
    try:
        client = gateway.client(key["key"])
        plain = list(client.chat.completions.create(model="stream", messages=HI, max_tokens=3,
                                                    stream=True))
        assert all(c.usage is None for c in plain) and all(c.choices for c in plain)
        asked = list(client.chat.completions.create(model="stream", messages=HI, max_tokens=3,
                                                    stream=True,
                                                    stream_options={"include_usage": True}))
        assert asked[-1].usage.completion_tokens == 3 and asked[-1].choices == []
        # Both metered from the upstream's own count, which came after all the nulls.
        entries = gateway.ledger(lambda e: e["key_id"] == key["id"], at_least=2)
        assert [(e["output_tokens"], e["usage_source"]) for e in entries] == [(3, "upstream")] * 2
    finally:
        upstreams.set("slowstream", usage_nulls=False)


@pytest.mark.parametrize("data, carries", [
    (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', False),
    (b'data: {"choices":[],"usage":null}\n\n', False),
    (b'data: {"choices":[], "usage" : null}\n\n', False),
    (b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n', True),
    (b'data: {"choices":[], "usage" :\t {"prompt_tokens":1}}\n\n', True),
    (b'data: {"usage":null,"x":{"usage":{"total_tokens":2}}}\n\n', True),
    # in a string its quotes are escaped: not a key
    (b'data: {"choices":[{"delta":{"content":"\\"usage\\": {"}}]}\n\n', False),
    (b'data: {"name":"usage","v":{}}\n\n', False),
])
def test_carries_usage_tells_a_usage_object_from_null_and_from_text(data, carries):
    from spectrum_gateway.upstream import carries_usage
    assert carries_usage(data) is carries


def test_pass_on_holds_done_back_and_drops_only_the_usage_the_client_did_not_ask_for():
    from spectrum_gateway.app import RelayedStream
    token = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
    usage = b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
    for done in (b"data: [DONE]\n\n", b"data:[DONE]\n\n"):
        for want_usage in (False, True):
            stream = RelayedStream(None, None, None, want_usage)
            assert stream.pass_on(token) is token                 # passed on as it came
            assert stream.pass_on(token[:20]) == b""              # half an event: kept
            assert stream.pass_on(token[20:] + usage[:9]) == token
            assert stream.pass_on(usage[9:] + done) == (usage if want_usage else b"")
            assert stream.done == done and stream.usage == {"completion_tokens": 2}
            assert stream.chunks == 2 + want_usage


def test_an_upstream_whose_body_never_ends_after_its_done_is_not_waited_on(
        tmp_path, upstreams, dead_port, jwt_keys):
    # The client's [DONE] waits for the upstream's body to end (so the request is settled
    # first); an upstream that holds its body open after [DONE] gets 2 s for it, not the
    # read timeout, and the answer it gave in full is metered as one.
    config = gateway_config("memory", upstreams, dead_port, jwt_keys["jwks_file"])
    config["upstream_timeout_s"] = 120
    gw = Gateway(tmp_path, config).start()
    upstreams.set("slowstream", interval_s=0.001, linger_s=60)
    try:
        key = gw.create_key("acme")
        started = time.monotonic()
        chunks = list(gw.client(key["key"]).chat.completions.create(
            model="stream", messages=HI, max_tokens=3, stream=True))
        took = time.monotonic() - started
        assert "".join(c.choices[0].delta.content for c in chunks if c.choices) == \
            "slowstream:0 slowstream:1 slowstream:2 "
        assert took < 60, took        # ~2 s: neither the upstream's 60 s nor the timeout's 120
        entries = gw.ledger(lambda e: e["key_id"] == key["id"])
        assert [(e["status"], e["output_tokens"]) for e in entries] == [(200, 3)]
    finally:
        upstreams.set("slowstream", linger_s=0)
        gw.stop()


def test_legacy_completions_route(gateway, acme_key):
    answer = gateway.client(acme_key["key"]).completions.create(model="chat", prompt="a b c", max_tokens=2)
    assert answer.choices[0].text in ("stable:0 stable:1 ", "canary:0 canary:1 ")
    assert answer.usage.prompt_tokens == 3


def test_client_disconnect_aborts_the_upstream_call(gateway, acme_key, upstreams):
    upstreams.set("abortme", interval_s=0.3)
    before = upstreams.stats("abortme")
    client = gateway.client(acme_key["key"])
    try:
        with client.chat.completions.with_streaming_response.create(
                model="abort", messages=HI, max_tokens=200, stream=True) as response:
            stream = iter(response.parse())
            for _ in range(3):
                next(stream)
        # Leaving the block closed the connection, a minute before the upstream's 200 tokens
        # end: the upstream sees an abort, not a completion.
        wait_for(lambda: upstreams.stats("abortme")["aborted"] == before["aborted"] + 1, 30,
                 "the upstream to see its stream aborted")
        assert upstreams.stats("abortme")["completed"] == before["completed"]
    finally:
        upstreams.set("abortme", interval_s=0.01)


def test_client_leaving_a_whole_answer_aborts_the_upstream_call(gateway, acme_key, upstreams):
    upstreams.set("abortme", delay_s=60)      # the answer would come a minute on
    before = upstreams.stats("abortme")
    try:
        with pytest.raises(openai.APITimeoutError):
            gateway.client(acme_key["key"], timeout=0.7).chat.completions.create(
                model="abort", messages=HI, max_tokens=2)
        wait_for(lambda: upstreams.stats("abortme")["aborted"] == before["aborted"] + 1, 30,
                 "the upstream to see the whole-answer request abandoned")
        assert upstreams.stats("abortme")["completed"] == before["completed"]
    finally:
        upstreams.set("abortme", delay_s=0)


def test_upstream_timeout_is_504(gateway, acme_key, upstreams):
    upstreams.set("hang", mode="hang")
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        gateway.client(acme_key["key"]).chat.completions.create(model="slow", messages=HI, max_tokens=2)
    assert info.value.status_code == 504
    assert "every upstream of model 'slow' failed: hang timed out" in info.value.message
    assert info.value.body["type"] == "timeout_error"
    assert time.monotonic() - started > 1.4      # not before upstream_timeout_s (1.5)


def test_upstream_going_quiet_mid_stream_ends_it_with_an_error_event(gateway, acme_key, upstreams):
    upstreams.set("abortme", interval_s=0.01, stall_after=3)
    key = gateway.create_key("acme")
    try:
        seen = []
        with pytest.raises(openai.APIError) as info:
            for chunk in gateway.client(key["key"]).chat.completions.create(
                    model="abort", messages=HI, max_tokens=10, stream=True):
                seen.append(chunk.choices[0].delta.content)
        assert seen == ["abortme:0 ", "abortme:1 ", "abortme:2 "]
        assert "upstream abortme timed out mid-stream" in info.value.message
        [entry] = gateway.ledger(lambda e: e["key_id"] == key["id"], tenant="acme")
        assert entry["status"] == 504 and entry["output_tokens"] == 3
    finally:
        upstreams.set("abortme", stall_after=None)


def test_refused_upstream_is_502_after_fallback(gateway, acme_key):
    with pytest.raises(openai.InternalServerError) as info:
        gateway.client(acme_key["key"]).chat.completions.create(model="dead", messages=HI, max_tokens=2)
    assert info.value.status_code == 502
    assert "refused unreachable" in info.value.message and "refused2 unreachable" in info.value.message
    assert info.value.response.headers["x-spectrum-fallback"] == "refused refused; refused2 refused"


def test_body_over_6_mb_is_413(gateway, acme_key):
    with pytest.raises(openai.APIStatusError) as info:
        gateway.client(acme_key["key"]).chat.completions.create(
            model="chat", max_tokens=2, messages=[{"role": "user", "content": "x" * (6 * 1024 * 1024)}])
    assert info.value.status_code == 413
    assert "accepts at most 6291456 (max_body_bytes)" in info.value.message


def test_malformed_json_is_400_and_unknown_routes_404(gateway, acme_key):
    headers = {"Authorization": f"Bearer {acme_key['key']}", "content-type": "application/json"}
    r = httpx.post(gateway.url + "/v1/chat/completions", content=b'{"model": "chat",', headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gateway.url + "/v1/chat/completions", content=b'[1, 2]', headers=headers)
    assert r.status_code == 400 and "must be a JSON object" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client(acme_key["key"]).chat.completions.create(model="chat", messages=HI, max_tokens=-5)
    assert "max_tokens must be a whole number >= 1, got -5" in info.value.message
    r = httpx.get(gateway.url + "/v1/nothing-here", headers=headers)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("body", [
    {"model": "chat", "messages": 5, "max_tokens": 2},
    {"model": "chat", "messages": [{"role": "user", "content": ["odd"]}, 7], "max_tokens": 2},
    {"model": "chat", "prompt": [1, 2, 3], "max_tokens": 2, "n": "two"},
    {"model": "chat", "messages": HI, "max_tokens": 2, "stream": True, "stream_options": "yes"},
    {"model": ["chat"], "messages": HI},
    {"model": "chat", "messages": HI, "max_tokens": True},
])
def test_odd_bodies_get_an_answer_not_a_crash(gateway, acme_key, body):
    headers = {"Authorization": f"Bearer {acme_key['key']}"}
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code < 500, r.text
    assert httpx.post(gateway.url + "/v1/chat/completions", headers=headers, timeout=30,
                      json={"model": "chat", "messages": HI, "max_tokens": 1}).status_code == 200
