"""The rung interface: every rung folder under ``options/`` exposes the same verbs
(``RungModule``), so the deploy CLI is a loop over rungs rather than six programs. The rungs'
facts and capabilities are data in the core (``options.core.rungs``), re-exported here.
"""
from __future__ import annotations

import argparse
import importlib
from types import ModuleType
from typing import Any, Iterator, Protocol

from options.core import BadInput
from options.core.rungs import LEVELS, RUNGS, Capabilities, Rung, UnknownLevel, rung  # noqa: F401
from options.plan import Plan


def rung_module(level: int) -> ModuleType:
    """Import a rung's folder only when it is used, so CLI start-up stays fast."""
    return importlib.import_module(rung(level).module)


class RungModule(Protocol):
    """What every ``options/<rung>/__init__.py`` exposes.

    Flags shared by every rung are defined once in ``options/deploy.py``; a rung adds only its
    own flags, in its own argument group. ``spec_from_args`` raises ``options.core.BadInput``
    (exit 2) with a message naming the value, why it is wrong, and what would be right.
    What a rung can do (serve locally, run on the emulator, create resources, its dialect) is
    data on its ``Rung`` (``rung(level).can``), never a test of its level.
    """

    LEVEL: int

    def add_arguments(self, group: argparse._ArgumentGroup) -> None: ...
    def spec_from_args(self, args: argparse.Namespace) -> Any: ...
    def run_local(self, spec: Any, args: argparse.Namespace) -> int: ...  # the `local` target
    def plan(self, spec: Any) -> Plan: ...                 # pure: no cloud calls
    def apply(self, plan: Plan, target: Any) -> Any: ...   # rolls back what it created on failure
    def invoke(self, deployment: Any, request: Any) -> Any | Iterator[Any]: ...
    def status(self, spec: Any, target: Any) -> dict: ...
    def down(self, spec: Any, target: Any) -> list[str]: ...


def check_target(level: int, kind: str) -> None:
    """The one place that says whether a rung runs on a target; BadInput with the reason if not."""
    r = rung(level)
    if kind == "emulator" and not r.can.has_emulator:
        raise BadInput(f"level {level} ({r.name}) has no emulator: {r.can.reason('has_emulator')}; "
                       "use --target aws (python -m options.deploy --level "
                       f"{level} --plan shows its requests and cost)")


VERBS = ("add_arguments", "spec_from_args", "run_local", "plan", "apply", "invoke", "status", "down")
