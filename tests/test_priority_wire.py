"""vLLM's scheduling priority on both sides of the wire, with no engine: for every dialect that
carries it, a client Request's priority reaches the server's parsed request and comes back
from the wire; Bedrock Converse has no such field and its wire form leaves it out (and stays
valid for botocore)."""
from __future__ import annotations

import json

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

from byo_vllm.dialects import BadRequest, parse_request
from options import contract
from options.contract import Request
from options.core import BadInput, wire

# dialect → where the priority sits in its body
CARRIERS = {
    wire.OPENAI_CHAT: lambda body: body["priority"],
    wire.OPENAI_COMPLETIONS: lambda body: body["priority"],
    wire.TGI: lambda body: body["parameters"]["priority"],
}


def _request(name: str, **kw) -> Request:
    if name == wire.OPENAI_CHAT:
        return Request(messages=[{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "hello"},
                                 {"role": "user", "content": "again"}], **kw)
    return Request(prompt="Say hi", **kw)


@pytest.mark.parametrize("priority", [-3, 0, 7, 2**40], ids=lambda p: f"priority={p}")
@pytest.mark.parametrize("name", list(CARRIERS))
def test_priority_goes_through_every_dialect_both_ways(name, priority):
    d = contract.dialect(name)
    body = d.to_wire(_request(name, priority=priority, max_tokens=5))
    assert CARRIERS[name](body) == priority
    assert d.from_wire(body).priority == priority                     # client side, back
    assert parse_request(json.dumps(body).encode()).priority == priority  # the server's reading


@pytest.mark.parametrize("name", list(CARRIERS))
def test_no_priority_sends_none_and_the_server_reads_zero(name):
    body = contract.dialect(name).to_wire(_request(name))
    assert "priority" not in json.dumps(body)
    assert contract.dialect(name).from_wire(body).priority is None
    assert parse_request(json.dumps(body).encode()).priority == 0


def test_bedrock_converse_has_no_priority_and_stays_valid_for_botocore():
    request = Request(prompt="hi", model="amazon.nova-micro-v1:0", priority=5, system="Be brief.")
    body = contract.dialect(wire.BEDROCK).to_wire(request)
    assert "priority" not in json.dumps(body).lower()
    shape = get_session().get_service_model("bedrock-runtime").operation_model("Converse").input_shape
    report = ParamValidator().validate(body, shape)
    assert not report.has_errors(), report.generate_report()
    # ... and a priority is something botocore itself would refuse in that request.
    bad = ParamValidator().validate({**body, "priority": 5}, shape)
    assert "Unknown parameter in input: \"priority\"" in bad.generate_report()


@pytest.mark.parametrize("value", ["high", 1.5, True], ids=repr)
def test_a_priority_that_is_not_a_whole_number_is_refused_by_the_client(value):
    with pytest.raises(BadInput, match=rf"priority={value!r} must be a whole number"):
        Request(prompt="hi", priority=value)


@pytest.mark.parametrize("body,field", [
    ({"prompt": "hi", "priority": "high"}, "priority"),
    ({"messages": [{"role": "user", "content": "hi"}], "priority": 1.5}, "priority"),
    ({"prompt": "hi", "priority": 2**63}, "priority"),
    ({"inputs": "hi", "parameters": {"priority": True}}, "parameters.priority"),
], ids=["string", "fraction", "too-large", "tgi-bool"])
def test_the_server_refuses_a_bad_priority_naming_the_field(body, field):
    with pytest.raises(BadRequest) as e:
        parse_request(json.dumps(body).encode())
    assert e.value.field == field and field in str(e.value)
