"""The six rungs of the deployment spectrum, as data: who runs the model, what you own, how it
is billed, and what each rung can do (its capabilities), so that callers read a rung's data
instead of testing its level (SkyPilot's ``CloudImplementationFeatures``: a reason per thing a
rung cannot do, checked in one place)."""
from __future__ import annotations

from dataclasses import dataclass

from options.core.errors import BadInput
from options.core.wire import BEDROCK, OPENAI_CHAT, OPENAI_COMPLETIONS, TGI

PER_TOKEN = "per token"
PER_INSTANCE_HOUR = "per instance-hour"
SAGEMAKER = "sagemaker"
EC2 = "ec2"


@dataclass(frozen=True)
class Capabilities:
    """What a rung can do; ``why_not`` gives the reason for each capability it lacks."""
    dialect: str               # the wire dialect its endpoint speaks (options.core.wire)
    serves_locally: bool       # --target local runs the serving path on this machine
    has_emulator: bool         # --target emulator runs its cloud calls against a local AWS
    creates_resources: bool    # apply creates resources that bill until --down removes them
    why_not: tuple[tuple[str, str], ...] = ()   # (capability, reason) pairs

    def reason(self, capability: str) -> str:
        return dict(self.why_not).get(capability, f"level has no {capability.replace('_', ' ')}")


@dataclass(frozen=True)
class Rung:
    level: int
    name: str
    module: str            # import path of the rung's folder
    who_runs_the_model: str
    you_own: str
    billed: str            # PER_TOKEN, PER_INSTANCE_HOUR, or per instance-hour plus a fixed fee
    platform: str          # whose price list bills it: BEDROCK, SAGEMAKER or EC2 (+ EKS)
    can: Capabilities

    @property
    def serves_locally(self) -> bool:
        return self.can.serves_locally

    @property
    def per_token(self) -> bool:
        return self.billed == PER_TOKEN


_CLOUD_ONLY = "{what} runs only in AWS: --target local prints the plan and its cost instead"

RUNGS: tuple[Rung, ...] = (
    Rung(1, "Bedrock", "options.bedrock", "AWS, hidden", "prompts only", PER_TOKEN, BEDROCK,
         Capabilities(BEDROCK, serves_locally=False, has_emulator=False, creates_resources=False,
                      why_not=(("serves_locally", _CLOUD_ONLY.format(what="Bedrock")),
                               ("has_emulator", "the local AWS emulator (moto) does not implement "
                                "bedrock-runtime's converse and converse_stream"),
                               ("creates_resources", "Bedrock bills per token: nothing is created, "
                                "so there is nothing to remove")))),
    Rung(2, "SageMaker JumpStart", "options.jumpstart",
         "your account, AWS image and AWS artifacts", "instance type and count",
         PER_INSTANCE_HOUR, SAGEMAKER,
         Capabilities(TGI, serves_locally=False, has_emulator=True, creates_resources=True,
                      why_not=(("serves_locally", _CLOUD_ONLY.format(
                          what="JumpStart (AWS's image with AWS's artifacts on AWS's GPUs)")),))),
    Rung(3, "Bring your own model on LMI", "options.lmi",
         "your account, AWS's LMI container (vLLM inside)", "model and OPTION_* configuration",
         PER_INSTANCE_HOUR, SAGEMAKER,
         Capabilities(TGI, serves_locally=True, has_emulator=True, creates_resources=True)),
    Rung(4, "Bring your own code on LMI", "options.custom_code",
         "your account, AWS's LMI container running your model.py",
         "pre/post-processing, loading, batching", PER_INSTANCE_HOUR, SAGEMAKER,
         Capabilities(TGI, serves_locally=True, has_emulator=True, creates_resources=True)),
    Rung(5, "Bring your own image", "options.byo_image",
         "your account, your container", "the whole image (CUDA, Python, vLLM, server)",
         PER_INSTANCE_HOUR, SAGEMAKER,
         Capabilities(OPENAI_COMPLETIONS, serves_locally=True, has_emulator=True,
                      creates_resources=True)),
    Rung(6, "Build your own infrastructure (EKS)", "options.eks",
         "your account, your cluster", "everything but the hardware",
         "per instance-hour + EKS per cluster-hour", EC2,
         Capabilities(OPENAI_CHAT, serves_locally=False, has_emulator=True, creates_resources=True,
                      why_not=(("serves_locally", "no Kubernetes API server runs here: --target "
                                "local renders and validates the manifests instead"),))),
)

LEVELS = tuple(r.level for r in RUNGS)


class UnknownLevel(BadInput):
    pass


def rung(level: int) -> Rung:
    for r in RUNGS:
        if r.level == level:
            return r
    raise UnknownLevel(f"level {level!r} is not a rung of the spectrum: choose one of "
                       f"{', '.join(map(str, LEVELS))} "
                       f"({'; '.join(f'{r.level} = {r.name}' for r in RUNGS)})")
