"""The bring-your-own server as a Ray Serve application: rung 6 on Ray.

One engine, one vocabulary, two ways to host it. The same ``App`` that gunicorn's worker
serves (``app.create_app``: the same settings, routes and dialects) runs inside a Serve
replica; Serve places, scales, health-checks and replaces the replicas instead of gunicorn
and the HPA.

    ingress (light, CPU only)  ──DeploymentHandle, streamed──▶  engine (App + vLLM AsyncLLM)
    HTTP in, body read once,      one ASGI message per item       the byo routes answer: the
    relayed message by message                                      OpenAI routes, /invocations
                                                                    in each dialect, /ping, ...

- ``EngineServer`` holds the App. Its constructor runs the App's lifespan startup (the engine
  loads in the replica) and returns once the engine is ready, so Serve sends a replica no
  request before it can answer; ``check_health`` fails when the engine has died, and Serve
  replaces the replica. Serve drains a stopping replica (streams in flight finish, up to
  ``graceful_shutdown_timeout_s``) and then calls ``__del__``, which runs the lifespan
  shutdown once (Serve and the garbage collector may both call it).
- ``Ingress`` reads each request's body and hands ``(scope, body)`` to an engine replica; the
  engine's ASGI messages come back as a stream and are sent on as they come. A replica that
  dies before answering gives a 503; one that dies mid-stream ends the stream with the byo
  server's in-band error event, so a client sees an error, never a hang.
- Adapters (LoRA on in the settings) go through Serve's multiplexing: the ingress names each
  request's adapter as its multiplexed model id (the ``serve_multiplexed_model_id`` header, or
  the route's own choice: the OpenAI ``model`` field, SageMaker's TargetModel header,
  ``/models/<name>/invoke``), so Serve routes it to a replica that holds the adapter; the
  engine replica's ``@serve.multiplexed(max_num_models_per_replica=N)`` loader loads it into
  the engine's adapter registry (its single-flight loads, pinning and guarded sources), and
  Serve's LRU evicts through the registry too, so ``/metrics`` counts both
  (``byo_adapter_loads``, ``byo_adapter_evictions``). The adapters are the application's
  (its adapters folder): ``POST /models`` and ``DELETE /models/<name>``, which would change one
  replica's registry of many, get a 400 saying so (``replica_local_change``).
- ``build_app(args)`` is the builder a serve config names
  (``import_path: byo_vllm.ray_serve:build_app``); ``args`` are checked here, each problem
  named with the value and what would be right.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ray import serve
from ray.serve.handle import DeploymentHandle

from .asgi import SSE_HEADERS, respond_error
from .config import MAX_BODY_BYTES, ConfigError, ServerSettings, settings_from_env
from .dialects import BadRequest, dumps_compact
from .routes import TARGET_MODEL

log = logging.getLogger("byo_vllm.ray_serve")

ENGINE_DEPLOYMENT = "engine"
INGRESS_DEPLOYMENT = "ingress"
IMPORT_PATH = f"{__name__}:build_app"
# Requests one engine replica has in flight before Serve adds another, and the most it takes.
TARGET_ONGOING_REQUESTS = 64
MAX_ONGOING_REQUESTS = 128
# A stream's tokens after its first are relayed at most this often, each time all that came
# since in one item: every item through the DeploymentHandle and the proxy costs ~1-3 ms of
# CPU across the proxy, ingress and engine replica (measured: options.bench --level 6), while
# the tiny model makes a token a millisecond. vLLM's stream_interval does the same in tokens.
# The first token is never held.
STREAM_FLUSH_S = 0.02
# How long a request whose client went away may take to stop on its own before it is cancelled.
DISCONNECT_GRACE_S = 2.0
# Each answer says which engine replica gave it (Serve's replica id).
REPLICA_HEADER = b"x-spectrum-replica"
# The ingress only relays bytes: it takes many requests per replica.
INGRESS_MAX_ONGOING_REQUESTS = 1024
# Serve's header naming a request's multiplexed model (the proxy also accepts '-' for '_').
MULTIPLEXED_HEADER = "serve_multiplexed_model_id"
# Routes whose JSON body may name the adapter in "model".
_MODEL_ROUTES = ("/invocations", "/v1/completions", "/v1/chat/completions")
_INVOKE_PATH = re.compile(r"^/models/(?P<name>[^/]+)/invoke$")
# Settings that are process environment for vLLM or the hub client rather than server settings.
_PROCESS_ENV = re.compile(r"^(VLLM_|HF_|HUGGING_FACE_|OMP_|TRANSFORMERS_)")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
ARGS = {
    "model": "the model: a hub id, or a folder every Ray node can read",
    "settings": "the server's environment: SM_VLLM_*, OPTION_*, SPECTRUM_SERVER_*, VLLM_* "
                "(names to strings)",
    "autoscaling_config": "Serve's autoscaling of the engine replicas (min_replicas, "
                          "max_replicas, target_ongoing_requests, upscale_delay_s, ...)",
    "num_replicas": "a fixed number of engine replicas (instead of autoscaling_config)",
    "engine_num_cpus": "CPUs Ray reserves for each engine replica",
    "engine_num_gpus": "GPUs Ray gives each engine replica (tensor x pipeline parallel)",
    "max_ongoing_requests": "the most requests one engine replica takes at once",
    "ingress_replicas": "replicas of the light ingress deployment; 0: the engine deployment "
                        "takes HTTP itself (one hop less; no LoRA)",
    "max_adapters_per_replica": "LoRA adapters one engine replica holds at once (Serve's "
                                "max_num_models_per_replica; needs SM_VLLM_ENABLE_LORA; "
                                "default: SM_VLLM_MAX_CPU_LORAS)",
}
_CPU_LORAS = ("SM_VLLM_MAX_CPU_LORAS", "OPTION_MAX_CPU_LORAS")


@dataclass(frozen=True)
class RayAppArgs:
    """``build_app``'s arguments, checked."""
    model: str
    settings: dict[str, str] = field(default_factory=dict)
    autoscaling_config: dict[str, Any] | None = None
    num_replicas: int | None = None
    engine_num_cpus: float = 1.0
    engine_num_gpus: float = 0.0
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS
    ingress_replicas: int = 1
    max_adapters_per_replica: int | None = None

    def server_env(self) -> dict[str, str]:
        """The environment ``settings_from_env`` reads in each engine replica: the engine's
        adapter cache holds what Serve's multiplexing keeps, unless the settings size it."""
        env = {"HF_MODEL_ID": self.model, **self.settings}
        if self.max_adapters_per_replica and not any(k in env for k in _CPU_LORAS):
            env["SM_VLLM_MAX_CPU_LORAS"] = str(self.max_adapters_per_replica)
        return env

    def process_env(self) -> dict[str, str]:
        """Settings the engine's processes read from their environment (VLLM_*, HF_*)."""
        return {k: v for k, v in self.settings.items()
                if _PROCESS_ENV.match(k) and k != "HF_MODEL_ID"}


