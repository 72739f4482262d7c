"""The names of the wire dialects, and the one function that tells which dialect a request
body is in. The client (``options.contract``) and the bring-your-own server
(``byo_vllm.dialects``) both use these, so a format has one name on both sides of the wire
(TGI's ``router/src/sagemaker.rs``: the body's shape decides the dialect, in one place).
"""
from __future__ import annotations

from typing import Any

from options.core.errors import BadInput

OPENAI_CHAT = "openai-chat"                # {"messages": [...]}; served at /v1/chat/completions
OPENAI_COMPLETIONS = "openai-completions"  # {"prompt": ...}; served at /v1/completions
TGI = "tgi"                                # {"inputs": ..., "parameters": {...}}: HF TGI, AWS LMI
BEDROCK = "bedrock"                        # {"modelId", "messages": [{"content": [{"text"}]}]}
DIALECTS = (OPENAI_CHAT, OPENAI_COMPLETIONS, TGI, BEDROCK)
# Not a generation dialect: an embeddings request, {"input": text | [texts] | [token ids] | ...};
# served at /v1/embeddings (and /invocations) by a server whose engine runs a pooling model.
OPENAI_EMBEDDINGS = "openai-embeddings"
# Other names the same formats go by (the server's route names, LMI's name for TGI's shape).
ALIASES = {"chat": OPENAI_CHAT, "completion": OPENAI_COMPLETIONS, "completions": OPENAI_COMPLETIONS,
           "lmi": TGI}


class UnknownDialect(BadInput):
    """A dialect name, or a body, that is none of the known wire dialects."""


def canonical_dialect(name: str) -> str:
    """The dialect's one name, from that name or an alias (``chat``, ``completion``, ``lmi``)."""
    if name in DIALECTS:
        return name
    try:
        return ALIASES[name]
    except (KeyError, TypeError):
        raise UnknownDialect(f"unknown dialect {name!r}: choose one of {', '.join(DIALECTS)} "
                             f"(or an alias: {', '.join(sorted(ALIASES))})") from None


def detect_dialect(body: Any) -> str:
    """Which dialect a decoded request body is in, from the keys only that dialect sends:
    one of ``DIALECTS``, or ``OPENAI_EMBEDDINGS`` for an embeddings request."""
    if isinstance(body, dict):
        if "modelId" in body:
            return BEDROCK
        if "messages" in body:
            return OPENAI_CHAT
        if "prompt" in body:
            return OPENAI_COMPLETIONS
        if "inputs" in body:
            return TGI
        if "input" in body:
            return OPENAI_EMBEDDINGS
        keys = ", ".join(sorted(map(str, body))[:10]) or "none"
    else:
        keys = f"none (the body is a JSON {type(body).__name__}, not an object)"
    raise UnknownDialect("unknown request dialect: expected 'messages' (OpenAI chat), 'prompt' "
                         "(OpenAI completion), 'inputs' with 'parameters' (TGI/LMI), 'modelId' "
                         "with 'messages' (Bedrock Converse) or 'input' (OpenAI embeddings); "
                         f"got keys: {keys}")
