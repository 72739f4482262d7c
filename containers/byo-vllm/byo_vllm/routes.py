"""The HTTP routes: SageMaker's contract (``/ping``, ``/invocations``), OpenAI-compatible
``/v1/completions`` and ``/v1/chat/completions`` (so ``vllm bench serve`` measures this
server directly), ``/v1/embeddings`` (when the engine runs a pooling model), ``/v1/models``
and ``/metrics``.

``/invocations`` goes by the body: ``messages`` / ``prompt`` / ``inputs`` generate text, and
``input`` (OpenAI's embeddings body) embeds; on a pooling engine ``inputs`` is Hugging Face's
feature extraction (TEI's SageMaker shape) and embeds too.

No request can take the server down: every failure becomes a JSON error with a status.
Everything here runs on the server's one event loop; only a model.py handler (level 4),
which blocks, runs in a thread.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from urllib.parse import parse_qs
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from options.core.wire import (OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_EMBEDDINGS, TGI,
                               UnknownDialect, detect_dialect)

from . import embeddings, metrics, openai_layer
from .asgi import ClientGone, Request, Send, respond, respond_error, respond_json, stream
from .config import MAX_BODY_BYTES, ServerSettings
from .dialects import (BadRequest, Finished, GenerationRequest, check_lengths, fits_fast_path,
                       parse_body, request_dialect, request_from, responder_for)
from .engine import EngineAdapter, EngineUnavailable

DEFAULT_PAGE = 100          # GET /models without max_results

log = logging.getLogger("byo_vllm.routes")
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
# SageMaker passes InvokeEndpoint's TargetModel in this header.
TARGET_MODEL = b"x-amzn-sagemaker-target-model"
ROUTES_TEXT = ("GET|POST /ping, POST /invocations, POST /v1/completions, POST "
               "/v1/chat/completions, POST /v1/embeddings, GET /v1/models, GET /metrics, "
               "GET /health, GET /version, POST /tokenize, POST /detokenize, and "
               "with LoRA on GET|POST "
               "/models, GET|DELETE /models/<name>, POST /models/<name>/invoke")
LORA_OFF = ("this server serves one model: start it with SM_VLLM_ENABLE_LORA=true (or "
            "OPTION_ENABLE_LORA=true) to serve LoRA adapters through /models")

Handler = Callable[[Request, Send, list], Awaitable[None]]


class Routes:
    """The ASGI application's request handling; ``backend`` is an EngineAdapter or a
    handler backend (level 4)."""

    def __init__(self, backend, settings: ServerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.engine = backend if isinstance(backend, EngineAdapter) else None
        self.table: dict[str, dict[str, Handler]] = {
            "/ping": {"GET": self.ping, "POST": self.ping},
            "/invocations": {"POST": self.invocations},
            "/v1/completions": {"POST": self.completions},
            "/v1/chat/completions": {"POST": self.chat_completions},
            "/v1/embeddings": {"POST": self.embeddings},
            "/v1/models": {"GET": self.models},
            "/metrics": {"GET": self.prometheus},
            # vLLM's operational routes, which its clients and probes call.
            "/health": {"GET": self.health},
            "/version": {"GET": self.version},
            "/tokenize": {"POST": self.tokenize},
            "/detokenize": {"POST": self.detokenize},
            "/models": {"GET": self.list_models, "POST": self.load_model},
        }

    async def __call__(self, scope: dict, receive, send: Send) -> None:
        request = Request(scope, receive)
        methods = self.table.get(request.path)
        route = request.path if methods is not None else "unmatched"
        if methods is None and request.path.startswith("/models/"):
            methods, route = self._model_routes(request.path)
        # SageMaker's custom attributes come back as they went.
        attributes = request.headers.get(b"x-amzn-sagemaker-custom-attributes")
        extra = [(b"x-amzn-sagemaker-custom-attributes", attributes)] if attributes else []
        status = [500]

        async def counted_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if methods is None:
                raise BadRequest(f"no route {request.method} {request.path}: this server "
                                 f"answers {ROUTES_TEXT}", None, 404)
            handler = methods.get(request.method)
            if handler is None:
                raise BadRequest(f"{request.method} is not allowed on {request.path}: use "
                                 f"{' or '.join(methods)}", None, 405)
            await handler(request, counted_send, extra)
        except BadRequest as e:
            metrics.ERRORS.labels(route, "bad_request").inc()
            # A client too slow to send its body gets its connection closed with the answer.
            close = [(b"connection", b"close")] if e.status == 408 else []
            await respond_error(counted_send, e, extra + close)
        except EngineUnavailable as e:
            metrics.ERRORS.labels(route, "unavailable").inc()
            await respond_error(counted_send, BadRequest(str(e), None, 503), extra)
        except ClientGone:
            status[0] = 499                 # nginx's word for it: nobody left to answer
        except Exception as e:  # noqa: BLE001 - a server never dies from a request
            log.exception("request failed")
            metrics.ERRORS.labels(route, "internal").inc()
            await respond_error(counted_send, BadRequest(
                f"internal error: {type(e).__name__}: {e}", None, 500), extra)
        finally:
            metrics.REQUESTS.labels(route, str(status[0])).inc()

    async def _body(self, request: Request) -> bytes:
        return await request.body(MAX_BODY_BYTES, self.settings.read_timeout_s)

    # -- the contract -----------------------------------------------------------------------
    async def ping(self, request: Request, send: Send, extra: list) -> None:
        if self.backend.ready:
            metrics.ENGINE_READY.set(1)
            await respond(send, 200, b"", b"text/plain", extra)
            return
        metrics.ENGINE_READY.set(0)
        why = (getattr(self.backend, "dead_error", None) or getattr(self.backend, "failed", None)
               or "the model is still loading")
        await respond_error(send, BadRequest(why, None, 503), extra)

    async def invocations(self, request: Request, send: Send, extra: list) -> None:
        if self.engine is None:
            await self._invoke_handler(request, send, extra)
            return
        body = await self._body(request)
        shape = self._embedding_shape(parse_body(body))
        if shape is not None:
            await self._embed(send, extra, body, shape)
            return
        target = request.headers.get(TARGET_MODEL)
        await self._generate(request, send, extra, None,
                             target.decode("latin-1") if target else None, body)

    def _embedding_shape(self, data: dict[str, Any]) -> str | None:
        """embeddings.OPENAI or .TEI when an /invocations body asks for embeddings."""
        try:
            name = detect_dialect(data)
        except UnknownDialect:
            return None                          # parse_request says what is wrong
        if name == OPENAI_EMBEDDINGS:
            return embeddings.OPENAI
        engine = self.engine
        if name == TGI and engine.ready and engine.runner == "pooling":
            return embeddings.TEI
        return None

    async def embeddings(self, request: Request, send: Send, extra: list) -> None:
        if self.engine is None:
            raise BadRequest("this server runs a model.py handler: send requests to "
                             "/invocations", None, 404)
        await self._embed(send, extra, await self._body(request), embeddings.OPENAI)

    async def completions(self, request: Request, send: Send, extra: list) -> None:
        await self._generate(request, send, extra, "completion")

    async def chat_completions(self, request: Request, send: Send, extra: list) -> None:
        await self._generate(request, send, extra, "chat")

    async def models(self, request: Request, send: Send, extra: list) -> None:
        engine = self.engine
        data = [{"id": self.settings.served_model_name, "object": "model", "owned_by": "spectrum",
                 "max_model_len": engine.max_model_len if engine else None}]
        if engine is not None and engine.ready:      # what the engine runs as
            data[0].update(max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
                           runner=engine.runner, tasks=list(engine.tasks),
                           scheduling_policy=engine.scheduling_policy,
                           prefix_caching=engine.prefix_caching)
        adapters = self.engine.adapters if self.engine is not None else None
        if adapters is not None:
            data += [{"id": a.name, "object": "model", "owned_by": "spectrum",
                      "parent": self.settings.served_model_name} for a in adapters.all()]
        await respond_json(send, {"object": "list", "data": data}, 200, extra)

    # -- many models: SageMaker's multi-model contract over LoRA adapters (adapters.py) ----
    def _model_routes(self, path: str) -> tuple[dict[str, Handler] | None, str]:
        name, _, rest = path[len("/models/"):].partition("/")
        if not name or rest not in ("", "invoke"):
            return None, "unmatched"
        if rest == "invoke":
            return ({"POST": functools.partial(self.invoke_model, name)},
                    "/models/{name}/invoke")
        return ({"GET": functools.partial(self.get_model, name),
                 "DELETE": functools.partial(self.unload_model, name)}, "/models/{name}")

    def _adapters(self):
        adapters = self.engine.adapters if self.engine is not None else None
        if adapters is None:
            if self.engine is not None and not self.engine.ready:
                raise EngineUnavailable(self.engine.dead_error or "the model is still "
                                        "loading: retry when /ping answers 200")
            raise BadRequest(LORA_OFF, None, 501)
        return adapters

    async def load_model(self, request: Request, send: Send, extra: list) -> None:
        adapters = self._adapters()
        data = parse_body(await self._body(request))
        for key in ("model_name", "url"):
            if key not in data:
                raise BadRequest(f"the body needs {key!r}: POST /models {{\"model_name\": "
                                 "NAME, \"url\": FOLDER or s3://PREFIX[, \"pinned\": true]}",
                                 key)
        adapter = await adapters.load(data["model_name"], data["url"], data.get("pinned", False))
        await respond_json(send, {"message": f"model {adapter.name} loaded"} | adapter.describe(),
                           200, extra)

    async def list_models(self, request: Request, send: Send, extra: list) -> None:
        adapters = self._adapters()
        query = parse_qs(request.scope.get("query_string", b"").decode("latin-1"))
        token = query.get("next_page_token", [None])[0]
        raw = query.get("max_results", [str(DEFAULT_PAGE)])[0]
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            raise BadRequest(f"max_results={raw!r} must be a whole number from 1 to 1000",
                             "max_results")
        page, following = adapters.page(token, int(raw))
        body: dict[str, Any] = {"models": [a.describe() for a in page]}
        if following:
            body["nextPageToken"] = following
        await respond_json(send, body, 200, extra)

    async def get_model(self, name: str, request: Request, send: Send, extra: list) -> None:
        adapters = self._adapters()
        await respond_json(send, adapters.status(adapters.get(name)), 200, extra)

    async def unload_model(self, name: str, request: Request, send: Send, extra: list) -> None:
        await self._adapters().unload(name)
        await respond_json(send, {"message": f"model {name} unloaded"}, 200, extra)

    async def invoke_model(self, name: str, request: Request, send: Send, extra: list) -> None:
        adapters = self._adapters()
        if not adapters.is_base(name):
            adapters.get(name)                 # 404 before the body is read
        await self._generate(request, send, extra, None, name)

    async def prometheus(self, request: Request, send: Send, extra: list) -> None:
        body, content_type = metrics.render()
        await respond(send, 200, body, content_type.encode(), extra)

    # -- vLLM's operational routes, answered as vLLM's server answers them -------------------
    async def health(self, request: Request, send: Send, extra: list) -> None:
        """200 with no body while the engine serves; 503 while it loads or after it died
        (vLLM's /health; /ping is SageMaker's)."""
        if self.backend.ready:
            await respond(send, 200, b"", b"application/json", extra)
            return
        await self.ping(request, send, extra)

    async def version(self, request: Request, send: Send, extra: list) -> None:
        try:
            from vllm import __version__ as vllm_version
        except ImportError:
            vllm_version = None
        await respond_json(send, {"version": vllm_version}, 200, extra)

    async def tokenize(self, request: Request, send: Send, extra: list) -> None:
        layer = self._openai_layer()
        await layer.tokenize(parse_body(await self._body(request)), request, send, extra)

    async def detokenize(self, request: Request, send: Send, extra: list) -> None:
        layer = self._openai_layer()
        await layer.detokenize(parse_body(await self._body(request)), request, send, extra)

    def _openai_layer(self):
        if self.engine is None:
            raise BadRequest("this server runs a model.py handler: send requests to "
                             "/invocations", None, 404)
        return self._ready_engine().openai

    # -- what the engine can do -------------------------------------------------------------
    def _ready_engine(self) -> EngineAdapter:
        engine = self.engine
        if not engine.ready:
            raise EngineUnavailable(engine.dead_error or "the model is still loading: retry "
                                    "when /ping answers 200")
        return engine

    def _check_priority(self, priority: int, field_name: str) -> None:
        """A nonzero priority on an engine that would not read it is refused: vLLM 0.32's
        first-come-first-served scheduler ignores priorities silently."""
        policy = self.engine.scheduling_policy
        if priority and policy != "priority":
            raise BadRequest(
                f"{field_name}={priority}: this server's engine schedules first come, first "
                f"served (scheduling policy {policy!r}) and would ignore it; start the server "
                "with SM_VLLM_SCHEDULING_POLICY=priority to order requests by priority (lower "
                "runs earlier), or leave priority out (0)", field_name)

    # -- embeddings -------------------------------------------------------------------------
    async def _embed(self, send: Send, extra: list, body: bytes, shape: str) -> None:
        req = embeddings.parse_embeddings(parse_body(body), shape)
        engine = self._ready_engine()
        if not engine.embeds:
            fix = ("start it with SM_VLLM_RUNNER=pooling (or serve an embedding model) to "
                   "answer embeddings, or send a generation request (messages, prompt or "
                   "inputs)" if engine.runner == "generate" else
                   "serve a model whose pooler embeds (vLLM's embed task)")
            raise BadRequest(f"this server's engine runs runner {engine.runner!r} (tasks "
                             f"{', '.join(engine.tasks)}) and serves no embeddings: {fix}",
                             req.field)
        if req.dimensions is not None and not engine.matryoshka:
            raise BadRequest(f"dimensions={req.dimensions}: this model's embeddings cannot be "
                             "shortened (it is not a Matryoshka model); leave dimensions out "
                             "to get its full vectors", "dimensions")
        self._check_priority(req.priority, "priority")
        ids = [self._embedding_ids(engine, item, f"{req.field}[{i}]")
               for i, item in enumerate(req.inputs)]
        submitted = time.monotonic()
        metrics.PROMPT_TOKENS.inc(sum(map(len, ids)))
        with _engine_errors(engine):
            # Every input at once, so vLLM batches them; all of them end before the answer
            # (or the first failure) goes out, so none is left running unawaited.
            vectors = await asyncio.gather(*(engine.embed(t, req.dimensions, req.priority)
                                             for t in ids), return_exceptions=True)
            failed = next((v for v in vectors if isinstance(v, BaseException)), None)
            if failed is not None:
                raise failed
        metrics.E2E.labels("embeddings").observe(time.monotonic() - submitted)
        metrics.EMBEDDING_INPUTS.inc(len(vectors))
        await respond_json(send, embeddings.answer(req, vectors, sum(map(len, ids)),
                                                   self.settings.served_model_name), 200, extra)

    @staticmethod
    def _embedding_ids(engine: EngineAdapter, item: str | list[int], where: str) -> list[int]:
        ids = engine.tokenize(item) if isinstance(item, str) else item
        if max(ids) >= engine.vocab_size:
            raise BadRequest(f"{where} holds token id {max(ids)}, outside the model's vocabulary "
                             f"of {engine.vocab_size} tokens (ids 0..{engine.vocab_size - 1})",
                             where)
        if len(ids) > engine.max_model_len:
            raise BadRequest(f"{where} is {len(ids)} tokens but the model's context "
                             f"(max_model_len) is {engine.max_model_len}: shorten it", where)
        return ids

    # -- generation -------------------------------------------------------------------------
    async def _generate(self, request: Request, send: Send, extra: list,
                        dialect: str | None, model: str | None = None,
                        body: bytes | None = None) -> None:
        engine = self.engine
        if engine is None:
            raise BadRequest("this server runs a model.py handler: send requests to "
                             "/invocations", None, 404)
        if body is None:
            body = await self._body(request)
        data = parse_body(body)
        dialect = request_dialect(data, dialect)
        if dialect != TGI and not fits_fast_path(data, dialect):
            await self._generate_in_vllm_layer(request, send, extra, dialect, data, model)
            return
        req = request_from(data, dialect)
        self._ready_engine()
        if engine.runner != "generate":
            raise BadRequest(
                f"this server's engine runs runner {engine.runner!r} (tasks "
                f"{', '.join(engine.tasks)}) and generates no text: send embeddings to POST "
                '/v1/embeddings or /invocations ({"input": ...}), or start the server without '
                "SM_VLLM_RUNNER=pooling, with a generative model, to generate", "body")
        self._check_priority(req.priority, "parameters.priority" if req.dialect == TGI
                             else "priority")
        if engine.adapters is None:
            await self._generate_with(request, send, extra, req, None)
            return
        if model is None:                              # OpenAI's field names the adapter
            named = data.get("model")
            model = named if isinstance(named, str) and named else None
        lease = await engine.adapters.acquire(model)
        try:
            await self._generate_with(request, send, extra, req, lease)
        finally:
            lease.release()

    async def _generate_in_vllm_layer(self, request: Request, send: Send, extra: list,
                                      dialect: str, data: dict[str, Any],
                                      model: str | None) -> None:
        """An OpenAI body beyond the lean path (tools, response_format, logprobs, n ...)
        through vLLM's own serving layer (openai_layer.py), inside the adapter's lease."""
        engine = self._ready_engine()
        layer = engine.openai
        if model is not None:                          # /models/<name>/invoke, TargetModel
            data = dict(data, model=model)
        elif engine.adapters is None and "model" in data:
            # Without LoRA the server serves one model and ``model`` selects nothing: it
            # answers as that model and says so (as the lean path does). vLLM's own server
            # answers 404 to a name it does not serve.
            data = dict(data, model=self.settings.served_model_name)
        req = layer.parse(dialect, data)
        if engine.runner != "generate":
            raise BadRequest(f"this server's engine runs runner {engine.runner!r} and "
                             "generates no text", "body")
        lease = None
        if engine.adapters is not None:
            lease = await engine.adapters.acquire(req.model)
        submitted = time.monotonic()
        try:
            with _engine_errors(engine):
                usage = await layer.answer(dialect, req, request, send, extra,
                                           lease.lora_request if lease is not None else None)
        finally:
            if lease is not None:
                lease.release()
        metrics.E2E.labels(dialect).observe(time.monotonic() - submitted)
        prompt_tokens, completion_tokens = openai_layer.usage_tokens(usage)
        metrics.PROMPT_TOKENS.inc(prompt_tokens)
        metrics.OUTPUT_TOKENS.inc(completion_tokens)

    async def _generate_with(self, request: Request, send: Send, extra: list,
                             req: GenerationRequest, lease) -> None:
        engine = self.engine
        prompt_ids = _prompt_ids(engine, req)
        sampling = dict(req.sampling, max_tokens=check_lengths(req, len(prompt_ids),
                                                                engine.max_model_len))
        if req.details:
            sampling["logprobs"] = 0
        submitted = time.monotonic()
        with _engine_errors(engine):
            outputs = engine.generate(prompt_ids, sampling, req.stream,
                                      lease.lora_request if lease is not None else None,
                                      req.priority)
        metrics.WAITING.inc()
        metrics.PROMPT_TOKENS.inc(len(prompt_ids))
        try:
            with _engine_errors(engine):
                first = await outputs.__anext__()
        finally:
            metrics.WAITING.dec()
        answering = lease.name if lease is not None and lease.name else \
            self.settings.served_model_name
        responder = responder_for(req, answering, engine.decode_one)
        if not req.stream:
            async for first in outputs:       # FINAL_ONLY: already the last; let it end
                pass
            done = _finished(first, len(prompt_ids), sampling)
            metrics.E2E.labels(req.dialect).observe(time.monotonic() - submitted)
            metrics.OUTPUT_TOKENS.inc(done.completion_tokens)
            await respond_json(send, responder.full(done), 200, extra)
            return
        metrics.TTFT.labels(req.dialect).observe(time.monotonic() - submitted)
        render = _StreamRenderer(responder, len(prompt_ids), sampling.get("seed"))
        metrics.RUNNING.inc()
        try:
            finished = await stream(request, send, _chunks(first, outputs, render), extra)
            if finished:
                metrics.E2E.labels(req.dialect).observe(time.monotonic() - submitted)
            elif not render.finished:
                metrics.ABORTED.inc()          # closing the engine's iterator aborted it
        finally:
            metrics.RUNNING.dec()
            metrics.OUTPUT_TOKENS.inc(render.produced)

    async def _invoke_handler(self, request: Request, send: Send, extra: list) -> None:
        """Level 4: the user's model.py answers /invocations (interface 6), in a thread."""
        backend = self.backend
        if not backend.ready:
            raise EngineUnavailable(backend.failed or "the handler is still loading")
        body = await self._body(request)
        status, content_type, answer = await asyncio.to_thread(
            backend.invoke, body, request.header("content-type") or "application/json",
            request.header("accept") or "application/json")
        headers = [(b"content-type", content_type.encode()), *extra]
        if isinstance(answer, (bytes, bytearray)):
            await respond(send, status, bytes(answer), content_type.encode(), extra)
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        parts = iter(answer)
        while (part := await asyncio.to_thread(next, parts, None)) is not None:
            await send({"type": "http.response.body", "body": _as_bytes(part),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@contextlib.contextmanager
def _engine_errors(engine: EngineAdapter) -> Iterator[None]:
    """Around calls into the engine: its refusal of a request (vLLM's own validation) is a
    400, and a failure because the engine died a 503."""
    try:
        yield
    except (BadRequest, EngineUnavailable, ClientGone):
        raise
    except engine.client_errors as e:
        raise BadRequest(f"the engine rejected the request: {e}") from None
    except Exception as e:
        if engine.dead_error:
            raise EngineUnavailable(engine.dead_error) from e
        refused = openai_layer.as_bad_request(e)      # vLLM's own 4xx classes, as vLLM says
        if refused is not None:
            raise refused from None
        raise


def _as_bytes(part: Any) -> bytes:
    return part if isinstance(part, (bytes, bytearray)) else str(part).encode()


def _prompt_ids(engine: EngineAdapter, req: GenerationRequest) -> list[int]:
    if req.messages is not None:
        return engine.tokenize_chat(req.messages)
    if isinstance(req.prompt, list):
        return req.prompt
    return engine.tokenize(req.prompt)


def _finished(output, prompt_tokens: int, sampling: dict[str, Any]) -> Finished:
    choice = output.outputs[0]
    logprobs = [next(iter(d.values())).logprob if d else None
                for d in (choice.logprobs or [])] if choice.logprobs else []
    return Finished(
        text=choice.text, finish_reason=choice.finish_reason, stop_reason=choice.stop_reason,
        prompt_tokens=prompt_tokens, completion_tokens=len(choice.token_ids),
        token_ids=list(choice.token_ids), logprobs=logprobs, seed=sampling.get("seed"))


class _StreamRenderer:
    """Turns each engine output (a delta) into the bytes of one SSE write: the per-token
    path, so keep it lean."""

    __slots__ = ("_responder", "_want_logprobs", "_prompt_tokens", "_seed", "_head", "texts",
                 "produced", "finished")

    def __init__(self, responder, prompt_tokens: int, seed: int | None) -> None:
        self._responder = responder
        self._want_logprobs = responder.req.details
        self._prompt_tokens = prompt_tokens
        self._seed = seed
        self._head = responder.start()
        self.texts: list[str] = []
        self.produced = 0
        self.finished = False

    def __call__(self, output) -> bytes:
        choice = output.outputs[0]
        ids = choice.token_ids
        self.produced += len(ids)
        self.texts.append(choice.text)
        lps = ([next(iter(d.values())).logprob if d else None for d in choice.logprobs]
               if self._want_logprobs and choice.logprobs else None)
        chunk = self._responder.delta(choice.text, ids, lps, choice.finish_reason)
        if self._head:
            chunk, self._head = self._head + chunk, b""
        if not output.finished:
            return chunk
        self.finished = True
        done = Finished("".join(self.texts), choice.finish_reason, choice.stop_reason,
                        self._prompt_tokens, self.produced, seed=self._seed)
        return chunk + self._responder.end(done)


async def _chunks(first, outputs: AsyncIterator, render: _StreamRenderer) -> AsyncIterator[bytes]:
    """The stream's bytes, output by output. An engine failure mid-stream becomes an in-band
    error event; closing this iterator early closes the engine's, which aborts the request."""
    try:
        yield render(first)
        async for output in outputs:
            chunk = render(output)
            if chunk:                     # an empty chunk would end a chunked response
                yield chunk
    except Exception as e:  # noqa: BLE001 - the headers are out: say it in the stream
        log.exception("stream failed")
        metrics.ERRORS.labels("stream", "engine").inc()
        yield (b"data: " + json.dumps(
            {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error",
                       "code": 500}}).encode() + b"\n\n")
    finally:
        await outputs.aclose()
