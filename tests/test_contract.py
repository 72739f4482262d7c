"""The one request shape, its dialects, and stream reassembly however the bytes are cut."""
from __future__ import annotations

import json

import pytest

from options import contract
from options.contract import (Request, Result, StreamDecoder, StreamEvent, Timings, Usage,
                              collect, detect_dialect, dialect, events_from_bytes, sse_stream)
from options.core import BadInput

REQUESTS = {
    "prompt": Request(prompt="Say hi", max_tokens=16, temperature=0.5, top_p=0.9, stop=["\n"],
                      model="m"),
    "stream": Request(prompt="Say hi", max_tokens=8, stream=True, model="m"),
    "benchmark": Request(prompt="x " * 10, max_tokens=32, ignore_eos=True, stream=True, model="m"),
    "conversation": Request(messages=[{"role": "user", "content": "a"},
                                      {"role": "assistant", "content": "b"},
                                      {"role": "user", "content": "c"}],
                            system="be brief", max_tokens=4, model="m"),
}
# What each dialect can carry: the text-only ones take no conversation and fold the system
# prompt into the text; Bedrock has no ignore_eos and streams through a different call.
CARRIES = {"openai-chat": {"prompt", "stream", "benchmark", "conversation"},
           "openai-completions": {"prompt", "stream", "benchmark"},
           "tgi": {"prompt", "stream", "benchmark"},
           "bedrock": {"prompt", "conversation"}}


@pytest.mark.parametrize("name", sorted(CARRIES))
def test_every_dialect_round_trips_the_request(name):
    d = dialect(name)
    for key in sorted(CARRIES[name]):
        req = REQUESTS[key]
        back = d.from_wire(json.loads(json.dumps(d.to_wire(req))))
        if name == "bedrock":      # the stream flag is a choice of API call, not a field
            back.stream = req.stream
        if name in ("tgi",):       # TGI bodies carry no model name
            back.model = req.model
        assert back == req, (name, key)


@pytest.mark.parametrize("name", sorted(CARRIES))
def test_every_dialect_round_trips_results_and_stream_events(name):
    d = dialect(name)
    res = Result("héllo wörld", "length", Usage(7, 3))
    back = d.result_from_wire(json.loads(json.dumps(d.result_to_wire(res))))
    assert (back.text, back.finish_reason, back.usage) == ("héllo wörld", "length", Usage(7, 3))
    events = [StreamEvent("text", text="hé"), StreamEvent("text", text="llo"),
              StreamEvent("finish", finish_reason="stop"), StreamEvent("usage", usage=Usage(5, 2))]
    got = [e for ev in events for e in d.events_from_wire(json.loads(json.dumps(d.stream_to_wire(ev))))]
    assert [(e.kind, e.text, e.finish_reason, e.usage) for e in got] == \
        [(e.kind, e.text, e.finish_reason, e.usage) for e in events]


def test_wire_shapes_are_what_the_servers_expect():
    chat = dialect("openai-chat").to_wire(REQUESTS["conversation"])
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    bench = dialect("openai-completions").to_wire(REQUESTS["benchmark"])
    assert bench["ignore_eos"] is True and bench["stream_options"] == {"include_usage": True}
    tgi = dialect("lmi").to_wire(Request(prompt="p", system="s", max_tokens=5, temperature=0.7))
    assert tgi == {"inputs": "s\n\np", "parameters": {"max_new_tokens": 5, "temperature": 0.7,
                                                       "do_sample": True, "details": True}}
    conv = dialect("bedrock").to_wire(REQUESTS["conversation"])
    assert conv["system"] == [{"text": "be brief"}]
    assert conv["messages"][1] == {"role": "assistant", "content": [{"text": "b"}]}
    assert conv["inferenceConfig"] == {"maxTokens": 4}
    for name, body in [("openai-chat", chat), ("openai-completions", bench), ("tgi", tgi),
                       ("bedrock", conv)]:
        assert detect_dialect(body) is dialect(name)


def test_bad_requests_say_what_is_wrong():
    with pytest.raises(BadInput, match="exactly one of prompt"):
        Request()
    with pytest.raises(BadInput, match="max_tokens=0"):
        Request(prompt="x", max_tokens=0)
    with pytest.raises(BadInput, match="openai-chat or bedrock"):
        dialect("tgi").to_wire(REQUESTS["conversation"])
    with pytest.raises(BadInput, match="unknown dialect 'soap'"):
        dialect("soap")
    with pytest.raises(BadInput, match="unknown request dialect.*got keys: foo"):
        detect_dialect({"foo": 1})


# --- streams cut anywhere --------------------------------------------------------------------

def _openai_sse(texts, usage=(3, 4)) -> bytes:
    events = [StreamEvent("text", text=t) for t in texts]
    events += [StreamEvent("finish", finish_reason="length"), StreamEvent("usage", usage=Usage(*usage))]
    return b"".join(sse_stream(events, "openai-completions"))


def _lmi_jsonlines(texts) -> bytes:
    lines = [{"token": {"id": i, "text": t}} for i, t in enumerate(texts)]
    lines.append({"token": None, "generated_text": "".join(texts),
                  "details": {"finish_reason": "length", "generated_tokens": len(texts)}})
    return b"".join(json.dumps(x, ensure_ascii=False).encode() + b"\n" for x in lines)


TEXTS = ["Grüße", " 日本", "語 ", "🙂", " fin"]
STREAMS = {"openai-completions": _openai_sse(TEXTS), "tgi": _lmi_jsonlines(TEXTS)}


