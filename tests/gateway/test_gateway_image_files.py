"""The gateway's image read without building it (tests/gateway/test_gateway_image.py builds and
runs it): lint clean, the files and user the level-6 manifests expect, and packages pinned to
releases that satisfy the project's own ``gateway`` extra."""
from __future__ import annotations

import json
import tomllib

from packaging.requirements import Requirement

from images import (assert_hadolint_passes, copies, declared, instructions,
                         requirement_names)
from gateway_harness import GATEWAY_DIR, REPO
from infra.eks.gateway import deployment
from infra.eks.workload import RUN_AS_USER

DOCKERFILE = GATEWAY_DIR / "Dockerfile"
REQUIREMENTS = GATEWAY_DIR / "requirements.txt"
# What the image may carry of the repository: the gateway, and the core and request shape
# its Bedrock and SageMaker upstreams speak through.
CARRIED = ("containers/gateway/", "options/__init__.py", "options/core", "options/contract.py")


def test_hadolint_passes():
    assert_hadolint_passes(DOCKERFILE)


def test_it_carries_the_gateway_and_what_it_imports_only():
    sources = [s for _, ss, _ in copies(DOCKERFILE) for s in ss]
    for source in sources:
        assert source.startswith(CARRIED), f"the image copies {source}; it carries only {CARRIED}"
        assert (REPO / source).exists(), f"the image copies missing {source}"
    for needed in ("containers/gateway/spectrum_gateway", "containers/gateway/serve",
                   "containers/gateway/admin", "options/contract.py", "options/core"):
        assert needed in sources, f"the image lacks {needed}"


def test_entrypoint_user_and_port_are_what_the_manifests_run():
    (entry,) = [json.loads(a) for a in declared(DOCKERFILE, "ENTRYPOINT")]
    assert entry == ["/opt/program/serve"]
    assert declared(DOCKERFILE, "USER") == [f"{RUN_AS_USER}:{RUN_AS_USER}"]
    env = " ".join(declared(DOCKERFILE, "ENV"))
    assert "PATH=/opt/program:" in env, "admin must run by name (kubectl exec ... admin)"
    from infra.eks.spec import EksSpec, resolve
    spec = EksSpec(gateway=True, image="123456789012.dkr.ecr.us-east-1.amazonaws.com/byo:0.1.0")
    container = deployment(resolve(spec))["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "serve"
    assert declared(DOCKERFILE, "EXPOSE") == [str(container["ports"][0]["containerPort"])]


def test_pins_satisfy_the_gateway_extra_and_live_in_requirements_txt():
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: the image pins exact releases"
            pins[req.name.lower()] = spec.version
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gateway"]
    for line in extra:
        req = Requirement(line)
        name = req.name.lower()
        assert name in pins, f"the gateway extra needs {req.name}; requirements.txt lacks it"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} breaks {line!r}"
    runs = " ".join(a for w, a in instructions(DOCKERFILE) if w == "RUN")
    assert "-r /opt/program/requirements.txt" in runs
    for name in requirement_names(REQUIREMENTS):
        assert f"{name}==" not in runs, f"the Dockerfile pins {name} itself"
