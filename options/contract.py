"""One request shape and one result shape for every rung, and the wire dialects between them.

A ``Request`` becomes the body a rung speaks (Bedrock Converse, OpenAI completions or chat,
LMI/TGI ``inputs`` + ``parameters``) through that dialect's adapter, and the answer comes back
as a ``Result`` or as ``StreamEvent``s. Transports are separate from dialects: the same OpenAI
chat body can go to a local server over HTTP (``invoke_http``) or to a SageMaker endpoint
(``invoke_sagemaker``); only Bedrock has a transport of its own (``options.bedrock``).

Streams arrive as bytes cut anywhere (SageMaker ``PayloadPart``s are not aligned to lines,
events or UTF-8 characters): ``StreamDecoder`` buffers and splits them into messages.
"""
from __future__ import annotations

import codecs
import json
import time
from dataclasses import astuple, dataclass, field
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

from options.core import BadInput
from options.core.wire import (BEDROCK, OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_EMBEDDINGS, TGI,
                               canonical_dialect, detect_dialect as detect_dialect_name)

# Finish reasons, normalised: "stop" (end of sequence or a stop string), "length" (max_tokens).
# Anything else a server says is passed through unchanged.
_FINISH_REASONS = {
    "end_turn": "stop", "stop_sequence": "stop", "eos_token": "stop", "eos": "stop",
    "stop": "stop", "max_tokens": "length", "length": "length",
}


def normalise_finish_reason(reason: str | None) -> str | None:
    return _FINISH_REASONS.get(reason, reason) if reason else None


@dataclass
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None   # set where a price is known (Bedrock: usage × price table)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.cost_usd is not None:
            out["cost_usd"] = self.cost_usd
        return out


@dataclass
class Timings:
    """Client-side timings, as vLLM's ``vllm bench serve`` defines them.

    ``ttft_s``: request sent → first chunk carrying a token. ``itl_s``: gaps between such chunks.
    ``e2e_s``: request sent → last such chunk (so ``e2e_s == ttft_s + sum(itl_s)`` for a stream);
    for a buffered answer, request sent → answer read. A token's chunk counts even when its text
    is empty (the detokenizer holds back part of a character, or a tiny model's token has no
    text), as ``vllm bench serve`` counts it: otherwise a stream of such tokens has no timings.
    """
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    server_latency_s: float | None = None   # what the server says it took (Bedrock latencyMs)

    def to_json(self) -> dict[str, Any]:
        out = {"ttft_s": self.ttft_s, "e2e_s": self.e2e_s, "itl_s": list(self.itl_s)}
        if self.server_latency_s is not None:
            out["server_latency_s"] = self.server_latency_s
        return out


