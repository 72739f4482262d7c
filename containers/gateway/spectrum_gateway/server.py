"""Starting the gateway: check the config, then uvicorn (one process, or N workers)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .config import ConfigError, GatewayConfig, load_config

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


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
    import uvicorn
    config = load_config(config_path)
    check_startup(config, workers)
    from .auth import load_secret
    load_secret(config)          # created once here, so the workers share one secret
    os.environ["SPECTRUM_GATEWAY_CONFIG"] = str(Path(config_path).resolve())
    # The workers are fresh interpreters: they find this package through PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)
    if PACKAGE_PARENT not in sys.path:
        sys.path.insert(0, PACKAGE_PARENT)
    print(f"spectrum gateway on http://{host}:{port} ({workers} worker"
          f"{'s' if workers > 1 else ''}, store {config.store})", file=sys.stderr, flush=True)
    uvicorn.run("spectrum_gateway.app:create_app", factory=True, host=host, port=port,
                workers=workers if workers > 1 else None, log_level=log_level,
                access_log=False, timeout_graceful_shutdown=10)
