"""The three request dialects seen on SageMaker's ``/invocations``, in and out.

- ``openai-chat`` (``OPENAI_CHAT``): OpenAI chat completions (``messages``)
- ``openai-completions`` (``OPENAI_COMPLETIONS``): OpenAI completions (``prompt``)
- ``tgi`` (``TGI``): Hugging Face TGI / AWS LMI (``inputs`` + ``parameters``)

The names, and the detection of a body's dialect, are the project's core
(``options.core.wire``), shared with the client (``options.contract``); the older names
``chat`` and ``completion`` are still accepted.

``parse_request`` turns a body into one ``GenerationRequest`` (or raises ``BadRequest``
naming the field, what is wrong and what would be right). ``responder_for`` returns the
object that writes the answer back in the dialect it was asked in: one JSON document, or
server-sent events when ``"stream": true``. Streaming chunks are built from precomputed
prefixes because they sit on the per-token path.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from options.core.wire import (OPENAI_CHAT, OPENAI_COMPLETIONS, TGI, UnknownDialect,
                               canonical_dialect, detect_dialect)

# The dialects this server speaks (Bedrock's Converse bodies go to Bedrock only).
DIALECTS = (OPENAI_CHAT, OPENAI_COMPLETIONS, TGI)
# Defaults when a request names no output length. OpenAI completions: 16 (its spec);
# OpenAI chat: the rest of the context (as vLLM); TGI/LMI: 100 (TGI's default).
DEFAULT_MAX_TOKENS = {OPENAI_COMPLETIONS: 16, OPENAI_CHAT: None, TGI: 100}
MAX_STOP_SEQUENCES = 16
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
# The OpenAI fields the server's own lean path serves. A body with any other field (tools,
# response_format, logprobs, echo ...), more than one choice, or messages carrying more than
# a role and text goes to vLLM's OpenAI serving layer (openai_layer.py), which also refuses
# names that neither reads.
_SAMPLING_FIELDS = frozenset({
    "model", "max_tokens", "n", "temperature", "top_p", "top_k", "seed", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "min_tokens", "ignore_eos", "stop", "stream",
    "stream_options", "priority"})
FAST_FIELDS = {OPENAI_CHAT: _SAMPLING_FIELDS | {"messages", "max_completion_tokens"},
               OPENAI_COMPLETIONS: _SAMPLING_FIELDS | {"prompt"}}

dumps_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class BadRequest(ValueError):
    """The client's mistake: answered with ``status`` and a JSON error naming the field."""

    def __init__(self, message: str, field_name: str | None = None, status: int = 400):
        super().__init__(message)
        self.field = field_name
        self.status = status

    def to_json(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.field,
                          "code": self.status}}


@dataclass
class GenerationRequest:
    dialect: str
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None                 # None: the rest of the context
    sampling: dict[str, Any] = field(default_factory=dict)   # SamplingParams fields
    stream: bool = False
    include_usage: bool = False
    details: bool = False                          # TGI: token-level details
    return_full_text: bool = False                 # TGI: prepend the prompt
    max_tokens_field: str = "max_tokens"           # as the client spelled it, for messages
    priority: int = 0                              # vLLM's: lower runs earlier (see routes)


# -- parsing ----------------------------------------------------------------------------------
def parse_body(body: bytes) -> dict[str, Any]:
    if not body:
        raise BadRequest("the request body is empty: send a JSON object", "body")
    try:
        data = json.loads(body)
    except UnicodeDecodeError as e:
        raise BadRequest(f"the body is not UTF-8 text: {e}", "body") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not valid JSON: {e.msg} at line {e.lineno} "
                         f"column {e.colno}", "body") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(data).__name__}", "body")
    return data


def request_dialect(data: dict[str, Any], dialect: str | None = None) -> str:
    """The dialect a route takes (``dialect``, any of its names), else the body's own."""
    try:
        name = canonical_dialect(dialect) if dialect else detect_dialect(data)
    except UnknownDialect as e:
        raise BadRequest(str(e), "body") from None
    if name not in DIALECTS:
        raise BadRequest(f"{name} bodies (modelId + messages of content blocks) go to Bedrock, "
                         "not to this server: send OpenAI chat (messages of role and content), "
                         "OpenAI completion (prompt) or TGI/LMI (inputs + parameters)", "body")
    return name


def fits_fast_path(data: dict[str, Any], dialect: str) -> bool:
    """Whether the server's own path serves this OpenAI body (``FAST_FIELDS``, one choice,
    messages of a role and text, one prompt), rather than vLLM's serving layer."""
    if not data.keys() <= FAST_FIELDS[dialect] or data.get("n", 1) not in (1, None):
        return False
    options = data.get("stream_options")
    if isinstance(options, dict) and not options.keys() <= {"include_usage"}:
        return False
    if dialect == OPENAI_COMPLETIONS:
        prompt = data.get("prompt")
        return not (isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
                    and len(prompt) > 1)
    messages = data.get("messages")
    return not isinstance(messages, list) or all(
        not isinstance(m, dict) or (m.keys() <= {"role", "content"} and m.get("role") != "tool")
        for m in messages)