@dataclass
class Request:
    """What a user asks, whatever rung answers. Give ``prompt`` or ``messages`` (not both).

    ``messages`` are OpenAI-style ``{"role": "user"|"assistant", "content": str}``;
    ``system`` is kept apart so every dialect can place it where it belongs.
    ``ignore_eos`` (for benchmarks) makes servers that support it generate exactly
    ``max_tokens`` tokens; Bedrock has no such switch and ignores it.
    ``priority`` is vLLM's scheduling priority (lower runs earlier; 0 is the default): sent as
    ``priority`` in OpenAI bodies and ``parameters.priority`` in TGI/LMI ones. It takes effect
    only on an engine started with the priority scheduling policy (the bring-your-own server
    refuses a nonzero priority otherwise). Bedrock Converse has no such field: its wire form
    leaves it out.
    """
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    system: str | None = None
    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    stream: bool = False
    ignore_eos: bool = False
    model: str | None = None      # the model name OpenAI-style servers and Bedrock need
    priority: int | None = None
    # OpenAI function tools and the choice among them ("auto", "required", "none" or
    # {"type": "function", "function": {"name": ...}}): the openai-chat dialect carries them.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise BadInput("a request needs exactly one of prompt (text) or messages "
                           f"(a list of {{'role', 'content'}}); got prompt={self.prompt!r}, "
                           f"messages={self.messages!r}")
        if self.messages is not None:
            if not self.messages:
                raise BadInput("messages is empty: give at least one {'role': 'user', 'content': ...}")
            for m in self.messages:
                if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") \
                        or not isinstance(m.get("content"), str):
                    raise BadInput(f"message {m!r} is not {{'role': 'user'|'assistant', "
                                   "'content': str}} (put a system prompt in Request.system)")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise BadInput(f"max_tokens={self.max_tokens!r} must be a whole number ≥ 1")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise BadInput(f"temperature={self.temperature!r} must be between 0 and 2")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise BadInput(f"top_p={self.top_p!r} must be in (0, 1]")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.priority is not None and (not isinstance(self.priority, int)
                                          or isinstance(self.priority, bool)):
            raise BadInput(f"priority={self.priority!r} must be a whole number (lower runs "
                           "earlier; 0 is the default), e.g. priority=-1")
        if self.tools is not None:
            for t in self.tools:
                fn = t.get("function") if isinstance(t, dict) else None
                if not (isinstance(t, dict) and t.get("type") == "function"
                        and isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
                    raise BadInput(f"tool {t!r} is not an OpenAI function tool: "
                                   "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")
        if self.tool_choice is not None and not self.tools:
            raise BadInput(f"tool_choice={self.tool_choice!r} without tools: give the tools to "
                           "choose from, or leave tool_choice out")

    def refuse_tools(self, dialect_name: str) -> None:
        """BadInput when this request carries tools a dialect cannot say."""
        if self.tools:
            raise BadInput(f"the {dialect_name} dialect cannot carry tools: send the request "
                           f"with tools through {OPENAI_CHAT}, or leave the tools out")

    def as_messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.messages] if self.messages is not None \
            else [{"role": "user", "content": self.prompt}]

    def as_text(self) -> str:
        """The prompt for text-only dialects: the system prompt, then the user's text."""
        if self.messages is not None:
            raise BadInput("this dialect takes a plain prompt, not a conversation: send "
                           "messages through a chat dialect (openai-chat or bedrock)")
        return f"{self.system}\n\n{self.prompt}" if self.system else self.prompt

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _from_messages(messages: list[dict[str, Any]], **kw: Any) -> Request:
    """A Request from chat messages; one user message becomes a plain prompt again."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return Request(prompt=messages[0]["content"], **kw)
    return Request(messages=messages, **kw)


@dataclass
class StreamEvent:
    """One thing a stream said: a text delta, the token usage, or the finish reason."""
    kind: str                       # "text" | "usage" | "finish" | "tool_call"
    text: str = ""                  # a text delta, or a tool call's arguments delta
    tool: tuple[int, str | None] | None = None     # a tool call's (index, name when first said)
    usage: Usage | None = None
    finish_reason: str | None = None
    t: float = field(default_factory=time.perf_counter)   # when the client saw it


@dataclass
class Result:
    text: str
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    raw: Any = None                 # the decoded answer body, for debugging and --json
    tool_calls: list[dict[str, str]] = field(default_factory=list)   # [{"name", "arguments"}]

    def to_json(self) -> dict[str, Any]:
        out = {"text": self.text, "finish_reason": self.finish_reason,
               "usage": self.usage.to_json(), "timings": self.timings.to_json()}
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        return out


def collect(events: Iterable[StreamEvent], started: float | None = None) -> Result:
    """Fold a stream into a Result with timings measured from ``started`` (perf_counter)."""
    text: list[str] = []
    usage, finish = Usage(), None
    times: list[float] = []
    calls: dict[int, dict[str, str]] = {}
    for ev in events:
        if ev.kind == "text":           # a token's chunk, timed even when its text is held back
            text.append(ev.text)
            times.append(ev.t)
        elif ev.kind == "tool_call" and ev.tool is not None:
            index, name = ev.tool
            call = calls.setdefault(index, {"name": "", "arguments": ""})
            call["name"] = name or call["name"]
            call["arguments"] += ev.text
            times.append(ev.t)
        elif ev.kind == "usage" and ev.usage:
            usage = Usage(*(new if new is not None else old
                            for new, old in zip(astuple(ev.usage), astuple(usage))))
        elif ev.kind == "finish":
            finish = ev.finish_reason
    timings = Timings()
    if times and started is not None:
        timings = Timings(ttft_s=times[0] - started, e2e_s=times[-1] - started,
                          itl_s=[b - a for a, b in zip(times, times[1:])])
    return Result("".join(text), finish, usage, timings,
                  tool_calls=[calls[i] for i in sorted(calls)])


# ---------------------------------------------------------------------------------------------
# Dialects. Each adapter maps both ways, so a server (or a test) can use the same code:
#   to_wire(Request) -> body          from_wire(body) -> Request
#   result_to_wire(Result) -> body    result_from_wire(body) -> Result
#   stream_to_wire(StreamEvent) -> message | None      events_from_wire(message) -> [StreamEvent]
# ---------------------------------------------------------------------------------------------

class Dialect:
    name: str = ""
    path: str = "/invocations"      # where an HTTP server takes this dialect

    def to_wire(self, req: Request) -> dict[str, Any]: raise NotImplementedError
    def from_wire(self, body: dict[str, Any]) -> Request: raise NotImplementedError
    def result_to_wire(self, res: Result) -> dict[str, Any]: raise NotImplementedError
    def result_from_wire(self, body: Any) -> Result: raise NotImplementedError
    def stream_to_wire(self, ev: StreamEvent) -> dict[str, Any] | None: raise NotImplementedError
    def events_from_wire(self, msg: Any) -> list[StreamEvent]: raise NotImplementedError


def _opt(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _openai_usage(u: dict[str, Any] | None) -> Usage | None:
    if not u:
        return None
    return Usage(_int(u.get("prompt_tokens")), _int(u.get("completion_tokens")))


def _openai_usage_wire(u: Usage) -> dict[str, Any]:
    i, o = u.input_tokens or 0, u.output_tokens or 0
    return {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}


class _OpenAI(Dialect):
    """What the two OpenAI dialects share: sampling fields, usage, finish reasons, SSE chunks."""

    def _common(self, req: Request) -> dict[str, Any]:
        body = _opt(model=req.model, max_tokens=req.max_tokens, temperature=req.temperature,
                    top_p=req.top_p, stop=req.stop)
        if req.ignore_eos:
            body["ignore_eos"] = True          # a vLLM extension to the OpenAI schema
        if req.priority is not None:
            body["priority"] = req.priority    # so is this
        if req.stream:
            body["stream"] = True
            # Without this an OpenAI stream carries no token counts at all.
            body["stream_options"] = {"include_usage": True}
        return body

    def _common_back(self, body: dict[str, Any]) -> dict[str, Any]:
        stop = body.get("stop")
        return _opt(model=body.get("model"), max_tokens=body.get("max_tokens", 256),
                    temperature=body.get("temperature"), top_p=body.get("top_p"),
                    stop=[stop] if isinstance(stop, str) else stop,
                    stream=bool(body.get("stream", False)),
                    ignore_eos=bool(body.get("ignore_eos", False)), priority=body.get("priority"))

    def _text_field(self, choice: dict[str, Any], streaming: bool) -> Any:
        """The choice's text as the wire has it (absent, a string, or content parts)."""
        raise NotImplementedError

    def _choice_text(self, choice: dict[str, Any], streaming: bool) -> str:
        return _content_text(self._text_field(choice, streaming))

    def _carries_token(self, choice: dict[str, Any]) -> bool:
        """A streamed choice with a text field but no text still brought a token, unless it
        only says the finish reason."""
        return isinstance(self._text_field(choice, True), str) and not choice.get("finish_reason")

    def result_from_wire(self, body: Any) -> Result:
        choices = body.get("choices") or [{}]
        return Result(self._choice_text(choices[0], False) or "",
                      normalise_finish_reason(choices[0].get("finish_reason")),
                      _openai_usage(body.get("usage")) or Usage(), raw=body)

    def events_from_wire(self, msg: Any) -> list[StreamEvent]:
        if isinstance(msg, dict) and "error" in msg:
            raise StreamError(_error_text(msg["error"]))
        out: list[StreamEvent] = []
        for choice in msg.get("choices") or []:
            text = self._choice_text(choice, True)
            if text or self._carries_token(choice):
                out.append(StreamEvent("text", text=text))
            if choice.get("finish_reason"):
                out.append(StreamEvent("finish",
                                       finish_reason=normalise_finish_reason(choice["finish_reason"])))
        usage = _openai_usage(msg.get("usage"))
        if usage:
            out.append(StreamEvent("usage", usage=usage))
        return out


