"""Fixtures shared by the whole suite."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The folder of the tiny random-weight Llama (built once, cached across runs)."""
    from options.tiny_model import tiny_model_dir
    return tiny_model_dir()
