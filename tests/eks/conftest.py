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


@pytest.fixture(scope="session")
def schemas():
    """The upstream schema folder; a clear failure (not a silent skip) when it is missing."""
    from infra.eks.validate import missing_schemas_note, schema_dir

    folder = schema_dir()
    if folder is None:
        pytest.fail(missing_schemas_note())
    return folder