class OpenAICompletions(_OpenAI):
    name = OPENAI_COMPLETIONS
    path = "/v1/completions"

    def to_wire(self, req: Request) -> dict[str, Any]:
        req.refuse_tools(self.name)
        return {"prompt": req.as_text(), **self._common(req)}

    def from_wire(self, body: dict[str, Any]) -> Request:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadInput(f"prompt must be a string, got {prompt!r}")
        return Request(prompt=prompt, **self._common_back(body))

    def _text_field(self, choice: dict[str, Any], streaming: bool) -> Any:
        return choice.get("text")

    def result_to_wire(self, res: Result) -> dict[str, Any]:
        return {"object": "text_completion",
                "choices": [{"index": 0, "text": res.text, "finish_reason": res.finish_reason}],
                "usage": _openai_usage_wire(res.usage)}

    def stream_to_wire(self, ev: StreamEvent) -> dict[str, Any] | None:
        if ev.kind == "usage":
            return {"object": "text_completion", "choices": [], "usage": _openai_usage_wire(ev.usage)}
        return {"object": "text_completion",
                "choices": [{"index": 0, "text": ev.text, "finish_reason": ev.finish_reason}]}


class OpenAIChat(_OpenAI):
    name = OPENAI_CHAT
    path = "/v1/chat/completions"

    def to_wire(self, req: Request) -> dict[str, Any]:
        system = [{"role": "system", "content": req.system}] if req.system else []
        return {"messages": system + req.as_messages(), **self._common(req),
                **_opt(tools=req.tools, tool_choice=req.tool_choice)}

    def result_from_wire(self, body: Any) -> Result:
        result = super().result_from_wire(body)
        message = ((body.get("choices") or [{}])[0].get("message") or {})
        result.tool_calls = [{"name": (c.get("function") or {}).get("name") or "",
                              "arguments": (c.get("function") or {}).get("arguments") or ""}
                             for c in message.get("tool_calls") or []]
        return result

    def events_from_wire(self, msg: Any) -> list[StreamEvent]:
        said = super().events_from_wire(msg)
        calls = [StreamEvent("tool_call", text=(call.get("function") or {}).get("arguments") or "",
                             tool=(int(call.get("index") or 0),
                                   (call.get("function") or {}).get("name")))
                 for choice in msg.get("choices") or []
                 for call in (choice.get("delta") or {}).get("tool_calls") or []]
        return calls + said          # the finish reason comes after the calls it ends

    def from_wire(self, body: dict[str, Any]) -> Request:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadInput(f"messages must be a non-empty list, got {messages!r}")
        system = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "system"]
        rest = [{"role": m.get("role"), "content": _content_text(m.get("content"))}
                for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
        return _from_messages(rest, system="\n\n".join(map(_content_text, system)) or None,
                              **self._common_back(body),
                              **_opt(tools=body.get("tools"), tool_choice=body.get("tool_choice")))

    def _text_field(self, choice: dict[str, Any], streaming: bool) -> Any:
        return (choice.get("delta" if streaming else "message") or {}).get("content")

    def result_to_wire(self, res: Result) -> dict[str, Any]:
        return {"object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": res.text},
                             "finish_reason": res.finish_reason}],
                "usage": _openai_usage_wire(res.usage)}

    def stream_to_wire(self, ev: StreamEvent) -> dict[str, Any] | None:
        if ev.kind == "usage":
            return {"object": "chat.completion.chunk", "choices": [],
                    "usage": _openai_usage_wire(ev.usage)}
        delta = {"content": ev.text} if ev.kind == "text" else {}
        return {"object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": ev.finish_reason}]}


