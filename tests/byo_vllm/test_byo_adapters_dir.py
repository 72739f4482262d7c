"""SPECTRUM_SERVER_ADAPTERS_DIR: a folder of adapters registered at start-up when the model
comes from the hub (on EKS an init container fills it from S3), as vLLM's --lora-modules."""
from __future__ import annotations

import asyncio

import pytest

from byo_vllm.adapters import AdapterRegistry, AllowedSources, LoraLimits
from byo_vllm.config import ConfigError, settings_from_env
from test_byo_adapters_guards import TINY, write_peft_adapter
from test_byo_adapters_registry import RecordingEngine


def test_the_setting_is_an_absolute_folder(tmp_path):
    env = {"HF_MODEL_ID": "Qwen/Qwen2.5-7B-Instruct"}
    assert settings_from_env(env).adapters_dir is None
    settings = settings_from_env({**env, "SPECTRUM_SERVER_ADAPTERS_DIR": str(tmp_path)})
    assert settings.adapters_dir == str(tmp_path)
    assert settings.describe()["adapters_dir"] == str(tmp_path)
    for bad in ("adapters", "/adapters/../etc"):
        with pytest.raises(ConfigError, match="SPECTRUM_SERVER_ADAPTERS_DIR=" + repr(bad).replace(".", r"\.")):
            settings_from_env({**env, "SPECTRUM_SERVER_ADAPTERS_DIR": bad})


def test_a_hub_model_registers_the_folders_adapters_and_loads_them(tmp_path):
    folder = tmp_path / "adapters"
    write_peft_adapter(folder / "support", 1)
    write_peft_adapter(folder / "sql", 2)
    engine = RecordingEngine()

    async def go():
        # No model folder (a hub id): only the adapters folder is a root, as the engine builds it.
        registry = AdapterRegistry(engine, LoraLimits(gpu_slots=1, cpu_slots=2, max_rank=8),
                                   AllowedSources.build(None, (str(folder),)), tmp_path / "store",
                                   base_names=("base",), base_modules=TINY, zero_adapter=False)
        await registry.start(None, folder)
        assert [a.name for a in registry.all()] == ["sql", "support"]
        assert {registry.where(a) for a in registry.all()} == {"registered"}
        lease = await registry.acquire("support")
        assert lease.lora_request.lora_name.startswith("support-")
        lease.release()
        assert engine.added == [lease.lora_request.lora_name]
    asyncio.run(go())
