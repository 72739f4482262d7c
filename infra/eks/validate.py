"""Offline validation of everything ``render`` produces. Each check can fail on its own:

- built-in kinds: ``kubernetes-validate`` in strict mode (unknown fields are errors, and a kind
  no validator knows is an error, not the library's warning);
- CRD kinds (NodePool, EC2NodeClass, RayService): the upstream CRD's ``openAPIV3Schema``
  through ``jsonschema``, converted as shared/k8s-schemas/README.md says, plus hand checks for
  the CEL rules that matter;
- RayService ``serveConfigV2``: Ray Serve's deploy schema (a project model, see project_schemas);
- the eksctl ClusterConfig: eksctl's own JSON schema;
- Gateway API, Envoy Gateway and Prometheus Operator kinds: project-written schemas of the
  fields Spectrum emits (their CRDs are not available offline);
- every file: yamllint;
- security: checkov (``--skip-download --framework kubernetes``), in its own environment;
  each skipped check must carry its reason in the manifest.

Schemas come from ``$SPECTRUM_K8S_SCHEMAS``, else ``../shared/k8s-schemas`` beside the checkout.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

from infra.eks.project_schemas import OPENAI_APP_ARGS, PROJECT_KINDS, SERVE_DEPLOY
from infra.eks.rayservice import BYO_APP, OPENAI_APP

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMAS_ENV = "SPECTRUM_K8S_SCHEMAS"
CHECKOV_ENV = "SPECTRUM_CHECKOV"
EKSCTL_SCHEMA = "eksctl-v1alpha5.schema.json"
# The upstream files the CRD and eksctl checks read, and where each is published: an installed
# Spectrum carries none of them (they are the projects' data, not ours), so the note names them.
UPSTREAM_SCHEMAS = {
    "ray.io_rayservices.yaml": "github.com/ray-project/kuberay, ray-operator/config/crd/bases/",
    "karpenter.sh_nodepools.yaml": "github.com/aws/karpenter-provider-aws, pkg/apis/crds/ at v1.14.1",
    "karpenter.k8s.aws_ec2nodeclasses.yaml": "github.com/aws/karpenter-provider-aws, pkg/apis/crds/ at v1.14.1",
    EKSCTL_SCHEMA: "github.com/eksctl-io/eksctl, pkg/apis/eksctl.io/v1alpha5/assets/schema.json",
}
YAMLLINT_CONFIG = """
extends: default
rules:
  line-length: {max: 240}
  truthy: {allowed-values: ["true", "false"], check-keys: false}
