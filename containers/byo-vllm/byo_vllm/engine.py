"""The engine adapter: one vLLM ``AsyncLLM`` on the server's own event loop.

Everything on the serving path runs on that one loop, as in vLLM's own server: the HTTP
protocol, parsing, tokenisation, submission, and each stream's writes. A burst of new
requests is admitted without thread hand-offs, and a slow client costs a socket, not a
thread. The engine is built in a helper thread (building it blocks for the whole load), so
the loop answers ``/ping`` with 503 meanwhile.

The adapter uses only vLLM's public engine API (``AsyncLLM.generate``, ``encode`` for a
pooling model's embeddings, ``abort``, ``get_tokenizer``, ``get_supported_tasks``,
``errored``/``dead_error``, ``shutdown``); the OpenAI routes' full vocabulary goes through
vLLM's own serving layer on the same engine (openai_layer.py). ``check_vllm`` verifies both
before loading: a vLLM without it leaves the server up with ``/ping`` answering 503 and
saying why, never serving a silently wrong stream.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator

from options.core.heap import freeze_start_up_heap

from . import metrics
from .config import WORKER_BOOT_ERROR, ConfigError, ServerSettings

log = logging.getLogger("byo_vllm.engine")

# The vLLM releases this adapter is tested against (the CPU tests and the GPU image's base).
TESTED_VLLM = ("0.32.",)
# What the adapter calls on vLLM, checked at start-up (see check_vllm).
REQUIRED_ENGINE_API = ("from_engine_args", "generate", "encode", "abort", "get_tokenizer",
                       "get_supported_tasks", "errored", "dead_error", "shutdown", "add_lora",
                       "remove_lora", "list_loras", "pin_lora")


class EngineUnavailable(RuntimeError):
    """The engine is still loading or has died: the server answers 503."""


def check_vllm() -> str | None:
    """Why this vLLM cannot be driven by the adapter, or None when it can."""
    try:
        import vllm
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.lora.request import LoRARequest  # noqa: F401 - adapters.py builds these
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
    try:   # openai_layer.py builds vLLM's OpenAI serving layer with these
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state  # noqa: F401
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: F401
    except ImportError as e:
        missing.append(f"its OpenAI serving layer ({e})")
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
        self.max_num_seqs = 0            # the scheduler's limits, said on /v1/models so a
        self.max_num_batched_tokens = 0  # capacity bench of a --url server reads, not assumes, them
        self.adapters = None              # adapters.AdapterRegistry when LoRA is on
        self.serve_args = None            # vllm serve's parsed arguments (engine_args.py)
        self.openai = None                # openai_layer.OpenAILayer once the engine is built
        self._zero_adapter = False
        # What the engine turned out to be, once built (the settings may leave it to vLLM).
        self.runner = ""                  # "generate" | "pooling"
        self.tasks: tuple[str, ...] = ()  # vLLM's supported tasks: ("generate",), ("embed", ...)
        self.scheduling_policy = ""       # "fcfs" | "priority"
        self.prefix_caching = False
        self.matryoshka = False           # the model's embeddings can be shortened (dimensions)
        self.vocab_size = 0
        # The exceptions by which vLLM refuses a request (the client's fault: a 400).
        self.client_errors: tuple[type[BaseException], ...] = (ValueError,)

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
        self.tasks = tuple(await self.engine.get_supported_tasks())
        self._describe_engine()
        from .openai_layer import OpenAILayer
        try:
            self.openai = await OpenAILayer.build(self.engine, self.serve_args, self.tasks)
        except Exception as e:  # noqa: BLE001 - the OpenAI routes are part of serving
            log.exception("vLLM's OpenAI serving layer could not be set up")
            self._fail(f"vLLM's OpenAI serving layer could not be set up: "
                       f"{type(e).__name__}: {e}")
            os._exit(WORKER_BOOT_ERROR)
        if self.engine.vllm_config.lora_config is not None:
            try:
                await self._start_adapters()
            except Exception as e:  # noqa: BLE001 - the base adapter is part of serving
                log.exception("LoRA adapters could not be set up")
                self._fail(f"LoRA adapters could not be set up: {type(e).__name__}: {e}")
                os._exit(WORKER_BOOT_ERROR)
        freeze_start_up_heap(log)
        self.state = "ready"

    def _build(self) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from vllm.engine.arg_utils import AsyncEngineArgs

        from .engine_args import parse_serve_args

        self.serve_args = parse_serve_args(self.settings)
        args = AsyncEngineArgs.from_cli_args(self.serve_args)
        if args.enable_lora:
            self._reserve_lora_slots(args)
        started = time.monotonic()
        engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
        from vllm.exceptions import VLLMClientError

        self.engine = engine
        self.tokenizer = engine.get_tokenizer()
        config = engine.vllm_config
        self.max_model_len = config.model_config.max_model_len
        self.max_num_seqs = config.scheduler_config.max_num_seqs
        self.max_num_batched_tokens = config.scheduler_config.max_num_batched_tokens
        self.runner = config.model_config.runner_type
        self.scheduling_policy = str(config.scheduler_config.policy)
        self.prefix_caching = bool(config.cache_config.enable_prefix_caching)
        self.matryoshka = bool(getattr(config.model_config, "is_matryoshka", False))
        self.vocab_size = config.model_config.get_vocab_size()
        self.client_errors = (ValueError, VLLMClientError)
        log.info("engine built in %.1f s", time.monotonic() - started)

    def _describe_engine(self) -> None:
        """The one log line (and /metrics gauge) saying what the engine runs as."""
        prefix = "on" if self.prefix_caching else "off"
        log.info("engine ready: max_model_len %d, runner %s (tasks %s), scheduling policy %s, "
                 "prefix caching %s (%s)", self.max_model_len, self.runner,
                 ", ".join(self.tasks), self.scheduling_policy, prefix,
                 self.settings.prefix_caching_said())
        metrics.ENGINE_INFO.labels(self.runner, self.scheduling_policy, prefix).set(1)

    def _reserve_lora_slots(self, args) -> None:
        """Sizes the engine's adapter slots for adapters.py: one more in its adapter cache
        than asked (a new adapter is loaded before another is evicted), one more for the
        all-zero adapter where base-model requests carry it, and a GPU slot for every cached
        adapter. With fewer GPU slots than cached adapters, vLLM 0.32 swaps adapters in and
        out of the slots as batches change, and under a mix of more adapters than slots that
        left a running request's adapter out of its slots: the engine died (KeyError in
        punica_wrapper convert_mapping). Here an adapter keeps its slot while it is loaded."""
        from vllm.platforms import current_platform

        choice = self.settings.base_zero_adapter
        # vLLM's CPU LoRA ops (torch_ops) read slot -1 for a row without an adapter, which is
        # the last adapter's; its Triton (GPU) kernels skip such rows.
        self._zero_adapter = choice == "true" or (choice == "auto" and current_platform.is_cpu())
        cached = args.max_cpu_loras or args.max_loras
        args.max_cpu_loras = cached + 1 + int(self._zero_adapter)
        args.max_loras = args.max_cpu_loras

    async def _start_adapters(self) -> None:
        import tempfile
        from pathlib import Path

        from .adapters import AdapterRegistry, AllowedSources, LoraLimits, base_model_modules

        lora = self.engine.vllm_config.lora_config
        zero = int(self._zero_adapter)
        model_dir = Path(self.settings.model) if Path(self.settings.model).is_dir() else None
        weights_dir = model_dir or await asyncio.to_thread(_hub_snapshot, self.settings.model)
        base = await asyncio.to_thread(base_model_modules, weights_dir)
        if base is None:
            log.warning("the base model's safetensors were not found: adapters' target "
                        "modules and shapes are not checked before loading")
        store = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="byo-adapters-"))
        registry = AdapterRegistry(
            self.engine,
            LoraLimits(gpu_slots=lora.max_loras - 1 - zero,
                       cpu_slots=lora.max_cpu_loras - 1 - zero, max_rank=lora.max_lora_rank),
            AllowedSources.build(model_dir, self.settings.adapter_sources
                                 + ((self.settings.adapters_dir,) if self.settings.adapters_dir
                                    else ())), store,
            base_names=(self.settings.served_model_name, self.settings.model),
            base_modules=base, zero_adapter=self._zero_adapter)
        await registry.start(model_dir, Path(self.settings.adapters_dir)
                             if self.settings.adapters_dir else None)
        self.adapters = registry

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
        if self.adapters is not None:
            import shutil
            shutil.rmtree(self.adapters.store, ignore_errors=True)

    # -- requests ---------------------------------------------------------------------------
    def tokenize_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def tokenize(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt))

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    @property
    def embeds(self) -> bool:
        """The engine answers embeddings (a pooling model with vLLM's embed task)."""
        return "embed" in self.tasks

    def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any],
                 stream: bool, lora_request=None, priority: int = 0) -> AsyncIterator:
        """The engine's outputs for one request: every new delta when ``stream``, else one
        final output. Closing the iterator early aborts the request in the engine.
        ``lora_request``: the adapter, from ``adapters.AdapterRegistry.acquire``;
        ``priority``: vLLM's (lower runs earlier; only the priority policy reads it).

        ``client_errors``: the engine rejected the request (raised on the first
        ``__anext__``)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not self.ready:
            raise EngineUnavailable(self.dead_error or "the engine is still loading")
        params = SamplingParams(
            **sampling,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
        return self.engine.generate({"prompt_token_ids": prompt_token_ids}, params,
                                    uuid.uuid4().hex, lora_request=lora_request,
                                    priority=priority)

    async def embed(self, prompt_token_ids: list[int], dimensions: int | None = None,
                    priority: int = 0) -> list[float]:
        """One input's embedding (vLLM's embed task). ``client_errors``: the engine rejected
        the request; RuntimeError: it failed it."""
        from vllm import PoolingParams

        if not self.ready:
            raise EngineUnavailable(self.dead_error or "the engine is still loading")
        final = None
        async for final in self.engine.encode(
                {"prompt_token_ids": prompt_token_ids},
                PoolingParams(task="embed", dimensions=dimensions), uuid.uuid4().hex,
                priority=priority):
            pass
        if final is None or getattr(final, "error", None) is not None:
            raise RuntimeError(f"the engine returned no embedding: "
                               f"{getattr(final, 'error', None) or 'no output'}")
        return final.outputs.data.float().tolist()


def _hub_snapshot(model: str):
    """The local folder of a hub model vLLM has downloaded (None if there is none)."""
    try:
        from pathlib import Path

        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - only a missing check follows
        return None
