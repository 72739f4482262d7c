"""Fleet sizing, every rung priced, the plot, bench files as capacity, and the recommendation."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cost.breakeven import Capacity, parse_mix
from cost.fleet import DAYS_PER_MONTH, build_fleets, compare, make_traffic
from cost.prices import load_prices
from infra.eks.cluster import fixed_hourly
from options.core import BadInput

REPO = Path(__file__).resolve().parents[2]
QWEN = "qwen.qwen3-32b-v1:0"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cost", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def cli_json(*args: str) -> dict:
    return json.loads(cli(*args, "--json").stdout)


def bench_doc(output_tps: float, level: int = 5, target: str = "aws", concurrency: int | None = 16,
              prompt: int = 768, output: int = 256) -> dict:
    """A spectrum.bench/1 document as `python -m options.bench --json FILE` writes it."""
    completed = 200
    stats = lambda base: {"mean": base * 1.1, "p50": base, "p90": base * 1.6, "p99": base * 2.4}  # noqa: E731
    return {
        "schema": "spectrum.bench/1", "level": level, "target": target, "model": "Qwen/Qwen3-32B",
        "profile": {"requests": completed, "concurrency": concurrency, "request_rate": None, "burstiness": 1.0,
                    "prompt_tokens": {"kind": "fixed", "value": prompt},
                    "output_tokens": {"kind": "fixed", "value": output}, "seed": 0},
        "metrics": {"output_tokens_per_second": output_tps, "requests_per_second": output_tps / output,
                    "ttft_ms": stats(180.0), "itl_ms": stats(21.0), "tpot_ms": stats(22.0), "e2e_ms": stats(5600.0)},
        "counts": {"completed": completed, "errors": {}, "input_tokens": completed * prompt,
                   "output_tokens": completed * output},
        "started_at": "2026-11-29T12:00:00+00:00", "duration_s": completed * output / output_tps,
    }


@pytest.fixture
def bench_file(tmp_path):
    def write(output_tps: float, name: str = "bench.json", **kw) -> str:
        path = tmp_path / name
        path.write_text(json.dumps(bench_doc(output_tps, **kw)))
        return str(path)
    return write


# --- fleet sizing ------------------------------------------------------------------------------

def test_replicas_are_max_of_floor_and_peak_over_capacity():
    table = load_prices()
    mix = parse_mix("3:1")
    traffic, _ = make_traffic(mix, avg=2000, peak=9000)
    fleets = build_fleets(table, table.instance("g6e.xlarge"), {}, Capacity(500, "--capacity"), 2, 0.0,
                          eks_fixed_hourly=fixed_hourly(table)["hourly"])
    # 500 output tok/s = 2,000 tok/s at 3:1 -> ceil(9000 / 2000) = 5 replicas at peak.
    assert [f.replicas(traffic) for f in fleets] == [5] * 5
    low, _ = make_traffic(mix, avg=100, peak=100)
    assert fleets[0].replicas(low) == 2  # the floor
    exact, _ = make_traffic(mix, avg=4000, peak=4000)
    assert fleets[0].replicas(exact) == 2  # exactly two replicas' worth needs no third


def test_every_rung_priced_with_the_right_meter():
    table = load_prices()
    traffic, _ = make_traffic(parse_mix("chat"), avg=1000, peak=3000, hours_per_day=12)
    fleets = build_fleets(table, table.instance("g6e.xlarge"), {}, Capacity(400, "--capacity"), 1, 0.0,
                          eks_fixed_hourly=fixed_hourly(table)["hourly"])
    data = compare(traffic, table.bedrock(QWEN), fleets)
    rungs = {r["level"]: r for r in data["rungs"]}
    assert sorted(rungs) == [1, 2, 3, 4, 5, 6]
    month_tokens = 1000 * 3600 * 12 * DAYS_PER_MONTH
    assert rungs[1]["monthly_usd"] == pytest.approx(month_tokens * 0.2625 / 1e6, abs=0.01)
    replicas = math.ceil(3000 / 1600)  # 400 output tok/s = 1,600 tok/s at 3:1
    hours = (replicas * 12 + 1 * 12) * DAYS_PER_MONTH
    for level in (2, 3, 4, 5):
        assert rungs[level]["platform"] == "sagemaker" and rungs[level]["replicas_at_peak"] == replicas
        assert rungs[level]["monthly_usd"] == pytest.approx(hours * 2.6054, abs=0.01)
    assert rungs[6]["platform"] == "ec2"
    # Rung 6 also pays the control plane ($0.10/h) and 2 x m6i.xlarge system nodes ($0.192/h).
    assert rungs[6]["monthly_usd"] == pytest.approx(hours * 1.861 + (0.10 + 2 * 0.192) * 730,
                                                    abs=0.01)
    assert rungs[6]["fixed_monthly_usd"] == pytest.approx(0.484 * 730, abs=0.01)
    assert data["cheapest_level"] == min(rungs, key=lambda lvl: (rungs[lvl]["monthly_usd"], lvl))


def test_breakeven_volume_is_where_the_costs_cross():
    table = load_prices()
    traffic, _ = make_traffic(parse_mix("3:1"), avg=5000, peak=10000)
    fleet = build_fleets(table, table.instance("g6e.xlarge"), {}, Capacity(1500, "--capacity"), 1, 0.0,
                          eks_fixed_hourly=fixed_hourly(table)["hourly"])[0]
    price = 0.2625
    volume = fleet.breakeven_tokens_per_month(traffic, price)
    at = traffic.scaled_to(volume)
    assert fleet.monthly(at) == pytest.approx(volume * price / 1e6, rel=1e-9)
    below = traffic.scaled_to(volume * 0.99)
    assert fleet.monthly(below) > volume * 0.99 * price / 1e6
    slow = build_fleets(table, table.instance("g6e.xlarge"), {}, Capacity(100, "--capacity"), 1, 0.0,
                          eks_fixed_hourly=fixed_hourly(table)["hourly"])[0]
    assert slow.breakeven_tokens_per_month(traffic, price) is None


@pytest.mark.parametrize("kw, says", [
    ({}, "exactly one of --avg"),
    ({"avg": 10, "tokens_per_month": 1e9}, "exactly one of --avg"),
    ({"avg": 10, "peak": 5}, "must be >= the average"),
    ({"avg": 10, "hours_per_day": 25}, "allowed (0, 24]"),
    ({"avg": -3}, "average tokens/s -3"),
])
def test_bad_traffic(kw, says):
    with pytest.raises(BadInput, match=re_escape(says)):
        make_traffic(parse_mix("chat"), **kw)


def re_escape(text: str) -> str:
    import re
    return re.escape(text)


# --- the CLI: compare, plot, bench ---------------------------------------------------------------

def test_compare_json_and_table():
    args = ("compare", "--model", QWEN, "--instance", "g6e.xlarge", "--tokens-per-month", "3e10",
            "--peak", "20000", "--hours-per-day", "16", "--capacity", "2000")
    data = cli_json(*args)
    assert data["traffic"]["tokens_per_month"] == 30_000_000_000
    assert data["cheapest_level"] == 6
    assert data["rungs"][1]["breakeven_tokens_per_month_vs_bedrock"] == pytest.approx(2.6054 * 730 / 0.2625e-6, rel=1e-6)
    assert any("EKS control plane" in a and "2 x m6i.xlarge" in a for a in data["assumptions"])
    table = cli(*args).stdout
    assert "JumpStart" in table and "EKS" in table and "Assumptions" in table


def test_plot_is_a_real_png_with_content(tmp_path):
    from PIL import Image
    import numpy as np

    path = tmp_path / "compare.png"
    data = cli_json("compare", "--model", QWEN, "--instance", "g6e.xlarge", "--tokens-per-month", "3e10",
                    "--peak", "20000", "--hours-per-day", "16", "--capacity", "2000", "--plot", str(path))
    assert data["plot"] == str(path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.load()
        assert image.format == "PNG" and image.width >= 800 and image.height >= 500
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.std() > 10                       # not a blank canvas
    colours = {tuple(p) for p in pixels.reshape(-1, 3)[::7]}
    assert len(colours) > 50                        # lines, text, markers in several colours
    # The Bedrock line's blue, the SageMaker red and the EKS green are all drawn.
    for rgb in ((0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28), (0x2c, 0xa0, 0x2c)):
        assert (np.abs(pixels.astype(int) - rgb).sum(axis=2) < 30).sum() > 200, rgb


def test_plot_needs_a_png_path(tmp_path):
    proc = cli("compare", "--model", QWEN, "--instance", "g6e.xlarge", "--avg", "100", "--capacity", "50",
               "--plot", str(tmp_path / "x.jpg"), code=2)
    assert "must end in .png" in proc.stderr


def test_bench_file_changes_the_breakeven_answer(bench_file):
    base = ("breakeven", "--model", QWEN, "--instance", "g6e.xlarge", "--mix", "3:1")
    without = cli_json(*base)
    assert "capacity" not in without and without["verdict"].startswith("Self-hosting breaks even only if")
    slow = cli_json(*base, "--bench", bench_file(300.0, "slow.json"))
    fast = cli_json(*base, "--bench", bench_file(1200.0, "fast.json"))
    assert slow["capacity"]["output_tokens_per_second"] == 300.0
    assert slow["capacity"]["tokens_per_second"] == 1200.0          # 300 output tok/s at 3:1
    assert slow["verdict"].startswith("Per-token is cheaper")
    assert fast["verdict"].startswith("Self-hosting is cheaper")
    assert slow["self_hosted_per_million"] == pytest.approx(4 * fast["self_hosted_per_million"], rel=1e-4)
    measured = slow["capacity"]["measured_at"]
    assert measured["profile"]["concurrency"] == 16 and measured["ttft_ms"]["p99"] == pytest.approx(432.0)
    assert "concurrency 16" in measured["summary"] and "TTFT p50 180 ms" in measured["summary"]
    assert any("prompt 768 tokens, output 256 tokens" in a for a in slow["assumptions"])


def test_bench_from_a_local_run_is_flagged(bench_file):
    out = cli("breakeven", "--model", QWEN, "--instance", "g6e.xlarge",
              "--bench", bench_file(40.0, target="local")).stdout
    assert "not on the priced instance" in out and "measured by bench file" in out


def test_compare_takes_one_bench_per_level(bench_file):
    data = cli_json("compare", "--model", QWEN, "--instance", "g6e.xlarge", "--avg", "3000", "--peak", "6000",
                    "--bench", bench_file(400.0, "l3.json", level=3), "--bench", bench_file(800.0, "l5.json", level=5))
    replicas = {r["level"]: r.get("replicas_at_peak") for r in data["rungs"]}
    # 400 output tok/s = 1,600 tok/s -> 4 replicas for a 6,000 peak; 800 -> 3,200 tok/s -> 2.
    assert replicas[3] == 4 and replicas[5] == 2
    assert replicas[2] == 4 and replicas[6] == 4     # no bench of their own: the first bench's capacity
    assert any("rungs without their own bench use the capacity from" in a for a in data["assumptions"])


@pytest.mark.parametrize("doc_change, says", [
    ({"schema": "other/1"}, "not a Spectrum bench result"),
    ({"metrics": {"output_tokens_per_second": 0}}, "must be a positive number"),
    ({"level": 1}, "only a bench of a self-hosted rung (level 2-6)"),
])
def test_bad_bench_files_exit_2(tmp_path, doc_change, says):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**bench_doc(500.0), **doc_change}))
    proc = cli("compare", "--model", QWEN, "--instance", "g6e.xlarge", "--avg", "100", "--bench", str(path), code=2)
    assert says in proc.stderr


def test_bench_file_that_is_not_json_exits_2(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text("{oops")
    proc = cli("breakeven", "--model", QWEN, "--instance", "g6e.xlarge", "--bench", str(path), code=2)
    assert "not readable JSON" in proc.stderr


# --- recommend ----------------------------------------------------------------------------------

def test_recommend_tree_alone():
    assert cli_json("recommend")["level"] == 1
    data = cli_json("recommend", "--custom-serving-code")
    assert data["level"] == 4 and any("serving code" in w for w in data["why"])
    assert any("without --custom-serving-code" in f for f in data["flip"])
    assert cli_json("recommend", "--own-infrastructure", "--custom-image")["level"] == 6


def test_recommend_weighs_cost():
    traffic = ("--model", QWEN, "--instance", "g6e.xlarge", "--hours-per-day", "16", "--capacity", "2000")
    # Little traffic: Bedrock stays the answer; the flips name the volume that would change it, and why no
    # replica speed would at this volume.
    small = cli_json("recommend", *traffic, "--tokens-per-month", "1e9")
    assert small["level"] == 1
    assert any("traffic above 7.25 B tokens/month (now 1 B)" in f and "makes rung 2 cheaper" in f for f in small["flip"])
    assert any("always-on replica(s) alone cost $1,901.94/month" in f for f in small["flip"])
    # Enough traffic but a slow replica: the flip says how fast a replica would have to be. Bedrock's
    # $7,875 pays for 5 replicas over the active hours, so each must carry 20,000 / 5 tok/s = 1,000 output.
    slow = cli_json("recommend", "--model", QWEN, "--instance", "g6e.xlarge", "--hours-per-day", "16",
                    "--capacity", "500", "--tokens-per-month", "3e10", "--peak", "20000")
    assert slow["level"] == 1
    assert any("a replica sustaining 1,000 output tok/s or more (now 500)" in f for f in slow["flip"])
    # Heavy traffic on a fast replica: SageMaker saves more than 30 %, so the answer climbs to rung 2; EKS would
    # save another 21 % (control plane and system nodes included), below the threshold, so the flip names it.
    big = cli_json("recommend", *traffic, "--tokens-per-month", "3e10", "--peak", "20000")
    assert big["level"] == 2 and big["tree_level"] == 1
    assert any("saving" in w for w in big["why"]) and any("rung 6 would be 21% cheaper" in w for w in big["why"])
    assert any("traffic below" in f for f in big["flip"]) and any("rung 6 (EC2 + EKS)" in f for f in big["flip"])
    assert cli_json("recommend", *traffic, "--tokens-per-month", "3e10", "--peak", "20000",
                    "--min-savings", "20")["level"] == 6
    assert cli_json("recommend", *traffic, "--tokens-per-month", "3e10", "--peak", "20000",
                    "--min-savings", "60")["level"] == 1


def test_recommend_bench_changes_the_answer(bench_file):
    args = ("recommend", "--model", QWEN, "--instance", "g6e.xlarge", "--tokens-per-month", "3e10",
            "--peak", "20000", "--hours-per-day", "16")
    assert cli_json(*args, "--bench", bench_file(300.0, "slow.json"))["level"] == 1
    assert cli_json(*args, "--bench", bench_file(2000.0, "fast.json"))["level"] == 2


def test_recommend_bad_input():
    assert "allowed [0, 100]" in cli("recommend", "--min-savings", "120", code=2).stderr
    assert "closest known" in cli("recommend", "--model", "qwen3", code=2).stderr


def test_prices_listing_and_filters():
    data = cli_json("prices", "--kind", "instance", "--gpu", "L40S")
    assert {r["gpu_type"] for r in data["instances"]} == {"L40S"} and "bedrock" not in data
    data = cli_json("prices", "--kind", "bedrock", "--filter", "qwen")
    assert {r["model_id"] for r in data["bedrock"]} == {QWEN, "qwen.qwen3-235b-a22b-2507-v1:0"}
    data = cli_json("prices", "--min-gpu-memory", "300")
    assert {r["name"] for r in data["instances"]} >= {"p4d.24xlarge", "p5.48xlarge", "g6e.48xlarge"}
    assert all(r["gpus"] * r["gpu_memory_gb_per_gpu"] >= 300 for r in data["instances"])
    assert "qwen.qwen3-32b-v1:0" in cli("prices", "--filter", "qwen").stdout
    assert "closest known: g5.xlarge" in cli("prices", "--filter", "g5.xlargee", code=2).stderr
    assert "known GPU types" in cli("prices", "--gpu", "T4", code=2).stderr


def test_an_instance_without_a_sagemaker_price_leaves_rungs_2_to_5_out():
    data = cli_json("compare", "--model", QWEN, "--instance", "g6e.16xlarge", "--avg", "1000", "--capacity", "800")
    assert [r["level"] for r in data["rungs"]] == [1, 6]
    assert any("not in the price table, so those rungs are left out" in a for a in data["assumptions"])
    rec = cli_json("recommend", "--model", QWEN, "--instance", "g6e.16xlarge", "--avg", "10000", "--capacity", "3000",
                   "--custom-model")
    assert rec["level"] == 6 and any("rungs 3-5 have no price" in w for w in rec["why"])


def test_bench_with_poisson_arrivals_says_so(tmp_path):
    doc = bench_doc(600.0)
    doc["profile"].update(request_rate=4.0, burstiness=0.5, concurrency=32)
    doc["profile"]["output_tokens"] = {"kind": "uniform", "low": 64, "high": 512}
    path = tmp_path / "poisson.json"
    path.write_text(json.dumps(doc))
    data = cli_json("breakeven", "--model", QWEN, "--instance", "g6e.xlarge", "--bench", str(path))
    summary = data["capacity"]["measured_at"]["summary"]
    assert "4 req/s (burstiness 0.5), at most 32 in flight" in summary and "output 64-512 tokens" in summary


def test_a_bench_without_a_level_applies_to_every_self_hosted_rung(tmp_path):
    path = tmp_path / "nolevel.json"
    path.write_text(json.dumps({**bench_doc(500.0), "level": None}))
    data = cli_json("compare", "--model", QWEN, "--instance", "g6e.xlarge", "--avg", "3000", "--peak", "6000",
                    "--bench", str(path))
    # 500 output tok/s = 2,000 tok/s at 3:1 -> 3 replicas for a 6,000 tok/s peak, on every self-hosted rung.
    assert [r.get("replicas_at_peak") for r in data["rungs"][1:]] == [3] * 5
    assert cli_json("breakeven", "--model", QWEN, "--instance", "g6e.xlarge",
                    "--bench", str(path))["capacity"]["output_tokens_per_second"] == 500.0
