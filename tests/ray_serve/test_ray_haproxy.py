"""``--ray-proxy haproxy`` and a local ``--adapter`` on a Ray of its own, as a user runs them:
``python -m options.deploy --level 6 --engine rayservice --target local --ray-proxy haproxy
--adapter a1=FOLDER`` serving until Ctrl-C. HAProxy (bundled with ray[serve]) answers on the
Serve port, the ingress replica serves HTTP itself and reaches the engine replica over gRPC;
every route and dialect still answers, streams included, the adapter from the local folder
answers by name, and Ctrl-C leaves nothing of the cluster behind. (The test run's shared Ray
runs Serve's own proxy: Ray reads the proxy's settings when its processes start, so this mode
needs a Ray of its own.)"""
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
from test_byo_adapters_guards import write_peft_adapter   # on sys.path via this folder's conftest

pytestmark = [pytest.mark.engine, pytest.mark.e2e]

READY_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def haproxy_app(tiny_model, tmp_path_factory):
    pytest.importorskip("ray.serve", reason="Ray Serve is in the project's ray extra")
    from options.local_server import free_port, own_process_group

    port = free_port()
    folder = tmp_path_factory.mktemp("ray-haproxy")
    log = folder / "deploy.log"
    write_peft_adapter(folder / "adapter-a1", seed=11)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-m", "options.deploy", "--level", "6", "--engine", "rayservice",
           "--target", "local", "--model", str(tiny_model), "--port", str(port),
           "--ray-proxy", "haproxy", "--adapter", f"a1={folder / 'adapter-a1'}"]
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
        proc.wait()                          # reaped: no zombie left in this process's tree
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


def test_a_local_adapter_answers_by_name_and_differs_from_the_base(haproxy_app, tiny_model):
    def greedy(model: str) -> str:
        r = requests.post(haproxy_app["url"] + "/v1/completions", timeout=120,
                          json={"model": model, "prompt": "The capital of", "max_tokens": 12,
                                "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    assert greedy("a1") != greedy(str(tiny_model))
    assert greedy("a1") == greedy("a1")
    missing = requests.post(haproxy_app["url"] + "/v1/completions", timeout=60,
                            json={"model": "a9", "prompt": "Hi", "max_tokens": 2})
    assert missing.status_code == 404 and "a1" in missing.text


def test_ctrl_c_stops_the_cluster_haproxy_included(haproxy_app):
    proc = haproxy_app["proc"]
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0, haproxy_app["log"].read_text(errors="replace")[-3000:]
    deadline = time.monotonic() + 30
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree):
        assert time.monotonic() < deadline, [p.name() for p in tree if p.is_running()]
        time.sleep(0.5)
