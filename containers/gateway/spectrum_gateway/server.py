"""Starting the gateway: check the config, then uvicorn (one process) or gunicorn with
uvicorn workers (``--workers N``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .config import ConfigError, GatewayConfig, load_config

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
GRACEFUL_SHUTDOWN_S = 10


def check_startup(config: GatewayConfig, workers: int) -> None:
    """Refuse set-ups that would serve wrongly rather than fail loudly."""
    if workers < 1:
        raise ConfigError(f"--workers must be 1 or more, got {workers}")
    if workers > 1 and not config.uses_redis:
        raise ConfigError(
            f"--workers {workers} needs a shared store: with 'store: memory' each worker would "
            f"keep its own counters, so every limit would become {workers} times the limit and "
            "a revoked key would keep working on the other workers; set "
            "'store: redis://HOST:PORT/DB' in the config, or run one worker")


def run(config_path: str, host: str, port: int, workers: int, log_level: str = "info") -> None:
    """No access log (the ledger records every request) and no ``server: uvicorn`` header
    (a public endpoint need not name its software)."""
    config = load_config(config_path)
    check_startup(config, workers)
    from .auth import load_secret
    load_secret(config)          # created once here, so the workers share one secret
    os.environ["SPECTRUM_GATEWAY_CONFIG"] = str(Path(config_path).resolve())
    if PACKAGE_PARENT not in sys.path:
        sys.path.insert(0, PACKAGE_PARENT)
    print(f"spectrum gateway on http://{host}:{port} ({workers} worker"
          f"{'s' if workers > 1 else ''}, store {config.store_name})", file=sys.stderr, flush=True)
    if workers == 1:
        import uvicorn
        uvicorn.run("spectrum_gateway.app:create_app", factory=True, host=host, port=port,
                    log_level=log_level, access_log=False, proxy_headers=False,
                    server_header=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    else:
        serve_workers(config, host, port, workers, log_level)


def serve_workers(config: GatewayConfig, host: str, port: int, workers: int,
                  log_level: str) -> None:
    """gunicorn's arbiter forking N uvicorn workers on one socket: it restarts a worker that
    dies or stops answering its heartbeat, and each worker builds its app from the config
    already checked here."""
    from gunicorn.app.base import BaseApplication
    try:                         # uvicorn >= 0.30 moved its gunicorn worker to this package
        from uvicorn_worker import UvicornWorker
    except ImportError:
        from uvicorn.workers import UvicornWorker

    class GatewayWorker(UvicornWorker):
        CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "access_log": False,
                         "proxy_headers": False, "server_header": False,
                         "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S}

    class GatewayWorkers(BaseApplication):
        def load_config(self) -> None:
            for name, value in {
                "bind": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                "workers": workers, "worker_class": GatewayWorker,
                "graceful_timeout": GRACEFUL_SHUTDOWN_S,
                "keepalive": 5,          # uvicorn's own default; gunicorn's is 2 s
                "loglevel": log_level, "accesslog": None, "errorlog": "-",
                "proc_name": "spectrum-gateway",
            }.items():
                self.cfg.set(name, value)

        def load(self):
            from .app import create_app
            return create_app(config)

    GatewayWorkers().run()
