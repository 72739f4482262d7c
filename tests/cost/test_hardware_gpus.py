"""The dated GPU and instance table that capacity from specs reads, and its agreement with the
price table (two data files about the same instances must not drift apart)."""
from __future__ import annotations

import json
import re

import pytest

from cost.hardware import gpus as hw
from cost.hardware.gpus import DTYPES, GpuTable, data_files, gpu, instance, instances, load_gpu_table
from cost.prices import load_prices
from options.core import BadInput

# The price table's gpu_type (and per-GPU GB, which splits the two A100s) -> this table's key.
PRICE_GPU_TYPES = {("A10G", 24): "a10g", ("L4", 24): "l4", ("L40S", 48): "l40s",
                   ("A100", 40): "a100-40gb", ("A100", 80): "a100-80gb", ("H100", 80): "h100",
                   ("H200", 141): "h200", ("B200", 180): "b200"}
# Instances a price table may not list yet but the capacity model must know (FACTS §13).
REQUIRED_INSTANCES = {"p4de.24xlarge": ("a100-80gb", 8), "p5.4xlarge": ("h100", 1),
                      "p5.48xlarge": ("h100", 8), "p5e.48xlarge": ("h200", 8),
                      "p5en.48xlarge": ("h200", 8), "p6-b200.48xlarge": ("b200", 8),
                      "p4d.24xlarge": ("a100-40gb", 8)}


def test_every_gpu_has_its_figures_a_source_and_a_date():
    table = load_gpu_table()
    names = [g.name for g in hw.gpus()]
    assert names == ["a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100", "h200", "b200"]
    for g in hw.gpus():
        assert g.source.strip() and g.as_of == table.as_of, g.name
        assert set(g.tflops) == set(DTYPES) and g.native("bf16") and g.native("fp16"), g.name
        assert g.memory_gib < g.memory_gb, f"{g.name}: CUDA's total is below the nominal GB"
        assert 0.9 * g.memory_gb * 1e9 / 2**30 < g.memory_gib, g.name
        assert g.link in ("nvlink", "pcie") and g.link_gb_s > 0 and g.bandwidth_gb_s > 0
        assert json.loads(json.dumps(g.to_json()))["tflops"] == g.tflops


def test_the_figures_are_dense_not_with_sparsity():
    """fp16 runs at the bf16 rate, and each halving of the width at most doubles it: a
    'with sparsity' figure slipped into one column would break the ratio."""
    for g in hw.gpus():
        assert g.tflops["fp16"] == g.tflops["bf16"], g.name
        for wide, narrow in (("bf16", "fp8"), ("fp8", "fp4"), ("bf16", "int8")):
            if g.native(wide) and g.native(narrow):
                assert 1.9 < g.tflops[narrow] / g.tflops[wide] < 2.1, (g.name, wide, narrow)


def test_h100_and_other_anchor_figures():
    h100 = gpu("h100")
    assert h100.peak_flops("bf16") == 989e12 and h100.peak_flops("bfloat16") == 989e12
    assert h100.bandwidth_gb_s == 3350 and h100.link == "nvlink" and h100.link_gb_s == 450
    assert h100.peak_flops("fp8") == 1978e12 and not h100.native("fp4")
    assert gpu("a100-80gb").bandwidth_gb_s == 2039 and gpu("a100-40gb").bandwidth_gb_s == 1555
    assert gpu("b200").peak_flops("nvfp4") == 9000e12
    assert gpu("l4").peak_flops("fp8") == 242e12 and gpu("l40s").bandwidth_gb_s == 864


def test_fp8_on_an_a100_is_not_native_and_its_peak_is_refused():
    a100 = gpu("a100-80gb")
    assert not a100.native("fp8") and not a100.native("fp8_e4m3") and a100.native("int8")
    with pytest.raises(BadInput) as raised:
        a100.peak_flops("fp8")
    message = str(raised.value)
    assert "A100" in message and "a100-80gb" in message and "bf16, fp16, int8" in message
    assert "h100" in message, "names a GPU that does run fp8"
    with pytest.raises(BadInput, match="unknown matmul dtype 'fp32'"):
        a100.peak_flops("fp32")


def test_gpu_names_are_case_insensitive_and_an_unknown_one_lists_them():
    assert gpu("H100") is gpu("h100") is gpu(" h100 ")
    assert gpu("A100-80GB").memory_gb == 80
    with pytest.raises(BadInput) as raised:
        gpu("a100")
    for g in hw.gpus():
        assert g.name in str(raised.value)


