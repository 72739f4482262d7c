"""Embeddings requests and answers, for a server whose engine runs a pooling model
(``SM_VLLM_RUNNER=pooling``, or a model whose own config makes it one).

Two body shapes:
- OpenAI's (``POST /v1/embeddings``; on ``/invocations`` a body with ``input`` and none of the
  generation dialects' keys): ``{"input": text | [texts] | [token ids] | [[token ids]],
  "model"?, "encoding_format": "float" | "base64", "dimensions"?, "user"?, "priority"?}``,
  answered ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding":
  [...]}], "model", "usage": {"prompt_tokens", "total_tokens"}}``. base64 is the vector's
  little-endian float32 bytes, as OpenAI sends it.
- Hugging Face's feature extraction, as TEI serves it on SageMaker (``/invocations`` of a
  pooling server with ``{"inputs": text | [texts]}``): answered with the bare list of vectors,
  one per input, always a list of lists (TEI's ``/embed``).
"""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from .dialects import BadRequest, parse_priority

OPENAI = "openai"
TEI = "tei"
# OpenAI's limit on inputs per request.
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


@dataclass
class EmbeddingRequest:
    inputs: list[str | list[int]]
    shape: str                       # OPENAI | TEI: how the answer is written
    field: str                       # "input" | "inputs": named in error messages
    encoding_format: str = "float"
    dimensions: int | None = None
    priority: int = 0


def parse_embeddings(data: dict[str, Any], shape: str) -> EmbeddingRequest:
    """An embeddings body (already decoded) as an EmbeddingRequest; BadRequest names the
    field that is wrong."""
    if shape == TEI:
        return _parse_tei(data)
    if "input" not in data:
        raise BadRequest('the body needs "input": a text, a list of texts, a list of token '
                         'ids or a list of such lists, e.g. {"input": ["first", "second"]}',
                         "input")
    req = EmbeddingRequest(_inputs(data["input"], "input"), OPENAI, "input")
    fmt = data.get("encoding_format")
    if fmt is not None:
        if fmt not in ENCODINGS:
            raise BadRequest(f"encoding_format={fmt!r} must be one of {', '.join(ENCODINGS)}",
                             "encoding_format")
        req.encoding_format = fmt
    dims = data.get("dimensions")
    if dims is not None:
        if not isinstance(dims, int) or isinstance(dims, bool) or dims < 1:
            raise BadRequest(f"dimensions={dims!r} must be a whole number ≥ 1", "dimensions")
        req.dimensions = dims
    req.priority = parse_priority(data)
    return req


def _parse_tei(data: dict[str, Any]) -> EmbeddingRequest:
    req = EmbeddingRequest(_inputs(data.get("inputs"), "inputs", tokens=False), TEI, "inputs")
    # vLLM's embedding pooler normalises; TEI's switches that say otherwise can't be honoured.
    for key, honoured in (("normalize", True), ("truncate", False)):
        value = data.get(key)
        if value is not None and value is not honoured:
            raise BadRequest(f"{key}={value!r} is not supported here: this server's vectors "
                             f"are always {'normalised' if honoured else 'of whole inputs'}; "
                             f"send {key}={str(honoured).lower()} or leave it out", key)
    return req


def _inputs(value: Any, field: str, tokens: bool = True) -> list[str | list[int]]:
    """OpenAI's ``input`` forms as a list: one text, texts, one token list, token lists."""
    what = ("a text, a list of texts, a list of token ids or a list of such lists" if tokens
            else "a text or a list of texts")
    if isinstance(value, str):
        value = [value]
    elif tokens and isinstance(value, list) and value and all(_is_token(t) for t in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{field} must be {what}; got {_kind(value)}", field)
    if len(value) > MAX_INPUTS:
        raise BadRequest(f"{field} holds {len(value)} inputs; at most {MAX_INPUTS} per request: "
                         "split it over several requests", field)
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise BadRequest(f"{field}[{i}] is an empty text: every input needs at least "
                                 "one character", f"{field}[{i}]")
        elif not (tokens and isinstance(item, list) and item and all(map(_is_token, item))):
            raise BadRequest(f"{field}[{i}] must be a non-empty text"
                             + (" or a non-empty list of token ids (whole numbers ≥ 0)"
                                if tokens else "") + f"; got {_kind(item)}", f"{field}[{i}]")
    return value


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'…' if len(text) > 60 else ''}"


def answer(req: EmbeddingRequest, vectors: list[list[float]], prompt_tokens: int,
           model: str) -> Any:
    """The answer's body, in the shape the request came in."""
    if req.shape == TEI:
        return vectors
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v, req)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def _encode(vector: list[float], req: EmbeddingRequest) -> list[float] | str:
    if req.encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
