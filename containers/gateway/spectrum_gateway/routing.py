"""Which upstream answers: tenant override, else a weighted canary that is sticky per
(tenant, model), then the model's ``fallback`` list in order.

The canary uses weighted rendezvous hashing: each upstream scores ``-weight / ln(u)`` with
``u`` a hash of (tenant, model, upstream) in (0, 1), and the highest score wins. A tenant
therefore lands on an upstream with probability weight / Σweights, every worker and replica
computes the same answer without sharing state, a restart changes nothing, and changing one
weight moves only the tenants it has to.
"""
from __future__ import annotations

import math

from options.core.affinity import bounded_order, unit_hash

from .config import Model, Upstream


def canary_choice(model: Model, tenant: str) -> Upstream:
    """The weighted, sticky pick among the upstreams with weight > 0."""
    return max((u for u in model.upstreams if u.weight > 0),
               key=lambda u: -u.weight / math.log(unit_hash(tenant, model.name, u.name)))


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
# An upstream with ``urls`` has several replicas; a request that names a session (``x-session-id``,
# or OpenAI's ``user``) goes to its session's replica, with bounded loads
# (``options.core.affinity`` says how and why; the simulator places sessions with it too).


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
