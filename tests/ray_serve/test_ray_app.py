"""Rung 6 on Ray, for real: the byo server's Serve application on a local Ray with the real
vLLM engine on CPU, deployed from the serve config rung 6 renders by default.

One Ray and one application for the module (session fixtures in conftest.py); the life-cycle
test walks 1 -> 2 replicas under load, kills a replica mid-stream, and back to 1."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

# The gateway's test harness: its gateway in front of the application, and its wait_for.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_harness import Gateway, wait_for  # noqa: E402

pytestmark = pytest.mark.engine

REPLICA_HEADER = "x-spectrum-replica"


def openai_client(app):
    from openai import OpenAI
    return OpenAI(base_url=app["url"] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_default_rendered_config_deploys_as_written(byo_ray_app):
    app = byo_ray_app["config"]["applications"][0]
    assert app["import_path"] == "byo_vllm.ray_serve:build_app"
    from ray import serve
    deployments = serve.status().applications["llm"].deployments
    assert set(deployments) == {"ingress", "engine"}
    assert requests.get(byo_ray_app["url"] + "/ping", timeout=30).status_code == 200


def test_rays_own_processes_run_the_lighter_control_plane(byo_ray_app):
    """The local Ray's environment (LOCAL_CONTROL_PLANE_ENV) reaches the processes Ray starts,
    which read it as they start: a task (no CPU reserved) reports what it sees."""
    import os

    import ray

    from options.eks.ray_local import LOCAL_CONTROL_PLANE_ENV

    @ray.remote(num_cpus=0)
    def seen(names):
        return {name: os.environ.get(name) for name in names}

    assert ray.get(seen.remote(list(LOCAL_CONTROL_PLANE_ENV)), timeout=60) == LOCAL_CONTROL_PLANE_ENV


def test_openai_sdk_chat_completion_and_stream(byo_ray_app, tiny_model):
    client = openai_client(byo_ray_app)
    more = {"ignore_eos": True}
    chat = client.chat.completions.create(
        model=str(tiny_model), messages=[{"role": "user", "content": "Hello"}], max_tokens=5,
        extra_body=more)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 5
    completion = client.completions.create(model=str(tiny_model), prompt="Hello", max_tokens=4,
                                           extra_body=more)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(
        model=str(tiny_model), messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
        stream=True, extra_body=more))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 1
    from openai import BadRequestError
    with pytest.raises(BadRequestError, match="max_tokens"):
        client.completions.create(model=str(tiny_model), prompt="Hi", max_tokens=-1)


@pytest.mark.parametrize("body, answer", [
    ({"inputs": "Hello", "parameters": {"max_new_tokens": 4}}, "generated_text"),
    ({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}, "chat.completion"),
    ({"prompt": "Hello", "max_tokens": 4}, "text_completion"),
])
def test_invocations_in_each_dialect(byo_ray_app, body, answer):
    r = requests.post(byo_ray_app["url"] + "/invocations", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    got = data[0] if isinstance(data, list) else data
    assert answer in (got.get("object"), *got), got


# ----------------------------------------------------------------------------------- life cycle

class Load:
    """Threads that keep one long stream each in flight until stopped; every stream's fate."""

    def __init__(self, url: str, threads: int, max_tokens: int = 300) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.streams: list[dict] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive(), "a client hung"

    def in_flight(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for s in self.streams:
                if s.get("replica") and "ended" not in s:
                    out[s["replica"]] = out.get(s["replica"], 0) + 1
            return out

    def _run(self) -> None:
        while not self.stop.is_set():
            s = {"started": time.monotonic()}
            with self.lock:
                self.streams.append(s)
            try:
                r = requests.post(self.url + "/v1/completions", stream=True, timeout=(10, 60),
                                  json={"prompt": "Tell me a story", "stream": True,
                                        "max_tokens": self.max_tokens, "ignore_eos": True})
                s["status"] = r.status_code
                s["replica"] = r.headers.get(REPLICA_HEADER)
                for line in r.iter_lines():
                    if line == b"data: [DONE]":
                        s["done"] = True
                    elif line.startswith(b"data: ") and b'"error"' in line:
                        s["error"] = json.loads(line[6:])["error"]
            except requests.RequestException as e:
                s["error"] = f"{type(e).__name__}: {e}"
            s["ended"] = time.monotonic()


def engine_replicas() -> set[str]:
    """The ids of the engine deployment's replica actors alive now."""
    import ray

    prefix = "SERVE_REPLICA::llm#engine#"
    return {a["name"][len(prefix):] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and a["name"].startswith(prefix)}


def requests_in_engines(url: str, polls: int = 6) -> float:
    """Requests the engine replicas hold (waiting for or producing tokens), summed over the
    replicas a few ``/metrics`` polls reached (each answer names its replica)."""
    held: dict[str, float] = {}
    for _ in range(polls):
        r = requests.get(url + "/metrics", timeout=10)
        held[r.headers.get(REPLICA_HEADER, "")] = sum(
            float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
            if line.startswith(("byo_requests_running ", "byo_requests_waiting ")))
    return sum(held.values())


def running_engine_replicas() -> int:
    from ray import serve
    states = serve.status().applications["llm"].deployments["engine"].replica_states
    return states.get("RUNNING", 0)


def test_autoscaling_and_a_replica_killed_mid_stream(byo_ray_app):
    import ray

    assert running_engine_replicas() == 1
    with Load(byo_ray_app["url"], threads=4) as load:
        loaded = time.monotonic()
        # Serve's autoscaler: 4 ongoing requests over a target of 2 per replica -> 2 replicas
        # (each start is an engine load).
        wait_for(lambda: running_engine_replicas() == 2, 180, "a second engine replica")
        scaled_up_s = time.monotonic() - loaded
        both = wait_for(lambda: len(load.in_flight()) == 2 and load.in_flight(), 60,
                          "streams in flight on both replicas")
        victim, survivor = sorted(both)
        before = engine_replicas()
        killed_at = time.monotonic()
        ray.kill(ray.get_actor(f"SERVE_REPLICA::llm#engine#{victim}", namespace="serve"),
                 no_restart=True)
        replaced = wait_for(lambda: engine_replicas() - before, 10,
                              "Serve to start a replacement replica")
        replaced_s = time.monotonic() - killed_at
        wait_for(lambda: all("ended" in s for s in load.streams
                               if s.get("replica") == victim), 10,
                   "the killed replica's streams to end")
    cut = [s for s in load.streams if s.get("replica") == victim
           and s["started"] < killed_at < s["ended"]]
    spanning = [s for s in load.streams if s.get("replica") == survivor
                and s["started"] < killed_at < s["ended"]]
    assert cut and spanning, (cut, spanning)
    # A stream the replica had sent whole before it died may still be read after the kill
    # (relayed in batches): it is complete. Every other one ends with the in-band error event,
    # promptly; none is cut short silently or left hanging, and the kill cut at least one.
    for s in cut:
        assert ("error" in s) != bool(s.get("done")), s
        assert s["ended"] - killed_at < 10, "the client of a killed replica waited"
    assert any("error" in s for s in cut), cut
    assert all(s.get("done") and "error" not in s for s in spanning), spanning
    # No load: back to one replica after the downscale delay.
    wait_for(lambda: running_engine_replicas() == 1 and len(engine_replicas()) == 1, 240,
               "the engine deployment to scale back to 1 replica")
    print(f"scaled 1 -> 2 in {scaled_up_s:.1f} s; replacement {sorted(replaced)} started "
          f"{replaced_s:.1f} s after the kill; {len(cut)} stream(s) cut, "
          f"{len(spanning)} completed on the other replica")


def test_the_gateway_in_front_fails_over_what_a_killed_replica_left_unanswered(
        byo_ray_app, tiny_model, tmp_path):
    """A gateway upstream with two addresses of the application (as two Services of one
    RayService would be). Whole answers cut by the engine replicas' death are a 503 from the
    ingress, which the gateway may retry: it fails over, and every request is answered once
    Serve's replacements serve."""
    import ray
    from urllib.parse import urlsplit

    url = byo_ray_app["url"]
    other = f"http://localhost:{urlsplit(url).port}"
    config = {"store": "memory", "upstream_timeout_s": 300, "tenants": {"acme": {"models": ["*"]}},
              "models": {"llm": {"upstreams": [{"name": "ray", "urls": [url, other],
                                                "model": str(tiny_model)}]}}}
    gw = Gateway(tmp_path, config).start()
    try:
        key = gw.create_key("acme")["key"]
        answers: list = []

        def ask() -> None:
            r = requests.post(gw.url + "/v1/completions", timeout=300,
                              headers={"authorization": f"Bearer {key}"},
                              json={"model": "llm", "prompt": "Tell me a story",
                                    "max_tokens": 900, "ignore_eos": True})
            answers.append((r.status_code, r.json()))

        clients = [threading.Thread(target=ask, daemon=True) for _ in range(4)]
        for c in clients:
            c.start()
        # Kill only once the engine replicas hold all four: a request still queued in Serve's
        # router is routed to the replacement, not cut, and would prove nothing here.
        wait_for(lambda: requests_in_engines(url) >= 4, 60, "the four requests in the engines")
        # Every engine replica (the load may have started a second): nothing answers until
        # Serve's replacements have loaded their engines.
        killed_at = time.monotonic()
        for victim in engine_replicas():
            ray.kill(ray.get_actor(f"SERVE_REPLICA::llm#engine#{victim}", namespace="serve"),
                     no_restart=True)
        for c in clients:
            c.join(300)
        assert not any(c.is_alive() for c in clients), "a client hung"
        assert [status for status, _ in answers] == [200] * 4, answers
        assert all(a["usage"]["completion_tokens"] == 900 for _, a in answers), answers
        def failovers() -> float:
            return sum(float(line.rsplit(" ", 1)[1]) for line in
                       requests.get(gw.url + "/metrics", timeout=10).text.splitlines()
                       if line.startswith("spectrum_gateway_replica_requests_total")
                       and 'routing="failover"' in line)
        failed_over = wait_for(failovers, 10, "a request answered by failover")
        assert "ActorDiedError" in gw.log(), gw.log()[-2000:]
        print(f"{len(answers)} answered, {failed_over:.0f} by failover, the last "
              f"{time.monotonic() - killed_at:.1f} s after the kill")
    finally:
        gw.stop()