def _content_text(content: Any) -> str:
    """OpenAI content is a string or a list of parts; only text parts matter here."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class TgiInputs(Dialect):
    """HF TGI / AWS LMI: ``{"inputs": text, "parameters": {...}, "stream": bool}``.

    Answers: ``{"generated_text", "details": {"finish_reason", "generated_tokens", ...}}`` (or a
    one-element list of it); streams send ``{"token": {"text"}, "generated_text", "details"}``
    per line (LMI jsonlines) or per SSE event (TGI, LMI sse).
    """
    name = TGI

    def to_wire(self, req: Request) -> dict[str, Any]:
        req.refuse_tools(self.name)
        params = _opt(max_new_tokens=req.max_tokens, temperature=req.temperature,
                      top_p=req.top_p, stop=req.stop)
        if req.temperature:                  # TGI samples only when asked to
            params["do_sample"] = True
        if req.ignore_eos:
            params["ignore_eos"] = True      # LMI passes vLLM sampling parameters through
        if req.priority is not None:
            params["priority"] = req.priority
        params["details"] = True             # ask for token counts and the finish reason
        body: dict[str, Any] = {"inputs": req.as_text(), "parameters": params}
        if req.stream:
            body["stream"] = True
        return body

    def from_wire(self, body: dict[str, Any]) -> Request:
        inputs = body.get("inputs")
        if not isinstance(inputs, str):
            raise BadInput(f"inputs must be a string, got {inputs!r}")
        p = body.get("parameters") or {}
        if not isinstance(p, dict):
            raise BadInput(f"parameters must be an object, got {p!r}")
        stop = p.get("stop")
        return Request(prompt=inputs, **_opt(
            max_tokens=p.get("max_new_tokens", 256), temperature=p.get("temperature"),
            top_p=p.get("top_p"), stop=[stop] if isinstance(stop, str) else stop,
            stream=bool(body.get("stream", False)), ignore_eos=bool(p.get("ignore_eos", False)),
            priority=p.get("priority")))

    @staticmethod
    def _usage(body: dict[str, Any]) -> Usage:
        if isinstance(body.get("usage"), dict):       # servers that also report OpenAI usage
            return _openai_usage(body["usage"]) or Usage()
        d = body.get("details") or {}
        inputs = _int(d.get("input_tokens"))
        if inputs is None and isinstance(d.get("prefill"), list) and d["prefill"]:
            inputs = len(d["prefill"])
        return Usage(inputs, _int(d.get("generated_tokens")))

    def result_from_wire(self, body: Any) -> Result:
        if isinstance(body, list):
            body = body[0] if body else {}
        return Result(body.get("generated_text") or "",
                      normalise_finish_reason((body.get("details") or {}).get("finish_reason")),
                      self._usage(body), raw=body)

    def result_to_wire(self, res: Result) -> dict[str, Any]:
        return {"generated_text": res.text,
                "details": _opt(finish_reason=res.finish_reason,
                                generated_tokens=res.usage.output_tokens,
                                input_tokens=res.usage.input_tokens)}

    def events_from_wire(self, msg: Any) -> list[StreamEvent]:
        if "error" in msg:
            raise StreamError(_error_text(msg["error"]))
        out: list[StreamEvent] = []
        token = msg.get("token")
        if isinstance(token, dict) and not token.get("special"):
            out.append(StreamEvent("text", text=token.get("text") or ""))
        details = msg.get("details")
        if details or isinstance(msg.get("usage"), dict):
            usage = self._usage(msg)
            if usage.input_tokens is not None or usage.output_tokens is not None:
                out.append(StreamEvent("usage", usage=usage))
            if details and details.get("finish_reason"):
                out.append(StreamEvent("finish",
                                       finish_reason=normalise_finish_reason(details["finish_reason"])))
        return out

    def stream_to_wire(self, ev: StreamEvent) -> dict[str, Any] | None:
        if ev.kind == "text":
            return {"token": {"text": ev.text}, "generated_text": None, "details": None}
        if ev.kind == "usage":
            return {"token": None, "generated_text": None,
                    "details": _opt(generated_tokens=ev.usage.output_tokens,
                                    input_tokens=ev.usage.input_tokens)}
        return {"token": None, "generated_text": None, "details": {"finish_reason": ev.finish_reason}}


class BedrockConverse(Dialect):
    """Bedrock Converse: the keyword arguments of ``converse``/``converse_stream`` and their answers.

    Converse has no scheduling priority (nor ``ignore_eos``): a Request's ``priority`` stays
    out of its wire form, as botocore would refuse an unknown parameter."""
    name = BEDROCK
    path = ""

    _STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}

    def to_wire(self, req: Request) -> dict[str, Any]:
        req.refuse_tools(self.name)
        if not req.model:
            raise BadInput("Bedrock needs a model id (e.g. amazon.nova-micro-v1:0 or a "
                           "cross-region profile such as us.amazon.nova-micro-v1:0)")
        body: dict[str, Any] = {
            "modelId": req.model,
            "messages": [{"role": m["role"], "content": [{"text": m["content"]}]}
                         for m in req.as_messages()],
            "inferenceConfig": _opt(maxTokens=req.max_tokens, temperature=req.temperature,
                                    topP=req.top_p, stopSequences=req.stop),
        }
        if req.system:
            body["system"] = [{"text": req.system}]
        return body

    def from_wire(self, body: dict[str, Any]) -> Request:
        cfg = body.get("inferenceConfig") or {}
        messages = [{"role": m["role"], "content": _blocks_text(m.get("content"))}
                    for m in body.get("messages") or []]
        return _from_messages(messages, system=_blocks_text(body.get("system")) or None,
                              **_opt(model=body.get("modelId"), max_tokens=cfg.get("maxTokens", 256),
                                     temperature=cfg.get("temperature"), top_p=cfg.get("topP"),
                                     stop=cfg.get("stopSequences")))

    @staticmethod
    def _usage(u: dict[str, Any] | None) -> Usage:
        u = u or {}
        return Usage(_int(u.get("inputTokens")), _int(u.get("outputTokens")))

    def result_from_wire(self, body: Any) -> Result:
        message = (body.get("output") or {}).get("message") or {}
        return Result(_blocks_text(message.get("content")),
                      normalise_finish_reason(body.get("stopReason")),
                      self._usage(body.get("usage")), raw=body)

    def result_to_wire(self, res: Result) -> dict[str, Any]:
        u = res.usage
        return {"output": {"message": {"role": "assistant", "content": [{"text": res.text}]}},
                "stopReason": self._STOP_REASONS.get(res.finish_reason, res.finish_reason),
                "usage": {"inputTokens": u.input_tokens or 0, "outputTokens": u.output_tokens or 0,
                          "totalTokens": (u.input_tokens or 0) + (u.output_tokens or 0)},
                "metrics": {"latencyMs": int((res.timings.e2e_s or 0) * 1000)}}

    def events_from_wire(self, msg: Any) -> list[StreamEvent]:
        """One event of ``converse_stream``'s ``stream`` (already parsed by botocore)."""
        for key in ("internalServerException", "modelStreamErrorException", "validationException",
                    "throttlingException", "serviceUnavailableException"):
            if key in msg:
                raise StreamError(f"{key}: {_error_text(msg[key])}")
        if "contentBlockDelta" in msg:
            text = (msg["contentBlockDelta"].get("delta") or {}).get("text")
            return [StreamEvent("text", text=text)] if text else []
        if "messageStop" in msg:
            return [StreamEvent("finish",
                                finish_reason=normalise_finish_reason(msg["messageStop"].get("stopReason")))]
        if "metadata" in msg:
            return [StreamEvent("usage", usage=self._usage(msg["metadata"].get("usage")))]
        return []

    def stream_to_wire(self, ev: StreamEvent) -> dict[str, Any] | None:
        if ev.kind == "text":
            return {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": ev.text}}}
        if ev.kind == "finish":
            return {"messageStop": {"stopReason": self._STOP_REASONS.get(ev.finish_reason,
                                                                          ev.finish_reason)}}
        u = ev.usage or Usage()
        return {"metadata": {"usage": {"inputTokens": u.input_tokens or 0,
                                       "outputTokens": u.output_tokens or 0,
                                       "totalTokens": (u.input_tokens or 0) + (u.output_tokens or 0)},
                             "metrics": {"latencyMs": 0}}}


def _blocks_text(blocks: Any) -> str:
    return "".join(b.get("text", "") for b in blocks or [] if isinstance(b, dict))


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err.get("Message") or err)
    return str(err)