def parse_request(body: bytes, dialect: str | None = None) -> GenerationRequest:
    """The body as a GenerationRequest; ``dialect`` None means detect it (``/invocations``).

    ``dialect`` is one of ``DIALECTS`` or an alias (``chat``, ``completion``, ``lmi``);
    ``req.dialect`` is always the dialect's one name."""
    data = parse_body(body)
    return request_from(data, request_dialect(data, dialect))


def request_from(data: dict[str, Any], dialect: str) -> GenerationRequest:
    """A parsed body of ``dialect`` (one of ``DIALECTS``) as a GenerationRequest."""
    if dialect == TGI:
        return _parse_tgi(data)
    req = GenerationRequest(dialect=dialect)
    if dialect == OPENAI_CHAT:
        req.messages = _messages(data.get("messages"))
        if "max_completion_tokens" in data:
            req.max_tokens = _int(data, "max_completion_tokens", 1)
            req.max_tokens_field = "max_completion_tokens"
    else:
        req.prompt = _prompt(data.get("prompt"))
    if req.max_tokens is None:
        req.max_tokens = (_int(data, "max_tokens", 1) if data.get("max_tokens") is not None
                          else DEFAULT_MAX_TOKENS[dialect])
    n = data.get("n", 1)
    if n not in (1, None):      # routes.py sends these to vLLM's serving layer instead
        raise BadRequest(f"n={n!r}: the lean path answers one choice; more are served by "
                         "vLLM's OpenAI serving layer (openai_layer.py)", "n")
    req.sampling = _sampling(data, temperature_default=1.0)
    req.priority = parse_priority(data)
    req.stream = _bool(data, "stream", False)
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("stream_options must be an object such as "
                             '{"include_usage": true}', "stream_options")
        req.include_usage = _bool(options, "include_usage", False, "stream_options.")
    return req


def _parse_tgi(data: dict[str, Any]) -> GenerationRequest:
    inputs = data["inputs"]
    if not isinstance(inputs, str):
        raise BadRequest(f"inputs must be a string (the prompt), got {type(inputs).__name__}",
                         "inputs")
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("parameters must be an object such as "
                         '{"max_new_tokens": 64}', "parameters")
    req = GenerationRequest(dialect=TGI, prompt=inputs, max_tokens_field="max_new_tokens")
    req.max_tokens = (_int(params, "max_new_tokens", 1, prefix="parameters.")
                      if params.get("max_new_tokens") is not None else DEFAULT_MAX_TOKENS[TGI])
    # TGI and LMI decode greedily unless asked to sample.
    do_sample = _bool(params, "do_sample", False, "parameters.")
    greedy = not do_sample and not any(params.get(k) is not None
                                      for k in ("temperature", "top_p", "top_k"))
    req.sampling = _sampling(params, temperature_default=0.0 if greedy else 1.0,
                             prefix="parameters.", stop_key="stop")
    req.details = _bool(params, "details", False, "parameters.")
    req.return_full_text = _bool(params, "return_full_text", False, "parameters.")
    req.priority = parse_priority(params, "parameters.")
    req.stream = _bool(data, "stream", False)
    return req


