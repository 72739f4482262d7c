"""LoRA adapters through Serve's multiplexing, on the shared local Ray application: three
adapters (the rendered --adapter settings, files in a local folder) and
``max_adapters_per_replica`` 2, so Serve's LRU evicts and reloads them in the one engine
replica. Chosen by the OpenAI ``model`` field or Serve's ``serve_multiplexed_model_id``
header; loads and evictions counted in the engine's /metrics; every adapter's greedy output
the same whichever way it is reached, alone or in a mixed, concurrent batch."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

pytestmark = pytest.mark.engine

ADAPTERS = ("a1", "a2", "a3")          # conftest.py writes them; byo_ray_app says so
PROMPT = "The deployment spectrum"
TOKENS = 12


def complete(app, model: str | None, route: str = "/v1/completions", headers=None) -> dict:
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    r = requests.post(app["url"] + route, json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def text(answer: dict) -> str:
    return answer["choices"][0]["text"]


def adapter_counts(app) -> dict[str, dict[str, float]]:
    """{adapter: {"loads": n, "evictions": n, "resident": n}} from the engine's /metrics."""
    body = requests.get(app["url"] + "/metrics", timeout=30).text
    counts = {a: {"loads": 0.0, "evictions": 0.0, "resident": 0.0} for a in ADAPTERS}
    for line in body.splitlines():
        m = re.match(r'^byo_adapter_(loads|evictions)_total\{adapter="([^"]+)"\} (\S+)$', line)
        if m and m[2] in counts:
            counts[m[2]][m[1]] = float(m[3])
        m = re.match(r'^byo_adapter_resident\{adapter="([^"]+)",where="(gpu|cpu)"\} (\S+)$',
                     line)
        if m and m[1] in counts:
            counts[m[1]]["resident"] += float(m[3])
    return counts


def delta(after, before, what: str) -> dict[str, float]:
    return {a: after[a][what] - before[a][what] for a in ADAPTERS}


def test_adapters_multiplexed_two_per_replica(byo_ray_app, tiny_model):
    from test_ray_app import running_engine_replicas, wait_for

    # One engine replica, so /metrics is the replica that served every request.
    wait_for(lambda: running_engine_replicas() == 1, 240, "one engine replica")
    app = byo_ray_app
    assert app["adapters"] == ADAPTERS and app["adapters_per_replica"] == 2
    start = adapter_counts(app)
    base = text(complete(app, str(tiny_model)))

    # Each adapter alone, in turn, by the OpenAI model field: a3 evicts a1 (Serve's LRU of 2).
    alone = {a: text(complete(app, a)) for a in ADAPTERS}
    after = adapter_counts(app)
    assert delta(after, start, "loads") == {"a1": 1, "a2": 1, "a3": 1}
    assert delta(after, start, "evictions") == {"a1": 1, "a2": 0, "a3": 0}
    assert {a: after[a]["resident"] for a in ADAPTERS} == {"a1": 0, "a2": 1, "a3": 1}
    assert len({base, *alone.values()}) == 4, (base, alone)    # each adapter changes the output

    # Serve's header chooses the adapter over the body's model (here the base model's), and
    # on /invocations without a model at all; a1 comes back, evicting a2.
    header = {"serve_multiplexed_model_id": "a1"}
    assert text(complete(app, str(tiny_model), headers=header)) == alone["a1"]
    assert text(complete(app, None, "/invocations", header)) == alone["a1"]
    assert text(complete(app, None, "/invocations",
                         {"serve-multiplexed-model-id": "a3"})) == alone["a3"]
    now = adapter_counts(app)
    assert delta(now, after, "loads") == {"a1": 1, "a2": 0, "a3": 0}
    assert delta(now, after, "evictions") == {"a1": 0, "a2": 1, "a3": 0}

    # A mixed, concurrent load over the three: the same output for each, reached however.
    order = [ADAPTERS[i % 3] for i in range(12)] + [None, None]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda a: (a, text(complete(app, a or str(tiny_model)))), order))
    for adapter, got in answers:
        assert got == (alone[adapter] if adapter else base), (adapter, got)

    end = adapter_counts(app)
    loads, evictions = delta(end, start, "loads"), delta(end, start, "evictions")
    assert sum(evictions.values()) >= 3 and all(loads[a] >= 2 for a in ADAPTERS), end
    # Every load but the ones still resident was evicted: Serve's cache and the engine agree.
    resident = {a: end[a]["resident"] for a in ADAPTERS}
    assert {a: loads[a] - evictions[a] for a in ADAPTERS} == resident
    assert sum(resident.values()) == app["adapters_per_replica"]
    print(f"adapters: {sum(loads.values()):g} loads, {sum(evictions.values()):g} evictions")


def test_an_unknown_adapter_is_named_in_a_404(byo_ray_app):
    r = requests.post(byo_ray_app["url"] + "/v1/completions", timeout=60,
                      json={"model": "nope", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 404, r.text
    assert "no adapter 'nope'" in r.json()["error"]["message"]
    assert "a1, a2, a3" in r.json()["error"]["message"]
    r = requests.post(byo_ray_app["url"] + "/models/a1/invoke", timeout=60,
                      headers={"serve_multiplexed_model_id": "a2"},
                      json={"prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "serve_multiplexed_model_id 'a2' and the path's model 'a1' disagree" in r.text


def test_registry_changes_are_refused_and_listing_still_answers(byo_ray_app):
    """POST /models and DELETE /models/<name> would reach one replica of many: a 400 saying how
    adapters are added on Ray, and nothing changed (a1 still answers)."""
    url = byo_ray_app["url"]
    r = requests.post(url + "/models", json={"model_name": "a4", "url": "/tmp/a4"}, timeout=60)
    assert r.status_code == 400, r.text
    assert "POST /models" in r.json()["error"]["message"] and "--adapter" in r.text
    r = requests.delete(url + "/models/a1", timeout=60)
    assert r.status_code == 400 and "DELETE /models/a1" in r.text, r.text
    listed = requests.get(url + "/models", timeout=60)
    assert listed.status_code == 200, listed.text
    assert {m["modelName"] for m in listed.json()["models"]} >= set(ADAPTERS), listed.text
    assert complete(byo_ray_app, "a1")["model"] == "a1"
