"""Which upstream answers: tenant override, else a weighted canary that is sticky per
(tenant, model), then the model's ``fallback`` list in order.

The canary uses weighted rendezvous hashing: each upstream scores ``-weight / ln(u)`` with
``u`` a hash of (tenant, model, upstream) in (0, 1), and the highest score wins. A tenant
therefore lands on an upstream with probability weight / Σweights, every worker and replica
computes the same answer without sharing state, a restart changes nothing, and changing one
weight moves only the tenants it has to.
"""
from __future__ import annotations

import hashlib
import math

from .config import Model, Upstream


def _unit_hash(*parts: str) -> float:
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 1) / (2 ** 64 + 2)     # strictly inside (0, 1)


def canary_choice(model: Model, tenant: str) -> Upstream:
    """The weighted, sticky pick among the upstreams with weight > 0."""
    return max((u for u in model.upstreams if u.weight > 0),
               key=lambda u: -u.weight / math.log(_unit_hash(tenant, model.name, u.name)))


def attempts(model: Model, tenant: str) -> list[Upstream]:
    """The upstreams to try, in order: the tenant's override or the canary's pick, then the
    fallback list (each upstream once)."""
    override = model.tenant_overrides.get(tenant)
    first = model.upstream(override) if override else canary_choice(model, tenant)
    order = [first]
    for name in model.fallback:
        upstream = model.upstream(name)
        if upstream not in order:
            order.append(upstream)
    return order


# ------------------------------------------------------------------------------ replicas
#
# An upstream with ``urls`` has several replicas. A request that names a session
# (``x-session-id``, or OpenAI's ``user``) goes to the replica its session hashes to, so a
# program's growing prompt finds its prefix in that replica's KV cache; consistent hashing
# with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018) keeps one hot session group from
# overloading it: a replica may take a session's request only while it has fewer than
# ``max(floor, ceil(c × (in flight + 1) / replicas))`` requests in flight, else the session's
# next choice does. The floor keeps a lightly loaded set from scattering sessions: with two
# requests in flight, "1.25 × the mean" is one, and a vLLM replica batches far more than that
# at almost no cost per request. The hash is rendezvous (each replica scores the session; the order of scores is the
# session's order of preference), so adding a replica moves only the sessions that now
# prefer it (about 1/n), and an overloaded replica's overflow spreads over the others
# instead of piling onto one ring neighbour.


def preference(session: str, replicas: list[str]) -> list[int]:
    """The replicas' indices in ``session``'s order of preference (the same everywhere)."""
    return sorted(range(len(replicas)), key=lambda i: _unit_hash(session, replicas[i]),
                  reverse=True)


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


class Replicas:
    """One upstream's replicas as this worker sees them: requests in flight to each and which
    are ejected (refused, timed out or answered 5xx within ``eject_s``). In-flight counts are
    per worker: each worker bounds its own share, no shared state on the request path."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.urls = list(upstream.urls)
        self.names = [f"{upstream.name}/{i}" for i in range(len(self.urls))]
        self.in_flight = [0] * len(self.urls)
        self.ejected_until = [0.0] * len(self.urls)
        self._turn = 0

    def order(self, session: str | None, now: float) -> tuple[list[int], str]:
        """The replicas to try, in order, and how the first was chosen: ``affinity``
        (the session's own), ``spill`` (its own was over the load bound), ``least_in_flight``
        or ``round_robin``. Ejected replicas go last: better a try than no answer."""
        live = [i for i in range(len(self.urls)) if self.ejected_until[i] <= now]
        ejected = [i for i in range(len(self.urls)) if i not in live]
        pool = live or ejected
        balance = self.upstream.balance
        if balance == "affinity" and session is not None:
            order, own = bounded_order(session, [self.urls[i] for i in pool],
                                       [self.in_flight[i] for i in pool], self.upstream.load_bound,
                                       self.upstream.load_floor)
            order, how = [pool[i] for i in order], "affinity" if own else "spill"
        else:
            self._turn += 1
            rotated = pool[self._turn % len(pool):] + pool[:self._turn % len(pool)]
            if balance == "round_robin":
                order, how = rotated, "round_robin"
            else:       # fewest in flight; ties in turn, so an idle set is still shared
                order = sorted(rotated, key=lambda i: self.in_flight[i])
                how = "least_in_flight"
        return order + [i for i in ejected if i not in order], how

    def eject(self, index: int, now: float) -> None:
        self.ejected_until[index] = now + self.upstream.eject_s

    def healthy(self, index: int) -> None:
        self.ejected_until[index] = 0.0