# One adapter per wire dialect, keyed by the dialect's one name (options.core.wire).
DIALECTS: dict[str, Dialect] = {d.name: d for d in
                                (OpenAIChat(), OpenAICompletions(), TgiInputs(), BedrockConverse())}


def dialect(name: str | Dialect) -> Dialect:
    """The adapter for a dialect's name or alias (``lmi`` is TGI's shape, as LMI speaks it)."""
    if isinstance(name, Dialect):
        return name
    return DIALECTS[canonical_dialect(name)]


def detect_dialect(body: dict[str, Any]) -> Dialect:
    """Which dialect a request body is in: the one detection the server uses too."""
    name = detect_dialect_name(body)
    if name == OPENAI_EMBEDDINGS:
        raise BadInput("this body ('input') asks for embeddings, not generation: read its "
                       "answer with embeddings_from_wire")
    return DIALECTS[name]


# ---------------------------------------------------------------------------------------------
# Embeddings (OpenAI's /v1/embeddings shape; not a generation dialect). The bring-your-own
# server answers it at /v1/embeddings and /invocations when its engine runs a pooling model.
# ---------------------------------------------------------------------------------------------

@dataclass
class Embeddings:
    """One vector per input, in the inputs' order, and the tokens the server counted."""
    vectors: list[list[float]]
    input_tokens: int | None = None
    model: str | None = None
    timings: Timings = field(default_factory=Timings)
    raw: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"vectors": self.vectors, "input_tokens": self.input_tokens, "model": self.model,
                "timings": self.timings.to_json()}


