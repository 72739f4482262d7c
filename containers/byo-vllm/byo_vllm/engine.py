"""The engine adapter: one vLLM ``AsyncLLM`` on its own asyncio loop thread.

Request threads (gunicorn's gthread pool) never run coroutines. They submit a request with
one cross-thread call, then wait on a lock that the loop thread releases when this request
has new tokens: once for a whole answer, once for a stream's first output. The rest of a
stream is written by the loop thread itself (``Generation.relay``), straight to the client's
socket, as vLLM's own server writes from its event loop: the request thread sleeps until the
stream ends instead of trading the GIL with the loop thread at every engine step.

Where a request thread does read output by output (``Generation.next``: HTTP/1.0 streams),
outputs that arrive while it is busy writing are merged by vLLM's own collector (DELTA mode)
and it is not signalled at all, and the signals of one engine step are sent together once
the output handler has handed every request its tokens.

A request whose client went away is aborted in the engine (``Generation.abort``), so no
compute keeps running for nobody.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import uuid
from typing import Any

from .config import WORKER_BOOT_ERROR, ConfigError, ServerSettings

log = logging.getLogger("byo_vllm.engine")


class EngineUnavailable(RuntimeError):
    """The engine is still loading or has died: the server answers 503."""


class Generation:
    """One request in the engine, read from a request thread."""

    __slots__ = ("_adapter", "_collector", "_lock", "_wake", "_waiting", "request_id",
                 "prompt_tokens", "submitted_at", "finished")

    def __init__(self, adapter: "EngineAdapter", prompt_tokens: int) -> None:
        self._adapter = adapter
        self._collector = None
        self._lock = threading.Lock()
        # A bare lock as a binary signal, held = "nothing new": releasing it is one C call,
        # where threading.Event.set runs a Condition's Python code on the engine's loop
        # thread for every output (about a fifth of that thread's time under load).
        self._wake = threading.Lock()
        self._wake.acquire()
        # True while the reader found nothing and is (about to be) blocked on _wake; read and
        # written only under _lock, so an output is never missed and a reader that is busy
        # writing is never signalled (its next read finds the merged outputs).
        self._waiting = False
        self.request_id = ""
        self.prompt_tokens = prompt_tokens
        self.submitted_at = time.monotonic()
        self.finished = False

    def _attach(self, collector) -> None:
        """Runs on the loop thread, right after vLLM created this request's collector."""
        put = collector.put
        lock, wake_later = self._lock, self._adapter._wake_later
        release = self._wake.release

        def put_and_wake(output) -> None:
            with lock:               # the collector merges in place: never read it mid-merge
                put(output)
                if not self._waiting:
                    return           # the reader is busy: its next read gets this, merged
                self._waiting = False
            wake_later(release)

        collector.put = put_and_wake
        self._collector = collector
        self.request_id = collector.request_id

    def next(self, timeout_s: float = 5.0):
        """The outputs produced since the last call (merged), blocking until there are some.

        Raises the engine's error if the request failed or the engine died."""
        lock, collector = self._lock, self._collector
        while True:
            with lock:
                output = collector.get_nowait()
                if output is None:
                    self._waiting = True
            if output is not None:
                if output.finished:
                    self.finished = True
                return output
            # Wakes once outputs arrived after the read above (or, after a timeout, at once
            # on a stale signal: then the read finds nothing and waits again).
            if not self._wake.acquire(timeout=timeout_s) and self._adapter.dead_error:
                raise EngineUnavailable(f"the engine died: {self._adapter.dead_error}")

    def relay(self, sock, render) -> None:
        """Hand the rest of this stream to the loop thread: it renders each output with
        ``render(output) -> (bytes, last)`` and writes it to ``sock`` as an HTTP/1.1 chunk,
        the way vLLM's own server writes from its event loop. The calling request thread
        sleeps once for the whole stream instead of waking for every engine step.

        Returns after the last chunk is written. Raises OSError if the client went away,
        EngineUnavailable if the engine died, and whatever ``render`` raised."""
        future = asyncio.run_coroutine_threadsafe(self._relay(sock, render),
                                                  self._adapter._loop)
        while True:
            try:
                return future.result(timeout=5.0)
            except concurrent.futures.TimeoutError:
                if self._adapter.dead_error:
                    future.cancel()
                    raise EngineUnavailable(
                        f"the engine died: {self._adapter.dead_error}") from None

    async def _relay(self, sock, render) -> None:
        loop = asyncio.get_running_loop()
        collector = self._collector
        sock.setblocking(False)        # the loop must never block on a slow client
        try:
            while True:
                output = await collector.get()      # the outputs since the last write, merged
                if output.finished:
                    self.finished = True
                data, last = render(output)
                if data:                            # an empty chunk would end the response
                    await loop.sock_sendall(sock, b"%X\r\n%s\r\n" % (len(data), data))
                if last:
                    return
        finally:
            sock.setblocking(True)     # gunicorn's thread writes the closing chunk

    def abort(self) -> None:
        """Stop generating for this request (the client went away); safe to call twice."""
        if not self.finished and self.request_id:
            self.finished = True
            self._adapter.abort(self.request_id)