def parse_args(args: dict[str, Any] | None) -> tuple[RayAppArgs, ServerSettings]:
    """Checks a serve config's ``args``; ConfigError naming every problem."""
    args = dict(args or {})
    problems: list[str] = []
    for key in sorted(set(args) - set(ARGS)):
        problems.append(f"{key!r} is not an argument of {IMPORT_PATH}: use "
                        + "; ".join(f"{k} ({why})" for k, why in ARGS.items()))
    model = args.get("model")
    if not isinstance(model, str) or not model.strip():
        problems.append(f"model {model!r} must name the model: a hub id such as "
                        "Qwen/Qwen2.5-7B-Instruct, or a folder every Ray node can read")
        model = ""
    settings = args.get("settings") or {}
    if not isinstance(settings, dict):
        problems.append(f"settings {settings!r} must map environment names to strings, e.g. "
                        "{SM_VLLM_MAX_MODEL_LEN: '4096'}")
        settings = {}
    for key, value in settings.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            problems.append(f"settings: {key!r} is not an environment name (A-Z, 0-9, _)")
        elif not isinstance(value, str):
            problems.append(f"settings: {key}={value!r} must be a string, as in the "
                            f"environment: {key}: '{value}'")
    autoscaling = args.get("autoscaling_config")
    replicas = args.get("num_replicas")
    if autoscaling is not None and replicas is not None:
        problems.append(f"num_replicas {replicas!r} and autoscaling_config both size the "
                        "engine: give one")
    if autoscaling is not None:
        problems += _autoscaling_problems(autoscaling)
    numbers = {"num_replicas": (replicas, int, 1), "ingress_replicas":
               (args.get("ingress_replicas", 1), int, 0),
               "max_ongoing_requests": (args.get("max_ongoing_requests", MAX_ONGOING_REQUESTS),
                                        int, 1),
               "engine_num_cpus": (args.get("engine_num_cpus", 1.0), (int, float), 0),
               "engine_num_gpus": (args.get("engine_num_gpus", 0.0), (int, float), 0),
               "max_adapters_per_replica": (args.get("max_adapters_per_replica"), int, 1)}
    for key, (value, kind, low) in numbers.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind) or value < low:
            what = "a whole number" if kind is int else "a number"
            problems.append(f"{key} {value!r} must be {what} >= {low}")
    settings = {k: v for k, v in settings.items() if isinstance(k, str) and isinstance(v, str)}
    parsed = RayAppArgs(
        model=model.strip(), settings=settings, autoscaling_config=autoscaling,
        num_replicas=replicas, engine_num_cpus=float(args.get("engine_num_cpus", 1.0) or 0),
        engine_num_gpus=float(args.get("engine_num_gpus", 0.0) or 0),
        max_ongoing_requests=args.get("max_ongoing_requests", MAX_ONGOING_REQUESTS),
        ingress_replicas=args.get("ingress_replicas", 1),
        max_adapters_per_replica=args.get("max_adapters_per_replica"))
    server = None
    if model and not problems:
        try:
            server = settings_from_env(parsed.server_env())
        except ConfigError as e:
            problems.append(str(e))
        else:
            problems += _adapter_problems(parsed, server)
    if problems:
        raise ConfigError(f"{IMPORT_PATH} cannot build the application from these args:\n  - "
                          + "\n  - ".join(problems))
    return parsed, server


