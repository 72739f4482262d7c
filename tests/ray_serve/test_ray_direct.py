"""The engine deployment as its own ingress (``ingress_replicas: 0``): Serve's proxy hands HTTP
to the engine replica, one streamed hop instead of two. Deployed beside the test run's default
application through the same deploy-from-config path, at ``/direct``, and removed after."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_harness import wait_for  # noqa: E402
from stream_hang_up import assert_hang_up_is_aborted  # noqa: E402  (tests/byo_vllm, by conftest)

pytestmark = pytest.mark.engine
# The direct application runs eager with no LoRA: on a CPU with AMX tiles (this machine's kind),
# that engine's worker, started under Ray, died of SIGILL at its first step until the project's
# vLLM plugin (byo_vllm.vllm_plugin) asked the kernel for AMX in every engine process; so this
# application is also that plugin's test. Settings of the default application the direct one
# leaves out: adapters (the direct layout serves none).
NOT_DIRECT = ("LORA", "ADAPTER")

ROUTE = "/direct"
REPLICA_HEADER = "x-spectrum-replica"


@pytest.fixture(scope="module")
def direct_app(byo_ray_app, tiny_model):
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    base = byo_ray_app["config"]
    default = base["applications"][0]
    settings = {k: v for k, v in default["args"]["settings"].items()
                if not any(word in k for word in NOT_DIRECT)}
    direct = {"name": "direct", "route_prefix": ROUTE, "import_path": default["import_path"],
              "args": {"model": str(tiny_model), "settings": settings, "num_replicas": 1,
                       "ingress_replicas": 0,
                       # No CPU reserved: the default application keeps both of this Ray's.
                       "engine_num_cpus": 0}}
    both = copy.deepcopy(base)
    both["applications"] = [*base["applications"], direct]
    client = _get_global_client()
    client.deploy_apps(ServeDeploySchema.model_validate(both))
    from ray import serve

    def running():
        app = serve.status().applications.get("direct")
        assert app is None or not str(app.status).endswith("DEPLOY_FAILED"), app.message
        return app is not None and str(app.status).endswith("RUNNING")
    try:
        wait_for(running, 300, "the direct application to run")
        assert set(serve.status().applications["direct"].deployments) == {"engine"}
        yield byo_ray_app["url"] + ROUTE
    finally:
        client.deploy_apps(ServeDeploySchema.model_validate(base))     # "direct" removed


def test_answers_and_streams_through_one_hop(direct_app, tiny_model):
    from openai import OpenAI

    client = OpenAI(base_url=direct_app + "/v1", api_key="unused", max_retries=0, timeout=120)
    done = client.completions.create(model=str(tiny_model), prompt="Hello", max_tokens=6,
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
    chunks = list(client.completions.create(model=str(tiny_model), prompt="Hi", max_tokens=40,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices[0].finish_reason == "length"
    r = requests.post(direct_app + "/invocations", timeout=60,
                      json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert "generated_text" in (answer[0] if isinstance(answer, list) else answer), answer
    assert r.headers.get(REPLICA_HEADER)
    bad = requests.post(direct_app + "/v1/completions", timeout=60,
                        json={"prompt": "Hi", "max_tokens": -1})
    assert bad.status_code == 400 and "max_tokens" in bad.text


def metric(url: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in
               requests.get(url + "/metrics", timeout=10).text.splitlines()
               if line.startswith(name))


@pytest.fixture(params=["ingress", "direct"])
def either_layout(request, byo_ray_app):
    """The default application's URL (proxy → ingress → engine), or the direct one's."""
    if request.param == "ingress":
        return byo_ray_app["url"], ""
    return request.getfixturevalue("direct_app"), ROUTE


def test_a_client_that_leaves_mid_stream_stops_the_engine(either_layout):
    """As on the plain server: the engine stops generating for a client that hung up, and
    counts it."""
    url, route = either_layout     # the default application is back to one replica
    generated = assert_hang_up_is_aborted(url, lambda name: metric(url, name), 1000, wait_for,
                                          path=route + "/v1/completions")
    print(f"{generated:.0f} tokens generated of 1000")
