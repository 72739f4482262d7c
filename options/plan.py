"""A Plan is data: the ordered cloud requests (or manifests) a rung would send, and its cost.

``--plan`` prints it; tests assert on it; ``apply`` sends it. Secrets never leave a plan
unmasked: ``Plan.to_json`` masks them, and so does anything that prints requests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class BadInput(ValueError):
    """Input the user can fix: the CLI prints the message and exits 2 (no traceback)."""


@dataclass
class Step:
    service: str                 # boto3 service name ("sagemaker", "s3", "ecr", ...) or "kubernetes"
    operation: str               # API operation name as AWS spells it ("CreateModel")
    params: dict[str, Any]
    # The request that removes what this step creates (for rollback and --down), if any.
    undo: "Step | None" = None
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"service": self.service, "operation": self.operation,
                               "params": mask_secrets(self.params)}
        if self.description:
            out["description"] = self.description
        return out


@dataclass
class Plan:
    level: int
    steps: list[Step]
    cost: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Rung-specific data apply() needs that is not a request (e.g. rendered manifests, paths).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "steps": [s.to_json() for s in self.steps],
                               "cost": self.cost}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


# Names whose values are secrets wherever they appear (env maps, headers, parameters).
_SECRET_NAME = re.compile(r"(TOKEN(?!S|IZE|_ID)|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|CREDENTIAL|PRIVATE_KEY)",
                          re.IGNORECASE)
# Names that point at a secret rather than hold one (Kubernetes `secretKeyRef`, `secretName`,
# an ARN in Secrets Manager): their values are safe to show.
_REFERENCE_NAME = re.compile(r"(Ref|Name|Arn|_ARN)$")
MASK = "****"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) and not _REFERENCE_NAME.search(name)


def mask_value(value: Any) -> str:
    return MASK


def mask_secrets(obj: Any) -> Any:
    """A copy of ``obj`` with the values of secret-named keys replaced by ``****``."""
    if isinstance(obj, dict):
        return {k: (mask_value(v) if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    else mask_secrets(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_secrets(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(mask_secrets(v) for v in obj)
    return obj