def lora_enabled(server: ServerSettings) -> bool:
    """Whether the settings turn LoRA on (SM_VLLM_ENABLE_LORA / OPTION_ENABLE_LORA; an empty
    value is the bare flag)."""
    arg = server.engine_args.get("enable_lora")
    return arg is not None and str(arg.value).strip().lower() not in ("false", "0", "no")


def _adapter_problems(parsed: RayAppArgs, server: ServerSettings) -> list[str]:
    if parsed.ingress_replicas == 0 and lora_enabled(server):
        return ["ingress_replicas 0 (the engine deployment as the ingress) with LoRA on: the "
                "ingress is what names each request's adapter (the body's model, SageMaker's "
                "TargetModel) for Serve's multiplexing; keep ingress_replicas >= 1, or turn "
                "SM_VLLM_ENABLE_LORA off"]
    wanted = parsed.max_adapters_per_replica
    if wanted is None:
        return []
    if not lora_enabled(server):
        return [f"max_adapters_per_replica {wanted} needs LoRA on: add SM_VLLM_ENABLE_LORA: "
                "'true' to settings (with SPECTRUM_SERVER_ADAPTERS_DIR naming the adapters' "
                "folder), or drop max_adapters_per_replica"]
    cached = server.engine_args.get("max_cpu_loras")
    if cached is not None and str(cached.value).isdigit() and int(cached.value) < wanted:
        return [f"max_adapters_per_replica {wanted} is above {cached.source}={cached.value}, "
                "the adapters the engine caches: Serve would keep adapters the engine has "
                f"already evicted; raise {cached.source} to at least {wanted} or lower "
                "max_adapters_per_replica"]
    return []


def _autoscaling_problems(config: Any) -> list[str]:
    from ray.serve.config import AutoscalingConfig

    if not isinstance(config, dict):
        return [f"autoscaling_config {config!r} must be a mapping, e.g. {{min_replicas: 1, "
                "max_replicas: 4, target_ongoing_requests: 64}"]
    try:
        AutoscalingConfig(**config)
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError names the field
        return [f"autoscaling_config {config!r} is not valid for Ray Serve: "
                + " ".join(str(e).split())]
    return []


