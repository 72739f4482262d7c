"""model.py run for real on the tiny model, through the djl_python stand-in."""
from __future__ import annotations

import json

import pytest

from byo_vllm.djl_standin import Input, Output

PROMPTS = [
    "Hi",
    "The deployment spectrum runs from managed services",
    "A serving engine keeps a batch of requests running at once, and each step it decodes",
    "Time to first token",
]


def request(body, content_type: str = "application/json") -> Input:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Input.for_request(raw, content_type)


def answer(output: Output, key=None):
    for i in range(output.content.size()):
        if output.content.key_at(i) == key:
            return json.loads(output.content.value_at(i))
    raise AssertionError(f"no content under {key!r}: {output.content.get_keys()}")


def alone(handler, prompt: str, **parameters) -> dict:
    out = handler.handle(request({"inputs": prompt,
                                  "parameters": {"max_new_tokens": 12, "details": True,
                                                 **parameters}}))
    assert out.code == 200
    return answer(out)


def test_warm_up_loads_the_model_once_and_answers_nothing(handler, tiny_model):
    generator = handler._generator
    assert generator is not None and generator.settings.model == str(tiny_model)
    assert generator.tokenizer.padding_side == "left"
    warm_again = Input()
    warm_again.properties["model_dir"] = "/nowhere"
    assert handler.handle(warm_again) is None
    assert handler._generator is generator          # loaded once, not per warm-up


def test_batch_answers_equal_each_prompt_run_alone(handler):
    """Prompts of different lengths share one left-padded generate() call; with the attention
    mask right, greedy decoding gives each exactly what it gets alone."""
    expected = [alone(handler, p) for p in PROMPTS]
    lengths = {e["details"]["input_tokens"] for e in expected}
    assert len(lengths) == len(PROMPTS)             # really different lengths: padding happens
    batch = Input.batch_of([request({"inputs": p, "parameters": {"max_new_tokens": 12,
                                                                "details": True}})
                            for p in PROMPTS])
    out = handler.handle(batch)
    assert out.code == 200
    got = [answer(out, f"batch_{i}.") for i in range(len(PROMPTS))]
    assert got == expected
    assert all(e["details"]["generated_tokens"] >= 1 and e["generated_text"] for e in expected)
    assert out.properties["batch_1_Content-Type"] == "application/json"


def test_a_list_of_inputs_is_one_batch_and_answers_a_list(handler):
    expected = [alone(handler, p) for p in PROMPTS[:3]]
    out = handler.handle(request({"inputs": PROMPTS[:3],
                                  "parameters": {"max_new_tokens": 12, "details": True}}))
    assert answer(out) == expected


