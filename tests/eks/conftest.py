"""Shared fixtures for the EKS (level 6) tests."""
from __future__ import annotations

import pytest



@pytest.fixture(scope="session")
def prices():
    from cost.prices import load_prices
    return load_prices()


@pytest.fixture(scope="module")
def moto_url():
    """moto in server mode, as --target emulator runs it."""
    from options.aws import emulator
    with emulator() as url:
        yield url
