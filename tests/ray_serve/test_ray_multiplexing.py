"""The pieces of adapter multiplexing that need no Ray or engine, in a second: how the ingress
names a request's adapter, the builder's check of ``max_adapters_per_replica``, and an
eviction by Serve's LRU through the engine's adapter registry (once, however often Serve and
the garbage collector call ``__del__``; after the adapter's running requests end)."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is in the project's ray extra")

from byo_vllm import metrics  # noqa: E402
from byo_vllm.config import ConfigError  # noqa: E402
from byo_vllm.dialects import BadRequest  # noqa: E402
from byo_vllm.ray_serve import ServedAdapter, choose_adapter, parse_args  # noqa: E402
from test_byo_adapters_registry import setup  # noqa: E402,F401 - the registry fixture

BASE = {"base", "/models/base"}


def scope(path: str, *headers: tuple[bytes, bytes], method: str = "POST") -> dict:
    return {"path": path, "method": method, "headers": list(headers)}


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize("path, headers, data, chosen", [
    ("/v1/completions", (), {"model": "a1", "prompt": "x"}, "a1"),
    ("/v1/chat/completions", (), {"model": "base", "messages": []}, ""),
    ("/v1/completions", (), {"prompt": "x"}, ""),
    ("/invocations", ((b"x-amzn-sagemaker-target-model", b"a2"),), {"inputs": "x"}, "a2"),
    ("/invocations", (), {"model": "a3", "prompt": "x"}, "a3"),
    ("/models/a2/invoke", (), {"inputs": "x"}, "a2"),
    ("/ping", (), {"model": "a1"}, ""),
])
def test_the_route_names_the_adapter(path, headers, data, chosen):
    got, _, sent = choose_adapter(scope(path, *headers), body(**data), BASE)
    assert got == chosen and sent == body(**data)


def test_servers_header_wins_and_the_route_is_told():
    header = (b"serve_multiplexed_model_id", b"a1")
    got, _, sent = choose_adapter(scope("/v1/completions", header),
                                  body(model="base", prompt="x"), BASE)
    assert got == "a1" and json.loads(sent) == {"model": "a1", "prompt": "x"}
    got, forwarded, sent = choose_adapter(
        scope("/invocations", (b"serve-multiplexed-model-id", b"a2"),
              (b"x-amzn-sagemaker-target-model", b"a1")), body(inputs="x"), BASE)
    assert got == "a2" and sent == body(inputs="x")
    assert [v for k, v in forwarded["headers"] if k == b"x-amzn-sagemaker-target-model"] == [b"a2"]
    assert choose_adapter(scope("/v1/completions", (b"serve_multiplexed_model_id", b"base")),
                          body(model="a1"), BASE)[0] == ""
    with pytest.raises(BadRequest, match="'a2' and the path's model 'a1' disagree"):
        choose_adapter(scope("/models/a1/invoke", (b"serve_multiplexed_model_id", b"a2")),
                       b"{}", BASE)


def test_the_builder_checks_the_adapters_per_replica():
    lora = {"SM_VLLM_ENABLE_LORA": "true"}
    parsed, server = parse_args({"model": "m", "settings": lora, "max_adapters_per_replica": 3})
    assert parsed.server_env()["SM_VLLM_MAX_CPU_LORAS"] == "3"
    assert server.engine_args["max_cpu_loras"].value == "3"
    with pytest.raises(ConfigError, match="max_adapters_per_replica 3 needs LoRA on"):
        parse_args({"model": "m", "max_adapters_per_replica": 3})
    with pytest.raises(ConfigError, match="max_adapters_per_replica 3 is above "
                                          "OPTION_MAX_CPU_LORAS=2"):
        parse_args({"model": "m", "max_adapters_per_replica": 3,
                    "settings": {**lora, "OPTION_MAX_CPU_LORAS": "2"}})
    with pytest.raises(ConfigError, match="max_adapters_per_replica 0 must be a whole number"):
        parse_args({"model": "m", "settings": lora, "max_adapters_per_replica": 0})


def test_the_engine_as_its_own_ingress_is_refused_with_lora():
    """Without the ingress nothing names a request's adapter for Serve from its body."""
    parsed, _ = parse_args({"model": "m", "ingress_replicas": 0})
    assert parsed.ingress_replicas == 0
    with pytest.raises(ConfigError, match="ingress_replicas 0 .* with LoRA on"):
        parse_args({"model": "m", "ingress_replicas": 0,
                    "settings": {"SM_VLLM_ENABLE_LORA": "true"}})
    with pytest.raises(ConfigError, match="ingress_replicas -1 must be a whole number >= 0"):
        parse_args({"model": "m", "ingress_replicas": -1})


def evictions(name: str) -> float:
    return metrics.ADAPTER_EVICTIONS.labels(name)._value.get()


def test_an_eviction_by_serve_runs_once_after_the_running_requests(setup):
    make, engine, _ = setup

    async def go():
        registry = await make(cpu_slots=2)
        loop = asyncio.get_running_loop()
        lease = await registry.acquire("a1")          # a request running on a1
        served = ServedAdapter(registry, "a1", loop)
        before = evictions("a1")
        # Serve calls a sync __del__ in its executor; it returns once a1 is out of the engine.
        dropping = loop.run_in_executor(None, served.__del__)
        await asyncio.sleep(0.2)
        assert not dropping.done() and registry.where(registry.get("a1")) != "registered"
        lease.release()
        await asyncio.wait_for(dropping, 5)
        assert registry.where(registry.get("a1")) == "registered"
        served.__del__()                              # the garbage collector's call: nothing
        assert await registry.evict("a1") is False    # idempotent
        assert evictions("a1") - before == 1
        removed = len(engine.removed)
        (await registry.acquire("a1")).release()      # still registered: loads again
        assert registry.where(registry.get("a1")) != "registered"
        assert len(engine.removed) == removed
        assert await registry.evict("unknown") is False
    asyncio.run(go())


@pytest.mark.parametrize("method, path, refused", [
    ("POST", "/models", True), ("POST", "/models/", True), ("DELETE", "/models/a1", True),
    ("GET", "/models", False), ("GET", "/models/a1", False), ("POST", "/models/a1/invoke", False),
    ("POST", "/v1/completions", False), ("DELETE", "/models/a1/invoke", False),
])
def test_only_the_routes_that_change_one_replicas_adapters_are_refused(method, path, refused):
    from byo_vllm.ray_serve import replica_local_change

    error = replica_local_change(scope(path, method=method))
    assert (error is not None) == refused
    if refused:
        assert error.status == 400 and f"{method} {path}" in str(error)
        assert "SPECTRUM_SERVER_ADAPTERS_DIR" in str(error) and "--adapter" in str(error)
