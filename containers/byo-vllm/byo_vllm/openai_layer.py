"""vLLM's own OpenAI serving layer, on the server's one engine.

The OpenAI routes' full vocabulary — ``tools`` and ``tool_choice`` with tool-call parsing,
the tool-result turn, ``response_format`` through structured outputs, ``logprobs`` and
``top_logprobs``, ``n``, ``echo``, penalties, ``stream_options`` — is served by the same
classes ``vllm serve`` runs (``OpenAIServingChat``, ``OpenAIServingCompletion``,
``ServingTokenization``), built by vLLM's own ``init_app_state`` from ``vllm serve``'s parsed
arguments (engine_args.py), as vLLM's SageMaker router does. Answers, errors and their
status codes are therefore vLLM's, word for word.

What this module adds is the server's own rules around it:
- a field neither OpenAI's nor vLLM's request names is a 400 naming it (vLLM logs and
  ignores such fields; this server never answers 200 while ignoring what was asked);
- a body that fails vLLM's validation is a 400 naming the field, not FastAPI's 422;
- the request runs inside the adapter registry's lease (adapters.py), so an adapter is
  loaded, pinned and kept while it answers;
- a client that goes away cancels its request.

Plain bodies — the fields ``dialects.FAST_FIELDS`` lists, one choice — take the server's own
lean path (routes.py), which answers the same bytes' worth with less work per token; the
differential test (tests/byo_vllm/test_openai_differential.py) holds both paths to vLLM's
own server.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator

from options.core.wire import OPENAI_CHAT, OPENAI_COMPLETIONS

from .asgi import JSON, Request, Send, respond, stream
from .dialects import BadRequest, dumps_compact

log = logging.getLogger("byo_vllm.openai_layer")

# The dialects this layer serves, with vLLM's request class, handler attribute and method.
_ROUTES = {
    OPENAI_CHAT: ("vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
                  "openai_serving_chat", "create_chat_completion"),
    OPENAI_COMPLETIONS: ("vllm.entrypoints.openai.completion.protocol:CompletionRequest",
                         "openai_serving_completion", "create_completion"),
}


def _import(path: str):
    import importlib
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def request_fields(model_class) -> frozenset[str]:
    """The body keys a vLLM request class reads: its fields and their aliases."""
    names = set()
    for name, info in model_class.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return frozenset(names)


def check_fields(data: dict[str, Any], known: frozenset[str], what: str) -> None:
    """BadRequest naming every key of ``data`` that ``known`` lacks."""
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        import difflib
        hints = [f"{k!r} (did you mean {', '.join(map(repr, close))}?)"
                 if (close := difflib.get_close_matches(k, known, n=2)) else repr(k)
                 for k in unknown]
        raise BadRequest(f"{', '.join(hints)}: not a field of {what} that this server (or "
                         "vLLM's OpenAI server) reads; it would be ignored, so it is refused: "
                         "remove it or correct its name", unknown[0])


def bad_request_from_validation(error, where: str = "") -> BadRequest:
    """A pydantic ValidationError as a 400 naming the first field it names."""
    problems = []
    first = None
    for item in error.errors():
        loc = ".".join(str(p) for p in item.get("loc", ()) if not str(p).startswith("function-"))
        first = first or loc or None
        problems.append(f"{where}{loc}: {item.get('msg')}" if loc else str(item.get("msg")))
    return BadRequest("; ".join(problems[:5]) or str(error), first and where + first)


class OpenAILayer:
    """vLLM's serving objects for one engine, and how a request goes through them."""

    def __init__(self, state, served_model_name: str) -> None:
        self.state = state
        self.served_model_name = served_model_name
        self._classes = {d: _import(path) for d, (path, _, _) in _ROUTES.items()}
        self._fields = {d: request_fields(c) for d, c in self._classes.items()}
        from pydantic import TypeAdapter
        from vllm.entrypoints.serve.tokenize.protocol import (DetokenizeRequest,
                                                              TokenizeChatRequest,
                                                              TokenizeCompletionRequest)
        self._tokenize = {"chat": TokenizeChatRequest, "prompt": TokenizeCompletionRequest}
        self._detokenize = TypeAdapter(DetokenizeRequest)
        self._detokenize_fields = request_fields(DetokenizeRequest)

    @classmethod
    async def build(cls, engine, serve_args, tasks: tuple[str, ...]) -> "OpenAILayer":
        """vLLM's ``init_app_state`` on ``engine`` with ``vllm serve``'s arguments."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        state = State()
        await init_app_state(engine, state, serve_args, tasks)
        return cls(state, serve_args.served_model_name[0])

    # -- the request ------------------------------------------------------------------------
    def parse(self, dialect: str, data: dict[str, Any]):
        """``data`` as vLLM's request object; BadRequest for an unknown or invalid field."""
        check_fields(data, self._fields[dialect], "an OpenAI " + (
            "chat completion" if dialect == OPENAI_CHAT else "completion") + " request")
        return _validated(lambda: self._classes[dialect].model_validate(data))

    async def answer(self, dialect: str, req, request: Request, send: Send, extra: list,
                     lora_request=None) -> str | None:
        """Serves ``req`` (from ``parse``) on ``send``. ``lora_request``: the adapter the
        registry leased for ``req.model`` (None for the base model without one). Returns the
        answer's usage as a JSON text when it said one (for the server's metrics)."""
        _, attribute, method = _ROUTES[dialect]
        if lora_request is not None:
            name = req.model or self.served_model_name
            req.model = name
            self.state.openai_serving_models.lora_requests[name] = lora_request
        handler = getattr(getattr(self.state, attribute), method)
        raw = _starlette_request(request)
        try:
            result = await _unless_gone(request, handler(req, raw))
        except Exception as e:
            refused = as_bad_request(e)           # vLLM's own 4xx, with its words
            if refused is None:
                raise
            raise refused from None
        if result is None:
            return None                                   # the client went away
        kind = type(result).__name__
        if kind == "ErrorResponse":
            await respond(send, result.error.code, _dump(result), JSON, extra)
            return None
        if hasattr(result, "model_dump"):                 # the whole answer
            await respond(send, 200, _dump(result), JSON, extra)
            usage = getattr(result, "usage", None)
            return usage.model_dump_json() if usage is not None else None
        seen = _Usage()
        await stream(request, send, _encoded(result, seen), extra)
        return seen.last

    async def tokenize(self, data: dict[str, Any], request: Request, send: Send,
                       extra: list) -> None:
        """``POST /tokenize`` as vLLM answers it (a prompt, or chat messages)."""
        model_class = self._tokenize["chat" if "messages" in data else "prompt"]
        check_fields(data, request_fields(model_class), "a /tokenize request")
        req = _validated(lambda: model_class.model_validate(data))
        await self._simple(self.state.serving_tokenization.create_tokenize(
            req, _starlette_request(request)), send, extra)

    async def detokenize(self, data: dict[str, Any], request: Request, send: Send,
                         extra: list) -> None:
        check_fields(data, self._detokenize_fields, "a /detokenize request")
        req = _validated(lambda: self._detokenize.validate_python(data))
        await self._simple(self.state.serving_tokenization.create_detokenize(
            req, _starlette_request(request)), send, extra)

    async def _simple(self, call, send: Send, extra: list) -> None:
        result = await call
        status = result.error.code if type(result).__name__ == "ErrorResponse" else 200
        await respond(send, status, _dump(result), JSON, extra)


