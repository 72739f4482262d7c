"""vLLM's scheduling priority through the bring-your-own server, and prefix caching on by
default: conftest.py's ``priority_server``, started with ``SM_VLLM_SCHEDULING_POLICY=priority``
and one request at a time in the engine (``SM_VLLM_MAX_NUM_SEQS=1``), so the order in which
waiting requests run is the scheduler's choice, visible from outside."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from byo_servers import engine_info, wait_for
from options import contract
from options.contract import Request
from options.core import wire

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_every_dialect_carries_a_priority_the_engine_accepts(priority_server, stream):
    for name in (wire.OPENAI_COMPLETIONS, wire.OPENAI_CHAT, wire.TGI):
        for priority in (-2, 0, 9):
            request = Request(prompt="The spectrum", max_tokens=6, ignore_eos=True,
                              priority=priority, stream=stream)
            out = contract.invoke_http(priority_server.url, request, name)
            result = contract.collect(out) if stream else out
            assert result.usage.output_tokens == 6, (name, priority)


def test_a_more_urgent_request_overtakes_one_that_waited_longer(priority_server):
    """Three requests, one engine slot: A runs; B (priority 5) then C (priority 1) wait; when
    A ends, C runs before B although B came first (first come, first served: B first).

    B and C each generate 64 tokens: run one after the other they end ~64 engine steps apart,
    so the order the client sees them end in is the engine's. With 4 tokens they ended a few
    milliseconds apart, where the client's threads could note them in either order."""
    url = priority_server.url
    done: dict[str, float] = {}

    def send(name: str, body: dict) -> None:
        r = requests.post(url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        done[name] = time.monotonic()

    running = requests.post(url + "/v1/completions", stream=True, timeout=300, json={
        "prompt": "A long one", "max_tokens": 1800, "ignore_eos": True, "stream": True,
        "priority": 0})
    assert running.status_code == 200, running.text
    lines = running.iter_lines()
    next(line for line in lines if line.startswith(b"data: "))      # A holds the slot
    short = {"prompt": "Short", "max_tokens": 64, "ignore_eos": True}
    threads = []
    for name, priority in (("B", 5), ("C", 1)):
        threads.append(threading.Thread(target=send, args=(name, {**short, "priority": priority})))
        threads[-1].start()
        wait_for(lambda: done or priority_server.metric("byo_requests_waiting") >= len(threads),
                 20, f"{name} to wait behind A")
        assert not done, f"{sorted(done)} ran while A held the only slot"
    # A must run on well after C waits, or the order would show nothing.
    after_c = sum(1 for line in lines if line.startswith(b"data: "))
    for t in threads:
        t.join(300)
    assert after_c >= 200, f"A ended only {after_c} events after C was seen waiting"
    assert sorted(done, key=done.get) == ["C", "B"], done
    print(f"C ended {1000 * (done['B'] - done['C']):.0f} ms before B")


def test_embeddings_on_a_generating_engine_say_what_to_set(priority_server):
    for path, body in [("/v1/embeddings", {"input": ["a", "b"]}), ("/invocations", {"input": "a"})]:
        r = priority_server.post(path, body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "input"
        for words in ("runner 'generate'", "serves no embeddings", "SM_VLLM_RUNNER=pooling"):
            assert words in error["message"]
    # TGI's inputs still generate here: only a pooling engine reads them as feature extraction.
    r = priority_server.post("/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 200 and "generated_text" in r.json()


def test_prefix_caching_is_on_by_default_and_hits_on_a_repeated_prefix(priority_server):
    (model,) = requests.get(priority_server.url + "/v1/models", timeout=10).json()["data"]
    assert model["runner"] == "generate" and model["scheduling_policy"] == "priority"
    assert model["prefix_caching"] is True
    assert engine_info(priority_server) == {"runner": "generate", "scheduling_policy": "priority",
                                            "prefix_caching": "on"}
    assert "prefix caching on (vLLM's default" in priority_server.log.read_text()
    # An agent's next step: the same long context, a new question at the end.
    context = "The deployment spectrum runs from Bedrock to EKS. " * 20
    hits = priority_server.metric("vllm:prefix_cache_hits_total")
    for question in ("Which rung is cheapest?", "Which rung is fastest?"):
        r = priority_server.post("/v1/completions", {"prompt": context + question, "max_tokens": 2})
        assert r.status_code == 200, r.text
    # The second prompt's shared part (whole 16-token blocks of it) came from the cache.
    assert priority_server.metric("vllm:prefix_cache_hits_total") - hits >= 64
