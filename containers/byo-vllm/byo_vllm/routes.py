"""The HTTP routes: SageMaker's contract (``/ping``, ``/invocations``), OpenAI-compatible
``/v1/completions`` and ``/v1/chat/completions`` (so ``vllm bench serve`` measures this
server directly), and ``/metrics``.

No request can take the server down: every failure becomes a JSON error with a status.
"""
from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any, Iterator

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from . import metrics
from .config import MAX_BODY_BYTES, ServerSettings
from .dialects import (BadRequest, Finished, GenerationRequest, dumps_compact, check_lengths,
                       parse_request, responder_for)
from .engine import EngineAdapter, EngineUnavailable

log = logging.getLogger("byo_vllm.routes")
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
JSON = "application/json"
SSE = "text/event-stream"


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(dumps_compact(payload), status=status, mimetype=JSON)


def error_response(message: str, status: int, field_name: str | None = None) -> Response:
    return json_response(BadRequest(message, field_name, status).to_json(), status)


def register(app: Flask, backend, settings: ServerSettings) -> None:
    """Adds every route to ``app``; ``backend`` is an EngineAdapter or a handler backend."""
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    engine = backend if isinstance(backend, EngineAdapter) else None

    @app.route("/ping", methods=["GET", "POST"])
    def ping() -> Response:
        if backend.ready:
            metrics.ENGINE_READY.set(1)
            return Response(b"", status=200)
        metrics.ENGINE_READY.set(0)
        why = (getattr(backend, "dead_error", None) or getattr(backend, "failed", None)
               or "the model is still loading")
        return error_response(why, 503)

    @app.route("/invocations", methods=["POST"])
    def invocations() -> Response:
        if engine is None:
            return _invoke_handler(backend)
        return _generate(engine, settings, None)

    @app.route("/v1/completions", methods=["POST"])
    def completions() -> Response:
        return _generate(_require_engine(engine), settings, "completion")

    @app.route("/v1/chat/completions", methods=["POST"])
    def chat_completions() -> Response:
        return _generate(_require_engine(engine), settings, "chat")

    @app.route("/v1/models", methods=["GET"])
    def models() -> Response:
        return json_response({"object": "list", "data": [
            {"id": settings.served_model_name, "object": "model", "owned_by": "spectrum",
             "max_model_len": engine.max_model_len if engine else None}]})

    @app.route("/metrics", methods=["GET"])
    def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, status=200, content_type=content_type)

    @app.after_request
    def count_and_pass_attributes(response: Response) -> Response:
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        metrics.REQUESTS.labels(rule, str(response.status_code)).inc()
        attributes = request.headers.get(CUSTOM_ATTRIBUTES)
        if attributes is not None:
            response.headers[CUSTOM_ATTRIBUTES] = attributes
        return response

    @app.errorhandler(BadRequest)
    def bad_request(e: BadRequest) -> Response:
        metrics.ERRORS.labels(_rule(), "bad_request").inc()
        return json_response(e.to_json(), e.status)

    @app.errorhandler(EngineUnavailable)
    def unavailable(e: EngineUnavailable) -> Response:
        metrics.ERRORS.labels(_rule(), "unavailable").inc()
        return error_response(str(e), 503)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        if e.code == 404:
            message = (f"no route {request.method} {request.path}: this server answers GET|POST "
                       "/ping, POST /invocations, POST /v1/completions, POST "
                       "/v1/chat/completions, GET /v1/models and GET /metrics")
        elif e.code == 413:
            message = (f"the body is larger than {MAX_BODY_BYTES} bytes (SageMaker's 6 MB "
                       "limit for real-time endpoints): send less")
        elif e.code == 405:
            message = f"{request.method} is not allowed on {request.path}"
        else:
            message = e.description or e.name
        return error_response(message, e.code or 500)

    @app.errorhandler(Exception)
    def unexpected(e: Exception) -> Response:
        log.exception("request failed")
        metrics.ERRORS.labels(_rule(), "internal").inc()
        return error_response(f"internal error: {type(e).__name__}: {e}", 500)


def _rule() -> str:
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


def _require_engine(engine: EngineAdapter | None) -> EngineAdapter:
    if engine is None:
        raise BadRequest("this server runs a model.py handler: send requests to /invocations",
                         None, 404)
    return engine


def _prompt_ids(engine: EngineAdapter, req: GenerationRequest) -> list[int]:
    if req.messages is not None:
        return engine.tokenize_chat(req.messages)
    if isinstance(req.prompt, list):
        return req.prompt
    return engine.tokenize(req.prompt)


