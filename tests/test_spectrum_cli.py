"""`spectrum`, the one console script: each subcommand is its module's own parser (one parser,
two doors), its help names it as `spectrum <command>`, and start-up imports nothing heavy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from options.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]
BREAKEVEN = ["breakeven", "--instance-price", "1.172", "--token-price", "0.10", "--json"]
ENTRY = "import sys; from options.cli import main; sys.exit(main())"   # what the console script runs


def run(*argv: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120,
                          env=env or {**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(REPO), str(REPO / "containers" / "byo-vllm")])}, cwd=cwd)


def test_cost_through_spectrum_prints_what_python_m_cost_prints(capsys):
    from cost.__main__ import main as cost_main

    assert main(["cost", *BREAKEVEN]) == 0
    through_spectrum = capsys.readouterr().out
    assert cost_main(BREAKEVEN) == 0
    assert json.loads(through_spectrum) == json.loads(capsys.readouterr().out)
    assert json.loads(through_spectrum)["inputs"]["instance_price_per_hour"] == 1.172


def test_the_console_entry_in_a_process_of_its_own_matches_python_m_cost():
    entry, module = run("-c", ENTRY, "cost", *BREAKEVEN), run("-m", "cost", *BREAKEVEN)
    assert entry.returncode == module.returncode == 0, entry.stderr + module.stderr
    assert json.loads(entry.stdout) == json.loads(module.stdout)


def test_help_lists_every_command_with_one_line(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert listed == ["deploy", "cost", "bench", "agent", "gateway", "serve", "check"] == list(COMMANDS)


def test_no_command_prints_the_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "commands:" in capsys.readouterr().err


def test_an_unknown_command_exits_2_with_the_list(capsys):
    assert main(["deplo"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'deplo'" in err and "deploy, cost, bench, agent, gateway, serve, check" in err


@pytest.mark.parametrize("command", ["cost", "bench", "agent", "deploy", "check"])
def test_a_command_s_help_names_it_by_the_door_it_came_through(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: spectrum {command} ")


def test_the_module_door_keeps_its_own_name():
    assert run("-m", "cost", "--help").stdout.startswith("usage: python -m cost ")


def test_bad_input_reaches_the_module_and_exits_2(capsys):
    assert main(["deploy", "--level", "9", "--plan"]) == 2
    assert "level 9 is not a rung" in capsys.readouterr().err


def test_serve_is_the_image_entrypoint(capsys):
    assert main(["serve", "--port", "1"]) == 2     # configuration comes from the environment only
    assert "usage: spectrum serve [serve]" in capsys.readouterr().err


def test_gateway_admin_is_the_gateway_s_own_parser(capsys):
    with pytest.raises(SystemExit):
        main(["gateway", "admin", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: spectrum gateway admin ") and "{keys,usage}" in out
    assert main(["gateway"]) == 2
    assert "spectrum gateway {serve,admin}" in capsys.readouterr().err


def test_gateway_says_plainly_when_it_is_not_installed(tmp_path):
    """An install without the gateway's extra: spectrum_gateway is packaged, but what it imports
    is not there (a stand-in package first on the path fails its import as that would)."""
    (tmp_path / "options").mkdir()
    for name in ("__init__.py", "cli.py"):
        (tmp_path / "options" / name).write_text((REPO / "options" / name).read_text())
    (tmp_path / "spectrum_gateway").mkdir()
    (tmp_path / "spectrum_gateway" / "__init__.py").write_text("raise ImportError(\"No module named 'orjson'\")\n")
    done = run("-c", ENTRY, "gateway", "serve", env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 1
    assert "the gateway cannot be imported here" in done.stderr and "Traceback" not in done.stderr
    assert "pip install 'spectrum[gateway]'" in done.stderr


def test_start_up_imports_nothing_heavy():
    probe = ("import sys; from options.cli import main; main(['--help']); "
             "print([m for m in ('boto3', 'botocore', 'vllm', 'torch', 'sagemaker', 'rich', 'cost') "
             "if m in sys.modules])")
    done = run("-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_pyproject_installs_the_script_and_names_the_license():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"spectrum": "options.cli:main"}
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    licence = (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    assert "Copyright 2026 the Spectrum authors" in licence and "END OF TERMS AND CONDITIONS" in licence
