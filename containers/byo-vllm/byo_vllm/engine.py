"""The engine adapter: one vLLM ``AsyncLLM`` on the server's own event loop.

Everything on the serving path runs on that one loop, as in vLLM's own server: the HTTP
protocol, parsing, tokenisation, submission, and each stream's writes. A burst of new
requests is admitted without thread hand-offs, and a slow client costs a socket, not a
thread. The engine is built in a helper thread (building it blocks for the whole load), so
the loop answers ``/ping`` with 503 meanwhile.

The adapter uses only vLLM's public engine API (``AsyncLLM.generate``, ``abort``,
``get_tokenizer``, ``errored``/``dead_error``, ``shutdown``). ``check_vllm`` verifies that
API before loading: a vLLM without it leaves the server up with ``/ping`` answering 503 and
saying why, never serving a silently wrong stream.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator

from .config import WORKER_BOOT_ERROR, ConfigError, ServerSettings

log = logging.getLogger("byo_vllm.engine")

# The vLLM releases this adapter is tested against (the CPU tests and the GPU image's base).
TESTED_VLLM = ("0.32.",)
# What the adapter calls on vLLM, checked at start-up (see check_vllm).
REQUIRED_ENGINE_API = ("from_engine_args", "generate", "abort", "get_tokenizer", "errored",
                       "dead_error", "shutdown")


class EngineUnavailable(RuntimeError):
    """The engine is still loading or has died: the server answers 503."""


def check_vllm() -> str | None:
    """Why this vLLM cannot be driven by the adapter, or None when it can."""
    try:
        import vllm
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        return (f"vLLM's engine API could not be imported ({e}); this server needs vLLM "
                f"{' or '.join(v + 'x' for v in TESTED_VLLM)}")
    version = getattr(vllm, "__version__", "unknown")
    missing = [name for name in REQUIRED_ENGINE_API if not hasattr(AsyncLLM, name)]
    missing += [f"RequestOutputKind.{kind}" for kind in ("DELTA", "FINAL_ONLY")
                if not hasattr(RequestOutputKind, kind)]
    if "output_kind" not in getattr(SamplingParams, "__annotations__", {}) and \
            not hasattr(SamplingParams, "output_kind"):
        missing.append("SamplingParams.output_kind")
    if missing:
        return (f"vLLM {version} lacks what this server calls: {', '.join(missing)}; use vLLM "
                f"{' or '.join(v + 'x' for v in TESTED_VLLM)}")
    if not version.startswith(TESTED_VLLM):
        log.warning("vLLM %s is not a release this server was tested with (%s); its engine "
                    "API checks passed, serving anyway", version, ", ".join(TESTED_VLLM))
    return None


class EngineAdapter:
    """Loads the engine in the background; serves requests on the event loop."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.state = "loading"            # loading | ready | failed | stopped
        self.failure: str | None = None
        self.engine = None
        self.tokenizer = None
        self.max_model_len = 0

    # -- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Loads the engine; returns when it is ready or failed (run it as a task)."""
        loop = asyncio.get_running_loop()
        # Importing vLLM alone takes seconds: off the loop, which keeps answering /ping.
        why = await loop.run_in_executor(None, check_vllm)
        if why is not None:
            log.error("not loading the engine: %s", why)
            self._fail(why)
            return
        try:
            await loop.run_in_executor(None, self._build)
        except BaseException as e:   # noqa: BLE001 - a server that cannot load must not linger
            if isinstance(e, ConfigError):
                log.error("%s", e)
            else:
                log.exception("the engine failed to load")
            self._fail(f"{type(e).__name__}: {e}")
            # gunicorn stops the whole server when its worker exits with this code, so the
            # platform sees the failure (and the log says why) instead of a 503 forever.
            os._exit(WORKER_BOOT_ERROR)
        self.state = "ready"

    def _build(self) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from .engine_args import build_engine_args

        args = build_engine_args(self.settings)
        started = time.monotonic()
        engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
        self.engine = engine
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = engine.model_config.max_model_len
        log.info("engine ready in %.1f s (max_model_len %d)", time.monotonic() - started,
                 self.max_model_len)

    def _fail(self, why: str) -> None:
        self.failure = why
        self.state = "failed"

    @property
    def dead_error(self) -> str | None:
        """Why the engine cannot serve (None while healthy or loading)."""
        if self.state == "failed":
            return self.failure
        engine = self.engine
        if engine is not None and engine.errored:
            return f"the engine died: {engine.dead_error}"
        return None

    @property
    def ready(self) -> bool:
        return self.state == "ready" and not self.engine.errored

    def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        self.state = "stopped"
        if engine is not None:
            engine.shutdown()

    # -- requests ---------------------------------------------------------------------------
    def tokenize_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def tokenize(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt))

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any],
                 stream: bool) -> AsyncIterator:
        """The engine's outputs for one request: every new delta when ``stream``, else one
        final output. Closing the iterator early aborts the request in the engine.

        ValueError: the engine rejected the request (raised on the first ``__anext__``)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not self.ready:
            raise EngineUnavailable(self.dead_error or "the engine is still loading")
        params = SamplingParams(
            **sampling,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
        return self.engine.generate({"prompt_token_ids": prompt_token_ids}, params,
                                    uuid.uuid4().hex)
