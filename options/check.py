"""spectrum check [--level N]: what deploying a rung needs, and whether it is there.

A newcomer's first failure is rarely in Spectrum: missing credentials, no SageMaker execution
role, a GPU quota of 0, a tool not on PATH. Each of those is one check here, with the fix for
it, before a deploy spends minutes (or money) finding out. The checks a level needs are data
(``NEEDS``); every cloud call goes through ``options.aws.Target``, so ``--target emulator``
asks the embedded local AWS the same questions.

Exit codes: 0 all that the level needs is there, 1 something is missing, 2 bad input.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import urllib.parse
from dataclasses import asdict, dataclass

from options.core import BadInput, LEVELS, exit_code, rung
from options.spectrum import check_target, rung_module

SAGEMAKER_PRINCIPAL = "sagemaker.amazonaws.com"
NO_CREDENTIALS = "skipped: no credentials"
NOT_EMULATED = "skipped: the emulator (moto) has no {api}; --target aws asks AWS"
CREDENTIALS_FIX = ("aws configure (or aws sso login, or export AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY)")
TRUST_POLICY = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": SAGEMAKER_PRINCIPAL}, "Action": "sts:AssumeRole"}]},
    separators=(",", ":"))
# name → (what to run, how to install it)
TOOLS = {
    "podman or docker": (("podman", "docker"), "install Podman (apt-get install podman) or Docker "
                         "(https://docs.docker.com/engine/install/)"),
    "kubectl": (("kubectl",), "install kubectl: https://kubernetes.io/docs/tasks/tools/"),
    "eksctl": (("eksctl",), "install eksctl: https://eksctl.io/installation/"),
    "helm": (("helm",), "install Helm: https://helm.sh/docs/intro/install/"),
}
# extra → (module it brings, what needs it)
EXTRAS = {"sdk": ("sagemaker", "the SageMaker Python SDK"),
          "infra": ("kubernetes", "the Kubernetes client and validators"),
          "engine-cpu": ("vllm", "vLLM on CPU, for --target local")}
# What each level needs, in the order checked (credentials first: the cloud checks use them).
CLOUD = ("credentials", "region")
SAGEMAKER = CLOUD + ("role", "quota")
NEEDS = {1: CLOUD + ("bedrock",),
         2: SAGEMAKER + ("extra:sdk",),
         3: SAGEMAKER + ("extra:sdk", "extra:engine-cpu"),
         4: SAGEMAKER + ("extra:sdk", "extra:engine-cpu"),
         5: SAGEMAKER + ("tool:podman or docker", "extra:engine-cpu"),
         6: CLOUD + ("tool:kubectl", "tool:eksctl", "tool:helm", "extra:infra")}
OPTIONAL = {"extra:engine-cpu"}     # only --target local serves with it: reported, not required
# The emulator (moto) takes any region and does not check the execution role: reported there,
# not required. What moto does not implement at all (Service Quotas' lists, Bedrock's model
# catalogue) is skipped on it, never answered with a guess.
NOT_ENFORCED_BY_EMULATOR = {"region", "role"}


@dataclass
class Check:
    check: str
    ok: bool | None           # None: skipped (no credentials, or the emulator lacks the API)
    detail: str
    fix: str = ""
    needed: bool = True       # False: reported, but does not make the exit code 1


@dataclass
class Context:
    """What the checks share: the target, the flags, and the account once STS has answered."""
    target: object
    args: argparse.Namespace
    account: str | None = None


# ----------------------------------------------------------------------------------- checks

def credentials(ctx: Context) -> Check:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        who = ctx.target.client("sts").get_caller_identity()
    except NoCredentialsError:
        return Check("AWS credentials", False, "none found (environment, ~/.aws, SSO or instance "
                     "role): the cloud checks below are skipped", CREDENTIALS_FIX)
    except (ClientError, BotoCoreError) as exc:
        return Check("AWS credentials", False, f"STS GetCallerIdentity failed: {exc}", CREDENTIALS_FIX)
    ctx.account = who["Account"]
    return Check("AWS credentials", True, f"{who['Arn']} (account {who['Account']})")


def region(ctx: Context) -> Check:
    source = next((name for name, value in (("--region", ctx.args.region),
                                            ("AWS_REGION", os.environ.get("AWS_REGION")),
                                            ("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION")))
                   if value), None)
    if source is None:
        return Check("region", False, f"not set: a deploy would use {ctx.target.region}",
                     "export AWS_REGION=<your region>, or pass --region")
    return Check("region", True, f"{ctx.target.region} (from {source})")


def role(ctx: Context) -> Check:
    from botocore.exceptions import BotoCoreError, ClientError
    from options.sagemaker.plan import ACCOUNT_PLACEHOLDER, DEFAULT_ROLE_ARN

    label = "SageMaker execution role"
    if ctx.account is None:
        return Check(label, None, NO_CREDENTIALS)
    arn = (ctx.args.role_arn or DEFAULT_ROLE_ARN).replace(ACCOUNT_PLACEHOLDER, ctx.account)
    name = arn.rsplit("/", 1)[-1]
    create = (f"aws iam create-role --role-name {name} --assume-role-policy-document '{TRUST_POLICY}' "
              f"&& aws iam attach-role-policy --role-name {name} --policy-arn "
              "arn:aws:iam::aws:policy/AmazonSageMakerFullAccess; or name yours with --role-arn "
              "(deploy reads it from --role-arn or $SAGEMAKER_ROLE_ARN)")
    try:
        document = ctx.target.client("iam").get_role(RoleName=name)["Role"]["AssumeRolePolicyDocument"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchEntity":
            return Check(label, False, f"{arn} does not exist", create)
        return Check(label, False, f"cannot read {arn}: {exc}", "allow iam:GetRole, or check the role by hand")
    except BotoCoreError as exc:
        return Check(label, False, f"cannot read {arn}: {exc}", "check the network and try again")
    trusted = trusted_services(document)
    if SAGEMAKER_PRINCIPAL in trusted:
        return Check(label, True, f"{arn}, which {SAGEMAKER_PRINCIPAL} may assume")
    return Check(label, False, f"{arn} trusts {', '.join(sorted(trusted)) or 'no service'}, not "
                 f"{SAGEMAKER_PRINCIPAL}", f"aws iam update-assume-role-policy --role-name {name} "
                 f"--policy-document '{TRUST_POLICY}'")


def trusted_services(document: dict | str) -> set[str]:
    """The services a trust policy lets assume the role (IAM may hand it back URL-encoded)."""
    if isinstance(document, str):
        document = json.loads(urllib.parse.unquote(document))
    statements = document.get("Statement", [])
    out: set[str] = set()
    for s in [statements] if isinstance(statements, dict) else statements:
        actions = s.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        if s.get("Effect") != "Allow" or not {"sts:AssumeRole", "sts:*", "*"} & set(actions):
            continue
        services = (s.get("Principal") or {}).get("Service", []) if isinstance(s.get("Principal"), dict) else []
        out.update([services] if isinstance(services, str) else services)
    return out


def quota(ctx: Context) -> Check:
    from botocore.exceptions import BotoCoreError, ClientError

    name = f"{ctx.args.instance_type} for endpoint usage"
    label = f"quota: {name}"
    if ctx.account is None or ctx.target.kind == "emulator":
        return Check(label, None, NO_CREDENTIALS if ctx.account is None else NOT_EMULATED.format(
            api="Service Quotas' ListServiceQuotas"))
    client = ctx.target.client("service-quotas")
    try:       # the applied value if the account has one, else AWS's default
        found = next(((q, how) for operation, how in (("list_service_quotas", "applied"),
                                                      ("list_aws_default_service_quotas", "default"))
                      for page in client.get_paginator(operation).paginate(ServiceCode="sagemaker")
                      for q in page["Quotas"] if q["QuotaName"] == name), None)
    except (ClientError, BotoCoreError) as exc:
        return Check(label, False, f"Service Quotas could not be read: {exc}",
                     f"allow servicequotas:ListServiceQuotas, or look in the Service Quotas console ({ctx.target.region})")
    if found is None:
        return Check(label, False, f"no SageMaker quota named {name!r} in {ctx.target.region}",
                     "check the instance type (--instance-type) and that SageMaker offers it in this region")
    (q, how), wanted = found, ctx.args.instance_count
    if q["Value"] >= wanted:
        return Check(label, True, f"{q['Value']:g} ({how}), {wanted} needed")
    return Check(label, False, f"{q['Value']:g} ({how}): fewer than the {wanted} a deploy needs",
                 f"aws service-quotas request-service-quota-increase --service-code sagemaker --quota-code "
                 f"{q['QuotaCode']} --desired-value {wanted} --region {ctx.target.region}")


def bedrock(ctx: Context) -> Check:
    from botocore.exceptions import BotoCoreError, ClientError
    from options.bedrock import DEFAULT_MODEL

    model = ctx.args.model or DEFAULT_MODEL
    label = f"Bedrock model access: {model}"
    if ctx.account is None or ctx.target.kind == "emulator":
        return Check(label, None, NO_CREDENTIALS if ctx.account is None else NOT_EMULATED.format(
            api="Bedrock's GetFoundationModel"))
    fix = f"enable it in the Bedrock console, Model access ({ctx.target.region}), or pick another --model"
    client = ctx.target.client("bedrock")
    try:
        client.get_foundation_model(modelIdentifier=model)
        access = client.get_foundation_model_availability(modelId=model)
    except ClientError as exc:
        return Check(label, False, f"{exc.response['Error']['Code']}: {exc.response['Error']['Message']}", fix)
    except BotoCoreError as exc:
        return Check(label, False, f"Bedrock could not be asked: {exc}", fix)
    missing = [f"{key} {value}" for key, value in (
        ("authorization", access.get("authorizationStatus")),
        ("agreement", (access.get("agreementAvailability") or {}).get("status")),
        ("entitlement", access.get("entitlementAvailability")),
        ("region", access.get("regionAvailability"))) if value not in ("AUTHORIZED", "AVAILABLE")]
    if missing:
        return Check(label, False, ", ".join(missing), fix)
    return Check(label, True, f"offered and authorized in {ctx.target.region}")


def tool(label: str) -> Check:
    names, fix = TOOLS[label]
    found = next((path for path in map(shutil.which, names) if path), None)
    if found:
        return Check(f"on PATH: {label}", True, found)
    return Check(f"on PATH: {label}", False, "not found on PATH", fix)


def extra(name: str) -> Check:
    module, what = EXTRAS[name]
    if importlib.util.find_spec(module) is not None:
        return Check(f"extra [{name}]", True, f"{what} ({module} importable)")
    return Check(f"extra [{name}]", False, f"{what}: {module} is not installed",
                 f"pip install 'spectrum[{name}]'")


CLOUD_CHECKS = {"credentials": credentials, "region": region, "role": role, "quota": quota, "bedrock": bedrock}


def run_checks(levels: list[int], ctx: Context) -> dict[str, Check]:
    """Each need once, in ``NEEDS`` order, for all the levels asked about."""
    out: dict[str, Check] = {}
    for need in dict.fromkeys(n for level in levels for n in NEEDS[level]):
        kind, _, name = need.partition(":")
        out[need] = {"tool": tool, "extra": extra}[kind](name) if name else CLOUD_CHECKS[kind](ctx)
        out[need].needed = need not in OPTIONAL and not (
            ctx.target.kind == "emulator" and need in NOT_ENFORCED_BY_EMULATOR)
    return out


def ready_levels(levels: list[int], checks: dict[str, Check]) -> list[int]:
    """The levels none of whose needed checks failed (a skipped one blocks only through the
    check it waits on: no credentials is itself a failure)."""
    return [level for level in levels
            if not any(checks[n].ok is False and checks[n].needed for n in NEEDS[level])]


# ----------------------------------------------------------------------------------- CLI

def build_parser(prog: str = "python -m options.check") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0].split(": ", 1)[1])
    p.add_argument("--level", type=int, help=f"the rung to check ({', '.join(map(str, LEVELS))}; "
                   "default: every rung)")
    p.add_argument("--target", choices=("aws", "emulator"), default="aws",
                   help="aws: your account (default); emulator: the embedded local AWS")
    p.add_argument("--endpoint-url", metavar="URL", help="a running emulator to ask instead of starting "
                   "one (implies --target emulator), e.g. --endpoint-url http://127.0.0.1:5000")
    p.add_argument("--region", metavar="R", help="AWS region (default $AWS_REGION, else us-east-1)")
    p.add_argument("--role-arn", metavar="ARN", default=os.environ.get("SAGEMAKER_ROLE_ARN"),
                   help="the execution role deploy will use (default $SAGEMAKER_ROLE_ARN, else "
                        "arn:aws:iam::<account>:role/SageMakerExecutionRole)")
    p.add_argument("--instance-type", metavar="T", help="whose quota to check (default: the level's)")
    p.add_argument("--instance-count", type=int, default=1, metavar="N", help="instances needed (1)")
    p.add_argument("--model", metavar="ID", help="Bedrock model id to check access to (level 1)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {check, ok, detail, fix, needed}")
    return p


def default_instance(level: int | None) -> str:
    """The instance a deploy of the level uses unless told: its rung's own default (level 2's
    comes from JumpStart per model; level 3's stands in for it and for "every level")."""
    return rung_module(level if level in (3, 4, 5) else 3).DEFAULT_INSTANCE