def test_every_instance_has_a_gpu_a_count_and_a_source():
    rows = instances()
    assert {i.name for i in rows} >= set(REQUIRED_INSTANCES)
    for i in rows:
        assert i.gpus >= 1 and i.source.strip() and i.link in ("nvlink", "pcie"), i.name
        assert json.loads(json.dumps(i.to_json()))["gpu"]["name"] == i.gpu.name
    for name, (gpu_name, count) in REQUIRED_INSTANCES.items():
        assert (instance(name).gpu.name, instance(name).gpus) == (gpu_name, count), name
    assert {g.name for g in hw.gpus()} == {i.gpu.name for i in rows}, "no GPU without an instance"


def test_g5_g6_g6e_are_pcie_only_with_1_4_or_8_gpus():
    for family in ("g5", "g6", "g6e"):
        for size, count in {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1,
                            "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}.items():
            spec = instance(f"{family}.{size}")
            assert (spec.gpus, spec.link, spec.link_gb_s) == (count, "pcie", 32), spec.name
    assert instance("p4d.24xlarge").link_gb_s == 300 and instance("p6-b200.48xlarge").link_gb_s == 900


def test_sagemaker_names_and_any_case_map_to_the_ec2_row():
    assert instance("ml.g5.12xlarge") is instance("g5.12xlarge")
    assert instance(" ML.P5.48XLARGE ").gpu.name == "h100"


@pytest.mark.parametrize("name", ["inf2.xlarge", "ml.inf2.48xlarge", "trn1.32xlarge", "inf1.xlarge",
                                  "trn2.48xlarge"])
def test_neuron_instances_are_not_modelled_and_a_gpu_one_is_named(name):
    with pytest.raises(BadInput) as raised:
        instance(name)
    message = str(raised.value)
    assert "not modelled" in message and "Neuron" in message
    named = re.search(r"such as (\S+) \(", message).group(1)
    assert instance(named).gpus >= 1, f"the alternative {named} is in the table"


@pytest.mark.parametrize("name", ["m6i.large", "ml.m6i.xlarge", "c7i.2xlarge", "r6i.large",
                                  "t3.medium"])
def test_a_cpu_only_instance_has_no_gpu(name):
    with pytest.raises(BadInput, match="has no GPU"):
        instance(name)


def test_an_unknown_instance_lists_close_names():
    with pytest.raises(BadInput) as raised:
        instance("g5.3xlarge")
    assert "g5.xlarge" in str(raised.value) or "g5.2xlarge" in str(raised.value)
    with pytest.raises(BadInput, match="unknown GPU instance type 'p3.2xlarge'"):
        instance("p3.2xlarge")


def test_the_price_table_agrees_with_this_table():
    """Every priced instance is either here with the same GPU, count, memory and link, or refused
    for a stated reason (Neuron, no GPU); the usable memory the price table carries stays within
    0.5 GiB of CUDA's total here."""
    for row in load_prices().instances():
        if row.gpus == 0:
            with pytest.raises(BadInput, match="has no GPU"):
                instance(row.name)
            continue
        if row.gpu_type.startswith(("Inferentia", "Trainium")):
            with pytest.raises(BadInput, match="not modelled"):
                instance(row.name)
            continue
        spec = instance(row.name)
        assert spec.gpu.name == PRICE_GPU_TYPES[(row.gpu_type, row.gpu_memory_gb_per_gpu)], row.name
        assert spec.gpus == row.gpus and spec.gpu.memory_gb == row.gpu_memory_gb_per_gpu, row.name
        assert (spec.link == "nvlink") == row.nvlink, row.name
        assert abs(spec.gpu.memory_gib - row.usable_gpu_memory_gib_per_gpu) <= 0.5, row.name


def test_the_newest_dated_file_is_read_and_a_wrong_schema_refused(tmp_path):
    newest = data_files()[-1]
    assert newest.name == f"gpus-{load_gpu_table().as_of}.json"
    doc = json.loads(newest.read_text())
    doc["schema"] = "spectrum.gpus/0"
    with pytest.raises(ValueError, match="schema"):
        GpuTable(doc)
    doc = json.loads(newest.read_text())
    del doc["gpus"][0]["tflops"]["fp4"]
    with pytest.raises(ValueError, match="tflops must give each"):
        GpuTable(doc)