def embeddings_to_wire(texts: list[str], model: str | None = None,
                       encoding_format: str | None = None) -> dict[str, Any]:
    """The OpenAI embeddings body for ``texts`` (``encoding_format``: float | base64)."""
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise BadInput(f"embeddings need a non-empty list of non-empty texts, got {texts!r}")
    if encoding_format not in (None, "float", "base64"):
        raise BadInput(f"encoding_format={encoding_format!r} must be float or base64")
    return {"input": list(texts), **_opt(model=model, encoding_format=encoding_format)}


def embeddings_from_wire(body: Any) -> Embeddings:
    """An embeddings answer: OpenAI's ``{"data": [{"index", "embedding"}], "usage"}`` (vectors
    as floats or base64 of little-endian float32), or TEI's bare list of vectors."""
    import base64
    import struct

    if isinstance(body, list):
        return Embeddings([[float(x) for x in v] for v in body], raw=body)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise InvokeError(f"not an embeddings answer (no 'data' list): {str(body)[:200]}",
                          kind="bad_response")
    vectors: list[list[float]] = []
    for item in sorted(data, key=lambda d: d.get("index", 0)):
        vec = item.get("embedding")
        if isinstance(vec, str):
            raw = base64.b64decode(vec)
            vec = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        vectors.append([float(x) for x in vec])
    usage = body.get("usage") or {}
    return Embeddings(vectors, _int(usage.get("prompt_tokens")), body.get("model"), raw=body)


