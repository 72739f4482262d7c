"""EC2 Spot capacity for rung 6's GPU nodes: the discount and the interruptions.

Each node's interruption notice is a Poisson process at the user's rate per node-hour, drawn
from the node's launch (seeded, so every candidate policy of one simulation meets the same
market). What a notice does is ``fleet.run_fleet``'s: the node stops taking requests at once
(node-termination-handler / Karpenter cordon and drain it), a replacement node is launched, and
two minutes later EC2 reclaims the node. Requests still queued or running on it then fail
(``interrupted``): they are not re-queued, because a request to a vLLM server is not retried
by the gateway or the HPA path; only a client that retries would save it, and the client is not
ours to assume. Nodes bill per second with EC2's 60 s minimum, at the on-demand price less the
spot discount; neither the discount nor the rate is in the repo's dated facts, so both come from
the user (``cost/data/scaling-*.json`` says why there is no default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cost.simulate.scaling import default
from options.core import BadInput


@dataclass(frozen=True)
class SpotMarket:
    discount: float                      # 1 - spot price / on-demand price
    interruptions_per_hour: float        # per node

    def __post_init__(self) -> None:
        if not (isinstance(self.discount, (int, float)) and 0 <= self.discount < 1):
            raise BadInput(f"--spot-discount {self.discount!r} must be a fraction in [0, 1) of the on-demand "
                           "price, e.g. 0.6 for a spot price 60 % below it")
        if not (isinstance(self.interruptions_per_hour, (int, float)) and math.isfinite(self.interruptions_per_hour)
                and self.interruptions_per_hour >= 0):
            raise BadInput(f"--spot-interruptions-per-hour {self.interruptions_per_hour!r} must be a rate >= 0 "
                           "per node-hour, e.g. 0.0003 for about 20 % of nodes reclaimed a month")

    @property
    def notice_s(self) -> float:
        return default("eks", "spot_notice_s")

    def hourly(self, on_demand_hourly: float) -> float:
        return on_demand_hourly * (1 - self.discount)

    def notices(self, seed: int) -> Callable[[int, float], float]:
        """A node's interruption notice time from its launch (inf: none), one draw per node in
        launch order."""
        rng = np.random.default_rng([seed, 0x5907])
        rate_per_s = self.interruptions_per_hour / 3600

        def notice_for(node: int, launched_s: float) -> float:
            return launched_s + float(rng.exponential(1 / rate_per_s)) if rate_per_s > 0 else math.inf
        return notice_for

    def to_json(self) -> dict[str, Any]:
        return {"capacity_type": "spot", "discount": self.discount,
                "interruptions_per_node_hour": self.interruptions_per_hour, "notice_s": self.notice_s,
                "on_interruption": "drained at the notice, replaced at once, requests left at reclaim fail"}
