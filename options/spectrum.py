"""The six rungs of the deployment spectrum, as data.

Each rung lives in one folder under ``options/`` and exposes the same verbs, so the deploy CLI
is a loop over rungs rather than six programs (see ``RungModule``).
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator, Protocol


@dataclass(frozen=True)
class Rung:
    level: int
    name: str
    module: str            # import path of the rung's folder
    who_runs_the_model: str
    you_own: str
    billed: str            # "per token" or "per instance-hour"
    serves_locally: bool   # can the serving path run on this machine (no cloud)?


RUNGS: tuple[Rung, ...] = (
    Rung(1, "Bedrock", "options.bedrock", "AWS, hidden", "prompts only", "per token", False),
    Rung(2, "SageMaker JumpStart", "options.jumpstart",
         "your account, AWS image and AWS artifacts", "instance type and count",
         "per instance-hour", False),
    Rung(3, "Bring your own model on LMI", "options.lmi",
         "your account, AWS's LMI container (vLLM inside)", "model and OPTION_* configuration",
         "per instance-hour", True),
    Rung(4, "Bring your own code on LMI", "options.custom_code",
         "your account, AWS's LMI container running your model.py",
         "pre/post-processing, loading, batching", "per instance-hour", True),
    Rung(5, "Bring your own image", "options.byo_image",
         "your account, your container", "the whole image (CUDA, Python, vLLM, server)",
         "per instance-hour", True),
    Rung(6, "Build your own infrastructure (EKS)", "options.eks",
         "your account, your cluster", "everything but the hardware",
         "per instance-hour + EKS per cluster-hour", True),
)

LEVELS = tuple(r.level for r in RUNGS)


class UnknownLevel(ValueError):
    pass


def rung(level: int) -> Rung:
    for r in RUNGS:
        if r.level == level:
            return r
    raise UnknownLevel(f"level {level!r} is not a rung of the spectrum: choose one of "
                       f"{', '.join(map(str, LEVELS))} "
                       f"({'; '.join(f'{r.level} = {r.name}' for r in RUNGS)})")


def rung_module(level: int) -> ModuleType:
    """Import a rung's folder only when it is used, so CLI start-up stays fast."""
    return importlib.import_module(rung(level).module)


class RungModule(Protocol):
    """What every ``options/<rung>/__init__.py`` exposes.

    Flags shared by every rung are defined once in ``options/deploy.py``; a rung adds only its
    own flags, in its own argument group. ``spec_from_args`` raises ``options.plan.BadInput``
    (exit 2) with a message naming the value, why it is wrong, and what would be right.
    """

    def add_arguments(self, group: argparse._ArgumentGroup) -> None: ...
    def spec_from_args(self, args: argparse.Namespace) -> Any: ...
    def run_local(self, spec: Any, args: argparse.Namespace) -> int: ...  # the `local` target
    def plan(self, spec: Any) -> "Plan": ...               # pure: no cloud calls
    def apply(self, plan: "Plan", target: Any) -> Any: ...  # rolls back what it created on failure
    def invoke(self, deployment: Any, request: Any) -> Any | Iterator[Any]: ...
    def status(self, spec: Any, target: Any) -> dict: ...
    def down(self, spec: Any, target: Any) -> list[str]: ...


from options.plan import Plan  # noqa: E402  (for the annotations above)