def embed_http(base_url: str, texts: list[str], *, model: str | None = None,
               path: str | None = None, encoding_format: str | None = None,
               timeout_s: float = 600.0, headers: dict[str, str] | None = None) -> Embeddings:
    """POST an embeddings request (``/v1/embeddings`` unless ``path`` or the URL names one)."""
    body = json.dumps(embeddings_to_wire(texts, model, encoding_format)).encode()
    started = time.perf_counter()
    conn, resp = _http_post(base_url, path, "/v1/embeddings", body, "application/json",
                            timeout_s, headers)
    try:
        raw = resp.read()
    finally:
        conn.close()
    out = embeddings_from_wire(_json_body(raw))
    out.timings = Timings(e2e_s=time.perf_counter() - started)
    return out


def embed_sagemaker(runtime_client: Any, endpoint_name: str, texts: list[str], *,
                    model: str | None = None) -> Embeddings:
    """Embeddings from a SageMaker endpoint (its ``/invocations`` takes OpenAI's body)."""
    started = time.perf_counter()
    resp = runtime_client.invoke_endpoint(
        EndpointName=endpoint_name, ContentType="application/json", Accept="application/json",
        Body=json.dumps(embeddings_to_wire(texts, model)).encode())
    out = embeddings_from_wire(_json_body(resp["Body"].read()))
    out.timings = Timings(e2e_s=time.perf_counter() - started)
    return out


# ---------------------------------------------------------------------------------------------
# Streams as bytes
# ---------------------------------------------------------------------------------------------

class StreamError(RuntimeError):
    """The server reported an error in the middle of a stream."""