"""

PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"


@dataclass
class Finding:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Check:
    name: str
    checked: int = 0                     # documents or files looked at
    findings: list[Finding] = field(default_factory=list)
    status: str = PASSED
    note: str = ""                       # what the check rests on, or why it did not run
    skipped: list[str] = field(default_factory=list)   # checkov: "CHECK resource: reason"

    def fail(self, where: str, message: str) -> None:
        self.findings.append(Finding(where, message))
        self.status = FAILED

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "status": self.status, "checked": self.checked,
               "findings": [str(f) for f in self.findings]}
        if self.note:
            out["note"] = self.note
        if self.skipped:
            out["skipped"] = self.skipped
        return out


@dataclass
class ValidationReport:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """No check failed (a check that could not run is reported, not counted as failed)."""
        return all(c.status != FAILED for c in self.checks)

    @property
    def complete(self) -> bool:
        return all(c.status == PASSED for c in self.checks)

    def check(self, name_prefix: str) -> Check:
        return next(c for c in self.checks if c.name.startswith(name_prefix))

    def findings(self) -> list[str]:
        return [f"[{c.name}] {f}" for c in self.checks for f in c.findings]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "complete": self.complete,
                "checks": [c.to_json() for c in self.checks]}


# --- where the schemas are ---------------------------------------------------------------

def schema_dir_candidates() -> list[Path]:
    out = []
    if os.environ.get(SCHEMAS_ENV):
        out.append(Path(os.environ[SCHEMAS_ENV]))
    out.append(REPO_ROOT.parent / "shared" / "k8s-schemas")
    return out


def schema_dir() -> Path | None:
    for candidate in schema_dir_candidates():
        if candidate.is_dir():
            return candidate
    return None


def missing_schemas_note() -> str:
    looked = " and ".join(str(p) for p in schema_dir_candidates())
    wanted = "; ".join(f"{name} ({where})" for name, where in UPSTREAM_SCHEMAS.items())
    return (f"no schema folder: looked in {looked}. Set {SCHEMAS_ENV} to a folder holding the "
            f"upstream schemas, each from its project (Apache-2.0): {wanted}")


# --- helpers -------------------------------------------------------------------------------

def _where(doc: dict[str, Any], file: str = "") -> str:
    meta = doc.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    ref = f"{doc.get('kind', '?')}/{ns}{meta.get('name', '?')}"
    return f"{file} {ref}".strip()


def _schema_errors(validator, doc: Any) -> list[str]:
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    out = []
    for e in errors[:10]:
        path = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        message = e.message if len(e.message) <= 300 else e.message[:300] + " ..."
        out.append(f"{path}: {message}")
    return out


def _key(doc: dict[str, Any]) -> tuple[str, str]:
    return (doc.get("apiVersion", ""), doc.get("kind", ""))


# --- CRD schemas -----------------------------------------------------------------------------

def crd_to_json_schema(node: Any, strict: bool = True) -> Any:
    """An openAPIV3Schema as JSON Schema: nullable, int-or-string, strict objects, defaults."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: crd_to_json_schema(sub, strict) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = crd_to_json_schema(value, strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [crd_to_json_schema(sub, strict) for sub in value]
        elif key.startswith("x-kubernetes-") or key in ("nullable", "description"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if (strict and "properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if "required" in out and "properties" in node:
        # The API server fills defaults before it checks `required`.
        out["required"] = [f for f in out["required"]
                           if "default" not in (node["properties"].get(f) or {})]
    return out


@lru_cache(maxsize=8)
def _crd_index(folder: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> {"schema": converted schema, "raw": CRD openAPIV3Schema}."""
    index: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            raw = version["schema"]["openAPIV3Schema"]
            index[(f"{group}/{version['name']}", kind)] = {
                "schema": crd_to_json_schema(raw), "raw": raw, "file": path.name,
                "served": version.get("served", True)}
    return index


def _label_domain_allowlist(raw: dict[str, Any], domain: str) -> set[str]:
    """The label keys a Karpenter CEL rule allows in a restricted domain, read from the CRD."""
    text = json.dumps(raw)
    for match in re.finditer(r'self in \[([^\]]*)\] \|\| !self\.find\(\\"\^\(\[\^/\]\+\)\\"\)\.endsWith\(\\"'
                             + re.escape(domain) + r'\\"\)', text):
        return set(re.findall(r'\\"([^\\"]+)\\"', match.group(1)))
    return set()


def _label_key_problems(key: str, raw: dict[str, Any]) -> list[str]:
    if key in ("karpenter.sh/nodepool", "kubernetes.io/hostname"):
        return [f"label {key!r} is restricted"]
    domain = key.split("/", 1)[0] if "/" in key else ""
    for restricted in ("karpenter.sh", "karpenter.k8s.aws"):
        if domain.endswith(restricted) and key not in _label_domain_allowlist(raw, restricted):
            return [f"label domain {restricted!r} is restricted: {key!r} is not one of the "
                    "well-known labels Karpenter accepts"]
    return []


def cel_node_pool(doc: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """NodePool rules (x-kubernetes-validations) that JSON Schema cannot express."""
    problems = []
    spec = doc.get("spec") or {}
    template = spec.get("template") or {}
    for i, req in enumerate((template.get("spec") or {}).get("requirements") or []):
        at = f"spec.template.spec.requirements.{i}"
        op, values = req.get("operator"), req.get("values") or []
        if op == "In" and not values:
            problems.append(f"{at}: requirements with operator 'In' must have a value defined")
        if op in ("Gt", "Lt", "Gte", "Lte") and not (
                len(values) == 1 and re.fullmatch(r"\d+", str(values[0]))):
            problems.append(f"{at}: operator {op!r} needs a single non-negative integer value")
        if op == "In" and "minValues" in req and len(values) < req["minValues"]:
            problems.append(f"{at}: minValues {req['minValues']} but only {len(values)} values")
        problems += [f"{at}.key: {p}" for p in _label_key_problems(str(req.get("key", "")), raw)]
    for key in ((template.get("metadata") or {}).get("labels") or {}):
        problems += [f"spec.template.metadata.labels: {p}" for p in _label_key_problems(key, raw)]
    node_class = (template.get("spec") or {}).get("nodeClassRef") or {}
    for part in ("group", "kind", "name"):
        if node_class.get(part) == "":
            problems.append(f"spec.template.spec.nodeClassRef.{part} may not be empty")
    if "replicas" in spec and "weight" in spec:
        problems.append("spec: 'weight' is not supported on static NodePools")
    for j, budget in enumerate((spec.get("disruption") or {}).get("budgets") or []):
        if ("schedule" in budget) != ("duration" in budget):
            problems.append(f"spec.disruption.budgets.{j}: 'schedule' must be set with 'duration'")
    return problems


_AMI_FAMILIES = {"al2": "AL2", "al2023": "AL2023", "bottlerocket": "Bottlerocket",
                 "windows2019": "Windows2019", "windows2022": "Windows2022",
                 "windows2025": "Windows2025"}
_RESTRICTED_TAGS = ("eks:eks-cluster-name", "karpenter.sh/nodepool", "karpenter.sh/nodeclaim",
                    "karpenter.k8s.aws/ec2nodeclass")


def cel_ec2_node_class(doc: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """EC2NodeClass rules (x-kubernetes-validations) that JSON Schema cannot express."""
    problems = []
    spec = doc.get("spec") or {}
    if ("role" in spec) == ("instanceProfile" in spec):
        problems.append("spec: must specify exactly one of ['role', 'instanceProfile']")
    for part in ("role", "instanceProfile"):
        if spec.get(part) == "":
            problems.append(f"spec.{part} cannot be empty")
    terms = spec.get("amiSelectorTerms") or []
    aliases = [t["alias"] for t in terms if "alias" in t]
    for alias in aliases:
        family = alias.split("@", 1)[0]
        if not re.fullmatch(r"[a-zA-Z0-9]+@.+", alias):
            problems.append(f"spec.amiSelectorTerms: alias {alias!r} must look like family@version")
        elif family not in _AMI_FAMILIES:
            problems.append(f"spec.amiSelectorTerms: alias family {family!r} is not one of "
                            f"{', '.join(_AMI_FAMILIES)}")
        elif family.startswith("windows") and alias.split("@", 1)[1] != "latest":
            problems.append("spec.amiSelectorTerms: windows families may only use version 'latest'")
        elif "amiFamily" in spec and spec["amiFamily"] not in ("Custom", _AMI_FAMILIES[family]):
            problems.append(f"spec.amiFamily {spec['amiFamily']!r} must be "
                            f"{_AMI_FAMILIES[family]!r} or 'Custom' with alias {alias!r}")
    if aliases and len(terms) != 1:
        problems.append("spec.amiSelectorTerms: 'alias' cannot be combined with other terms")
    for t in terms:
        if "alias" in t and set(t) - {"alias"}:
            problems.append("spec.amiSelectorTerms: 'alias' is mutually exclusive with other fields")
    if not aliases and "amiFamily" not in spec:
        problems.append("spec: must specify amiFamily if amiSelectorTerms does not contain an alias")
    for name, allowed in (("subnetSelectorTerms", ("tags", "id")),
                          ("securityGroupSelectorTerms", ("tags", "id", "name"))):
        selector_terms = spec.get(name) or []
        if not selector_terms:
            problems.append(f"spec.{name} cannot be empty")
        for t in selector_terms:
            if not any(k in t for k in allowed):
                problems.append(f"spec.{name}: each term needs one of {', '.join(allowed)}")
            if "id" in t and len(set(t) & set(allowed)) > 1:
                problems.append(f"spec.{name}: 'id' is mutually exclusive with other fields")
            for k, v in (t.get("tags") or {}).items():
                if k == "" or v == "":
                    problems.append(f"spec.{name}: empty tag keys or values aren't supported")
    for k in (spec.get("tags") or {}):
        if k == "" or k in _RESTRICTED_TAGS or k.startswith("kubernetes.io/cluster"):
            problems.append(f"spec.tags: tag {k!r} is restricted")
    return problems


CEL_CHECKS = {"NodePool": cel_node_pool, "EC2NodeClass": cel_ec2_node_class}


# --- the checks ------------------------------------------------------------------------------

Documents = Iterable[tuple[str, dict[str, Any]]]   # (file, document)


def _crd_keys(folder: Path | None) -> set[tuple[str, str]]:
    return set(_crd_index(str(folder))) if folder else set()


def check_builtin_kinds(docs: Documents, k8s_version: str, folder: Path | None) -> Check:
    import kubernetes_validate

    check = Check(f"kubernetes-validate strict (Kubernetes {k8s_version})")
    other = _crd_keys(folder) | set(PROJECT_KINDS)
    for file, doc in docs:
        if _key(doc) in other:
            continue
        check.checked += 1
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(top level)"
            check.fail(_where(doc, file), f"{path}: {e.message[:300]}")
        except kubernetes_validate.SchemaNotFoundError as e:
            # The library only warns here; an unknown kind would be rejected by the cluster.
            check.fail(_where(doc, file), f"unknown kind: {e.message}; no validator knows "
                                          f"{doc.get('apiVersion')} {doc.get('kind')}")
    return check


def check_crd_kinds(docs: Documents, folder: Path | None) -> Check:
    from jsonschema import Draft4Validator

    check = Check("CRD openAPIV3Schema + CEL hand checks")
    if folder is None:
        check.status, check.note = NOT_RUN, missing_schemas_note()
        return check
    index = _crd_index(str(folder))
    check.note = f"CRDs from {folder}"
    for file, doc in docs:
        entry = index.get(_key(doc))
        if entry is None:
            continue
        check.checked += 1
        where = _where(doc, file)
        for problem in _schema_errors(Draft4Validator(entry["schema"]), doc):
            check.fail(where, problem)
        for problem in CEL_CHECKS.get(doc["kind"], lambda d, r: [])(doc, entry["raw"]):
            check.fail(where, f"CEL rule: {problem}")
    return check


def _worker_gpus(doc: dict[str, Any]) -> list[tuple[int, int]]:
    """(GPUs per worker pod, max worker pods) for each GPU worker group of a RayService."""
    out = []
    cluster = (doc.get("spec") or {}).get("rayClusterConfig") or {}
    for group in cluster.get("workerGroupSpecs") or []:
        for c in ((group.get("template") or {}).get("spec") or {}).get("containers") or []:
            gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
            if gpus is not None:
                out.append((int(gpus), int(group.get("maxReplicas", group.get("replicas", 1)))))
    return out


def _serve_configs(docs: Documents, check: Check):
    """Each RayService's serveConfigV2 as (document, where, config); one that does not parse
    fails ``check``."""
    for file, doc in docs:
        if doc.get("kind") != "RayService":
            continue
        check.checked += 1
        where = _where(doc, file) + " serveConfigV2"
        text = (doc.get("spec") or {}).get("serveConfigV2")
        try:
            config = yaml.safe_load(text) if isinstance(text, str) else None
        except yaml.YAMLError as e:
            check.fail(where, f"not YAML: {e}")
            continue
        if not isinstance(config, dict):
            check.fail(where, "must be a YAML mapping (Ray Serve's deploy config) given as a string")
            continue
        yield doc, where, config


def check_ray_serve_configs(docs: Documents) -> Check:
    """Each serveConfigV2 through Ray's own ``ServeDeploySchema``, and the byo application's
    args through its builder's own check (``byo_vllm.ray_serve.parse_args``)."""
    check = Check("Ray Serve serveConfigV2 (Ray's own ServeDeploySchema)")
    try:
        from ray.serve.schema import ServeDeploySchema
    except ImportError as e:
        check.status, check.note = NOT_RUN, (f"Ray is not installed here ({e}): pip install "
                                             "'spectrum[ray]' to check with Ray's own schema")
        return check
    for doc, where, config in _serve_configs(docs, check):
        try:
            ServeDeploySchema.model_validate(config)
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError lists each field
            check.fail(where, " ".join(str(e).split()))
            continue
        workers = _worker_gpus(doc)
        for i, app in enumerate(config.get("applications") or []):
            if app.get("import_path") != BYO_APP:
                continue
            from byo_vllm.config import ConfigError
            from byo_vllm.ray_serve import parse_args
            try:
                parse_args(app.get("args"))
            except ConfigError as e:
                check.fail(f"{where} applications.{i}.args", str(e))
                continue
            need = (app.get("args") or {}).get("engine_num_gpus") or 0
            if workers and need and not any(g >= need for g, _ in workers):
                check.fail(f"{where} applications.{i}.args", f"an engine replica needs {need} "
                           f"GPUs but worker pods have {max(g for g, _ in workers)}")
    if not check.checked:
        check.note = "no RayService in this stack (--engine rayservice renders one)"
    return check


def check_serve_configs(docs: Documents) -> Check:
    from jsonschema import Draft202012Validator

    check = Check("Ray Serve serveConfigV2 (project model of Ray Serve's deploy schema)")
    for doc, where, config in _serve_configs(docs, check):
        problems = _schema_errors(Draft202012Validator(SERVE_DEPLOY), config)
        apps = config.get("applications") or []
        for attr in ("name", "route_prefix"):
            seen = [a.get(attr) for a in apps if isinstance(a, dict) and a.get(attr) is not None]
            if len(seen) != len(set(seen)):
                problems.append(f"applications: {attr} values must be unique, got {seen}")
        workers = _worker_gpus(doc)
        for i, app in enumerate(a for a in apps if isinstance(a, dict)):
            if app.get("import_path") != OPENAI_APP:
                continue
            args = app.get("args") or {}
            problems += [f"applications.{i}.args.{p}" for p in
                         _schema_errors(Draft202012Validator(OPENAI_APP_ARGS), args)]
            for j, llm in enumerate(args.get("llm_configs") or []):
                if not isinstance(llm, dict):
                    continue
                at = f"applications.{i}.args.llm_configs.{j}"
                kwargs = llm.get("engine_kwargs") or {}
                need = int(kwargs.get("tensor_parallel_size", 1)) * int(
                    kwargs.get("pipeline_parallel_size", 1))
                if workers and not any(g >= need for g, _ in workers):
                    problems.append(f"{at}: a replica needs {need} GPUs (tensor x pipeline "
                                    f"parallel) but worker pods have {max(g for g, _ in workers)}")
                lora = llm.get("lora_config")
                if lora is not None and kwargs.get("enable_lora") is not True:
                    problems.append(f"{at}: lora_config needs engine_kwargs.enable_lora: true "
                                    "(vLLM serves no adapter otherwise)")
                if lora is not None and not (lora or {}).get("dynamic_lora_loading_path"):
                    problems.append(f"{at}.lora_config: dynamic_lora_loading_path is missing: "
                                    "the folder Ray Serve loads <path>/<adapter> from")
                scaling = (llm.get("deployment_config") or {}).get("autoscaling_config") or {}
                lo, hi = scaling.get("min_replicas"), scaling.get("max_replicas")
                if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                    problems.append(f"{at}: autoscaling min_replicas {lo} > max_replicas {hi}")
                if workers and isinstance(hi, int):
                    capacity = sum(g // need * n for g, n in workers if g >= need)
                    if hi > capacity:
                        problems.append(f"{at}: max_replicas {hi} needs {hi * need} GPUs but the "
                                        f"worker groups can hold only {capacity} replicas")
        for problem in problems:
            check.fail(where, problem)
    if not check.checked:
        check.note = "no RayService in this stack (--engine rayservice renders one)"
    return check


def check_cluster_config(cluster_config: dict[str, Any], folder: Path | None) -> Check:
    from jsonschema.validators import validator_for

    check = Check("eksctl ClusterConfig schema")
    if folder is None or not (folder / EKSCTL_SCHEMA).is_file():
        check.status = NOT_RUN
        check.note = missing_schemas_note() if folder is None else f"{EKSCTL_SCHEMA} not in {folder}"
        return check
    schema = _load_json(str(folder / EKSCTL_SCHEMA))
    check.note = f"{folder / EKSCTL_SCHEMA}"
    check.checked = 1
    for problem in _schema_errors(validator_for(schema)(schema), cluster_config):
        check.fail("cluster.yaml ClusterConfig", problem)
    return check


@lru_cache(maxsize=4)
def _load_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


def check_project_kinds(docs: Documents) -> Check:
    from jsonschema import Draft202012Validator

    check = Check("Gateway API / Envoy Gateway / Prometheus Operator (project-written schemas)")
    check.note = ("their CRDs are not available offline: strict schemas of the fields Spectrum "
                  "emits, written by the project (infra/eks/project_schemas.py)")
    for file, doc in docs:
        schema = PROJECT_KINDS.get(_key(doc))
        if schema is None:
            continue
        check.checked += 1
        for problem in _schema_errors(Draft202012Validator(schema), doc):
            check.fail(_where(doc, file), problem)
    return check


def check_yaml(files: dict[str, str]) -> Check:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    check = Check("yamllint")
    config = YamlLintConfig(YAMLLINT_CONFIG)
    for name, text in files.items():
        check.checked += 1
        for problem in linter.run(text, config):
            check.fail(f"{name}:{problem.line}:{problem.column}",
                       f"{problem.level}: {problem.desc} ({problem.rule})")
    return check


def checkov_binary() -> str | None:
    for candidate in (os.environ.get(CHECKOV_ENV), str(REPO_ROOT / ".venv-checkov/bin/checkov"),
                      shutil.which("checkov")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def ray_pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods a RayService's templates make, so checkov (which skips custom kinds) sees them."""
    cluster = (doc.get("spec") or {}).get("rayClusterConfig") or {}
    groups = [("head", cluster.get("headGroupSpec") or {})] + [
        (g.get("groupName", "workers"), g) for g in cluster.get("workerGroupSpecs") or []]
    meta = doc.get("metadata") or {}
    out = []
    for group, spec in groups:
        template = spec.get("template") or {}
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {**(template.get("metadata") or {}),
                                 "name": f"{meta.get('name')}-{group}",
                                 "namespace": meta.get("namespace")},
                    "spec": template.get("spec") or {}})
    return out


def _checkov_tree(folder: Path, scratch: Path) -> Path:
    """A copy of ``folder`` plus the pods of each RayService in it."""
    tree = scratch / "manifests"
    shutil.copytree(folder, tree)
    pods = [pod for path in sorted(folder.rglob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if isinstance(doc, dict) and doc.get("kind") == "RayService"
            for pod in ray_pods(doc)]
    if pods:
        (tree / "zz-rayservice-pods.yaml").write_text(yaml.safe_dump_all(pods, sort_keys=False))
    return tree


def check_checkov(folder: Path, timeout_s: float = 180) -> Check:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="spectrum-checkov-") as scratch:
        return _run_checkov(_checkov_tree(Path(folder), Path(scratch)), timeout_s)


def _run_checkov(folder: Path, timeout_s: float) -> Check:
    check = Check("checkov (kubernetes)")
    binary = checkov_binary()
    if binary is None:
        check.status = NOT_RUN
        check.note = (f"checkov not found: set {CHECKOV_ENV} to a checkov binary (it needs its own "
                      "virtual environment: python -m venv .venv-checkov && "
                      ".venv-checkov/bin/pip install 'checkov>=3.2,<4')")
        return check
    proc = subprocess.run([binary, "--skip-download", "--framework", "kubernetes", "-d",
                           str(folder), "-o", "json", "--compact"],
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "LOG_LEVEL": "ERROR"})
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        check.fail(str(folder), f"checkov gave no JSON report (exit {proc.returncode}): "
                                f"{(proc.stderr or proc.stdout)[-500:]}")
        return check
    reports = report if isinstance(report, list) else [report]
    for rep in reports:
        if not isinstance(rep, dict) or "results" not in rep:
            continue      # "no resources found" comes back as a bare summary
        summary = rep.get("summary", {})
        check.checked += summary.get("resource_count", 0)
        results = rep["results"]
        for failed in results.get("failed_checks", []):
            check.fail(f"{failed.get('file_path')} {failed.get('resource')}",
                       f"{failed['check_id']} {failed.get('check_name', '')}")
        for skipped in results.get("skipped_checks", []):
            result = skipped.get("check_result") or {}
            reason = (result.get("suppress_comment") or skipped.get("suppress_comment") or "").strip()
            if reason == "No comment provided":      # what checkov fills in for a bare skip
                reason = ""
            line = f"{skipped['check_id']} {skipped.get('resource')}: {reason or '(no reason)'}"
            check.skipped.append(line)
            if not reason:
                check.fail(f"{skipped.get('file_path')} {skipped.get('resource')}",
                           f"{skipped['check_id']} is skipped without a reason")
        if summary.get("parsing_errors"):
            check.fail(str(folder), f"checkov could not parse {summary['parsing_errors']} file(s)")
    check.note = f"{binary}"
    return check


def validate_documents(docs: list[tuple[str, dict[str, Any]]], k8s_version: str,
                       folder: Path | None = None) -> list[Check]:
    folder = folder if folder is not None else schema_dir()
    return [check_builtin_kinds(docs, k8s_version, folder), check_crd_kinds(docs, folder),
            check_serve_configs(docs), check_ray_serve_configs(docs), check_project_kinds(docs)]


def validate_rendered(rendered, out_dir: Path | None = None, run_checkov: bool = True,
                      schemas: Path | None = None) -> ValidationReport:
    """Run every check on a ``Rendered``; checkov needs the written folder (``out_dir``)."""
    docs = [(m.file, m.doc) for m in rendered.manifests]
    folder = schemas if schemas is not None else schema_dir()
    checks = validate_documents(docs, rendered.resolved.kubernetes_version, folder)
    checks.append(check_cluster_config(rendered.cluster_config, folder))
    checks.append(check_yaml(rendered.files()))
    if run_checkov:
        if out_dir is None:
            checks.append(Check("checkov (kubernetes)", status=NOT_RUN,
                                note="needs the rendered folder on disk"))
        else:
            checks.append(check_checkov(Path(out_dir) / "manifests"))
    return ValidationReport(checks)
