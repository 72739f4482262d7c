"""``--ray-proxy haproxy`` on a Ray of its own, as a user runs it: ``python -m options.deploy
--level 6 --engine rayservice --target local --ray-proxy haproxy`` serving until Ctrl-C. HAProxy
(bundled with ray[serve]) answers on the Serve port, the ingress replica serves HTTP itself and
reaches the engine replica over gRPC; every route and dialect still answers, streams included,
and Ctrl-C leaves nothing of the cluster behind. (The test run's shared Ray runs Serve's own
proxy: Ray reads the proxy's settings when its processes start, so this mode needs a Ray of
its own.)"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests

pytestmark = [pytest.mark.engine, pytest.mark.e2e]

READY_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def haproxy_app(tiny_model, tmp_path_factory):
    pytest.importorskip("ray.serve", reason="Ray Serve is in the project's ray extra")
    from options.local_server import free_port, own_process_group

    port = free_port()
    log = tmp_path_factory.mktemp("ray-haproxy") / "deploy.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-m", "options.deploy", "--level", "6", "--engine", "rayservice",
           "--target", "local", "--model", str(tiny_model), "--port", str(port),
           "--ray-proxy", "haproxy"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, **own_process_group())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "serving on" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "not ready: " + log.read_text(errors="replace")[-3000:]
            time.sleep(1)
        yield {"url": url, "proc": proc, "log": log}
    finally:
        tree = []
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(120)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in tree:                       # by pid: what left the group
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_haproxy_answers_on_the_serve_port_in_front_of_replicas_serving_http(haproxy_app):
    tree = psutil.Process(haproxy_app["proc"].pid).children(recursive=True)
    names = [p.name() for p in tree if p.is_running()]
    assert "haproxy" in names, names
    r = requests.get(haproxy_app["url"] + "/ping", timeout=30)
    assert r.status_code == 200


def test_every_route_answers_streams_included(haproxy_app, tiny_model):
    from openai import OpenAI

    client = OpenAI(base_url=haproxy_app["url"] + "/v1", api_key="unused", max_retries=0,
                    timeout=120)
    more = {"ignore_eos": True}
    chat = client.chat.completions.create(
        model=str(tiny_model), messages=[{"role": "user", "content": "Hello"}], max_tokens=5,
        extra_body=more)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 5
    chunks = list(client.completions.create(model=str(tiny_model), prompt="Hi", max_tokens=40,
                                            stream=True, extra_body=more))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices)   # text came through
    for body, answer in (({"inputs": "Hello", "parameters": {"max_new_tokens": 4}}, "generated_text"),
                         ({"prompt": "Hello", "max_tokens": 4}, "text_completion")):
        r = requests.post(haproxy_app["url"] + "/invocations", json=body, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()[0] if isinstance(r.json(), list) else r.json()
        assert answer in (got.get("object"), *got), got
    bad = requests.post(haproxy_app["url"] + "/v1/completions",
                        data=json.dumps({"prompt": "Hi", "max_tokens": -1}),
                        headers={"content-type": "application/json"}, timeout=60)
    assert bad.status_code == 400 and "max_tokens" in bad.text


def test_ctrl_c_stops_the_cluster_haproxy_included(haproxy_app):
    proc = haproxy_app["proc"]
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0, haproxy_app["log"].read_text(errors="replace")[-3000:]
    deadline = time.monotonic() + 30
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree):
        assert time.monotonic() < deadline, [p.name() for p in tree if p.is_running()]
        time.sleep(0.5)
