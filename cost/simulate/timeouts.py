"""Each rung's front door: how long a client waits before the platform (or its SDK) gives up.

A request past its rung's limit fails as ``timed_out``: not served, missing the SLO. Two limits,
because streaming decides what a limit sees. An idle or read timeout closes a connection that
carried no byte for its length; a streamed answer's first byte comes with its first token, so it
bounds TTFT (queue + prefill), and the gaps after it are one engine step each. A request timeout
bounds the whole answer, E2E, streamed or not. The defaults, dated and sourced per rung (which
limit applies and why), are in ``cost/data/timeouts-*.json``; ``--timeout-s`` overrides them.

What the engine does with a timed-out request is the platform's: ``engine_stops`` says when it
stops working on it (``replica.py`` drops it then) or that it never does, and ``billed`` whether a
token-billed rung still bills it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from cost.simulate.scaling import dated_defaults
from options.core import BadInput

KINDS = ("ttft", "e2e")
ENGINE_STOPS = ("no", "at_next_token", "at_next_step")
# The names --timeout-s takes: one front door per simulation (rungs 2-5 share SageMaker's).
DOORS = {"1": "bedrock", "bedrock": "bedrock", "sagemaker": "sagemaker", "6": "eks", "eks": "eks"}


def timeout_defaults() -> dict[str, Any]:
    return dated_defaults("timeouts")


def _value(section: str, name: str):
    return timeout_defaults()[section][name]["value"]


@dataclass(frozen=True)
class FrontDoor:
    """One rung's limits (None: no limit), when its engine stops on a timed-out request, and
    whether the rung bills one (only a token-billed rung's bill depends on it)."""
    ttft_s: float | None
    e2e_s: float | None
    engine_stops: str = "no"
    billed: bool = False

    def __post_init__(self) -> None:
        if self.engine_stops not in ENGINE_STOPS:
            raise ValueError(f"engine_stops {self.engine_stops!r}: one of {ENGINE_STOPS}")

    def late(self, start: np.ndarray, first: np.ndarray, finish: np.ndarray) -> np.ndarray:
        """Requests whose first token or last token came past the limits, counted from ``start``."""
        with np.errstate(invalid="ignore"):
            out = np.zeros(len(start), dtype=bool)
            if self.ttft_s is not None:
                out |= first - start > self.ttft_s
            if self.e2e_s is not None:
                out |= finish - start > self.e2e_s
        return out

    def to_json(self) -> dict[str, Any]:
        return {"ttft_s": self.ttft_s, "e2e_s": self.e2e_s, "engine_stops": self.engine_stops,
                "timed_out_billed": self.billed}


def default_front_doors(rung6_autoscaler: str = "hpa") -> dict[str, FrontDoor]:
    """Each simulation's front door as the project deploys it. Rung 6 on Ray Serve keeps the
    edge's limits, the shorter E2E of the edge and Serve's own request_timeout_s, and Serve's
    cancellation (its ingress drops a request wherever it is)."""
    eks = FrontDoor(_value("eks", "ttft_s"), _value("eks", "e2e_s"), _value("eks", "engine_stops"))
    if rung6_autoscaler == "ray-serve":
        serve = _value("ray_serve", "request_timeout_s")
        limits = [v for v in (eks.e2e_s, serve) if v is not None]
        eks = replace(eks, e2e_s=min(limits) if limits else None, engine_stops=_value("ray_serve", "engine_stops"))
    return {"bedrock": FrontDoor(_value("bedrock", "ttft_s"), _value("bedrock", "e2e_s"),
                                 billed=_value("bedrock", "bills_timed_out")),
            "sagemaker": FrontDoor(_value("sagemaker", "ttft_s"), _value("sagemaker", "e2e_s"),
                                   _value("sagemaker", "engine_stops")),
            "eks": eks}


def door_of(level: int) -> str:
    return "bedrock" if level == 1 else "eks" if level == 6 else "sagemaker"


def front_doors(pairs: list[str], rung6_autoscaler: str = "hpa") -> dict[str, FrontDoor]:
    """The defaults with ``--timeout-s`` pairs applied: ``RUNG.KIND=SECONDS`` (KIND ttft or e2e),
    or ``RUNG=SECONDS`` where the rung has one limit by default; ``none`` removes a limit."""
    doors = default_front_doors(rung6_autoscaler)
    for pair in pairs:
        target, sep, text = pair.partition("=")
        rung, _, kind = target.strip().partition(".")
        door = DOORS.get(rung.strip().lower())
        example = "e.g. --timeout-s eks.ttft=120 or --timeout-s sagemaker=60"
        if not sep or door is None:
            hint = (": rungs 2-5 are one SageMaker real-time endpoint limit, give sagemaker=SECONDS"
                    if rung.strip() in ("2", "3", "4", "5") else "")
            raise BadInput(f"--timeout-s {pair!r} must be RUNG=SECONDS or RUNG.ttft|e2e=SECONDS with RUNG one of "
                           f"bedrock (1), sagemaker (2-5), eks (6){hint}; {example}")
        if not kind:
            kinds = [k for k in KINDS if getattr(doors[door], f"{k}_s") is not None]
            if len(kinds) != 1:
                has = "a limit on TTFT and one on E2E" if kinds else "no limit"
                said = (" (the load balancer's idle timeout)", " (the route's request timeout)") if door == "eks" \
                    else ("", "")
                raise BadInput(f"--timeout-s {pair!r}: {door} has {has}; name one: {door}.ttft=SECONDS{said[0]} or "
                               f"{door}.e2e=SECONDS{said[1]}")
            kind = kinds[0]
        if kind not in KINDS:
            raise BadInput(f"--timeout-s {pair!r}: the limit is ttft or e2e, not {kind!r}; {example}")
        seconds = _seconds(pair, text.strip())
        doors[door] = replace(doors[door], **{f"{kind}_s": seconds})
    return doors


def _seconds(pair: str, text: str) -> float | None:
    if text.lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BadInput(f"--timeout-s {pair!r}: {text!r} must be seconds > 0, or none for no limit")
    return value


def defaults_text() -> str:
    """The default limits, for --timeout-s's help."""
    said = [f"{door}.{k} {getattr(d, f'{k}_s'):g}" for door, d in default_front_doors().items() for k in KINDS
            if getattr(d, f"{k}_s") is not None]
    return f"{', '.join(said)} s ({Path(timeout_defaults()['path']).name}, which gives each one's source and why)"


def describe(doors: dict[str, FrontDoor], levels) -> str:
    """The limits the simulation applied, in words (for its assumptions)."""
    def limits(d: FrontDoor) -> str:
        said = [f"{k.upper()} over {getattr(d, f'{k}_s'):g} s" for k in KINDS if getattr(d, f"{k}_s") is not None]
        return " or ".join(said) if said else "no limit"
    stops = {"no": "the engine keeps working on it (its capacity stays spent)",
             "at_next_token": "the engine drops it when it next has a token for it",
             "at_next_step": "the engine drops it at its next step"}
    parts = []
    for door, rungs in (("bedrock", "rung 1"), ("sagemaker", "rungs 2-5"), ("eks", "rung 6")):
        if any(door_of(lv) == door for lv in levels):
            d = doors[door]
            then = ("billed" if d.billed else "not billed") if door == "bedrock" else stops[d.engine_stops]
            parts.append(f"{rungs}: {limits(d)} times out ({then})")
    source = timeout_defaults()
    return (f"front-door timeouts (--timeout-s; defaults from {Path(source['path']).name}, as of "
            f"{source['as_of']}, each with its source there): " + "; ".join(parts))