def _splits(data: bytes):
    yield "whole", [data]
    yield "one byte at a time", [data[i:i + 1] for i in range(len(data))]
    # Cut in the middle of every multi-byte character (so each part ends mid-character).
    cuts = [i + 1 for i, b in enumerate(data) if b >= 0xC0]
    yield "mid UTF-8 character", [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
    # Cut mid-event: every part holds one and a half events.
    n = max(1, len(data) // 7)
    yield "mid event", [data[i:i + n] for i in range(0, len(data), n)]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_reassembles_however_it_is_split(name):
    data = STREAMS[name]
    for label, parts in _splits(data):
        assert b"".join(parts) == data
        if label == "mid UTF-8 character":
            assert any(p and (p[-1] >= 0xC0) for p in parts)
        res = collect(events_from_bytes(parts, name), started=0.0)
        assert res.text == "".join(TEXTS), label
        assert res.finish_reason == "length", label
        assert res.usage.output_tokens == (4 if name == "openai-completions" else len(TEXTS)), label


def test_decoder_stops_at_done_and_rejects_garbage():
    dec = StreamDecoder()
    assert dec.feed(b'data: {"a": 1}\n\n: keep-alive\nevent: x\ndata: [DONE]\n\ndata: {"b": 2}\n') == [{"a": 1}]
    assert dec.done
    with pytest.raises(contract.StreamError, match="not JSON"):
        StreamDecoder().feed(b"data: <html>\n")


def test_collect_times_match_the_definitions():
    evs = [StreamEvent("text", text="a", t=1.5), StreamEvent("text", text="", t=1.6),
           StreamEvent("text", text="b", t=1.75), StreamEvent("text", text="c", t=2.25),
           StreamEvent("usage", usage=Usage(2, 3), t=2.3)]
    res = collect(evs, started=1.0)
    # The empty chunk brought a token too (its text held back): it is a step of its own.
    assert res.text == "abc"
    assert res.timings.ttft_s == pytest.approx(0.5) and res.timings.e2e_s == pytest.approx(1.25)
    assert res.timings.itl_s == pytest.approx([0.1, 0.15, 0.5])
    assert res.timings.e2e_s == pytest.approx(res.timings.ttft_s + sum(res.timings.itl_s))


@pytest.mark.parametrize("name, token, finish_only", [
    ("tgi", {"token": {"id": 7, "text": "", "special": False}}, {"token": None, "details": {"finish_reason": "length"}}),
    ("openai-completions", {"choices": [{"index": 0, "text": "", "finish_reason": None}]},
     {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}),
    ("openai-chat", {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]},
     {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
])
def test_a_stream_of_tokens_without_text_still_has_timings(name, token, finish_only):
    """A tiny model's tokens may all decode to nothing: each chunk still brought a token, so the
    request has a TTFT and an E2E, not None (vllm bench serve counts such chunks too)."""
    d = contract.dialect(name)
    events = [ev.__class__(ev.kind, text=ev.text, tool=ev.tool, usage=ev.usage,
                           finish_reason=ev.finish_reason, t=1.0 + k)
              for k, msg in enumerate([token, token, token, finish_only])
              for ev in d.events_from_wire(msg)]
    assert [ev.kind for ev in events] == ["text", "text", "text", "finish"]
    res = collect(events, started=0.5)
    assert res.text == "" and res.finish_reason == "length"
    assert res.timings.ttft_s == pytest.approx(0.5) and res.timings.e2e_s == pytest.approx(2.5)
    assert res.timings.itl_s == pytest.approx([1.0, 1.0])      # the finish-only chunk is no token
    # A special token (TGI) and a tool call's chunk are not text tokens.
    if name == "tgi":
        assert d.events_from_wire({"token": {"id": 2, "text": "</s>", "special": True}}) == []


# --- tools (openai-chat only) ---------------------------------------------------------------
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def test_tools_go_out_in_openai_chat_and_come_back_as_calls():
    chat = contract.dialect("openai-chat")
    req = Request(prompt="hi", tools=[TOOL], tool_choice="required")
    body = chat.to_wire(req)
    assert body["tools"] == [TOOL] and body["tool_choice"] == "required"
    assert chat.from_wire(body).tools == [TOOL]
    answer = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": '{"a":1}'}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9}}
    res = chat.result_from_wire(answer)
    assert res.tool_calls == [{"name": "lookup", "arguments": "{}"},
                              {"name": "lookup", "arguments": '{"a":1}'}]
    assert res.to_json()["tool_calls"] == res.tool_calls and res.text == ""


def test_streamed_tool_calls_are_joined_by_index():
    chat = contract.dialect("openai-chat")
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "a", "function": {"name": "lookup", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"q":'}},
            {"index": 1, "id": "b", "function": {"name": "other", "arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '"x"}'}}]}, "finish_reason": "tool_calls"}]},
    ]
    events = [e for c in chunks for e in chat.events_from_wire(c)]
    assert events[-1].kind == "finish"          # after the calls it ends
    res = contract.collect(events, started=0.0)
    assert res.tool_calls == [{"name": "lookup", "arguments": '{"q":"x"}'},
                              {"name": "other", "arguments": "{}"}]


@pytest.mark.parametrize("name", ["openai-completions", "tgi", "bedrock"])
def test_dialects_without_tools_refuse_them_by_name(name):
    with pytest.raises(BadInput, match=f"{name} dialect cannot carry tools"):
        contract.dialect(name).to_wire(Request(prompt="hi", tools=[TOOL], model="m"))


@pytest.mark.parametrize("kw,words", [
    ({"tools": [{"type": "function", "function": {}}]}, "not an OpenAI function tool"),
    ({"tools": [{"name": "lookup"}]}, "not an OpenAI function tool"),
    ({"tool_choice": "required"}, "without tools"),
])
def test_bad_tools_are_named(kw, words):
    with pytest.raises(BadInput, match=words):
        Request(prompt="hi", **kw)
