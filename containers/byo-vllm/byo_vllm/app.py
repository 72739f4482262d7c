"""The WSGI application gunicorn runs in its one worker: picks the backend, starts loading it
in the background (so /ping answers 503 at once), and registers the routes.

Backends: the vLLM engine (``engine.EngineAdapter``), or, for level 4, the user's model.py
served through ``lmi_handler.LmiHandlerBackend`` when ``OPTION_ENTRYPOINT`` names a .py file
or the model folder holds a model.py.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from flask import Flask

from . import routes
from .config import ConfigError, ServerSettings

log = logging.getLogger("byo_vllm.app")


class HandlerLoader:
    """Runs a handler backend's blocking ``load()`` in a background thread."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def start(self) -> None:
        threading.Thread(target=self._load, name="handler-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self.backend.load()
        except Exception:           # noqa: BLE001 - the backend reports it through .failed
            log.exception("the model.py handler failed to load")

    @property
    def ready(self) -> bool:
        return bool(self.backend.ready)

    @property
    def failed(self) -> str | None:
        return self.backend.failed

    def invoke(self, body: bytes, content_type: str, accept: str):
        return self.backend.invoke(body, content_type, accept)

    def shutdown(self) -> None:
        stop = getattr(self.backend, "shutdown", None)
        if stop is not None:
            stop()


def make_backend(settings: ServerSettings):
    """The backend the settings ask for (not started)."""
    if settings.handler_entrypoint is None:
        from .engine import EngineAdapter
        return EngineAdapter(settings)
    try:
        from .lmi_handler import LmiHandlerBackend
    except ImportError as e:
        raise ConfigError(
            f"{settings.handler_entrypoint} asks for the model.py backend, but this image has "
            f"no byo_vllm.lmi_handler module ({e}); remove OPTION_ENTRYPOINT / model.py to "
            "serve the model with vLLM directly") from None
    model_dir = Path(settings.model) if Path(settings.model).is_dir() else \
        Path(settings.handler_entrypoint).parent
    properties = dict(settings.lmi_properties)
    properties.setdefault("entryPoint", str(settings.handler_entrypoint))
    return HandlerLoader(LmiHandlerBackend(model_dir, properties))


def create_app(settings: ServerSettings, backend=None) -> Flask:
    backend = backend if backend is not None else make_backend(settings)
    app = Flask("byo_vllm")
    app.extensions["byo_backend"] = backend
    routes.register(app, backend, settings)
    backend.start()
    return app