def _validated(build):
    """``build()``: a vLLM request object; BadRequest when pydantic or vLLM's own validators
    refuse the body (these raise vLLM's errors directly, outside pydantic's)."""
    from pydantic import ValidationError

    try:
        return build()
    except ValidationError as e:
        raise bad_request_from_validation(e) from None
    except Exception as e:
        refused = as_bad_request(e)
        if refused is None:
            raise
        raise refused from None


def as_bad_request(exc: BaseException) -> BadRequest | None:
    """vLLM's classification of an exception its serving layer raised (its own
    ``create_error_response``), as the server's error; None when it is the server's fault."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    error = create_error_response(exc if isinstance(exc, Exception) else Exception(str(exc)))
    code = error.error.code
    if code >= 500:
        return None
    return BadRequest(error.error.message, error.error.param, code)


class _Usage:
    """The last usage a stream carried (``stream_options.include_usage``)."""
    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: str | None = None


async def _encoded(chunks: AsyncIterator[str], seen: _Usage) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            if '"usage":{' in chunk or '"usage": {' in chunk:
                seen.last = chunk
            yield chunk.encode()
    finally:
        await chunks.aclose()


async def _unless_gone(request: Request, call):
    """``call``'s result, or None (the call cancelled) when the client goes away first.
    Streams are not watched here: ``asgi.stream`` watches them."""
    task = asyncio.ensure_future(call)
    gone = asyncio.ensure_future(request.disconnected())
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        return None
    finally:
        gone.cancel()


def _starlette_request(request: Request):
    """The request as vLLM's serving layer reads it (headers, per-request state)."""
    from starlette.requests import Request as StarletteRequest

    async def no_body() -> dict:           # the body was read already
        return {"type": "http.disconnect"}
    return StarletteRequest(request.scope, no_body)


def _dump(result) -> bytes:
    return dumps_compact(result.model_dump()).encode()


def usage_tokens(usage_json: str | None) -> tuple[int, int]:
    """(prompt, completion) tokens from a usage object's or a usage chunk's JSON text."""
    if not usage_json:
        return 0, 0
    text = usage_json[len("data: "):] if usage_json.startswith("data: ") else usage_json
    try:
        data = json.loads(text)
    except ValueError:
        return 0, 0
    usage = data.get("usage", data) or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
