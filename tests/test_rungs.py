"""Every rung folder implements the one rung interface, and what a rung can do is data on it
(options.core.rungs), read by the CLIs instead of tests of the level."""
from __future__ import annotations

import inspect

import pytest

from options import contract
from options.bench.__main__ import build_parser
from options.bench.target import _server_env
from options.core import LEVELS, RUNGS, BadInput, rung, wire
from options.plan import Deployment
from options.spectrum import VERBS, check_target, rung_module


@pytest.mark.parametrize("level", LEVELS)
def test_every_rung_module_has_the_verbs(level):
    module = rung_module(level)
    assert module.LEVEL == level and module.__name__ == rung(level).module
    for verb in VERBS:
        assert callable(getattr(module, verb, None)), f"level {level} lacks {verb}"
    apply = inspect.signature(module.apply)
    assert list(apply.parameters)[:2] in (["plan", "target"], ["p", "target"])
    assert apply.return_annotation in (Deployment, "Deployment"), "one Deployment type"
    # A rung that serves here says how: its server's environment, which bench --level uses too.
    assert callable(getattr(module, "local_server", None)) == rung(level).serves_locally


@pytest.mark.parametrize("r", RUNGS, ids=lambda r: r.name)
def test_capabilities_are_data_with_a_reason_for_each_gap(r):
    assert r.can.dialect in wire.DIALECTS and contract.dialect(r.can.dialect).name == r.can.dialect
    for capability in ("serves_locally", "has_emulator", "creates_resources"):
        if not getattr(r.can, capability):
            reason = dict(r.can.why_not).get(capability)
            assert reason and len(reason) > 20, f"{r.name}: no reason for lacking {capability}"
    assert r.can.creates_resources == (not r.per_token), "what bills by the hour must be removable"
    assert r.platform in ("bedrock", "sagemaker", "ec2") and r.per_token == (r.platform == "bedrock")


def test_a_target_a_rung_lacks_is_refused_with_its_reason():
    with pytest.raises(BadInput, match="level 1 \\(Bedrock\\) has no emulator: the local AWS "
                                       "emulator \\(moto\\) does not implement"):
        check_target(1, "emulator")
    for level in LEVELS[1:]:
        check_target(level, "emulator")
    check_target(1, "aws")


def test_bench_starts_the_rungs_own_local_configuration():
    """bench --level 3 runs rung 3's LMI configuration, not the plain server."""
    args = build_parser().parse_args(["--level", "3", "--option", "OPTION_MAX_ROLLING_BATCH_SIZE=16"])
    with _server_env(args) as (env, what):
        assert env["OPTION_MAX_ROLLING_BATCH_SIZE"] == "16" and "LMI configuration" in what
    with _server_env(build_parser().parse_args(["--level", "4"])) as (env, what):
        assert "model.py handler" in what
    with pytest.raises(BadInput, match="give --level 3, 4 or 5"):
        with _server_env(build_parser().parse_args(["--option", "OPTION_X=1"])):
            pass