# ----------------------------------------------------------------------------------- engine

class _Lifespan:
    """Drives an ASGI app's lifespan protocol, as a server does around it."""

    def __init__(self, app) -> None:
        self.app = app
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._stopped = False

    async def startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        self._task = asyncio.ensure_future(self.app(scope, self._inbox.get, self._outbox.put))
        await self._inbox.put({"type": "lifespan.startup"})
        answer = await self._outbox.get()
        if answer["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the server's lifespan startup failed: {answer}")

    async def shutdown(self) -> None:
        """Runs the lifespan shutdown once, however often it is called."""
        if self._stopped or self._task is None:
            return
        self._stopped = True
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._outbox.get()
        await self._task


class EngineServer:
    """One engine replica: the byo server's App, its engine started in this replica."""

    async def __init__(self, server_env: dict[str, str],
                       max_adapters: int | None = None) -> None:
        from .app import create_app

        self.settings = settings_from_env(server_env)
        self.byo_app = create_app(self.settings)
        self.lifespan = _Lifespan(self.byo_app)
        await self.lifespan.startup()             # the engine loads in the background
        backend = self.byo_app.backend
        while not backend.ready:                  # Serve routes nothing here before ready
            why = _unavailable(backend)
            if why is not None:
                raise RuntimeError(f"the engine could not start: {why}")
            await asyncio.sleep(0.2)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._replica_header = (REPLICA_HEADER, self.replica.encode())
        self._load_adapter = None
        registry = getattr(backend, "adapters", None)
        if registry is not None:
            # Serve's LRU of adapters per replica, made here because its size is an argument.
            loop = asyncio.get_running_loop()

            async def load_adapter(name: str) -> ServedAdapter:
                (await registry.acquire(name)).release()
                return ServedAdapter(registry, name, loop)

            size = max_adapters or registry.limits.cpu_slots
            self._load_adapter = serve.multiplexed(max_num_models_per_replica=size)(load_adapter)
            log.info("adapters multiplexed: %d per replica", size)
        log.info("engine replica %s ready: %s", self.replica, self.settings.served_model_name)

    def check_health(self) -> None:
        """Serve's health check: the engine is up, or the replica is replaced."""
        backend = self.byo_app.backend
        if not backend.ready:
            raise RuntimeError(_unavailable(backend) or "the engine is not ready")

    async def http(self, scope: dict[str, Any], body: bytes) -> AsyncIterator[dict[str, Any]]:
        """One HTTP request through the App: its ASGI messages in lists, the first token's at
        once and the rest every ``STREAM_FLUSH_S`` (all that came since, joined). Closing
        the stream (the client went away) tells the App the client disconnected and stops
        it, which aborts the request in the engine. The request's multiplexed model id (the
        ingress sets it) names its adapter: loaded through Serve's multiplexing first."""
        refused = replica_local_change(scope)
        if refused is not None:
            yield self._tagged(await _error_messages(refused))
            return
        adapter = serve.get_multiplexed_model_id()
        if adapter and self._load_adapter is not None:
            try:
                await self._load_adapter(adapter)
            except BadRequest as e:               # unknown, or its files refused: the App's answer
                yield self._tagged(await _error_messages(e))
                return
        messages: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        task = asyncio.ensure_future(self.byo_app(scope, receive, messages.put))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        loop = asyncio.get_running_loop()
        answering, last_sent = False, 0.0
        try:
            while (first := await messages.get()) is not None:
                if answering:        # tokens after the first wait for the next flush
                    await asyncio.sleep(STREAM_FLUSH_S - (loop.time() - last_sent))
                batch = self._tagged(_drained(first, messages))
                answering = answering or any(message.get("body") for message in batch)
                yield batch
                last_sent = loop.time()
            task.result()
        finally:
            gone.set()
            if not task.done():
                # The App reads the disconnect and stops the request in the engine itself, as
                # on the plain server (and counts it: byo_requests_aborted); cancelled only if
                # it does not end within DISCONNECT_GRACE_S.
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(task), DISCONNECT_GRACE_S)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _tagged(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``batch`` with the replica's header added to its response start (which replica answered)."""
        for message in batch:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self._replica_header]
        return batch

    async def __del__(self) -> None:
        lifespan = getattr(self, "lifespan", None)
        if lifespan is not None:
            await lifespan.shutdown()