def _generate(engine: EngineAdapter, settings: ServerSettings, dialect: str | None) -> Response:
    req = parse_request(request.get_data(cache=False), dialect)
    if not engine.ready:
        raise EngineUnavailable(engine.dead_error or "the model is still loading: retry when "
                                "/ping answers 200")
    prompt_ids = _prompt_ids(engine, req)
    sampling = dict(req.sampling, max_tokens=check_lengths(req, len(prompt_ids),
                                                            engine.max_model_len))
    if req.details:
        sampling["logprobs"] = 0
    try:
        generation = engine.submit(prompt_ids, sampling, req.stream)
    except ValueError as e:                   # vLLM's own validation of the request
        raise BadRequest(f"the engine rejected the request: {e}") from None
    metrics.WAITING.inc()
    metrics.PROMPT_TOKENS.inc(len(prompt_ids))
    responder = responder_for(req, settings.served_model_name, engine.decode_one)
    try:
        first = generation.next()
    except BaseException:
        metrics.WAITING.dec()
        generation.abort()
        raise
    metrics.WAITING.dec()
    if not req.stream:
        done = _finished(first, generation, sampling)
        metrics.E2E.labels(req.dialect).observe(time.monotonic() - generation.submitted_at)
        metrics.OUTPUT_TOKENS.inc(done.completion_tokens)
        return json_response(responder.full(done))
    metrics.TTFT.labels(req.dialect).observe(time.monotonic() - generation.submitted_at)
    render = _StreamRenderer(responder, generation.prompt_tokens, sampling.get("seed"))
    # direct_passthrough: the server iterates the generator itself, without werkzeug's two
    # wrapping iterators per chunk (every chunk is already bytes).
    return Response(_stream(generation, first, render, req.dialect, _stream_socket()),
                    mimetype=SSE, headers={"Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"},
                    direct_passthrough=True)


def _stream_socket():
    """Readies the client's TCP socket for a stream (no Nagle delay), and returns it when the
    engine's loop thread may write the stream to it itself: under gunicorn (which hands it
    over in the environment) and HTTP/1.1, where gunicorn frames the response in chunks, as
    the loop does. Otherwise None: the request thread writes every chunk."""
    environ = request.environ
    sock = environ.get("gunicorn.socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        # A stream is many small writes: Nagle's algorithm would hold each one back until
        # the client acknowledged the one before (asyncio, under vLLM's own server, sets
        # this on every connection too).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if environ.get("SERVER_PROTOCOL") != "HTTP/1.1":
        return None
    return sock


def _finished(output, generation, sampling: dict[str, Any], text: str | None = None,
              completion_tokens: int | None = None) -> Finished:
    choice = output.outputs[0]
    logprobs = [next(iter(d.values())).logprob if d else None
                for d in (choice.logprobs or [])] if choice.logprobs else []
    return Finished(
        text=choice.text if text is None else text, finish_reason=choice.finish_reason,
        stop_reason=choice.stop_reason, prompt_tokens=generation.prompt_tokens,
        completion_tokens=len(choice.token_ids) if completion_tokens is None else completion_tokens,
        token_ids=list(choice.token_ids), logprobs=logprobs, seed=sampling.get("seed"))


class _StreamRenderer:
    """Turns each engine output (a delta) into the bytes of one SSE write: the per-token
    path, run on the engine's loop thread when it writes the stream, so keep it lean."""

    __slots__ = ("_responder", "_want_logprobs", "_prompt_tokens", "_seed", "_head", "texts",
                 "produced")

    def __init__(self, responder, prompt_tokens: int, seed: int | None) -> None:
        self._responder = responder
        self._want_logprobs = responder.req.details
        self._prompt_tokens = prompt_tokens
        self._seed = seed
        self._head = responder.start()
        self.texts: list[str] = []
        self.produced = 0

    def __call__(self, output) -> tuple[bytes, bool]:
        """The bytes to send for ``output``, and whether they end the stream."""
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
            return chunk, False
        done = Finished("".join(self.texts), choice.finish_reason, choice.stop_reason,
                        self._prompt_tokens, self.produced, seed=self._seed)
        return chunk + self._responder.end(done), True


def _stream(generation, first, render: _StreamRenderer, dialect: str,
            sock) -> Iterator[bytes]:
    """The first chunk goes out through the server (which sends the headers with it); the
    rest through the engine's loop thread when ``sock`` is given, else from this thread."""
    metrics.RUNNING.inc()
    try:
        chunk, last = render(first)
        yield chunk
        if not last and sock is not None:
            generation.relay(sock, render)
        else:
            while not last:
                chunk, last = render(generation.next())
                yield chunk
        metrics.E2E.labels(dialect).observe(time.monotonic() - generation.submitted_at)
    except (GeneratorExit, OSError):      # the client went away: stop the engine's work
        if not generation.finished:
            metrics.ABORTED.inc()
        raise                             # gunicorn closes the connection quietly
    except Exception as e:                # the engine failed mid-stream: say so in-band
        log.exception("stream failed")
        metrics.ERRORS.labels("stream", "engine").inc()
        yield (b"data: " + json.dumps(
            {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error",
                       "code": 500}}).encode() + b"\n\n")
    finally:
        generation.abort()
        metrics.RUNNING.dec()
        metrics.OUTPUT_TOKENS.inc(render.produced)


def _invoke_handler(backend) -> Response:
    """Level 4: the user's model.py answers /invocations (interface 6)."""
    if not backend.ready:
        raise EngineUnavailable(backend.failed or "the handler is still loading")
    status, content_type, body = backend.invoke(
        request.get_data(cache=False), request.content_type or JSON,
        request.headers.get("Accept", JSON))
    if isinstance(body, (bytes, bytearray)):
        return Response(bytes(body), status=status, content_type=content_type)
    return Response(body, status=status, content_type=content_type)
