"""The gateway's image, built by ``containers/gateway/build`` and run with podman the way the
level-6 manifests run it: user 10001, a read-only root with a tmpfs at /tmp, the config and
the secret file mounted read-only, ``serve --config ... --workers 2`` against Redis. Called
from the host with the OpenAI SDK; keys and usage through ``admin`` inside the container.

The first build on a fresh machine makes the local Debian base (shared with the serving
image) and installs the gateway's packages: about a minute; later runs reuse podman's layers.
The image stays behind; the container is always removed.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading

import httpx
import openai
import pytest

from gateway_harness import REPO, START_TIMEOUT_S, Gateway, answers, wait_for
from images import build_image, container_logs, container_state, podman
from infra.eks.spec import LOCAL_GATEWAY_IMAGE
from infra.eks.workload import RUN_AS_USER

pytestmark = pytest.mark.container

BUILD_SCRIPT = REPO / "containers" / "gateway" / "build"
BUILD_TIMEOUT_S = 30 * 60       # a cold build (debootstrap base included) on a busy machine
CONFIG_IN_CONTAINER = "/etc/spectrum-gateway/gateway.yaml"
SECRET_IN_CONTAINER = "/etc/spectrum-gateway-secret/hmac-secret"
UPSTREAM = "image"              # the fake upstream's name for these tests only
STREAMS_AT_STOP = 4


class ContainerGateway(Gateway):
    """The harness's gateway, but ``serve`` is the image's entrypoint and ``admin`` runs in
    the container (it reads the same mounted config and the same Redis)."""

    def __init__(self, directory, config: dict, image: str) -> None:
        super().__init__(directory, config, workers=2)
        self.image = image
        self.store = config["store"]
        self.name = f"spectrum-gateway-test-{os.getpid()}-{self.port}"
        self.secret_path = directory / "hmac-secret"
        self.secret_path.write_text(os.urandom(32).hex())
        for path in (self.config_path, self.secret_path):
            path.chmod(0o644)            # readable by the image's user, as a ConfigMap is

    def start(self) -> "ContainerGateway":
        # Host networking: the container reaches the test's Redis and fake upstream on
        # 127.0.0.1, and the host reaches the gateway on self.port.
        podman("run", "--detach", "--name", self.name, "--network", "host",
               "--read-only", "--tmpfs", "/tmp",
               "--volume", f"{self.config_path}:{CONFIG_IN_CONTAINER}:ro",
               "--volume", f"{self.secret_path}:{SECRET_IN_CONTAINER}:ro",
               self.image, "serve", "--config", CONFIG_IN_CONTAINER, "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", str(self.workers))
        wait_for(lambda: not self.running() or answers(self.url + "/readyz"), START_TIMEOUT_S,
                 "the container's gateway to answer /readyz")
        assert self.running(), self.log()
        wait_for(lambda: self.log().count("Application startup complete") >= self.workers,
                 START_TIMEOUT_S, "every worker to start")
        return self

    def running(self) -> bool:
        return bool(self.state().get("Running"))

    def state(self) -> dict:
        return container_state(self.name)

    def stop(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)

    def log(self) -> str:
        return container_logs(self.name)

    def admin(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = podman("exec", self.name, "admin", "--config", CONFIG_IN_CONTAINER, *args,
                      check=False, timeout=60)
        if check:
            assert done.returncode == 0, done.stderr
        return done


@pytest.fixture(scope="module")
def image() -> str:
    return build_image(BUILD_SCRIPT, timeout_s=BUILD_TIMEOUT_S)


@pytest.fixture(scope="module")
def box(image, tmp_path_factory, redis_server, upstreams):
    # A Redis database of its own: the session's other gateway keeps its keys in database 0.
    store = redis_server.url.rsplit("/", 1)[0] + "/7"
    config = {"store": store, "state_dir": "/tmp/spectrum-gateway",
              "secret_file": SECRET_IN_CONTAINER,
              "tenants": {"acme": {"rpm": 600, "tpm": 1_000_000, "max_concurrency": 16,
                                   "models": ["chat"]}},
              "models": {"chat": {"upstreams": [{"name": UPSTREAM, "url": upstreams.url(UPSTREAM),
                                                 "weight": 1}]}}}
    upstreams.set(UPSTREAM, mode="ok", interval_s=0.005)
    gateway = ContainerGateway(tmp_path_factory.mktemp("gateway-image"), config, image)
    try:
        yield gateway.start()
    finally:
        gateway.stop()


def test_build_prints_the_tag_the_level_6_manifests_name(image):
    assert image == LOCAL_GATEWAY_IMAGE
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["User"] == f"{RUN_AS_USER}:{RUN_AS_USER}", "the manifests' runAsUser"
    assert config["Entrypoint"] == ["/opt/program/serve"]
    assert "8000/tcp" in (config.get("ExposedPorts") or {})


def test_build_refuses_unknown_arguments_naming_them():
    done = subprocess.run([str(BUILD_SCRIPT), "--cpu"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 2 and "drop --cpu" in done.stderr
    done = subprocess.run([str(BUILD_SCRIPT), "--tag", "Not_An/Image"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and "'Not_An/Image' is not an image name" in done.stderr


def test_keys_streams_and_the_ledger_through_the_container(box):
    assert httpx.get(box.url + "/readyz", timeout=5).json() == {
        "status": "ready", "store": box.store}
    key = box.create_key("acme")
    assert key["tenant"] == "acme" and key["key"].startswith("sk-spg-")
    stream = box.client(key["key"]).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "one two three"}], max_tokens=6,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == [f"{UPSTREAM}:{i}" for i in range(6)]
    assert chunks[-1].usage.completion_tokens == 6
    (entry,) = box.ledger(lambda e: e["key_id"] == key["id"], tenant="acme")
    assert (entry["upstream"], entry["status"], entry["output_tokens"], entry["usage_source"]) == \
        (UPSTREAM, 200, 6, "upstream")
    assert box.metric("spectrum_gateway_requests_total", tenant="acme", model="chat",
                      upstream=UPSTREAM, status="200") >= 1


def test_a_wrong_key_is_refused_and_no_key_reaches_the_log(box):
    key = box.create_key("acme")
    wrong = key["key"][:-4] + "AAAA"
    with pytest.raises(openai.AuthenticationError) as refused:
        box.client(wrong).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert refused.value.status_code == 401
    box.client(key["key"]).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    log = box.log()
    assert key["key"] not in log and wrong not in log
    assert box.secret_path.read_text() not in log


def test_stop_lets_open_streams_finish_then_exits_0(box, upstreams):
    """``podman stop`` sends SIGTERM, as Kubernetes does: gunicorn stops taking requests and
    its workers finish the streams in flight (the manifests' grace period covers them)."""
    key = box.create_key("acme")["key"]
    tokens = 150
    upstreams.set(UPSTREAM, interval_s=0.02)         # 3 s a stream: still open at the stop
    results: list[object] = [None] * STREAMS_AT_STOP
    first_token = threading.Barrier(STREAMS_AT_STOP + 1, timeout=60)

    def read(i: int) -> None:
        try:
            stream = box.client(key, timeout=120).chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "count"}],
                max_tokens=tokens, stream=True)
            n = 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    n += 1
                    if n == 1:
                        first_token.wait()
            results[i] = n
        except Exception as e:     # noqa: BLE001 - reported by the assertion below
            results[i] = e
            first_token.abort()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(STREAMS_AT_STOP)]
    for t in threads:
        t.start()
    first_token.wait()                 # every stream has begun
    podman("stop", "--time", "60", box.name, timeout=90)
    for t in threads:
        t.join(60)
    assert results == [tokens] * STREAMS_AT_STOP, results
    state = box.state()
    assert not state["Running"] and state["ExitCode"] == 0, (state, box.log()[-3000:])
