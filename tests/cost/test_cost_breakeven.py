"""Break-even maths and `python -m cost breakeven`, checked against exact figures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cost.breakeven import (MIX_PRESETS, blended_price, parity_tokens_per_second, parse_mix,
                            self_hosted_per_million)
from options.core import BadInput

REPO = Path(__file__).resolve().parents[2]
QWEN = "qwen.qwen3-32b-v1:0"


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cost", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def cli_json(*args: str) -> dict:
    return json.loads(cli(*args, "--json").stdout)


# --- the maths ---------------------------------------------------------------------------------

def test_worked_example_exactly():
    # $1.172/h against $0.10 per 1M tokens: 11,720,000 tokens/h, 3,255.6 tokens/s.
    per_second = parity_tokens_per_second(1.172, 0.10)
    assert per_second * 3600 == pytest.approx(11_720_000)
    assert round(per_second, 1) == 3255.6


def test_qwen3_32b_on_g6e_xlarge_chat_mix():
    blended = blended_price(0.15, 0.60, parse_mix("3:1"))
    assert blended == pytest.approx(0.2625)
    assert parity_tokens_per_second(2.6054, blended) == pytest.approx(2757.0, abs=0.5)


def test_half_utilisation_doubles_the_parity_throughput():
    assert parity_tokens_per_second(2.6054, 0.2625, 0.5) == pytest.approx(2 * parity_tokens_per_second(2.6054, 0.2625))


@pytest.mark.parametrize("mix", [*MIX_PRESETS, "7:2", "1:9", "0.5:1"])
def test_blended_price_lies_between_input_and_output_prices(mix):
    blended = blended_price(0.15, 0.60, parse_mix(mix))
    assert 0.15 < blended < 0.60


def test_self_hosted_cost_at_parity_equals_the_token_price():
    parity = parity_tokens_per_second(2.6054, 0.2625, 0.6)
    assert self_hosted_per_million(2.6054, parity, 0.6) == pytest.approx(0.2625)


@pytest.mark.parametrize("text", ["3:0", "0:1", "-1:2", "abc", "3", "1:2000", ""])
def test_bad_mixes_name_the_allowed_forms(text):
    with pytest.raises(BadInput, match="IN:OUT"):
        parse_mix(text)


def test_mix_presets():
    assert (parse_mix("rag").input, parse_mix("rag").output) == (5.0, 1.0)
    assert (parse_mix("summarisation").input, parse_mix("generation").output) == (10.0, 3.0)


# --- the CLI ---------------------------------------------------------------------------------

def test_cli_raw_form_prints_the_worked_example_figures():
    out = cli("breakeven", "--instance-price", "1.172", "--token-price", "0.10").stdout
    assert "11,720,000" in out and "3,255.6" in out
    assert "Assumptions" in out and "every token" in out


def test_cli_raw_form_json():
    data = cli_json("breakeven", "--instance-price", "1.172", "--token-price", "0.10")
    assert data["breakeven_tokens_per_hour"] == pytest.approx(11_720_000)
    assert data["breakeven_tokens_per_second"] == pytest.approx(3255.556, abs=0.001)


def test_cli_full_form_json():
    data = cli_json("breakeven", "--model", QWEN, "--instance", "ml.g6e.xlarge", "--mix", "3:1")
    assert data["blended_price_per_million"] == pytest.approx(0.2625)
    assert data["breakeven_tokens_per_second"] == pytest.approx(2757.0, abs=0.5)
    assert data["hourly_usd"] == 2.6054
    assert data["inputs"]["instance_type"] == "ml.g6e.xlarge"
    assert any("2026-11-29" in a for a in data["assumptions"])
    half = cli_json("breakeven", "--model", QWEN, "--instance", "ml.g6e.xlarge", "--mix", "3:1", "--utilization", "0.5")
    assert half["breakeven_tokens_per_second"] == pytest.approx(2 * data["breakeven_tokens_per_second"], abs=0.01)


def test_cli_capacity_gives_cost_shortfall_and_verdict():
    data = cli_json("breakeven", "--model", "us." + QWEN, "--instance", "g6e.xlarge", "--mix", "chat",
                    "--capacity", "500", "--utilization", "0.8", "--discount", "20")
    # 500 output tok/s at 3:1 = 2,000 tok/s; hourly 2.6054 x 0.8 = 2.08432.
    assert data["hourly_usd"] == pytest.approx(2.08432)
    assert data["capacity"]["tokens_per_second"] == 2000
    assert data["self_hosted_per_million"] == pytest.approx(2.08432 / (2000 * 3600 * 0.8 / 1e6), rel=1e-5)
    assert data["shortfall_ratio"] == pytest.approx(data["breakeven_tokens_per_second"] / 2000, rel=1e-4)
    assert data["utilization_to_break_even"] == pytest.approx(data["shortfall_ratio"] * 0.8, rel=1e-3)
    assert data["verdict"].startswith("Per-token is cheaper")
    fast = cli_json("breakeven", "--model", QWEN, "--instance", "g6e.xlarge", "--capacity", "5000")
    assert fast["verdict"].startswith("Self-hosting is cheaper")


def test_cli_ec2_platform_uses_the_ec2_price():
    data = cli_json("breakeven", "--model", QWEN, "--instance", "g6e.xlarge", "--platform", "ec2")
    assert data["hourly_usd"] == 1.861


@pytest.mark.parametrize("args, says", [
    (["--model", "qwen3-32b", "--instance", "g6e.xlarge"], "qwen.qwen3-32b-v1:0"),
    (["--model", QWEN, "--instance", "ml.g6e.xlarg"], "g6e.xlarge"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--mix", "3:0"], "IN:OUT"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--utilization", "1.5"], "allowed (0, 1]"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--utilization", "0"], "allowed (0, 1]"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--discount", "100"], "allowed [0, 100)"),
    (["--instance-price", "-1", "--token-price", "0.1"], "allowed (0, 1000]"),
    (["--instance-price", "1", "--token-price", "0"], "allowed (0, 1000]"),
    (["--instance-price", "1"], "raw form"),
    (["--instance-price", "1", "--token-price", "0.1", "--mix", "3:1"], "--mix needs --model"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--capacity", "-5"], "capacity -5"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--tier", "batch"], "known tiers"),
    (["--model", QWEN, "--instance", "g6e.xlarge", "--bench", "/nonexistent/bench.json"], "does not exist"),
])
def test_cli_bad_input_exits_2_naming_the_fix(args, says):
    proc = cli("breakeven", *args, ok=False)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("error: ") and says in proc.stderr


def test_cli_argparse_errors_also_exit_2():
    proc = cli("breakeven", "--utilization", "lots", ok=False)
    assert proc.returncode == 2 and "invalid float value" in proc.stderr
