"""The app's start-up, in process: what it leaves the garbage collector to walk."""
from __future__ import annotations

import asyncio
import gc

import yaml

from gateway_harness import GATEWAY_DIR  # noqa: F401   puts spectrum_gateway on sys.path
from spectrum_gateway.app import create_app
from spectrum_gateway.config import load_config


def test_start_up_freezes_what_it_loaded_and_requests_objects_stay_collectable(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "store": "memory", "state_dir": str(tmp_path / "state"),
        "tenants": {"acme": {"rpm": 60, "tpm": 10000, "models": ["chat"]}},
        "models": {"chat": {"upstreams": [{"name": "up", "url": "http://127.0.0.1:9/v1"}]}}}))
    app = create_app(load_config(str(path)))

    async def lifespan():
        inbox: asyncio.Queue = asyncio.Queue()
        said: list[str] = []

        async def send(message):
            said.append(message["type"])
        await inbox.put({"type": "lifespan.startup"})
        running = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                          inbox.get, send))
        while "lifespan.startup.complete" not in said:
            assert not running.done(), said
            await asyncio.sleep(0.01)
        frozen = gc.get_freeze_count()

        # A cycle made after start-up (as a request's can be) is still collected.
        class Node:
            pass
        node = Node()
        node.me = node
        del node
        collected = gc.collect()
        await inbox.put({"type": "lifespan.shutdown"})
        await running
        return frozen, collected, said

    gc.unfreeze()
    try:
        frozen, collected, said = asyncio.run(lifespan())
    finally:
        gc.unfreeze()            # this test process goes on as it was
    # Everything loaded so far (this test run's modules included) is out of the full
    # collections' way: tens of thousands of objects.
    assert frozen > 10_000, frozen
    assert collected >= 1
    assert said == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
