"""One meaning per command: a flag the chosen target does not use is refused (exit 2) before
anything starts or is written, naming the flag, the target chosen and the targets that use it;
level 6 on a local Ray renders nothing, so --out (and every flag of the rendered stack) is refused
there. Nothing here starts Ray, an engine or an emulator."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from options import deploy
from options.core import BadInput
from options.deploy import main, parse_args

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch):
    """A refused command must not reach a runner: each one fails the test if called."""
    import options.eks
    import options.eks.ray_local

    def ran(*_, **__):
        raise AssertionError("a refused command ran")
    monkeypatch.setattr(options.eks.ray_local, "run_local", ran)
    monkeypatch.setattr(options.eks, "run_local", ran)
    monkeypatch.setattr(deploy, "run_emulator", ran)
    monkeypatch.setattr(deploy, "run_cloud", ran)


def test_level6_rayservice_with_out_is_refused_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "rendered"
    assert main(["--level", "6", "--engine", "rayservice", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out is not used by --target local --engine rayservice at level 6")
    assert "serves on a local Ray and writes no files" in err
    for user in ("--engine deployment", "--plan", "--target emulator", "--target aws"):
        assert user in err
    assert not out.exists()


@pytest.mark.parametrize("argv, flags, chosen, user", [
    (["--level", "3", "--plan", "--once"], "--once", "--plan at level 3", "--target local at levels 3-5"),
    (["--level", "3", "--target", "emulator", "--port", "8080"], "--port", "--target emulator at level 3",
     "--target local at levels 3-5"),
    (["--level", "1", "--once"], "--once", "--target local at level 1 (prints the plan",
     "--engine rayservice (a local Ray)"),
    (["--level", "6", "--once"], "--once", "--target local at level 6 (renders and validates",
     "--target local at levels 3-5"),
    (["--level", "3", "--target", "local", "--endpoint-url", "http://127.0.0.1:5000"], "--endpoint-url",
     "--target local at level 3 (serves here)", "--target emulator, --target aws, --status and --down"),
    (["--level", "3", "--plan", "--endpoint-url", "http://127.0.0.1:5000"], "--endpoint-url",
     "--plan at level 3", "--target emulator"),
    (["--level", "2", "--gateway", "--port", "1"], "--port", "--gateway at level 2", "--target local"),
    (["--level", "6", "--engine", "rayservice", "--image", "r/i:1", "--namespace", "x", "--once"],
     "--image and --namespace are", "--target local --engine rayservice at level 6", "--plan"),
    (["--level", "6", "--engine", "rayservice", "--ou", "d"], "--out", deploy.RAY_HERE, "--plan"),
], ids=["plan-once", "emulator-port", "level1-once", "level6-render-once", "local-endpoint-url",
        "plan-endpoint-url", "gateway-port", "ray-stack-flags", "abbreviated"])
def test_a_flag_the_target_does_not_use_is_refused_naming_it_and_its_targets(capsys, argv, flags, chosen, user):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flags}"), err
    assert f"not used by {chosen}" in err and user in err and "Traceback" not in err
    assert "choose a target that uses" in err


@pytest.mark.parametrize("argv", [
    ["--level", "3", "--once", "--port", "8080"],
    ["--level", "6", "--engine", "rayservice", "--once", "--port", "8080", "--min-replicas", "1",
     "--ray-proxy", "haproxy", "--ray-ingress-replicas", "0"],
    ["--level", "6", "--engine", "rayservice", "--plan", "--out", "d", "--image", "r/i:1"],
    ["--level", "6", "--out", "d", "--image", "r/i:1", "--namespace", "x"],
    ["--level", "6", "--target", "emulator", "--out", "d"],
    ["--level", "3", "--target", "aws", "--endpoint-url", "http://127.0.0.1:5000"],
    ["--level", "3", "--status", "--endpoint-url", "http://127.0.0.1:5000"],
    ["--level", "3", "--down", "--target", "aws"],
    ["--level", "3", "--plan", "--invoke", "hi"],
], ids=["serve-here", "ray-here", "ray-plan-out", "render-out", "emulator-out", "aws-endpoint-url",
        "status-endpoint-url", "down", "plan-invoke"])
def test_a_flag_the_target_uses_is_accepted(argv):
    parse_args(argv)


def test_level6_renders_into_out_on_every_target_but_a_local_ray(tmp_path):
    from options.eks import spec_from_args

    for argv in (["--out", str(tmp_path)], ["--plan", "--engine", "rayservice", "--out", str(tmp_path)]):
        assert spec_from_args(parse_args(["--level", "6", *argv])).out_dir == str(tmp_path)
    with pytest.raises(BadInput, match="--out is not used by --target local --engine rayservice"):
        parse_args(["--level", "6", "--engine", "rayservice", "--out", str(tmp_path)])


def test_the_refusal_exits_2_without_traceback_in_a_real_process(tmp_path):
    done = subprocess.run([sys.executable, "-m", "options.deploy", "--level", "6", "--engine", "rayservice",
                           "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: --out is not used by") and not (tmp_path / "out").exists()
    assert not done.stdout


def test_the_deploy_docs_table_names_every_target_and_every_refused_flag():
    page = (REPO / "docs" / "deploy" / "index.md").read_text()
    table = page[page.index("## What each target does"):]
    rows = re.findall(r"^\| (`[^|]+`)", table, re.M)
    for chosen in ("--target local", "--plan", "--target emulator", "--target aws", "--status",
                   "--down", "--gateway"):
        assert any(f"`{chosen}" in row for row in rows), chosen
    for flag in deploy.TARGET_FLAGS:
        assert f"`{flag}`" in table, flag
