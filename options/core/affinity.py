"""Session affinity with bounded loads: which replica a session's request goes to.

A request that names a session goes to the replica its session hashes to, so a program's
growing prompt finds its prefix in that replica's KV cache; consistent hashing with bounded
loads (Mirrokni, Thorup, Zadimoghaddam 2018) keeps one hot session group from overloading it:
a replica may take a session's request only while it has fewer than
``max(floor, ceil(c × (in flight + 1) / replicas))`` requests in flight, else the session's
next choice does. The floor keeps a lightly loaded set from scattering sessions: with two
requests in flight, "1.25 × the mean" is one, and a vLLM replica batches far more than that at
almost no cost per request. The hash is rendezvous (each replica scores the session; the order
of scores is the session's order of preference), so adding a replica moves only the sessions
that now prefer it (about 1/n), and an overloaded replica's overflow spreads over the others
instead of piling onto one ring neighbour.

One home for the gateway's router (``containers/gateway``) and the simulator's model of it
(``cost.simulate.fleet``, routing ``affinity``), so both place a session the same way.
"""
from __future__ import annotations

import hashlib
import math

# The bound c and the floor the gateway uses unless an upstream sets its own.
DEFAULT_LOAD_BOUND = 1.25
DEFAULT_LOAD_FLOOR = 8


def unit_hash(*parts: str) -> float:
    """A hash of ``parts`` strictly inside (0, 1), the same in every process."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 1) / (2 ** 64 + 2)


def preference(session: str, replicas: list[str]) -> list[int]:
    """The replicas' indices in ``session``'s order of preference (the same everywhere)."""
    return sorted(range(len(replicas)), key=lambda i: unit_hash(session, replicas[i]), reverse=True)


def load_cap(load_bound: float, in_flight: int, replicas: int, floor: int = 1) -> int:
    """The most requests one replica may hold before a session's request goes elsewhere:
    ``c`` times the mean after this request is placed, and never under ``floor``."""
    return max(1, floor, math.ceil(load_bound * (in_flight + 1) / replicas))


def bounded_order(session: str, replicas: list[str], loads: list[int], load_bound: float,
                  floor: int = 1) -> tuple[list[int], bool]:
    """Where to try ``session``'s request: the first replica in its preference that is under
    the load cap, then the rest in preference order (for failover). Also whether that is the
    session's own first choice (False: it spilled over the bound)."""
    prefs = preference(session, replicas)
    cap = load_cap(load_bound, sum(loads[i] for i in prefs), len(prefs), floor)
    chosen = next((i for i in prefs if loads[i] < cap), prefs[0])
    return [chosen] + [i for i in prefs if i != chosen], chosen == prefs[0]
