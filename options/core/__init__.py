"""What every layer of Spectrum shares, and nothing else: bad input, secret masking, the rungs
as data, the names of the wire dialects, and (``heap``) how a long-lived server keeps its
start-up heap out of the garbage collector's way.

It imports nothing of the project (``tests/import_graph.py`` checks it), so the CLIs, the rungs,
``cost/``, ``infra/`` and the images under ``containers/`` can all import it, and an image
carries it without carrying the rest (``options/__init__.py`` imports nothing).
"""
from options.core.errors import BadInput, exit_code
from options.core.masking import MASK, is_secret_name, mask_secrets, mask_secrets_text
from options.core.rungs import LEVELS, RUNGS, Capabilities, Rung, UnknownLevel, rung
from options.core.wire import (BEDROCK, DIALECTS, OPENAI_CHAT, OPENAI_COMPLETIONS,
                               OPENAI_EMBEDDINGS, TGI, UnknownDialect, canonical_dialect,
                               detect_dialect)

__all__ = ["BEDROCK", "BadInput", "Capabilities", "DIALECTS", "LEVELS", "MASK", "OPENAI_CHAT",
           "OPENAI_COMPLETIONS", "OPENAI_EMBEDDINGS", "RUNGS", "Rung", "TGI", "UnknownDialect", "UnknownLevel",
           "canonical_dialect", "detect_dialect", "exit_code", "is_secret_name", "mask_secrets",
           "mask_secrets_text", "rung"]