def parse_priority(data: dict[str, Any], prefix: str = "") -> int:
    """vLLM's scheduling priority (a vLLM extension of OpenAI's bodies; TGI/LMI's
    ``parameters.priority``): any 64-bit whole number, lower runs earlier, 0 when absent."""
    if data.get("priority") is None:
        return 0
    return _int(data, "priority", -(2**63), 2**63 - 1, prefix=prefix)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise BadRequest('messages must be a non-empty list of {"role": ..., "content": ...}',
                         "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object with role and content",
                             f"messages[{i}]")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise BadRequest(f"messages[{i}].role={role!r}: expected one of "
                             f"{', '.join(CHAT_ROLES)}", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):       # [{"type": "text", "text": ...}, ...]
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise BadRequest(f"messages[{i}].content[{j}]: only text parts "
                                     '{"type": "text", "text": ...} are supported',
                                     f"messages[{i}].content[{j}]")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string, got "
                             f"{type(content).__name__}", f"messages[{i}].content")
        out.append({"role": role, "content": content})
    return out


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if (isinstance(value, list) and value
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
        return value
    raise BadRequest("prompt must be a string (or a list of token ids); lists of several "
                     "prompts are not supported: send one request per prompt", "prompt")


def _sampling(data: dict[str, Any], temperature_default: float, prefix: str = "",
              stop_key: str = "stop") -> dict[str, Any]:
    out: dict[str, Any] = {
        "temperature": _float(data, "temperature", 0.0, 100.0, prefix, temperature_default),
        "top_p": _float(data, "top_p", 0.0, 1.0, prefix, 1.0, low_open=True),
    }
    if data.get("top_k") is not None:
        top_k = _int(data, "top_k", -1, prefix=prefix)
        out["top_k"] = -1 if top_k == 0 else top_k
    if data.get("seed") is not None:
        out["seed"] = _int(data, "seed", 0, 2**63 - 1, prefix=prefix)
    if data.get("repetition_penalty") is not None:
        out["repetition_penalty"] = _float(data, "repetition_penalty", 0.0, 100.0, prefix,
                                           low_open=True)
    for key in ("presence_penalty", "frequency_penalty"):
        if data.get(key) is not None:
            out[key] = _float(data, key, -2.0, 2.0, prefix)
    if data.get("min_tokens") is not None:
        out["min_tokens"] = _int(data, "min_tokens", 0, prefix=prefix)
    if data.get("ignore_eos") is not None:
        out["ignore_eos"] = _bool(data, "ignore_eos", False, prefix)
    stop = data.get(stop_key)
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
                or len(stop) > MAX_STOP_SEQUENCES):
            raise BadRequest(f"{prefix}{stop_key} must be a non-empty string or a list of at "
                             f"most {MAX_STOP_SEQUENCES} non-empty strings", prefix + stop_key)
        if stop:
            out["stop"] = stop
    return out


def _int(data: dict[str, Any], key: str, low: int, high: int | None = None,
         prefix: str = "") -> int:
    value = data.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{prefix}{key} must be a whole number, got {value!r}", prefix + key)
    if value < low or (high is not None and value > high):
        limit = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"{prefix}{key}={value} is out of range: it must be {limit}",
                         prefix + key)
    return value


def _float(data: dict[str, Any], key: str, low: float, high: float, prefix: str = "",
           default: float | None = None, low_open: bool = False) -> float:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadRequest(f"{prefix}{key} must be a number, got {value!r}", prefix + key)
    if value < low or value > high or (low_open and value == low):
        bound = f"greater than {low}" if low_open else f"at least {low}"
        raise BadRequest(f"{prefix}{key}={value} is out of range: it must be {bound} and at "
                         f"most {high}", prefix + key)
    return float(value)


def _bool(data: dict[str, Any], key: str, default: bool, prefix: str = "") -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{prefix}{key} must be true or false, got {value!r}", prefix + key)
    return value


def check_lengths(req: GenerationRequest, prompt_tokens: int, max_model_len: int) -> int:
    """The max_tokens to ask the engine for; BadRequest when the context cannot hold it."""
    field_name = {OPENAI_CHAT: "messages", TGI: "inputs"}.get(req.dialect, "prompt")
    if prompt_tokens >= max_model_len:
        raise BadRequest(f"{field_name} is {prompt_tokens} tokens but the model's context "
                         f"(max_model_len) is {max_model_len} tokens, which must also hold at "
                         f"least one output token: shorten it to at most {max_model_len - 1} "
                         "tokens", field_name)
    room = max_model_len - prompt_tokens
    if req.max_tokens is None:
        return room
    if req.max_tokens > room:
        where = "parameters." if req.dialect == TGI else ""
        raise BadRequest(f"{where}{req.max_tokens_field}={req.max_tokens} is more than the "
                         f"{room} tokens left in the context (max_model_len {max_model_len} − "
                         f"{prompt_tokens} prompt tokens): ask for at most {room}",
                         where + req.max_tokens_field)
    return req.max_tokens


# -- answering --------------------------------------------------------------------------------
@dataclass
class Finished:
    """What the answer's last part needs to know."""
    text: str
    finish_reason: str | None      # vLLM's: "length" | "stop" | "abort"
    stop_reason: str | int | None
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    seed: int | None = None


class Responder:
    """Writes one request's answer in its dialect. Subclasses per dialect."""

    sse_done = b"data: [DONE]\n\n"

    def __init__(self, req: GenerationRequest, model: str) -> None:
        self.req = req
        self.model = model
        self.created = int(time.time())

    def full(self, done: Finished) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> bytes:
        """Bytes sent before the first token (if any)."""
        return b""

    def delta(self, text: str, token_ids: list[int], logprobs: list[float | None] | None,
              finish_reason: str | None) -> bytes:
        raise NotImplementedError

    def end(self, done: Finished) -> bytes:
        raise NotImplementedError

    def usage(self, done: Finished) -> dict[str, int]:
        return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "total_tokens": done.prompt_tokens + done.completion_tokens}


