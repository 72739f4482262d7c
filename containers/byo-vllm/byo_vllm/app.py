"""The ASGI application gunicorn's worker serves: picks the backend, starts loading it in the
background when the server starts (so /ping answers 503 at once), shuts it down when the
server stops, and hands every request to the routes.

Backends: the vLLM engine (``engine.EngineAdapter``), or, for level 4, the user's model.py
served through ``lmi_handler.LmiHandlerBackend`` when ``OPTION_ENTRYPOINT`` names a .py file
or the model folder holds a model.py.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from pathlib import Path

from .config import ConfigError, ServerSettings
from .routes import Routes

log = logging.getLogger("byo_vllm.app")


class HandlerLoader:
    """Runs a handler backend's blocking ``load()`` in a thread."""

    def __init__(self, backend) -> None:
        self.backend = backend

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.backend.load)
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


class App:
    """ASGI: the lifespan starts and stops the backend; requests go to the routes."""

    def __init__(self, settings: ServerSettings, backend) -> None:
        self.settings = settings
        self.backend = backend
        self.routes = Routes(backend, settings)
        self._loading: asyncio.Task | None = None

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http":
            await self.routes(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                loop = asyncio.get_running_loop()
                # Blocking work (a model.py handler's calls, the engine's build) gets a pool
                # of its own size; nothing on the serving path of the engine uses it.
                loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
                    self.settings.threads, thread_name_prefix="byo-blocking"))
                self._loading = loop.create_task(self.backend.start())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.backend.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(settings: ServerSettings, backend=None) -> App:
    return App(settings, backend if backend is not None else make_backend(settings))