class EngineIngress(EngineServer):
    """``ingress_replicas: 0``: the engine deployment takes HTTP from Serve's proxy itself, one
    streamed hop (proxy → engine replica) instead of two (proxy → ingress → engine). The same
    answers, paced the same way (``http``); without the ingress, adapters cannot be chosen by
    the body's ``model``, so LoRA needs the ingress (``parse_args`` says so), and a replica that
    dies before answering is Serve's proxy's 500 rather than the ingress's 503."""

    def __serve_build_asgi_app__(self) -> "EngineAsgi":
        return EngineAsgi(self)


class EngineAsgi:
    """ASGI (an object, not a bound method: uvicorn's lifespan, which Serve runs, would take a
    method for ASGI2): HTTP from Serve's proxy answered by this replica's ``http``."""

    def __init__(self, server: EngineIngress) -> None:
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        body = await _http_body(scope, receive, send, self.server.lifespan.shutdown)
        if body is None:
            return
        answer = self.server.http(forwarded_scope(scope), body)
        try:
            async for batch in answer:
                for message in batch:
                    await send(message)
        finally:
            await answer.aclose()                  # a client gone: the engine aborts the request


class ServedAdapter:
    """An adapter in one replica's multiplexing cache: loaded in the engine's registry while
    Serve keeps it. Serve's LRU calls ``__del__`` (in a thread) when it drops the adapter, then
    the garbage collector calls it again: the eviction runs once, on the replica's loop, and
    is done before Serve loads the next adapter."""

    def __init__(self, registry, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.registry, self.name, self._loop = registry, name, loop
        self._evicted = False

    def __del__(self) -> None:
        if getattr(self, "_evicted", True):
            return
        self._evicted = True
        if self._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:                 # collected on the loop: it cannot wait here
            self._loop.create_task(self._evict())
            return
        asyncio.run_coroutine_threadsafe(self._evict(), self._loop).result()

    async def _evict(self) -> None:
        try:
            await self.registry.evict(self.name)
        except Exception as e:  # noqa: BLE001 - the engine stopped first: nothing to free
            log.warning("adapter %s not evicted: %s: %s", self.name, type(e).__name__, e)


def replica_local_change(scope: dict[str, Any]) -> BadRequest | None:
    """A 400 for the routes that change the adapter registry (SageMaker's multi-model contract:
    ``POST /models``, ``DELETE /models/<name>``). Under Serve such a request reaches one engine
    replica of many: the others, and every replica started later, would not know of the change,
    so the answer would depend on where Serve routed each later request."""
    method, path = scope.get("method"), scope.get("path") or ""
    if not ((method == "POST" and path.rstrip("/") == "/models")
            or (method == "DELETE" and path.startswith("/models/") and path.count("/") == 2)):
        return None
    return BadRequest(
        f"{method} {path} would change the adapters of one engine replica of many on Ray Serve, "
        "and the others would not know: here adapters come from the application's adapters "
        "folder (SPECTRUM_SERVER_ADAPTERS_DIR in the serve config's settings, filled from "
        "`options.deploy --adapter NAME=SOURCE`), and each replica loads them as requests ask "
        "through Serve's multiplexing. To add or remove one, redeploy with the adapters changed; "
        "GET /models lists them", "path")


def _drained(first: dict[str, Any], queue: asyncio.Queue) -> list[dict[str, Any]]:
    """``first`` and every message queued behind it, consecutive body parts joined: one item
    through the DeploymentHandle instead of one per token. The end of the stream (None) stays
    in the queue for the next ``get``."""
    batch = [first]
    while not queue.empty():
        message = queue.get_nowait()
        if message is None:
            queue.put_nowait(None)          # seen again by the next get: the stream's end
            break
        last = batch[-1]
        if (message["type"] == last["type"] == "http.response.body"
                and last.get("more_body", False)):
            batch[-1] = {"type": "http.response.body", "body": last["body"] + message["body"],
                         "more_body": message.get("more_body", False)}
        else:
            batch.append(message)
    return batch


async def _error_messages(error: BadRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def collect(message: dict[str, Any]) -> None:
        messages.append(message)
    await respond_error(collect, error)
    return messages


def _unavailable(backend) -> str | None:
    return getattr(backend, "dead_error", None) or getattr(backend, "failed", None)


# ----------------------------------------------------------------------------------- ingress

class Ingress:
    """The light front deployment: its ASGI app relays each request to an engine replica."""

    def __init__(self, engine: DeploymentHandle, base_names: list[str] | None = None) -> None:
        self.engine = engine
        self.base_names = base_names

    def __serve_build_asgi_app__(self) -> "Relay":
        return Relay(self.engine, self.base_names)


class Relay:
    """ASGI: HTTP in, the request handed to an engine replica, its answer sent on.
    ``base_names``: the base model's names when the engine serves adapters (None: it does
    not, and no request is multiplexed)."""

    def __init__(self, engine: DeploymentHandle, base_names: list[str] | None = None) -> None:
        self.engine = engine
        self.base_names = set(base_names) if base_names is not None else None

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        body = await _http_body(scope, receive, send)
        if body is None:
            return
        forwarded = forwarded_scope(scope)
        adapter = ""
        if self.base_names is not None:
            try:
                adapter, forwarded, body = choose_adapter(forwarded, body, self.base_names)
            except BadRequest as e:
                await respond_error(send, e)
                return
        handle = self.engine.options(stream=True, multiplexed_model_id=adapter)
        response = handle.http.remote(forwarded, body)
        started: dict[str, Any] | None = None
        finished = False
        try:
            async for batch in response:            # a list of messages (EngineServer.http)
                for message in batch:
                    if message["type"] == "http.response.start":
                        started = message
                    await send(message)
            finished = True
        except Exception as e:  # noqa: BLE001 - the replica died or failed the request
            finished = True
            await _replica_failed(send, started, e)
        finally:
            if not finished:
                response.cancel()                  # the client went away: stop the engine


async def _http_body(scope: dict[str, Any], receive, send, on_shutdown=None) -> bytes | None:
    """What both ASGI fronts do first: an HTTP request's body (None when there is no request
    to answer). Serve's lifespan messages are answered complete (the engine starts in the
    replica's constructor), ``on_shutdown`` run before the shutdown's."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and on_shutdown is not None:
                await on_shutdown()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return None
    if scope["type"] != "http":
        return None
    return await _read_body(receive, MAX_BODY_BYTES + 1)   # None: the client left first


async def _read_body(receive, limit: int) -> bytes | None:
    """The request's body, up to ``limit`` bytes (the engine's routes answer 413 past its
    limit); None when the client disconnected first."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size < limit:
            parts.append(chunk[:limit - size])
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def forwarded_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """What the engine's routes read of an HTTP scope, relative to the application's route."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return {"type": "http", "asgi": {"version": "3.0"},
            "http_version": scope.get("http_version", "1.1"), "method": scope["method"],
            "scheme": scope.get("scheme", "http"), "path": path, "root_path": "",
            "query_string": scope.get("query_string", b""),
            "headers": [(bytes(k), bytes(v)) for k, v in scope["headers"]]}


def choose_adapter(scope: dict[str, Any], body: bytes, base_names: set[str]
                   ) -> tuple[str, dict[str, Any], bytes]:
    """The adapter a request names, as its multiplexed model id ("" for the base model), and
    the scope and body the engine's routes then read. Serve's ``serve_multiplexed_model_id``
    header wins, and the route is told (the body's ``model``, SageMaker's TargetModel header);
    without it, the route's own choice: ``/models/<name>/invoke``, the TargetModel header on
    /invocations, the JSON body's ``model``."""
    headers = scope["headers"]
    explicit = next((v.decode("latin-1") for k, v in headers
                     if k.decode("latin-1").lower().replace("-", "_") == MULTIPLEXED_HEADER),
                    None)
    path = scope["path"]
    invoke = _INVOKE_PATH.match(path)
    if explicit is not None:
        explicit = explicit.strip()
        if invoke is not None and invoke["name"] != explicit:
            raise BadRequest(f"{MULTIPLEXED_HEADER} {explicit!r} and the path's model "
                             f"{invoke['name']!r} disagree: send one of them, or the same name",
                             MULTIPLEXED_HEADER)
        if path == "/invocations":
            scope = dict(scope, headers=[(k, v) for k, v in headers if k != TARGET_MODEL]
                         + [(TARGET_MODEL, explicit.encode("latin-1"))])
        elif path in _MODEL_ROUTES:
            data = _json_object(body)
            if data is not None and data.get("model") != explicit:
                body = dumps_compact(dict(data, model=explicit)).encode()
        return ("" if explicit in base_names else explicit), scope, body
    if invoke is not None:
        named = invoke["name"]
    elif path == "/invocations" and (target := dict(headers).get(TARGET_MODEL)):
        named = target.decode("latin-1")
    elif path in _MODEL_ROUTES and scope["method"] == "POST":
        data = _json_object(body)
        named = data.get("model") if data is not None else None
    else:
        named = None
    if not isinstance(named, str) or not named or named in base_names:
        return "", scope, body
    return named, scope, body


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (the engine's routes name what is wrong with it)."""
    if not body.lstrip()[:1] == b"{":
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def _replica_failed(send, started: dict[str, Any] | None, error: Exception) -> None:
    why = (f"the engine replica serving this request failed ({type(error).__name__}); "
           "Serve is replacing it: retry the request")
    log.warning("%s: %s", why, error)
    if started is None:                            # nothing sent yet: a plain 503
        await respond_error(send, BadRequest(why, None, 503), [(b"retry-after", b"1")])
        return
    content_type = dict(started.get("headers", [])).get(b"content-type", b"")
    if content_type != SSE_HEADERS[0][1]:
        raise error                                # a JSON answer cut short: drop the connection
    event = b"data: " + dumps_compact(BadRequest(why, None, 502).to_json()).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


# ----------------------------------------------------------------------------------- builder

_ENGINE = serve.deployment(name=ENGINE_DEPLOYMENT)(EngineServer)
_ENGINE_AS_INGRESS = serve.deployment(name=ENGINE_DEPLOYMENT)(serve.ingress()(EngineIngress))
_INGRESS = serve.deployment(name=INGRESS_DEPLOYMENT)(serve.ingress()(Ingress))


def build_app(args: dict[str, Any]) -> serve.Application:
    """The application a serve config names: ``import_path: byo_vllm.ray_serve:build_app``
    with ``args`` (see ``ARGS``)."""
    parsed, server = parse_args(args)
    scaling: dict[str, Any] = (
        {"num_replicas": parsed.num_replicas} if parsed.num_replicas is not None else
        {"autoscaling_config": parsed.autoscaling_config or {
            "min_replicas": 1, "max_replicas": 1,
            "target_ongoing_requests": TARGET_ONGOING_REQUESTS}})
    actor: dict[str, Any] = {"num_cpus": parsed.engine_num_cpus}
    if parsed.engine_num_gpus:
        actor["num_gpus"] = parsed.engine_num_gpus
    if parsed.process_env():
        actor["runtime_env"] = {"env_vars": parsed.process_env()}
    direct = parsed.ingress_replicas == 0
    engine = (_ENGINE_AS_INGRESS if direct else _ENGINE).options(ray_actor_options=actor,
        max_ongoing_requests=parsed.max_ongoing_requests,
        # Streams in flight finish before a replica stops (the byo server's graceful window).
        graceful_shutdown_timeout_s=server.graceful_timeout_s,
        health_check_period_s=2, health_check_timeout_s=30, **scaling)
    if direct:
        return engine.bind(parsed.server_env(), parsed.max_adapters_per_replica)
    ingress = _INGRESS.options(num_replicas=parsed.ingress_replicas,
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX_ONGOING_REQUESTS,
        graceful_shutdown_timeout_s=server.graceful_timeout_s)
    base_names = ([server.served_model_name, server.model] if lora_enabled(server) else None)
    return ingress.bind(engine.bind(parsed.server_env(), parsed.max_adapters_per_replica),
                        base_names)
