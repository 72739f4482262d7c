"""Break-even between paying per token (Bedrock) and paying per instance-hour (rungs 2-6).

The formulas (as cultivar and FMBench use them):
  blended price      P = (r_in·P_in + r_out·P_out) / (r_in + r_out)          USD per 1M tokens
  parity throughput  T* = H / (P · 3600 / 1e6 · u)                            tokens/s, one replica
  self-hosted cost   H / (T · 3600 · u / 1e6)                                 USD per 1M tokens
with H the all-in hourly cost of one replica and u its utilisation. Throughputs count input and
output tokens together, in the traffic's mix, because that is what the blended price is per.
A benchmark measures output tokens/s; at a mix r_in:r_out one replica then moves
output_tok_s · (r_in + r_out) / r_out tokens/s, if decoding is what limits it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from cost.prices import HOURS_PER_MONTH
from options.core import BadInput

SECONDS_PER_HOUR = 3600
# Input:output token ratios of common workloads.
MIX_PRESETS: dict[str, tuple[float, float]] = {
    "summarization": (10.0, 1.0),
    "rag": (5.0, 1.0),
    "chat": (3.0, 1.0),
    "balanced": (1.0, 1.0),
    "generation": (1.0, 3.0),
}
_MIX_ALIASES = {"summarisation": "summarization"}
MAX_MIX_RATIO = 1000.0


@dataclass(frozen=True)
class Mix:
    input: float
    output: float
    label: str

    @property
    def output_share(self) -> float:
        return self.output / (self.input + self.output)

    def __str__(self) -> str:
        return self.label


def parse_mix(text: str | None) -> Mix:
    """'3:1', '10:1', '1:3', '0.5:1' or a preset name -> Mix; BadInput naming what is allowed."""
    allowed = (f"IN:OUT with positive numbers (e.g. 3:1), each ratio at most {MAX_MIX_RATIO:g}:1, "
               f"or one of {', '.join(MIX_PRESETS)}")
    if text is None:
        text = "chat"
    name = _MIX_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name in MIX_PRESETS:
        r_in, r_out = MIX_PRESETS[name]
        return Mix(r_in, r_out, f"{name} {r_in:g}:{r_out:g}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*:\s*([0-9]*\.?[0-9]+)\s*", text)
    if not m:
        raise BadInput(f"mix {text!r} is not understood: use {allowed}")
    r_in, r_out = float(m.group(1)), float(m.group(2))
    if r_in <= 0 or r_out <= 0:
        raise BadInput(f"mix {text!r} has a zero side: use {allowed}")
    if max(r_in / r_out, r_out / r_in) > MAX_MIX_RATIO:
        raise BadInput(f"mix {text!r} is outside the allowed range: use {allowed}")
    return Mix(r_in, r_out, f"{r_in:g}:{r_out:g}")


def check_range(name: str, value: float, low: float, high: float, *, low_open: bool = False,
                high_open: bool = False, unit: str = "") -> float:
    """BadInput unless low <= value <= high (or strict where open); the message names the range."""
    bad = (math.isnan(value) or value < low or value > high or (low_open and value == low)
           or (high_open and value == high))
    if bad:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise BadInput(f"{name} {value:g}{unit} is out of range: allowed {lo}{low:g}, {high:g}{hi}{unit}")
    return value


def check_utilization(u: float) -> float:
    return check_range("utilization", u, 0.0, 1.0, low_open=True)


def check_discount(pct: float) -> float:
    return check_range("discount", pct, 0.0, 100.0, high_open=True, unit=" %")


def check_price(name: str, price: float, high: float) -> float:
    return check_range(name, price, 0.0, high, low_open=True)


def blended_price(p_in: float, p_out: float, mix: Mix) -> float:
    """USD per 1M tokens of the mix."""
    return (mix.input * p_in + mix.output * p_out) / (mix.input + mix.output)


def parity_tokens_per_second(hourly: float, price_per_million: float, utilization: float = 1.0) -> float:
    """Tokens/s one replica must sustain for its hourly cost to equal the per-token bill."""
    return hourly / (price_per_million * SECONDS_PER_HOUR / 1e6 * utilization)


def self_hosted_per_million(hourly: float, tokens_per_second: float, utilization: float = 1.0) -> float:
    """USD per 1M tokens when one replica moves ``tokens_per_second`` at ``utilization``."""
    return hourly / (tokens_per_second * SECONDS_PER_HOUR * utilization / 1e6)


def total_from_output(output_tok_s: float, mix: Mix) -> float:
    """Input+output tokens/s at ``mix`` when the replica emits ``output_tok_s`` (decode-bound)."""
    return output_tok_s / mix.output_share


@dataclass
class Capacity:
    """What one replica sustains, in output tokens/s, and where that figure came from."""
    output_tokens_per_second: float
    origin: str                         # "--capacity" or the bench file
    measured_at: dict[str, Any] = field(default_factory=dict)  # profile, latency, level, ...

    def describe(self) -> str:
        if "from_specs" in self.measured_at:
            return f"{self.output_tokens_per_second:,.1f} output tok/s predicted from {self.origin}"
        if not self.measured_at:
            return f"{self.output_tokens_per_second:,.1f} output tok/s (given with {self.origin})"
        return f"{self.output_tokens_per_second:,.1f} output tok/s measured by {self.origin}: " \
               f"{self.measured_at.get('summary', '')}"


def check_capacity(value: float, origin: str = "--capacity") -> Capacity:
    check_range("capacity", value, 0.0, 1e7, low_open=True, unit=" output tok/s")
    return Capacity(value, origin)


@dataclass
class BreakEven:
    hourly: float                       # all-in USD per hour of one replica, after discount
    price_per_million: float            # blended USD per 1M tokens
    utilization: float
    mix: Mix | None
    capacity: Capacity | None
    assumptions: list[str]
    inputs: dict[str, Any]

    @property
    def tokens_per_hour(self) -> float:
        return self.parity_tokens_per_second * SECONDS_PER_HOUR

    @property
    def parity_tokens_per_second(self) -> float:
        return parity_tokens_per_second(self.hourly, self.price_per_million, self.utilization)

    @property
    def parity_tokens_per_month(self) -> float:
        # Tokens actually served in a month by one replica running at parity throughput and u.
        return self.parity_tokens_per_second * self.utilization * SECONDS_PER_HOUR * HOURS_PER_MONTH

    @property
    def capacity_tokens_per_second(self) -> float | None:
        if self.capacity is None:
            return None
        if self.mix is None:  # raw form: one price for every token, capacity taken as is
            return self.capacity.output_tokens_per_second
        return total_from_output(self.capacity.output_tokens_per_second, self.mix)

    def to_json(self) -> dict[str, Any]:
        cap = self.capacity_tokens_per_second
        out: dict[str, Any] = {
            "inputs": self.inputs,
            "hourly_usd": round(self.hourly, 6),
            "blended_price_per_million": round(self.price_per_million, 6),
            "utilization": self.utilization,
            "breakeven_tokens_per_hour": round(self.tokens_per_hour, 3),
            "breakeven_tokens_per_second": round(self.parity_tokens_per_second, 3),
            "breakeven_tokens_per_month": round(self.parity_tokens_per_month),
        }
        if self.mix is not None:
            out["mix"] = {"input": self.mix.input, "output": self.mix.output, "label": self.mix.label}
            out["breakeven_output_tokens_per_second"] = round(
                self.parity_tokens_per_second * self.mix.output_share, 3)
        if cap is not None:
            shortfall = self.parity_tokens_per_second / cap
            out.update({
                "capacity": {"output_tokens_per_second": self.capacity.output_tokens_per_second,
                             "tokens_per_second": round(cap, 3), "origin": self.capacity.origin,
                             "measured_at": self.capacity.measured_at},
                "self_hosted_per_million": round(self_hosted_per_million(self.hourly, cap, self.utilization), 6),
                "shortfall_ratio": round(shortfall, 4),
                # The utilisation at which the replica's $/1M equals the per-token price.
                "utilization_to_break_even": round(shortfall * self.utilization, 4),
            })
        out["verdict"] = self.verdict()
        out["assumptions"] = self.assumptions
        return out

    def verdict(self) -> str:
        parity = self.parity_tokens_per_second
        cap = self.capacity_tokens_per_second
        if cap is None:
            return (f"Self-hosting breaks even only if one replica sustains at least {parity:,.1f} tokens/s "
                    f"at {self.utilization:.0%} utilisation; measure it (--capacity or --bench) to decide.")
        own = self_hosted_per_million(self.hourly, cap, self.utilization)
        need_u = parity * self.utilization / cap
        if cap >= parity:
            return (f"Self-hosting is cheaper: ${own:.4f} vs ${self.price_per_million:.4f} per 1M tokens "
                    f"({cap:,.1f} tok/s sustained against {parity:,.1f} needed); it stays cheaper down to "
                    f"{need_u:.0%} utilisation.")
        tail = ("even at 100 % utilisation it cannot break even" if need_u > 1
                else f"it would break even at {need_u:.0%} utilisation")
        return (f"Per-token is cheaper: self-hosted costs ${own:.4f} vs ${self.price_per_million:.4f} per 1M tokens; "
                f"one replica sustains {cap:,.1f} of the {parity:,.1f} tok/s needed "
                f"(shortfall x{parity / cap:.2f}); {tail}.")


def tokens(n: float) -> str:
    """1.23e10 -> '12.3 B': numbers people read at a glance."""
    for size, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.3g}"


def apply_discount(hourly: float, discount_pct: float) -> float:
    return hourly * (1 - check_discount(discount_pct) / 100)
