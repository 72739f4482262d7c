"""LmiHandlerBackend: the byo server's stand-in for DJL Serving, end to end on the tiny model."""
from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import pytest

from byo_vllm.lmi_handler import LmiHandlerBackend, entry_point_for, handler_properties
from options.custom_code.package import prepare_model_dir


@pytest.fixture(scope="module")
def backend(tiny_model, tmp_path_factory) -> LmiHandlerBackend:
    model_dir = prepare_model_dir(tmp_path_factory.mktemp("level4") / "model", tiny_model,
                                  {"dtype": "fp32", "batch_size": "4", "max_batch_delay": "50"})
    served = LmiHandlerBackend(model_dir, {"OPTION_MAX_NEW_TOKENS": "10"})
    assert not served.ready and served.failed is None
    served.load()
    assert served.failed is None and served.ready
    return served


def invoke(backend, body, content_type="application/json"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return backend.invoke(raw, content_type, "application/json")


def invoke_together(backend, bodies) -> list[tuple]:
    """Send the bodies at the same time, from one thread each, as concurrent clients do."""
    answers: dict[int, tuple] = {}
    threads = [threading.Thread(target=lambda i=i, b=b: answers.__setitem__(i, invoke(backend, b)))
               for i, b in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return [answers[i] for i in range(len(bodies))]


def test_properties_reach_the_handler_as_djl_gives_them(backend):
    props = backend.properties
    assert props["model_dir"] == str(backend.model_dir)
    assert props["max_new_tokens"] == "10" and props["dtype"] == "fp32"   # no option. prefix
    assert props["entryPoint"] == "model.py" and backend.batch_size == 4
    handler = backend._handle.__globals__["_generator"]
    assert handler.settings.max_new_tokens == 10


def test_json_answer(backend):
    status, content_type, body = invoke(backend, {"inputs": "Hello there",
                                                  "parameters": {"details": True}})
    assert (status, content_type) == (200, "application/json")
    answer = json.loads(body)
    assert answer["details"]["generated_tokens"] <= 10 and isinstance(answer["generated_text"], str)


def test_concurrent_requests_form_a_batch_with_the_same_answers(backend):
    prompts = ["one", "two words here", "a somewhat longer third prompt for padding", "4"]
    alone = [json.loads(invoke(backend, {"inputs": p})[2]) for p in prompts]
    answers = invoke_together(backend, [{"inputs": p} for p in prompts])
    assert [status for status, _, _ in answers] == [200] * 4
    assert [json.loads(body) for _, _, body in answers] == alone


def test_streamed_answer_is_an_iterator_of_jsonlines(backend):
    status, content_type, chunks = invoke(backend, {"inputs": "Hello there", "stream": True})
    assert (status, content_type) == (200, "application/jsonlines")
    assert not isinstance(chunks, (bytes, bytearray))
    lines = [json.loads(chunk) for chunk in chunks]
    assert lines and all("token" in line for line in lines)
    plain = json.loads(invoke(backend, {"inputs": "Hello there"})[2])
    assert lines[-1]["generated_text"] == plain["generated_text"]


def test_bad_requests_get_their_code(backend):
    status, content_type, body = invoke(backend, b"not json")
    assert status == 400 and content_type == "application/json"
    assert "not valid JSON" in json.loads(body)["error"]
    status, _, body = invoke(backend, {"inputs": "x", "parameters": {"nope": 1}})
    assert status == 400 and "unknown parameter 'nope'" in json.loads(body)["error"]


# --- hand-written handlers: what the backend does with any model.py ------------------------------
def write_handler(folder: Path, source: str, properties: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    (folder / "serving.properties").write_text(properties)
    return folder


BATCH_REPORTER = """
    import json
    try:
        from djl_python import Input, Output
    except ImportError:
        from byo_vllm.djl_standin import Input, Output

    def handle(inputs):
        if inputs.is_empty():
            return None
        batch = inputs.get_batches()
        out = Output()
        for i, item in enumerate(batch):
            body = item.get_as_json()
            if body.get("explode"):
                raise RuntimeError("the handler blew up")
            if body.get("reject"):
                out.add_as_json({"code": 422, "message": "no", "error": "rejected"}, batch_index=i)
            else:
                out.add_as_json({"batch": len(batch), "echo": body["n"]}, batch_index=i)
        return out
"""


def test_dynamic_batching_gathers_concurrent_requests(tmp_path):
    # A long delay: the batch is sent as soon as it is full, so the test takes no longer.
    folder = write_handler(tmp_path / "m", BATCH_REPORTER, "batch_size=3\nmax_batch_delay=30000\n")
    served = LmiHandlerBackend(folder, {})
    served.load()
    assert served.ready, served.failed
    first, second, third = invoke_together(served, [{"n": 0}, {"n": 1, "reject": True}, {"n": 2}])
    assert first[0] == 200 and json.loads(first[2]) == {"batch": 3, "echo": 0}
    assert second[0] == 422 and json.loads(second[2])["error"] == "rejected"
    assert third[0] == 200 and json.loads(third[2]) == {"batch": 3, "echo": 2}
    # A handler that raises fails its batch with 424, and the backend keeps serving.
    failed = invoke_together(served, [{"n": 9, "explode": True}, {"n": 10}, {"n": 11}])
    assert [status for status, _, _ in failed] == [424] * 3
    assert "the handler blew up" in json.loads(failed[1][2])["error"]
    assert invoke_together(served, [{"n": 1}] * 3)[0][0] == 200


def test_async_handler_and_the_entry_point_option(tmp_path):
    folder = write_handler(tmp_path / "m", """
        from byo_vllm.djl_standin import Output

        async def handle(inputs):
            if inputs.is_empty():
                return None
            return Output().add_as_json({"got": inputs.get_as_json()})
    """)
    (folder / "model.py").rename(folder / "custom.py")
    assert entry_point_for(folder, {}) is None                     # nothing says level 4
    assert entry_point_for(folder, {"OPTION_ENTRYPOINT": "custom.py"}) == folder / "custom.py"
    assert entry_point_for(folder, {"OPTION_ENTRYPOINT": "djl_python.vllm"}) is None
    served = LmiHandlerBackend(folder, {"OPTION_ENTRYPOINT": "custom.py"})
    served.load()
    assert served.ready, served.failed
    assert json.loads(invoke(served, {"a": 1})[2]) == {"got": {"a": 1}}


def test_a_stream_that_breaks_half_way_ends_with_an_error_line(tmp_path):
    folder = write_handler(tmp_path / "m", """
        from byo_vllm.djl_standin import Output

        def tokens():
            yield "first"
            raise RuntimeError("the accelerator fell over")

        def handle(inputs):
            if inputs.is_empty():
                return None
            out = Output().add_property("Content-Type", "application/jsonlines")
            return out.add_stream_content(tokens(), output_formatter=lambda t: t + "\\n")
    """)
    served = LmiHandlerBackend(folder, {})
    served.load()
    status, content_type, chunks = invoke(served, {"inputs": "hi", "stream": True})
    assert (status, content_type) == (200, "application/jsonlines")
    chunks = list(chunks)
    assert chunks[0] == b"first\n"
    assert json.loads(chunks[1]) == {"code": 424, "message": "prediction failure",
                                     "error": "the accelerator fell over"}
    assert invoke(served, {"inputs": "again", "stream": True})[0] == 200


def test_a_handler_that_fails_to_load_is_reported_not_raised(tmp_path):
    folder = write_handler(tmp_path / "m", """
        def handle(inputs):
            raise OSError("weights not found in /opt/ml/model")
    """)
    served = LmiHandlerBackend(folder, {})
    served.load()
    assert not served.ready
    assert "weights not found" in served.failed and "model.py" in served.failed
    status, _, body = invoke(served, {"inputs": "hi"})
    assert status == 503 and "weights not found" in json.loads(body)["error"]


def test_serving_properties_win_over_what_the_server_passes(tmp_path):
    folder = write_handler(tmp_path / "m", BATCH_REPORTER,
                           "option.dtype=bf16\nbatch_size=not-a-number\n")
    props = handler_properties(folder, {"OPTION_DTYPE": "fp32", "OPTION_MAX_NEW_TOKENS": "5"})
    assert props["dtype"] == "bf16" and props["max_new_tokens"] == "5"
    served = LmiHandlerBackend(folder, {})
    served.load()
    assert not served.ready and "batch_size='not-a-number'" in served.failed
