"""The adapter registry's bookkeeping (single-flight, LRU, pinning, unloading, pages) in a
few seconds, against a stand-in for vLLM's AsyncLLM that records its add_lora/remove_lora
calls. The real engine runs the same paths in test_byo_adapters.py."""
from __future__ import annotations

import asyncio

import pytest

from byo_vllm.adapters import AdapterRegistry, AllowedSources, LoraLimits
from byo_vllm.dialects import BadRequest
from test_byo_adapters_guards import TINY, write_peft_adapter


class RecordingEngine:
    """vLLM's adapter API as the registry calls it, with a load that takes a while."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[int] = []
        self.pinned: list[int] = []
        self.resident: dict[int, str] = {}

    async def add_lora(self, request) -> bool:
        await asyncio.sleep(0.05)
        if "refused" in request.lora_path:
            raise ValueError("vLLM does not yet support DoRA.")
        self.added.append(request.lora_name)
        self.resident[request.lora_int_id] = request.lora_name
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return self.resident.pop(lora_id, None) is not None

    async def pin_lora(self, lora_id: int) -> bool:
        self.pinned.append(lora_id)
        return True


@pytest.fixture
def setup(tmp_path):
    model = tmp_path / "model"
    for i in range(1, 5):
        write_peft_adapter(model / "adapters" / f"a{i}", i)
    write_peft_adapter(model / "adapters" / "refused", 9)
    engine = RecordingEngine()

    async def make(cpu_slots: int = 2, zero: bool = True) -> AdapterRegistry:
        """A started registry: the zero adapter loaded, the folder's adapters registered."""
        registry = AdapterRegistry(engine, LoraLimits(gpu_slots=1, cpu_slots=cpu_slots,
                                                      max_rank=8),
                                   AllowedSources.build(model), tmp_path / f"store{zero}",
                                   base_names=("base",), base_modules=TINY, zero_adapter=zero)
        await registry.start(model)
        return registry
    return make, engine, model


def run(coro):
    return asyncio.run(coro)


def test_the_base_carries_the_pinned_zero_adapter_and_folder_adapters_are_registered(setup):
    make, engine, model = setup

    async def go():
        registry = await make()
        assert engine.added == ["spectrum-base-zero"] and engine.pinned == [1]
        assert [a.name for a in registry.all()] == ["a1", "a2", "a3", "a4", "refused"]
        assert {registry.where(a) for a in registry.all()} == {"registered"}
        for name in (None, "base"):
            lease = await registry.acquire(name)
            assert lease.lora_request.lora_name == "spectrum-base-zero" and lease.name is None
        no_zero = await make(zero=False)
        assert (await no_zero.acquire(None)).lora_request is None
    run(go())


def test_concurrent_first_requests_share_one_load(setup):
    make, engine, model = setup

    async def go():
        registry = await make()
        leases = await asyncio.gather(*(registry.acquire("a1") for _ in range(64)))
        assert engine.added.count("a1-2") == 1
        assert {lease.lora_request.lora_int_id for lease in leases} == {2}
        assert registry.get("a1").inflight == 64
        for lease in leases:
            lease.release()
            lease.release()                    # twice is once
        assert registry.get("a1").inflight == 0
    run(go())


def test_lru_evicts_the_oldest_idle_never_one_with_requests_running(setup):
    make, engine, model = setup

    async def go():
        registry = await make(cpu_slots=2)
        held = await registry.acquire("a1")           # a1 busy
        (await registry.acquire("a2")).release()
        (await registry.acquire("a3")).release()      # evicts a2, not the older a1
        assert registry.where(registry.get("a2")) == "registered"
        assert registry.where(registry.get("a1")) != "registered"
        # Every resident busy: the next load waits for a release, then evicts.
        busy = await registry.acquire("a3")
        waiting = asyncio.ensure_future(registry.acquire("a4"))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        held.release()
        lease = await asyncio.wait_for(waiting, 5)
        assert registry.where(registry.get("a1")) == "registered"
        lease.release()
        busy.release()
    run(go())


def test_pinned_adapters_stay_and_a_cache_full_of_them_is_507(setup):
    make, engine, model = setup

    async def go():
        registry = await make(cpu_slots=2)
        for name in ("p1", "p2"):
            await registry.load(name, str(model / "adapters" / "a1"), pinned=True)
        with pytest.raises(BadRequest) as e:
            await registry.acquire("a3")
        assert e.value.status == 507 and "p1, p2" in str(e.value)
        with pytest.raises(BadRequest) as e:
            await registry.load("p3", str(model / "adapters" / "a2"), pinned=True)
        assert e.value.status == 507
        assert [a.name for a in registry.all()].count("p3") == 0       # not kept
        await registry.unload("p1")
        (await registry.acquire("a3")).release()
        assert registry.where(registry.get("p2")) != "registered"
    run(go())


def test_an_adapter_the_engine_refuses_costs_no_other_adapter(setup):
    make, engine, model = setup

    async def go():
        registry = await make(cpu_slots=2)
        for name in ("a1", "a2"):
            (await registry.acquire(name)).release()
        removed = list(engine.removed)
        with pytest.raises(BadRequest) as e:
            await registry.acquire("refused")
        assert e.value.status == 400 and "DoRA" in str(e.value)
        assert engine.removed == removed                 # nothing evicted for it
        assert {registry.where(registry.get(n)) for n in ("a1", "a2")} <= {"gpu", "cpu"}
    run(go())


def test_409_unload_waits_for_running_requests_then_a_reload_is_new(setup):
    make, engine, model = setup

    async def go():
        registry = await make()
        url = str(model / "adapters" / "a1")
        await registry.load("b", url)
        with pytest.raises(BadRequest) as e:
            await registry.load("b", url)
        assert e.value.status == 409
        lease = await registry.acquire("b")
        first_id = lease.lora_request.lora_int_id
        unloading = asyncio.ensure_future(registry.unload("b"))
        await asyncio.sleep(0.1)
        assert not unloading.done() and first_id not in engine.removed
        with pytest.raises(BadRequest) as e:
            await registry.acquire("b")                  # gone for new requests at once
        assert e.value.status == 404 and "a1" in str(e.value)
        lease.release()
        await asyncio.wait_for(unloading, 5)
        assert first_id in engine.removed
        await registry.load("b", url)
        assert (await registry.acquire("b")).lora_request.lora_int_id != first_id
    run(go())


def test_pages_cover_every_adapter_once(setup):
    make, engine, model = setup

    async def go():
        registry = await make()
        seen, token = [], None
        while True:
            page, token = registry.page(token, 2)
            seen += [a.name for a in page]
            if token is None:
                break
        assert seen == ["a1", "a2", "a3", "a4", "refused"]
        with pytest.raises(BadRequest):
            registry.page("%%%", 2)
    run(go())