class _OpenAIResponder(Responder):
    object_name = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, req: GenerationRequest, model: str) -> None:
        super().__init__(req, model)
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self._head = ('data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[' % (
            self.id, self.chunk_object, self.created, dumps_compact(model)))

    def end(self, done: Finished) -> bytes:
        if not self.req.include_usage:
            return self.sse_done
        usage = {"id": self.id, "object": self.chunk_object, "created": self.created,
                 "model": self.model, "choices": [], "usage": self.usage(done)}
        return b"data: " + dumps_compact(usage).encode() + b"\n\n" + self.sse_done

    def _envelope(self, choice: dict[str, Any], done: Finished) -> dict[str, Any]:
        return {"id": self.id, "object": self.object_name, "created": self.created,
                "model": self.model, "choices": [choice], "usage": self.usage(done)}


class CompletionResponder(_OpenAIResponder):
    object_name = chunk_object = "text_completion"
    id_prefix = "cmpl"

    def full(self, done: Finished) -> dict[str, Any]:
        return self._envelope({"index": 0, "text": done.text, "logprobs": None,
                               "finish_reason": done.finish_reason,
                               "stop_reason": done.stop_reason}, done)

    def delta(self, text, token_ids, logprobs, finish_reason) -> bytes:
        return (self._head + '{"index":0,"text":' + dumps_compact(text)
                + ',"logprobs":null,"finish_reason":'
                + (dumps_compact(finish_reason) if finish_reason else "null") + "}]}\n\n").encode()


class ChatResponder(_OpenAIResponder):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def full(self, done: Finished) -> dict[str, Any]:
        return self._envelope({"index": 0, "message": {"role": "assistant",
                                                       "content": done.text},
                               "logprobs": None, "finish_reason": done.finish_reason,
                               "stop_reason": done.stop_reason}, done)

    def start(self) -> bytes:
        return (self._head + '{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n').encode()

    def delta(self, text, token_ids, logprobs, finish_reason) -> bytes:
        return (self._head + '{"index":0,"delta":{"content":' + dumps_compact(text)
                + '},"logprobs":null,"finish_reason":'
                + (dumps_compact(finish_reason) if finish_reason else "null") + "}]}\n\n").encode()


class TgiResponder(Responder):
    """TGI's shapes: ``{"generated_text", "details"}``; streams one event per token."""

    def __init__(self, req: GenerationRequest, model: str, decode_one=None) -> None:
        super().__init__(req, model)
        self._decode_one = decode_one
        self._index = 0
        self._held: dict[str, Any] | None = None
        self._prefix = req.prompt if req.return_full_text and isinstance(req.prompt, str) else ""

    @staticmethod
    def finish_reason(done: Finished) -> str:
        if done.finish_reason == "length":
            return "length"
        return "stop_sequence" if isinstance(done.stop_reason, str) else "eos_token"

    def _details(self, done: Finished) -> dict[str, Any]:
        out: dict[str, Any] = {"finish_reason": self.finish_reason(done),
                               "generated_tokens": done.completion_tokens,
                               "input_tokens": done.prompt_tokens, "seed": done.seed}
        return out

    def _token(self, token_id: int, text: str, logprob: float | None) -> dict[str, Any]:
        return {"id": token_id, "text": text, "logprob": logprob, "special": False}

    def full(self, done: Finished) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": self._prefix + done.text}
        if self.req.details:
            details = self._details(done)
            logprobs = done.logprobs or [None] * len(done.token_ids)
            details["tokens"] = [self._token(t, self._decode_one(t) if self._decode_one else "",
                                             lp) for t, lp in zip(done.token_ids, logprobs)]
            out["details"] = details
        return out

    def delta(self, text, token_ids, logprobs, finish_reason) -> bytes:
        # One event per token, as TGI sends; the merged text rides on the last token of the
        # delta so that joining every event's text gives the answer exactly. The very last
        # token waits for end(), which adds generated_text and details to it, as TGI does.
        parts = []
        last = len(token_ids) - 1
        for i, token_id in enumerate(token_ids):
            event = {"index": self._index, "token": self._token(
                token_id, text if i == last else "", logprobs[i] if logprobs else None),
                "generated_text": None, "details": None}
            self._index += 1
            if finish_reason and i == last:
                self._held = event
            else:
                parts.append(b"data: " + dumps_compact(event).encode() + b"\n\n")
        return b"".join(parts)

    def end(self, done: Finished) -> bytes:
        event = self._held or {"index": self._index, "token": None}
        event["generated_text"] = self._prefix + done.text
        event["details"] = self._details(done) if self.req.details else None
        return b"data: " + dumps_compact(event).encode() + b"\n\n"


def responder_for(req: GenerationRequest, model: str, decode_one=None) -> Responder:
    if req.dialect == OPENAI_CHAT:
        return ChatResponder(req, model)
    if req.dialect == OPENAI_COMPLETIONS:
        return CompletionResponder(req, model)
    return TgiResponder(req, model, decode_one)
