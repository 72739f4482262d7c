"""Shared set-up for the level-4 tests: the handler loaded for real on the tiny model."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
HANDLER = REPO / "options" / "custom_code" / "model.py"

# The handler falls back to the stand-in the server ships (byo_vllm.djl_standin), installed
# with the project.

def load_handler_module(name: str) -> ModuleType:
    """A fresh copy of model.py, as DJL imports it: a file, not a package module."""
    spec = importlib.util.spec_from_file_location(name, HANDLER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_handler():
    return load_handler_module


@pytest.fixture(scope="module")
def handler(tiny_model: Path) -> ModuleType:
    """model.py after its warm-up request, with the tiny model loaded."""
    from byo_vllm.djl_standin import Input

    module = load_handler_module(f"custom_code_model_{id(tiny_model)}")
    warm_up = Input()
    warm_up.properties.update({"model_dir": str(tiny_model), "dtype": "fp32"})
    assert module.handle(warm_up) is None
    return module