def main(argv: list[str] | None = None, prog: str = "python -m options.check") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        levels = [rung(args.level).level] if args.level is not None else list(LEVELS)
        if args.target == "emulator" or args.endpoint_url:
            for level in levels if args.level is not None else []:
                check_target(level, "emulator")      # level 1: no emulator, and why
            levels = [level for level in levels if rung(level).can.has_emulator]
        if args.instance_count < 1:
            raise BadInput(f"--instance-count {args.instance_count} must be at least 1")
        args.instance_type = args.instance_type or default_instance(args.level)
        checks = _run(levels, args)
    except BaseException as exc:  # noqa: BLE001 - exit_code re-raises what is not ours
        return exit_code(exc, lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json.dumps([asdict(c) for c in checks.values()], indent=2, ensure_ascii=False))
    else:
        render(checks, levels, args)
    return 0 if ready_levels(levels, checks) == levels else 1


def _run(levels: list[int], args: argparse.Namespace) -> dict[str, Check]:
    from options.aws import Target, emulator
    from options.sagemaker.plan import region_of

    if args.endpoint_url:
        return run_checks(levels, Context(Target("emulator", region_of(args), args.endpoint_url), args))
    if args.target == "emulator":
        with emulator() as url:
            return run_checks(levels, Context(Target("emulator", region_of(args), url), args))
    return run_checks(levels, Context(Target("aws", region_of(args)), args))


def render(checks: dict[str, Check], levels: list[int], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    what = f"level {levels[0]} ({rung(levels[0]).name})" if len(levels) == 1 else "every level"
    table = Table(title=f"What {what} needs, on {args.target}", title_justify="left")
    for column in ("", "check", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for c in checks.values():
        mark = "[green]✓[/]" if c.ok else "[dim]–[/]" if c.ok is None else "[red]✗[/]" if c.needed else "[yellow]✗[/]"
        table.add_row(mark, escape(c.check + ("" if c.needed else " (not required)")), escape(c.detail), escape(c.fix))
    console.print(table)
    missing = [c.check for c in checks.values() if c.needed and c.ok is False]
    skipped = sum(c.ok is None for c in checks.values())
    console.print(f"[red]{len(missing)} missing:[/] {escape('; '.join(missing))}" if missing else "[green]ready[/]",
                  f"({skipped} skipped)" if skipped else "")
    if len(levels) > 1:
        ready = ready_levels(levels, checks)
        console.print(f"ready: {', '.join(f'level {n}' for n in ready) or 'no level'}")


if __name__ == "__main__":
    sys.exit(main())
