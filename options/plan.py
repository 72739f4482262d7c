"""A Plan is data: the ordered cloud requests (or manifests) a rung would send, and its cost.

``--plan`` prints it; tests assert on it; ``apply`` sends it. Secrets never leave a plan
unmasked: ``Plan.to_json`` masks them, and so does anything that prints requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Bad input and masking live in the core; importable from here too, where rungs meet them.
from options.core import MASK, BadInput, is_secret_name, mask_secrets  # noqa: F401


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


@dataclass
class Deployment:
    """What ``apply`` returns at every rung: where requests go, in which dialect, and what the
    run made. The deploy CLI reads these fields and nothing rung-specific."""
    level: int
    endpoint_name: str            # what requests address: a SageMaker endpoint, a Bedrock model
                                  # id, an EKS cluster/namespace/name
    target: Any                   # options.aws.Target
    dialect: str                  # the wire dialect invoke speaks (options.core.wire)
    created: list[str] = field(default_factory=list)   # what this run made
    reused: list[str] = field(default_factory=list)    # what already existed
    elapsed_s: float = 0.0
    base_url: str | None = None   # an HTTP address, where the rung has one (EKS: its edge)
    extra: dict[str, Any] = field(default_factory=dict)   # what only the rung's invoke reads