class StreamDecoder:
    """Bytes cut anywhere → decoded messages (dicts), for SSE and JSON-lines streams.

    ``feed(bytes)`` returns the messages completed by those bytes; ``close()`` the rest.
    UTF-8 characters split across parts are held back by an incremental decoder; lines split
    across parts wait in a buffer. ``data: [DONE]`` ends the stream. Only single-line SSE data
    is supported, which is what vLLM, TGI and LMI send.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._pending = ""
        self.done = False

    def feed(self, data: bytes) -> list[Any]:
        self._pending += self._utf8.decode(data)
        *lines, self._pending = self._pending.split("\n")
        return [m for m in map(self._line, lines) if m is not None]

    def close(self) -> list[Any]:
        rest = self._pending + self._utf8.decode(b"", final=True)
        self._pending = ""
        m = self._line(rest)
        return [m] if m is not None else []

    def _line(self, line: str) -> Any:
        line = line.strip()
        if not line or self.done or line.startswith(":"):
            return None
        if line.startswith("data:"):
            line = line[5:].strip()
            if line == "[DONE]":
                self.done = True
                return None
        elif line.startswith(("event:", "id:", "retry:")):
            return None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise StreamError(f"the stream sent a line that is not JSON: {line[:200]!r}") from None


SSE_DONE = b"data: [DONE]\n\n"


def sse_message(message: Any) -> bytes:
    """One server-sent event carrying ``message`` as JSON (what a streaming server writes)."""
    return b"data: " + json.dumps(message, ensure_ascii=False).encode() + b"\n\n"


def sse_stream(events: Iterable[StreamEvent], dia: str | Dialect) -> Iterator[bytes]:
    """The SSE bytes a server in dialect ``dia`` sends for ``events``, ending with [DONE]."""
    d = dialect(dia)
    for ev in events:
        message = d.stream_to_wire(ev)
        if message is not None:
            yield sse_message(message)
    yield SSE_DONE


def events_from_bytes(parts: Iterable[bytes], dia: str | Dialect) -> Iterator[StreamEvent]:
    """Stream events from raw stream bytes in any split (HTTP chunks, SageMaker PayloadParts)."""
    d, dec = dialect(dia), StreamDecoder()
    for part in parts:
        for msg in dec.feed(part):
            yield from d.events_from_wire(msg)
    for msg in dec.close():
        yield from d.events_from_wire(msg)


# ---------------------------------------------------------------------------------------------
# Transports
# ---------------------------------------------------------------------------------------------

class InvokeError(RuntimeError):
    """The server answered with an error status. ``kind`` names it for error counts."""

    def __init__(self, message: str, kind: str = "error", status: int | None = None):
        super().__init__(message)
        self.kind, self.status = kind, status


def invoke_http(base_url: str, request: Request, dialect_name: str | Dialect = OPENAI_COMPLETIONS,
                *, path: str | None = None, timeout_s: float = 600.0,
                headers: dict[str, str] | None = None) -> Result | Iterator[StreamEvent]:
    """POST ``request`` to a server in ``dialect_name``; a Result, or StreamEvents if streaming.

    The path is ``path`` if given, else the one in ``base_url`` if it has one, else the
    dialect's usual path (``/v1/completions``, ``/v1/chat/completions``, ``/invocations``).
    A Result's timings are measured here; a stream's events carry their arrival times (fold
    them with ``collect(events, started)``, ``started`` being ``time.perf_counter()`` taken
    before the call).
    """
    d = dialect(dialect_name)
    body = json.dumps(d.to_wire(request)).encode()
    started = time.perf_counter()
    conn, resp = _http_post(base_url, path, d.path or "/invocations", body,
                            "text/event-stream" if request.stream else "application/json",
                            timeout_s, headers)
    if request.stream:
        return _http_events(conn, resp, d)
    try:
        raw = resp.read()
    finally:
        conn.close()
    result = d.result_from_wire(_json_body(raw))
    result.timings = Timings(ttft_s=None, e2e_s=time.perf_counter() - started)
    return result


def _http_post(base_url: str, path: str | None, default_path: str, body: bytes, accept: str,
               timeout_s: float, headers: dict[str, str] | None) -> tuple[Any, Any]:
    """POST ``body`` to ``path``, else the URL's own path, else ``default_path``: the open
    connection and its response (status < 400); InvokeError otherwise."""
    import http.client

    url = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise BadInput(f"base URL {base_url!r} is not an http(s) URL such as http://127.0.0.1:8080")
    target = path or (url.path if url.path not in ("", "/") else default_path)
    conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(url.hostname, url.port, timeout=timeout_s)
    try:
        conn.request("POST", target, body=body, headers={
            "Content-Type": "application/json", "Accept": accept, **(headers or {})})
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        raise InvokeError(f"could not reach {base_url}{target}: {e}", kind="connection") from e
    if resp.status >= 400:
        detail = resp.read()[:500].decode("utf-8", "replace")
        conn.close()
        raise InvokeError(f"{base_url}{target} answered HTTP {resp.status}: {detail}",
                          kind=f"http_{resp.status}", status=resp.status)
    return conn, resp


def _http_events(conn: Any, resp: Any, d: Dialect) -> Iterator[StreamEvent]:
    def parts() -> Iterator[bytes]:
        while chunk := resp.read1(65536):
            yield chunk
    try:
        yield from events_from_bytes(parts(), d)
    finally:
        conn.close()


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvokeError(f"the answer is not JSON: {raw[:200]!r}", kind="bad_response") from None


def invoke_sagemaker(runtime_client: Any, endpoint_name: str, request: Request,
                     dialect_name: str | Dialect = OPENAI_CHAT, *,
                     custom_attributes: str | None = None) -> Result | Iterator[StreamEvent]:
    """Invoke a SageMaker endpoint through boto3's ``sagemaker-runtime`` client.

    Streaming requests use ``invoke_endpoint_with_response_stream`` and reassemble the
    PayloadParts, which may split lines, events and UTF-8 characters anywhere.
    """
    d = dialect(dialect_name)
    kw: dict[str, Any] = {"EndpointName": endpoint_name, "ContentType": "application/json",
                          "Body": json.dumps(d.to_wire(request)).encode()}
    if custom_attributes:
        kw["CustomAttributes"] = custom_attributes
    started = time.perf_counter()
    if request.stream:
        resp = runtime_client.invoke_endpoint_with_response_stream(**kw)
        return events_from_bytes(_payload_parts(resp["Body"]), d)
    resp = runtime_client.invoke_endpoint(Accept="application/json", **kw)
    result = d.result_from_wire(_json_body(resp["Body"].read()))
    result.timings = Timings(e2e_s=time.perf_counter() - started)
    return result


def _payload_parts(stream: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    from botocore.exceptions import EventStreamError

    try:
        for event in stream:
            if "PayloadPart" in event:
                yield event["PayloadPart"].get("Bytes", b"")
            elif "ModelStreamError" in event or "InternalStreamFailure" in event:
                (key, err), = event.items()
                raise StreamError(f"{key}: {_error_text(err)}")
    except EventStreamError as e:      # exceptions sent inside the event stream
        raise StreamError(str(e)) from e
