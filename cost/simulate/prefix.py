"""A replica's prefix cache over a trace's shared prompt blocks (Mooncake's ``hash_ids``).

vLLM keeps the KV blocks of prompts it has computed and serves a later prompt's matching head
from them (automatic prefix caching, on by default), evicting the least recently used blocks no
running request holds. A trace that names its prompts' blocks (``Trace.prefix_blocks``: one id
per ``block_tokens`` prompt tokens, an id standing for its block and every block before it, as
Mooncake's are) says which heads repeat. Each replica here keeps the blocks its finished
prefills computed and admits a prompt with its longest cached run of leading blocks already
computed: the rest is prefilled as usual. Blocks enter the cache when the
prompt that computes them finishes its prefill, so two prompts prefilled side by side do not
share (as in vLLM, whose blocks are reusable once computed).

Blocks a running request uses are never evicted (as in vLLM); the others stay while they fit
the KV cache the running requests leave free, the replica's reserve for their whole prompts and
answers (the cautious side: vLLM allocates as tokens come, and blocks shared by several running
requests are reserved for each). A hit counts whole blocks of the trace's granularity (vLLM's
are 16 tokens, so it matches finer); the prompt's last token is always computed.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from options.core import BadInput


@dataclass(frozen=True)
class PrefixBlocks:
    """A trace's prompt blocks: ``blocks[i]`` the ids of request i's prompt, in order."""
    blocks: Sequence[Sequence[int]]
    block_tokens: int


class PrefixCache:
    """One replica's cached prompt blocks (see the module docstring); counts tokens queried and hit
    as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` do.

    A block a running request uses stays (vLLM never evicts a block in use); the others are
    kept, least recently used out first, while they fit the KV cache the running requests leave
    free (``fit``)."""

    __slots__ = ("blocks", "block_tokens", "lru", "in_use", "free_cached", "queried", "hit")

    def __init__(self, prefix: PrefixBlocks) -> None:
        self.blocks, self.block_tokens = prefix.blocks, prefix.block_tokens
        self.lru: OrderedDict[int, None] = OrderedDict()   # every cached block, oldest use first
        self.in_use: dict[int, int] = {}                     # block -> running requests using it
        self.free_cached = 0                                 # cached blocks no running request uses
        self.queried = 0
        self.hit = 0

    def _own(self, request: int) -> dict[int, None]:
        return dict.fromkeys(self.blocks[request])          # its blocks, each once, in order

    def admit(self, request: int, prompt_tokens: int) -> int:
        """Request ``request`` starts: the leading prompt tokens the cache serves it (the longest
        run of its blocks held), and its blocks are in use until ``release``."""
        own = self._own(request)
        run = 0
        for block in own:
            if block not in self.lru:
                break
            self.lru.move_to_end(block)
            run += 1
        cached = min(run * self.block_tokens, max(0, prompt_tokens - 1))
        self.queried += prompt_tokens
        self.hit += cached
        for block in own:
            if not self.in_use.get(block) and block in self.lru:
                self.free_cached -= 1
            self.in_use[block] = self.in_use.get(block, 0) + 1
        return cached

    def store(self, request: int) -> None:
        """Request ``request``'s prompt is computed: its blocks are cached, the most recently used."""
        for block in self._own(request):
            if block not in self.lru:
                self.lru[block] = None
                if not self.in_use.get(block):
                    self.free_cached += 1
            self.lru.move_to_end(block)

    def release(self, request: int) -> None:
        """Request ``request`` has left the engine (finished or dropped): its blocks are free to evict."""
        for block in self._own(request):
            left = self.in_use[block] - 1
            if left:
                self.in_use[block] = left
            else:
                del self.in_use[block]
                if block in self.lru:
                    self.free_cached += 1

    def fit(self, free_tokens: float) -> None:
        """Evict the least recently used blocks no running request uses until the rest fit in
        ``free_tokens`` (the KV cache the running requests leave)."""
        excess = self.free_cached - int(free_tokens // self.block_tokens)    # blocks to evict
        if excess <= 0:
            return
        # Walk from the oldest only as far as the victims go: this runs at every admission of a
        # busy replica, and copying the whole cache each time would cost its size.
        victims = []
        for block in self.lru:
            if not self.in_use.get(block):
                victims.append(block)
                if len(victims) == excess:
                    break
        for block in victims:
            del self.lru[block]
        self.free_cached -= len(victims)


def prefix_of(trace, block_tokens: int) -> PrefixBlocks | None:
    """The trace's prompt blocks at ``block_tokens`` tokens an id (``--block-tokens``), or None
    where the trace names none (then every prompt is new, unless ``--prefix-cache-hit-rate``)."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise BadInput(f"--block-tokens {block_tokens!r} must be a whole number >= 1: the prompt tokens one "
                       "prefix block id stands for (Mooncake's traces: 512)")
    if trace.prefix_blocks is None:
        return None
    return PrefixBlocks(trace.prefix_blocks, block_tokens)


def hit_summary(caches: Sequence[PrefixCache]) -> dict[str, Any]:
    """The fleet's prefix-cache counts, as vLLM's metrics would sum them over its replicas."""
    queried = sum(c.queried for c in caches)
    hit = sum(c.hit for c in caches)
    return {"queried_tokens": int(queried), "hit_tokens": int(hit),
            "hit_rate": round(hit / queried, 4) if queried else None}


def reuse_bound(prefix: PrefixBlocks, input_tokens: Sequence[int]) -> float:
    """The most of the trace's prompt tokens any replica's cache could serve: one cache that sees
    every request in order, forgets nothing and holds a prompt's blocks as soon as it arrives.
    Replicas splitting the traffic, eviction and prompts prefilled side by side only lower it, so
    a bound built on it (a search's cost floor) stays a bound."""
    cache = PrefixCache(prefix)
    for request, prompt in enumerate(input_tokens):
        cache.admit(request, int(prompt))
        cache.store(request)
        cache.release(request)
    return cache.hit / cache.queried if cache.queried else 0.0


def check_one_source(prefix: PrefixBlocks | None, hit_rate: float) -> None:
    """A trace's blocks and a flat rate are two answers to one question: refuse both."""
    if prefix is not None and hit_rate:
        raise BadInput(f"the trace names its prompts' shared blocks (hash_ids), which give each request's "
                       f"prefix-cache hits; --prefix-cache-hit-rate {hit_rate:g} would count them twice: leave "
                       "it out (or give it as 0 where a saved capacity model carries one)")


def session_keys(prefix: PrefixBlocks | None, requests: int) -> list[str | None]:
    """Each request's session for affinity routing: the first of its prompt blocks (the requests
    of one conversation or agent program share it, as they share the session id the gateway is
    sent), None where it has none."""
    if prefix is None:
        raise BadInput("--routing affinity sends each session to its replica, and takes a request's session from "
                       "the first of its prompt blocks: give a trace that names them (Mooncake hash_ids)")
    return [str(blocks[0]) if blocks else None for blocks in list(prefix.blocks)[:requests]]
