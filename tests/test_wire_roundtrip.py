"""One request vocabulary on both sides of the wire, with no engine: for every dialect the
server speaks, a client Request goes to the wire (options.contract) and the server parses it
(byo_vllm.dialects) into what the user asked; the server's answer, whole or streamed and with
its usage, goes to the wire and the client reads back the same text, finish reason and counts.
"""
from __future__ import annotations

import json

import pytest

from byo_vllm import dialects as server
from byo_vllm.dialects import Finished, parse_request, responder_for
from options import contract
from options.contract import Request, collect, events_from_bytes
from options.core import wire

CONVERSATION = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."},
                {"role": "user", "content": "Another?"}]
# dialect → (what the user asks, what the server must have understood besides sampling)
CASES = {
    wire.OPENAI_COMPLETIONS: (
        Request(prompt="Say hi", system="Be brief.", max_tokens=12, temperature=0.5, top_p=0.9,
                stop=["END"], ignore_eos=True, model="tiny"),
        {"prompt": "Be brief.\n\nSay hi", "messages": None}),
    wire.OPENAI_CHAT: (
        Request(messages=CONVERSATION, system="Be brief.", max_tokens=8, temperature=0.2,
                model="tiny"),
        {"prompt": None, "messages": [{"role": "system", "content": "Be brief."}, *CONVERSATION]}),
    wire.TGI: (
        Request(prompt="Say hi", max_tokens=9, temperature=0.7, top_p=0.8, stop=["\n"],
                ignore_eos=True),
        {"prompt": "Say hi", "messages": None, "details": True}),
}
# (vLLM's finish, its stop reason, what the client reads): a length cut, a stop string, an EOS.
FINISHES = [("length", None, "length"), ("stop", "END", "stop"), ("stop", None, "stop")]


def to_server(name: str, request: Request):
    """Client → wire → server: the body the client sends, parsed as /invocations does."""
    body = json.dumps(contract.dialect(name).to_wire(request)).encode()
    return parse_request(body)          # no route dialect: detected from the body


def test_one_set_of_names_on_both_sides():
    assert set(server.DIALECTS) == set(CASES) and set(server.DIALECTS) < set(wire.DIALECTS)
    assert set(contract.DIALECTS) == set(wire.DIALECTS)
    for alias, name in wire.ALIASES.items():
        assert contract.dialect(alias) is contract.dialect(name)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", list(CASES))
def test_client_request_reaches_the_server_as_asked(name, stream):
    request, understood = CASES[name]
    request = Request(**{**request.__dict__, "stream": stream})
    req = to_server(name, request)
    assert req.dialect == name
    for key, value in understood.items():
        assert getattr(req, key) == value, key
    assert req.max_tokens == request.max_tokens
    assert req.sampling["temperature"] == request.temperature
    assert req.sampling["top_p"] == (request.top_p or 1.0)
    assert req.sampling.get("stop") == request.stop
    assert req.sampling.get("ignore_eos", False) == request.ignore_eos
    assert req.stream == stream
    # An OpenAI stream carries token counts only when asked; the client always asks.
    assert req.include_usage == (stream and name != wire.TGI)


def _finished(finish: str, stop_reason) -> Finished:
    return Finished(text="Hello there", finish_reason=finish, stop_reason=stop_reason,
                    prompt_tokens=5, completion_tokens=3, token_ids=[11, 12, 13])


@pytest.mark.parametrize("finish,stop_reason,client_reads", FINISHES,
                         ids=["length", "stop-string", "eos"])
@pytest.mark.parametrize("name", list(CASES))
def test_whole_answer_reaches_the_client(name, finish, stop_reason, client_reads):
    req = to_server(name, CASES[name][0])
    done = _finished(finish, stop_reason)
    body = json.loads(json.dumps(responder_for(req, "tiny").full(done)))
    result = contract.dialect(name).result_from_wire(body)
    assert result.text == "Hello there"
    assert result.finish_reason == client_reads
    assert (result.usage.input_tokens, result.usage.output_tokens) == (5, 3)


@pytest.mark.parametrize("cut", [1, 7, 64], ids=lambda n: f"parts-of-{n}-bytes")
@pytest.mark.parametrize("finish,stop_reason,client_reads", FINISHES,
                         ids=["length", "stop-string", "eos"])
@pytest.mark.parametrize("name", list(CASES))
def test_streamed_answer_reaches_the_client(name, finish, stop_reason, client_reads, cut):
    request = Request(**{**CASES[name][0].__dict__, "stream": True})
    req = to_server(name, request)
    responder = responder_for(req, "tiny")
    done = _finished(finish, stop_reason)
    wire_bytes = (responder.start()
                  + responder.delta("Hel", [11], None, None)
                  + responder.delta("lo ", [12], None, None)
                  + responder.delta("there", [13], None, finish)
                  + responder.end(done))
    # SageMaker's PayloadParts (and TCP) cut the bytes anywhere.
    parts = [wire_bytes[i:i + cut] for i in range(0, len(wire_bytes), cut)]
    result = collect(events_from_bytes(parts, name))
    assert result.text == "Hello there"
    assert result.finish_reason == client_reads
    assert (result.usage.input_tokens, result.usage.output_tokens) == (5, 3)


def test_a_bedrock_body_is_known_to_both_sides_and_refused_by_the_server():
    body = contract.dialect(wire.BEDROCK).to_wire(Request(prompt="hi", model="amazon.nova-micro-v1:0"))
    assert wire.detect_dialect(body) == wire.BEDROCK
    assert contract.detect_dialect(body) is contract.dialect(wire.BEDROCK)
    with pytest.raises(server.BadRequest, match="go to Bedrock"):
        parse_request(json.dumps(body).encode())
