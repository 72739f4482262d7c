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

# Each life-cycle stream asks for all the context leaves after its prompt (MAX_MODEL_LEN 1024),
# with ignore_eos: the longest answer the engine gives, so that half of it is hundreds of steps.
LIFE_TOKENS = 1000


def engine_loads(app: dict, loads: float, floor_s: float) -> float:
    """A bound for a wait that includes engine loads: ``loads`` times what the application's
    deploy took on this machine (``ready_s``: one engine load, and Serve's own start), at least
    ``floor_s``. A machine that loads an engine slowly gets a longer wait, never a failure."""
    return max(floor_s, loads * app["ready_s"])


class Load:
    """Threads that keep one long stream each in flight until stopped; every stream's fate.
    A stream records when it started and ended, the replica that answered (its header), how
    many ``data:`` events the client read, and how it ended: ``done`` (the [DONE] event),
    ``error`` (the in-band error event, a dict; or, a str, what broke at the client) or
    ``closed`` (this client closed it, see ``stop_streams_started_after``)."""

    def __init__(self, url: str, threads: int, max_tokens: int = 300) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.streams: list[dict] = []
        self.close_after = float("inf")
        self.join_s = 120.0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:        # the test failed: close every stream, hide nothing
            self.close_after, self.join_s = float("-inf"), 60.0
        self.stop.set()
        deadline = time.monotonic() + self.join_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert exc[0] is not None or not any(t.is_alive() for t in self.threads), \
            f"a client's stream had not ended {self.join_s:.0f} s after the load stopped"

    def stop_streams_started_after(self, t: float, join_s: float) -> None:
        """When the load stops, streams started after ``t`` are closed by their clients (the
        engine aborts them) rather than read to their end; the others are read to their end,
        within ``join_s``."""
        self.close_after, self.join_s = t, join_s

    def in_flight(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for s in self.streams:
                if s.get("replica") and "ended" not in s:
                    out[s["replica"]] = out.get(s["replica"], 0) + 1
            return out

    def answering(self) -> dict[str, int]:
        """Per replica, the streams whose client has read at least one event, ended or not."""
        with self.lock:
            out: dict[str, int] = {}
            for s in self.streams:
                if s.get("replica") and s.get("events"):
                    out[s["replica"]] = out.get(s["replica"], 0) + 1
            return out

    def longest_s(self) -> float:
        """The longest a stream has taken from start to [DONE] so far (0 before any)."""
        with self.lock:
            return max((s["ended"] - s["started"] for s in self.streams if s.get("done")),
                       default=0.0)

    def _run(self) -> None:
        while not self.stop.is_set():
            s = {"started": time.monotonic(), "events": 0}
            with self.lock:
                self.streams.append(s)
            try:
                with requests.post(self.url + "/v1/completions", stream=True, timeout=(10, 60),
                                   json={"prompt": "Tell me a story", "stream": True,
                                         "max_tokens": self.max_tokens,
                                         "ignore_eos": True}) as r:
                    s["status"] = r.status_code
                    s["replica"] = r.headers.get(REPLICA_HEADER)
                    for line in r.iter_lines():
                        if self.stop.is_set() and s["started"] > self.close_after:
                            s["closed"] = True
                            break
                        if line == b"data: [DONE]":
                            s["done"] = True
                        elif line.startswith(b"data: ") and b'"error"' in line:
                            s["error"] = json.loads(line[6:])["error"]
                        elif line.startswith(b"data: "):
                            s["events"] += 1
            except requests.RequestException as e:
                s["error"] = f"{type(e).__name__}: {e}"
            s["ended"] = time.monotonic()


def engine_replicas() -> set[str]:
    """The ids of the engine deployment's replica actors alive now (starting ones included)."""
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


# vLLM's own counters, which its engine updates every step (not once per request, as byo_*
# are): the tokens it has generated, and the requests it has finished and their tokens. What
# it has generated for the requests it has not finished is the difference.
GENERATED = "vllm:generation_tokens_total"
FINISHED = "vllm:request_success_total"
FINISHED_TOKENS = "vllm:request_generation_tokens_sum"
HELD = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def engine_metrics(url: str) -> tuple[str, dict[str, float]]:
    """One ``/metrics`` answer: the engine replica that gave it, and its counters (GENERATED,
    FINISHED, FINISHED_TOKENS, HELD), each summed over its labels."""
    r = requests.get(url + "/metrics", timeout=10)
    assert r.status_code == 200, r.text[:500]
    values = dict.fromkeys((GENERATED, FINISHED, FINISHED_TOKENS, *HELD), 0.0)
    for line in r.text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return r.headers.get(REPLICA_HEADER, ""), values


def replica_states() -> dict[str, int]:
    from ray import serve
    engine = serve.status().applications["llm"].deployments["engine"]
    return {str(getattr(state, "value", state)): n for state, n in engine.replica_states.items()}


def running_engine_replicas() -> int:
    return replica_states().get("RUNNING", 0)


def kill_gate(url: str, load: Load, baseline: dict[str, dict[str, float]],
              last: dict[str, tuple[float, float]]) -> dict | None:
    """The replica to kill now, if one /metrics answer proves a stream the client is reading
    from it mid-answer, and another replica has a stream in flight (the kill must leave it
    whole); else None.

    ``answering`` is read before the metrics, so every stream it counts had started in that
    engine before its counters were read. At most FINISHED of them had finished there, so at
    least ``answering - FINISHED`` had not (nor, then, ended at the client, which reads [DONE]
    after the engine's end), and together they had generated no more than all the engine's
    unfinished requests. If that is at most half of LIFE_TOKENS for each of them, one has at
    least half its answer to go: a kill sent at once cuts it, unless the engine runs
    LIFE_TOKENS / 2 steps before the kill lands."""
    answering = load.answering()
    in_flight = load.in_flight()
    replica, now = engine_metrics(url)
    at = time.monotonic()
    # The first replica's counters include this module's other tests (its baseline, taken
    # idle before the load); a replica Serve started during the load begins at zero.
    base = baseline.get(replica, dict.fromkeys(now, 0.0))
    finished = (now[FINISHED] - base[FINISHED])
    unfinished_tokens = ((now[GENERATED] - now[FINISHED_TOKENS])
                         - (base[GENERATED] - base[FINISHED_TOKENS]))
    previous, last[replica] = last.get(replica), (at, now[GENERATED])
    unfinished_read = answering.get(replica, 0) - int(finished)
    others = [r for r in in_flight if r != replica]
    if unfinished_read < 1 or unfinished_tokens > unfinished_read * LIFE_TOKENS / 2 or not others:
        return None
    return {"victim": replica, "survivor": others[0], "read_at": at,
            "unfinished_read": unfinished_read, "unfinished_tokens": unfinished_tokens,
            # the engine's pace since its previous answer, for the messages (None: none)
            "tokens_per_s": (now[GENERATED] - previous[1]) / (at - previous[0])
            if previous and at > previous[0] else None}


def test_autoscaling_and_a_replica_killed_mid_stream(byo_ray_app):
    import ray

    url = byo_ray_app["url"]
    # The module's earlier tests may have scaled the engine up (their requests count toward
    # Serve's target): start from one replica, alive and running, once Serve has scaled back.
    wait_for(lambda: running_engine_replicas() == 1 and len(engine_replicas()) == 1,
             engine_loads(byo_ray_app, 2, 120),
             "the engine deployment at one replica before the load", 0.5)
    (first,) = engine_replicas()

    def idle():
        replica, values = engine_metrics(url)
        return replica == first and not any(values[name] for name in HELD) and values
    baseline = {first: wait_for(idle, 60, "the engine replica idle before the load", 0.5)}
    with Load(url, threads=4, max_tokens=LIFE_TOKENS) as load:
        loaded = time.monotonic()
        # Serve's autoscaler: 4 ongoing requests over a target of 2 per replica -> 2 replicas.
        # Its decision shows at once; the replica's start is an engine load, as slow as this
        # machine loads one (the first's took ready_s).
        wait_for(lambda: sum(replica_states().values()) >= 2, 60,
                 "Serve to start a second engine replica (4 streams, a target of 2 each)", 0.5)
        try:
            wait_for(lambda: running_engine_replicas() == 2, engine_loads(byo_ray_app, 3, 180),
                     f"the second engine replica to load its engine (the application's deploy "
                     f"took {byo_ray_app['ready_s']:.0f} s)", 0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; Serve's engine replicas: {replica_states()}") from None
        scaled_up_s = time.monotonic() - loaded
        # Kill a replica only once one /metrics answer proves a stream the client is reading
        # from it has at least half its answer to go in the engine (kill_gate). Streams reach
        # the new replica as the first's end: bounded by how long answers take here.
        last: dict[str, tuple[float, float]] = {}
        gate_s = max(120.0, 3 * load.longest_s(), 3 * (time.monotonic() - loaded))
        gate = wait_for(lambda: kill_gate(url, load, baseline, last), gate_s,
                        "a stream provably mid-answer on one replica, and one in flight on the "
                        "other", 0.2)
        victim, survivor = gate["victim"], gate["survivor"]
        before = engine_replicas()
        killed_at = time.monotonic()
        ray.kill(ray.get_actor(f"SERVE_REPLICA::llm#engine#{victim}", namespace="serve"),
                 no_restart=True)
        wait_for(lambda: victim not in engine_replicas(), 30, "Ray to record the replica dead")
        recorded_s = time.monotonic() - gate["read_at"]
        # Serve tells the ingress of the death, which ends each stream with the in-band
        # error: no client of the dead replica waits for its read timeout.
        wait_for(lambda: all("ended" in s for s in load.streams
                             if s.get("replica") == victim and s["started"] < killed_at), 30,
                 "the killed replica's streams to end")
        replaced = wait_for(lambda: engine_replicas() - before, 60,
                            "Serve to start a replacement replica")
        replaced_s = time.monotonic() - killed_at
        load.stop_streams_started_after(killed_at, max(120.0, 3 * load.longest_s()))
    cut = [s for s in load.streams if s.get("replica") == victim
           and s["started"] < killed_at < s["ended"]]
    spanning = [s for s in load.streams if s.get("replica") == survivor
                and s["started"] < killed_at < s["ended"]]
    assert cut and spanning, (cut, spanning)
    # Each stream of the killed replica in flight at the kill ends one of two ways: whole, if
    # the replica had sent all of it before it died (Serve relays what it had sent), or with
    # the ingress's in-band error event. Never cut short silently, never broken at the client.
    for s in cut:
        assert bool(s.get("done")) != isinstance(s.get("error"), dict), s
        assert not isinstance(s.get("error"), str), f"the stream broke at the client: {s}"
        if "error" in s:
            assert "engine replica serving this request failed" in s["error"]["message"], s
    # kill_gate proved one of them mid-answer: it is cut, unless the engine ran half an answer's
    # steps between the gate's read and the kill (what the message weighs).
    pace = (f"{gate['tokens_per_s']:.0f} tokens/s" if gate["tokens_per_s"] is not None
            else "its pace not measured")
    assert any("error" in s for s in cut), (
        f"no stream of the killed replica was cut: {gate['unfinished_read']} stream(s) the "
        f"client was reading had {gate['unfinished_tokens']:.0f} tokens generated in all "
        f"(of {LIFE_TOKENS} each) {recorded_s:.2f} s before Ray recorded the kill ({pace}): "
        f"{cut}")
    assert all(s.get("done") and "error" not in s for s in spanning), spanning
    # No load: back to one replica after the downscale delay (the replacement may still be
    # loading its engine when Serve stops it).
    wait_for(lambda: running_engine_replicas() == 1 and len(engine_replicas()) == 1,
             engine_loads(byo_ray_app, 2, 240), "the engine deployment to scale back to 1 replica",
             0.5)
    print(f"scaled 1 -> 2 in {scaled_up_s:.1f} s; killed {gate['unfinished_read']} stream(s) "
          f"being read, {gate['unfinished_tokens']:.0f} tokens generated in all ({pace}), "
          f"Ray recording the kill {recorded_s:.2f} s after that read; replacement "
          f"{sorted(replaced)} started {replaced_s:.1f} s after the kill; "
          f"{len(cut)} stream(s) cut, {len(spanning)} completed on the other replica")


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
    # Each answer may wait for Serve's replacement to load its engine, then be generated:
    # bounded by this machine's engine load (the application's deploy), not a fixed time.
    answer_s = 300 + engine_loads(byo_ray_app, 2, 0)
    config = {"store": "memory", "upstream_timeout_s": answer_s,
              "tenants": {"acme": {"models": ["*"]}},
              "models": {"llm": {"upstreams": [{"name": "ray", "urls": [url, other],
                                                "model": str(tiny_model)}]}}}
    gw = Gateway(tmp_path, config).start()
    try:
        key = gw.create_key("acme")["key"]
        answers: list = []

        def ask() -> None:
            r = requests.post(gw.url + "/v1/completions", timeout=answer_s,
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
        deadline = time.monotonic() + answer_s
        for c in clients:
            c.join(max(0.0, deadline - time.monotonic()))
        assert not any(c.is_alive() for c in clients), \
            f"a client had no answer {answer_s:.0f} s after the kill"
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
