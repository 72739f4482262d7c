"""The process around the routes: gunicorn's arbiter with one worker (one engine, one model
copy), and in that worker one asyncio loop serving HTTP with uvicorn's protocol, as vLLM's own
server does. All knowledge of gunicorn and uvicorn lives here.

- The arbiter binds the port before the worker imports anything heavy, so connections are
  accepted at once and /ping answers 503 while the engine loads.
- SIGTERM (SageMaker sends SIGKILL 30 s later): the listening socket closes, requests in
  flight finish (streams included), the engine shuts down, the process exits 0.
- Slow clients cost a socket, never a thread: reading is asynchronous, and a client that
  has not sent a request's headers within ``read_timeout_s`` is dropped (nginx's
  client_header_timeout; the body has its own timeout in ``asgi.Request.body``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

from gunicorn.app.base import BaseApplication
from gunicorn.workers.base import Worker

from .config import WORKER_BOOT_ERROR, ServerSettings

log = logging.getLogger("byo_vllm.server")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _protocol_with_header_timeout(timeout_s: float):
    """uvicorn's httptools protocol, plus a deadline for each request's headers. It hooks
    only httptools' parser callbacks and asyncio's protocol methods; where those are not
    what this expects, the plain protocol serves (and the log says so)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    hooks = ("connection_made", "connection_lost", "on_message_begin", "on_headers_complete")
    if not all(callable(getattr(HttpToolsProtocol, name, None)) for name in hooks):
        log.warning("uvicorn's HttpToolsProtocol lacks %s: serving without a header timeout",
                    ", ".join(hooks))
        return HttpToolsProtocol

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_deadline = None

        def _arm(self) -> None:
            if self._header_deadline is None:
                self._header_deadline = asyncio.get_running_loop().call_later(
                    timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()                  # a new connection owes us a request

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()                  # a kept-alive connection started its next request

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return HeaderTimeoutProtocol


class EngineWorker(Worker):
    """A gunicorn worker that runs the ASGI app on one asyncio loop with uvicorn. gunicorn's
    signal handlers stay installed; while the loop serves, uvicorn's take SIGTERM and SIGINT
    for a graceful shutdown."""

    def run(self) -> None:
        import uvicorn

        settings: ServerSettings = self.app.settings
        config = uvicorn.Config(
            self.wsgi, lifespan="on", log_config=None, access_log=False,
            http=_protocol_with_header_timeout(settings.read_timeout_s),
            # Longer than SageMaker's idle connection reuse.
            timeout_keep_alive=75,
            # The arbiter kills a worker that stays silent for gunicorn's timeout.
            timeout_notify=self.timeout, callback_notify=self._notify,
            timeout_graceful_shutdown=settings.graceful_timeout_s)
        server = uvicorn.Server(config)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(server.serve(sockets=self.sockets))
        if not server.started:
            sys.exit(WORKER_BOOT_ERROR)     # gunicorn stops the server: it cannot serve

    async def _notify(self) -> None:
        self.notify()


def _loop_factory():
    """uvloop where installed (as under vLLM's own server), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class ServerApplication(BaseApplication):
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        options = {
            "bind": f"{s.host}:{s.port}",
            "workers": 1,                       # one engine, one model copy
            "worker_class": f"{__name__}.EngineWorker",
            # The worker's heartbeat runs on its loop between requests: a long generation
            # never trips it; only a stuck loop does.
            "timeout": 120,
            "graceful_timeout": s.graceful_timeout_s + 2,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": "byo-vllm",
        }
        if os.path.isdir("/dev/shm"):
            options["worker_tmp_dir"] = "/dev/shm"   # heartbeat file off slow disks
        for key, value in options.items():
            self.cfg.set(key, value)

    def load(self):
        from .app import create_app
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        return create_app(self.settings)


def run(settings: ServerSettings) -> None:
    """Serve until SIGTERM; exits the process with gunicorn's status."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    log.info("effective configuration: %s", json.dumps(settings.describe(), sort_keys=True))
    ServerApplication(settings).run()
