"""The server's request parsing and validation (byo_vllm.dialects), without an engine: every
bad body is refused with the field it names, why, and what would be right."""
from __future__ import annotations

import json

import pytest

from byo_vllm.dialects import (DEFAULT_MAX_TOKENS, MAX_STOP_SEQUENCES, BadRequest, check_lengths,
                               parse_request)
from options.core import OPENAI_CHAT, OPENAI_COMPLETIONS, TGI


def parse(body, dialect=None):
    return parse_request(json.dumps(body).encode() if not isinstance(body, bytes) else body,
                         dialect)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}

# (body, route's dialect, field named, words the message must hold)
REFUSED = [
    (b"", None, "body", ["empty", "JSON object"]),
    (b"{not json", None, "body", ["not valid JSON", "line 1 column 2"]),
    (b'{"prompt": "\xff"}', None, "body", ["not UTF-8"]),
    (b"[1, 2]", None, "body", ["must be a JSON object", "list"]),
    ({"text": "hi"}, None, "body", ["unknown request dialect", "messages", "prompt", "inputs",
                                     "got keys: text"]),
    ({"modelId": "amazon.nova-micro-v1:0", "messages": [{"role": "user",
                                                         "content": [{"text": "hi"}]}]},
     None, "body", ["go to Bedrock", "OpenAI chat"]),
    ({"prompt": "hi"}, "soap", "body", ["unknown dialect 'soap'", OPENAI_CHAT]),
    ({"messages": []}, None, "messages", ["non-empty list"]),
    ({"messages": ["hi"]}, None, "messages[0]", ["role and content"]),
    ({"messages": [{"role": "robot", "content": "hi"}]}, None, "messages[0].role",
     ["'robot'", "system, user, assistant"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None,
     "messages[0].content[0]", ["only text parts"]),
    ({"messages": [{"role": "user", "content": 7}]}, None, "messages[0].content",
     ["must be a string", "int"]),
    ({"prompt": ["a", "b"]}, None, "prompt", ["one request per prompt"]),
    ({"prompt": [1, -2]}, None, "prompt", ["list of token ids"]),
    ({"prompt": "hi", "max_tokens": 0}, None, "max_tokens", ["max_tokens=0", "at least 1"]),
    ({"prompt": "hi", "max_tokens": "5"}, None, "max_tokens", ["whole number", "'5'"]),
    ({**CHAT, "max_completion_tokens": 1.5}, None, "max_completion_tokens", ["whole number"]),
    ({"prompt": "hi", "temperature": 101}, None, "temperature", ["at most 100.0"]),
    ({"prompt": "hi", "temperature": True}, None, "temperature", ["must be a number"]),
    ({"prompt": "hi", "top_p": 0}, None, "top_p", ["greater than 0.0"]),
    ({"prompt": "hi", "top_k": -2}, None, "top_k", ["at least -1"]),
    ({"prompt": "hi", "seed": -1}, None, "seed", ["between 0 and"]),
    ({"prompt": "hi", "presence_penalty": 3}, None, "presence_penalty", ["at most 2.0"]),
    ({"prompt": "hi", "stop": ["a", ""]}, None, "stop", ["non-empty string"]),
    ({"prompt": "hi", "stop": ["s"] * (MAX_STOP_SEQUENCES + 1)}, None, "stop",
     [f"at most {MAX_STOP_SEQUENCES}"]),
    ({"prompt": "hi", "n": 2}, None, "n", ["n=2", "one choice"]),
    ({"prompt": "hi", "stream": "yes"}, None, "stream", ["true or false", "'yes'"]),
    ({"prompt": "hi", "stream_options": []}, None, "stream_options", ["include_usage"]),
    ({"prompt": "hi", "stream_options": {"include_usage": 1}}, None,
     "stream_options.include_usage", ["true or false"]),
    ({"inputs": ["a"]}, None, "inputs", ["must be a string", "list"]),
    ({"inputs": "hi", "parameters": [1]}, None, "parameters", ["max_new_tokens"]),
    ({"inputs": "hi", "parameters": {"max_new_tokens": 0}}, None, "parameters.max_new_tokens",
     ["at least 1"]),
    ({"inputs": "hi", "parameters": {"do_sample": "no"}}, None, "parameters.do_sample",
     ["true or false"]),
    ({"inputs": "hi", "parameters": {"stop": 5}}, None, "parameters.stop", ["non-empty string"]),
]


@pytest.mark.parametrize("body,dialect,field,words", REFUSED,
                         ids=[f"{i}-{case[2]}" for i, case in enumerate(REFUSED)])
def test_bad_requests_name_the_field_why_and_the_fix(body, dialect, field, words):
    with pytest.raises(BadRequest) as caught:
        parse(body, dialect)
    err = caught.value
    assert err.field == field and err.status == 400
    for word in words:
        assert word in str(err), (word, str(err))
    assert err.to_json()["error"] == {"message": str(err), "type": "invalid_request_error",
                                      "param": field, "code": 400}


def test_each_dialect_is_detected_and_gets_its_defaults():
    chat = parse(CHAT)
    assert (chat.dialect, chat.max_tokens, chat.messages) == (
        OPENAI_CHAT, DEFAULT_MAX_TOKENS[OPENAI_CHAT], [{"role": "user", "content": "hi"}])
    completion = parse({"prompt": ["one prompt"]})
    assert (completion.dialect, completion.prompt, completion.max_tokens) == (
        OPENAI_COMPLETIONS, "one prompt", 16)
    assert completion.sampling == {"temperature": 1.0, "top_p": 1.0}
    tgi = parse({"inputs": "hi"})
    assert (tgi.dialect, tgi.max_tokens, tgi.max_tokens_field) == (TGI, 100, "max_new_tokens")
    assert tgi.sampling["temperature"] == 0.0, "TGI decodes greedily unless asked to sample"
    assert parse({"inputs": "hi", "parameters": {"top_k": 5}}).sampling["temperature"] == 1.0
    assert parse({"prompt": [1, 2, 3]}).prompt == [1, 2, 3], "token ids pass through"


def test_the_routes_older_dialect_names_are_still_accepted():
    assert parse({"prompt": "hi"}, "completion").dialect == OPENAI_COMPLETIONS
    assert parse(CHAT, "chat").dialect == OPENAI_CHAT
    assert parse({"inputs": "x"}, "lmi").dialect == TGI
    with pytest.raises(BadRequest, match="messages must be a non-empty list"):
        parse({"prompt": "hi"}, OPENAI_CHAT)      # a route's dialect wins over the body's keys


def test_sampling_fields_reach_the_engine_as_vllm_names():
    req = parse({**CHAT, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                 "top_k": 0, "seed": 3, "stop": "END", "min_tokens": 2, "ignore_eos": True,
                 "repetition_penalty": 1.1, "frequency_penalty": -1, "stream": True,
                 "stream_options": {"include_usage": True}})
    assert (req.max_tokens, req.max_tokens_field, req.stream, req.include_usage) == (
        7, "max_completion_tokens", True, True)
    assert req.sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": -1, "seed": 3,
                            "repetition_penalty": 1.1, "frequency_penalty": -1.0,
                            "min_tokens": 2, "ignore_eos": True, "stop": ["END"]}
    tgi = parse({"inputs": "hi", "parameters": {"details": True, "return_full_text": True,
                                                "stop": ["\n"], "max_new_tokens": 3}})
    assert (tgi.details, tgi.return_full_text, tgi.sampling["stop"]) == (True, True, ["\n"])


def test_lengths_are_checked_against_the_context_in_the_clients_words():
    assert check_lengths(parse(CHAT), prompt_tokens=10, max_model_len=64) == 54
    assert check_lengths(parse({"prompt": "hi", "max_tokens": 5}), 10, 64) == 5
    with pytest.raises(BadRequest) as caught:
        check_lengths(parse({"inputs": "hi", "parameters": {"max_new_tokens": 60}}), 10, 64)
    assert caught.value.field == "parameters.max_new_tokens"
    assert "more than the 54 tokens left" in str(caught.value) and "at most 54" in str(caught.value)
    with pytest.raises(BadRequest) as caught:
        check_lengths(parse(CHAT), prompt_tokens=64, max_model_len=64)
    assert caught.value.field == "messages" and "at most 63 tokens" in str(caught.value)
