"""python -m cost consolidate: N dedicated endpoints, N adapters on one base, inference components.

Expected dollars are computed here from the price file's rows (read as plain JSON) and the
sizing rule written out by hand, never from the code under test.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cost.prices import data_files

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOURS_PER_MONTH = 730
SAGEMAKER = {r["name"]: r["sagemaker_hourly"] for r in json.loads(data_files()[-1].read_text())["instances"]}
G5, G5_12 = SAGEMAKER["g5.xlarge"], SAGEMAKER["g5.12xlarge"]      # 1 and 4 A10G

# One model: 500 tok/s average, 2000 at peak, chat 3:1; one g5.xlarge replica emits 400 output
# tok/s = 1600 tok/s at 3:1, so each dedicated endpoint runs ceil(2000 / 1600) = 2 replicas.
BASE = ["--instance", "ml.g5.xlarge", "--capacity", "400", "--traffic-per-model", "500",
        "--peak-per-model", "2000"]


def adapter_bench(tmp_path: Path, ratio: float = 0.75, target: str = "aws") -> str:
    """The document `python -m options.bench --adapters a1,...,a8 --json FILE` writes (its
    ``adapters`` object; the rest of a spectrum.bench/1 document beside it)."""
    band = {"median": ratio, "min": ratio - 0.02, "max": ratio + 0.03}
    doc = {"schema": "spectrum.bench/1", "level": 5, "target": target, "model": "base",
           "metrics": {"output_tokens_per_second": 300.0}, "counts": {"completed": 64},
           "adapters": {"names": [f"a{i}" for i in range(1, 9)], "mix": "zipf:1.1", "rounds": 3,
                        "concurrency": 32, "throughput_ratio": ratio, "ttft_ratio_p50": 1.2,
                        "ttft_ratio_p99": 1.4, "loads": 11, "evictions": 3, "hits": 180,
                        "by_concurrency": {"32": {"throughput_ratio": band}}}}
    path = tmp_path / "adapters.json"
    path.write_text(json.dumps(doc))
    return str(path)


def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cost", "consolidate", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def consolidate(*args: str) -> dict:
    from cost.__main__ import build_parser
    args_ns = build_parser().parse_args(["consolidate", *args])
    data, _ = args_ns.handler(args_ns)
    return json.loads(json.dumps(data))


def rows(data: dict) -> dict:
    return {r["strategy"]: r for r in data["strategies"]}


def test_three_ways_priced_by_hand(tmp_path):
    data = consolidate(*BASE, "--models", "10", "--adapters", "--adapter-bench", adapter_bench(tmp_path),
                       "--shared-instance", "ml.g5.12xlarge")
    by = rows(data)
    # (a) 10 endpoints x 2 replicas, all month
    assert by["dedicated"]["instances_at_peak"] == 20
    assert by["dedicated"]["monthly_usd"] == pytest.approx(10 * 2 * G5 * HOURS_PER_MONTH, abs=0.005)
    # (b) one base at 0.75 x 400 = 300 output tok/s = 1200 tok/s for 10 x 2000 tok/s at peak
    assert by["adapters"]["instances_at_peak"] == math.ceil(20000 / 1200) == 17
    assert by["adapters"]["monthly_usd"] == pytest.approx(17 * G5 * HOURS_PER_MONTH, abs=0.005)
    assert by["adapters"]["saves_vs_dedicated_usd"] == pytest.approx(3 * G5 * HOURS_PER_MONTH, abs=0.01)
    # break-even: ceil(2000 n / 1200) < 2 n first at n = 3 (n = 2 needs 4 either way)
    assert by["adapters"]["breakeven_models"] == 3
    # (c) 20 copies, 4 per g5.12xlarge -> 5 instances; per GPU it costs more than a g5.xlarge: never cheaper
    assert (by["inference_components"]["copies_per_instance"], by["inference_components"]["instances_at_peak"]) == (4, 5)
    assert by["inference_components"]["monthly_usd"] == pytest.approx(5 * G5_12 * HOURS_PER_MONTH, abs=0.005)
    assert G5_12 / 4 > G5 and by["inference_components"]["breakeven_models"] is None
    assert data["cheapest"] == "adapters"
    overhead_note = next(a for a in data["assumptions"] if a.startswith("adapters:"))
    assert "8 adapters mixed zipf:1.1" in overhead_note and "range 0.73-0.78" in overhead_note


def test_inference_components_scale_to_zero_on_the_cheapest_shared_instance():
    """12 active hours a day; components may drop to 0 copies, endpoints keep 1 replica."""
    data = consolidate(*BASE, "--models", "3", "--hours-per-day", "12", "--min-copies", "0")
    by = rows(data)
    active = idle = 12 * HOURS_PER_MONTH / 24
    per_endpoint = (2 * active + 1 * idle) * G5
    assert by["dedicated"]["monthly_usd"] == pytest.approx(3 * per_endpoint, abs=0.005)
    # the cheapest A10G instance per copy is the g5.xlarge itself: 6 copies, 6 instances, none when idle
    assert by["inference_components"]["instance_type"] == "ml.g5.xlarge"
    assert by["inference_components"]["monthly_usd"] == pytest.approx(6 * active * G5, abs=0.005)
    assert by["inference_components"]["breakeven_models"] == 1
    assert "adapters" not in by and data["shared_instance_chosen"] is True
    assert any("no --adapters" in a for a in data["assumptions"])


def test_unmeasured_adapters_say_so():
    data = consolidate(*BASE, "--models", "4", "--adapters")
    assert rows(data)["adapters"]["throughput_ratio"] == 1.0
    assert any("NOT MEASURED" in a for a in data["assumptions"])


def test_cli_table_and_plot(tmp_path):
    out = tmp_path / "consolidate.png"
    proc = cli(*BASE, "--models", "6", "--adapters", "--adapter-ratio", "0.9", "--plot", str(out))
    assert "Cheapest at 6 models: adapters" in proc.stdout
    assert out.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("args, message", [
    (["--models", "0"], "models 0 is out of range"),
    (["--models", "2", "--instance", "ml.g9.xlarge"], "unknown instance type 'ml.g9.xlarge'"),
    (["--models", "2", "--shared-instance", "ml.g6.12xlarge"], "has L4 but the capacity was measured on ml.g5.xlarge"),
    (["--models", "2", "--adapter-ratio", "0.8"], "add --adapters"),
    (["--models", "2", "--adapters", "--adapter-ratio", "3"], "adapter throughput ratio 3.0 must be a number in (0, 2]"),
    (["--models", "2", "--peak-per-model", "100"], "peak 100 tokens/s is below the average 500"),
    (["--models", "2", "--min-copies", "-1"], "min copies -1 is out of range"),
])
def test_bad_input_names_the_value(capsys, args, message):
    from cost.__main__ import main
    assert main(["consolidate", *BASE, *args]) == 2
    assert message in capsys.readouterr().err


def test_bad_adapter_bench_and_shared_instance_too_small(tmp_path, capsys):
    from cost.__main__ import main
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"schema": "spectrum.bench/1", "metrics": {}}))
    assert main(["consolidate", *BASE, "--models", "2", "--adapters", "--adapter-bench", str(bad)]) == 2
    assert "has no adapters.throughput_ratio" in capsys.readouterr().err
    assert main(["consolidate", "--instance", "ml.g5.12xlarge", "--capacity", "400", "--traffic-per-model", "5",
                 "--models", "2", "--shared-instance", "ml.g5.xlarge"]) == 2
    assert "has 1 accelerators; one copy needs 4" in capsys.readouterr().err
    assert main(["consolidate", "--instance", "ml.g5.xlarge", "--traffic-per-model", "5", "--models", "2"]) == 2
    assert "give the capacity of one replica" in capsys.readouterr().err