class EngineAdapter:
    """Loads the engine in the background and serves requests from any thread."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.state = "loading"            # loading | ready | failed | stopped
        self.failure: str | None = None
        self.engine = None
        self.tokenizer = None
        self.max_model_len = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tokenizer_lock = threading.Lock()
        # Readers to signal once the engine's output handler yields (see _wake_later).
        self._to_wake: list = []
        self._loop_thread_id = 0

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        try:
            loop.run_until_complete(self._load())
        except BaseException as e:   # noqa: BLE001 - a server that cannot load must not linger
            if isinstance(e, ConfigError):
                log.error("%s", e)
            else:
                log.exception("the engine failed to load")
            self._fail(f"{type(e).__name__}: {e}")
            # gunicorn stops the whole server when its worker exits with this code, so the
            # platform sees the failure (and the log says why) instead of a 503 forever.
            os._exit(WORKER_BOOT_ERROR)
        loop.run_forever()

    async def _load(self) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from .engine_args import build_engine_args

        args = build_engine_args(self.settings)
        started = time.monotonic()
        engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
        self.engine = engine
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = engine.model_config.max_model_len
        self.state = "ready"
        log.info("engine ready in %.1f s (max_model_len %d)", time.monotonic() - started,
                 self.max_model_len)

    def _fail(self, why: str) -> None:
        self.failure = why
        self.state = "failed"

    @property
    def dead_error(self) -> str | None:
        """Why the engine cannot serve, once it could (None while healthy or loading)."""
        if self.state == "failed":
            return self.failure
        engine = self.engine
        if engine is not None and engine.errored:
            return str(engine.dead_error)
        return None

    @property
    def ready(self) -> bool:
        return self.state == "ready" and not self.engine.errored

    def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        self.state = "stopped"
        if engine is not None:
            engine.shutdown()
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _wake_later(self, release) -> None:
        """Loop thread: signal a waiting reader after this engine step's outputs are all
        handed over, not in the middle: a reader woken mid-step would contend for the GIL
        with the loop thread while it still processes the other requests' outputs."""
        if threading.get_ident() != self._loop_thread_id:   # not from the output handler
            try:
                release()
            except RuntimeError:
                pass
            return
        if not self._to_wake:
            self._loop.call_soon(self._wake_all)
        self._to_wake.append(release)

    def _wake_all(self) -> None:
        to_wake, self._to_wake = self._to_wake, []
        for release in to_wake:
            try:
                release()
            except RuntimeError:     # a signal from before a timed-out wait is still pending
                pass

    # -- requests ---------------------------------------------------------------------------
    def tokenize_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        with self._tokenizer_lock:      # HF fast tokenizers are not safe to share across threads
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def tokenize(self, prompt: str) -> list[int]:
        with self._tokenizer_lock:
            return list(self.tokenizer.encode(prompt))

    def decode_one(self, token_id: int) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode([token_id])

    def submit(self, prompt_token_ids: list[int], sampling: dict[str, Any],
               stream: bool) -> Generation:
        """Start generating; returns at once. ValueError: the engine rejected the request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not self.ready:
            raise EngineUnavailable(self.dead_error or "the engine is still loading")
        params = SamplingParams(
            **sampling,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
        generation = Generation(self, len(prompt_token_ids))
        request_id = uuid.uuid4().hex

        async def add() -> None:
            collector = await self.engine.add_request(
                request_id, {"prompt_token_ids": prompt_token_ids}, params)
            generation._attach(collector)

        asyncio.run_coroutine_threadsafe(add(), self._loop).result()
        return generation

    def abort(self, request_id: str) -> None:
        engine, loop = self.engine, self._loop
        if engine is not None and loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(engine.abort(request_id, internal=True), loop)
