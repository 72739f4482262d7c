"""Fixtures shared by the whole suite."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The folder of the tiny random-weight Llama (built once, cached across runs)."""
    from options.tiny_model import tiny_model_dir
    return tiny_model_dir()


@pytest.fixture
def botocore_events():
    """Handlers registered on boto3's default session (the one ``options.aws.Target``'s clients
    come from) reach every client it makes, until the test ends: how tests answer or inspect
    AWS calls at botocore's level."""
    import boto3

    boto3.setup_default_session()
    registered = []

    def register(event, handler):
        boto3.DEFAULT_SESSION.events.register(event, handler)
        registered.append((event, handler))
    yield register
    for event, handler in registered:
        boto3.DEFAULT_SESSION.events.unregister(event, handler)
