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