def test_a_bad_item_gets_its_own_error_and_spares_the_rest(handler):
    good = alone(handler, PROMPTS[1])
    batch = Input.batch_of([
        request(b"{not json"),
        request({"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 12, "details": True}}),
        request({"inputs": "x", "parameters": {"max_new_tokens": "ten"}}),
    ])
    out = handler.handle(batch)
    assert out.code == 200
    first, second, third = (answer(out, f"batch_{i}.") for i in range(3))
    assert first["code"] == 400 and "not valid JSON" in first["error"]
    assert second == good
    assert third["code"] == 400 and 'max_new_tokens="ten"' in third["error"]


@pytest.mark.parametrize("body, needle", [
    ({"prompt": "hi"}, 'needs "inputs"'),
    ({"inputs": ""}, "non-empty string"),
    ({"inputs": ["a", 3]}, "non-empty list of non-empty strings"),
    ({"inputs": "hi", "parameters": {"beam_width": 2}}, "unknown parameter 'beam_width'"),
    ({"inputs": "hi", "parameters": {"temperature": -1}}, "temperature=-1 is out of range"),
    ({"inputs": "hi", "parameters": {"top_p": 1.5}}, "top_p=1.5 is out of range"),
    ({"inputs": "hi", "parameters": {"details": "yes"}}, 'details="yes" must be a bool'),
    ({"inputs": "hi", "parameters": {"seed": 2 ** 70}}, "seed=1180591620717411303424 is out"),
    ({"inputs": "hi", "parameters": [1]}, '"parameters" must be an object'),
    ({"inputs": ["a", "b"], "stream": True}, "takes one prompt"),
    ({"inputs": "hi", "stream": "yes"}, '"stream" must be true or false'),
])
def test_bad_requests_get_a_400_that_names_the_problem(handler, body, needle):
    out = handler.handle(request(body))
    assert out.code == 400
    error = answer(out)
    assert error["code"] == 400 and needle in error["error"], error


def test_a_prompt_longer_than_the_context_is_refused_alone(handler):
    too_long = "serving " * 2100
    batch = Input.batch_of([request({"inputs": too_long}),
                            request({"inputs": PROMPTS[0], "parameters": {"details": True}})])
    out = handler.handle(batch)
    refused = answer(out, "batch_0.")
    assert refused["code"] == 400 and "2048-token context" in refused["error"]
    assert answer(out, "batch_1.")["details"]["generated_tokens"] >= 1


def test_text_plain_body_is_the_prompt(handler):
    expected = alone(handler, PROMPTS[0], details=False, max_new_tokens=30)
    out = handler.handle(request(PROMPTS[0].encode(), content_type="text/plain"))
    assert answer(out) == expected


def test_streaming_sends_lmi_jsonlines_token_by_token(handler):
    expected = alone(handler, PROMPTS[2])
    out = handler.handle(request({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 12},
                                  "stream": True}))
    assert out.properties["content-type"] == "application/jsonlines"
    chunks = [out.stream_output_formatter(item) for item in out.stream_content]
    lines = [json.loads(chunk) for chunk in chunks]
    assert all(chunk.endswith(b"\n") and chunk.count(b"\n") == 1 for chunk in chunks)
    assert len(lines) == expected["details"]["generated_tokens"]   # one line per token
    assert all(isinstance(line["token"]["id"], int) for line in lines)
    assert "generated_text" not in lines[0] or len(lines) == 1
    last = lines[-1]
    assert last["generated_text"] == expected["generated_text"]
    assert last["details"] == expected["details"]
    assert "".join(line["token"]["text"] for line in lines) == expected["generated_text"]


def test_a_stream_streams_in_a_batch_of_one_but_not_among_others(handler):
    stream = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 4}, "stream": True}
    out = handler.handle(Input.batch_of([request(stream)]))
    assert out.stream_content is not None
    assert json.loads(out.stream_output_formatter(list(out.stream_content)[-1]))["details"]
    shared = handler.handle(Input.batch_of([request(stream), request({"inputs": PROMPTS[0]})]))
    refused = answer(shared, "batch_0.")
    assert refused["code"] == 400 and "cannot share a dynamic batch" in refused["error"]
    assert "generated_text" in answer(shared, "batch_1.")


def test_max_new_tokens_and_ignore_eos_bound_the_answer(handler):
    result = alone(handler, PROMPTS[0], max_new_tokens=5, ignore_eos_token=True)
    assert result["details"]["generated_tokens"] == 5
    assert result["details"]["finish_reason"] == "length"


def test_stop_sequences_cut_the_answer(handler):
    full = alone(handler, PROMPTS[1], max_new_tokens=16)["generated_text"]
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = alone(handler, PROMPTS[1], max_new_tokens=16, stop_sequences=[stop])
    assert cut["generated_text"] == full[:full.index(stop)]
    assert cut["details"]["finish_reason"] == "stop_sequence"


def test_return_full_text_and_seeded_sampling(handler):
    plain = alone(handler, PROMPTS[0])
    full = alone(handler, PROMPTS[0], return_full_text=True)
    assert full["generated_text"] == PROMPTS[0] + plain["generated_text"]
    sampled = [alone(handler, PROMPTS[0], temperature=1.5, seed=7)["generated_text"]
               for _ in range(2)]
    assert sampled[0] == sampled[1]                  # the seed makes sampling repeatable


def test_warm_up_without_a_model_fails_with_a_clear_message(load_handler):
    module = load_handler("custom_code_model_without_model")
    with pytest.raises(ValueError, match="no model to load"):
        module.handle(Input())


def test_warm_up_rejects_an_unknown_dtype(tiny_model, load_handler):
    module = load_handler("custom_code_model_bad_dtype")
    warm_up = Input()
    warm_up.properties.update({"model_dir": str(tiny_model), "dtype": "int3"})
    with pytest.raises(ValueError, match="option.dtype='int3'"):
        module.handle(warm_up)
