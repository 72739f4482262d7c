"""The dated price table and the API other parts price their plans with."""
from __future__ import annotations

import json

import pytest

import cost
from cost.prices import HOURS_PER_MONTH, DATA_DIR, UnknownName, data_files, load_prices
from options.core import BadInput

# Reference prices, us-east-1 on-demand (instances: AWS Price List snapshots in public cost tools
# (truffle, cultivar, FMBench); Bedrock: litellm model_prices_and_context_window.json v1.110.2):
# the rows everything else is checked against.
REFERENCE_INSTANCES = {
    "g5.xlarge": (1.006, 1.408, 1, "A10G", 24), "g5.2xlarge": (1.212, 1.515, 1, "A10G", 24),
    "g5.12xlarge": (5.672, 7.09, 4, "A10G", 24), "g5.48xlarge": (16.288, 20.36, 8, "A10G", 24),
    "g6.xlarge": (0.8048, 1.1267, 1, "L4", 24), "g6e.xlarge": (1.861, 2.6054, 1, "L40S", 48),
    "g6e.12xlarge": (10.4926, 13.1158, 4, "L40S", 48),
    "p4d.24xlarge": (21.9576, 25.2513, 8, "A100", 40), "p5.48xlarge": (55.04, 63.296, 8, "H100", 80),
    "inf2.xlarge": (0.7582, 0.99, 1, "Inferentia2", 32),
}
REFERENCE_BEDROCK = {
    "amazon.nova-micro-v1:0": (0.035, 0.14), "amazon.nova-lite-v1:0": (0.06, 0.24),
    "amazon.nova-pro-v1:0": (0.80, 3.20), "meta.llama3-1-8b-instruct-v1:0": (0.22, 0.22),
    "meta.llama3-1-70b-instruct-v1:0": (0.72, 0.72), "meta.llama3-3-70b-instruct-v1:0": (0.72, 0.72),
    "mistral.mistral-7b-instruct-v0:2": (0.15, 0.20), "mistral.mixtral-8x7b-instruct-v0:1": (0.45, 0.70),
    "anthropic.claude-3-haiku-20240307-v1:0": (0.25, 1.25),
    "anthropic.claude-3-5-haiku-20241022-v1:0": (0.80, 4.00),
    "anthropic.claude-sonnet-4-5-20250929-v1:0": (3.00, 15.00),
    "anthropic.claude-haiku-4-5-20251001-v1:0": (1.00, 5.00),
    "qwen.qwen3-32b-v1:0": (0.15, 0.60), "qwen.qwen3-235b-a22b-2507-v1:0": (0.22, 0.88),
    "deepseek.v3-v1:0": (0.58, 1.68), "deepseek.r1-v1:0": (1.35, 5.40),
    "openai.gpt-oss-20b-1:0": (0.07, 0.30), "openai.gpt-oss-120b-1:0": (0.15, 0.60),
}


@pytest.fixture(scope="module")
def table():
    return load_prices()


def test_every_row_of_the_data_file_has_a_date_and_a_source():
    files = data_files()
    assert files, f"no dated price file in {DATA_DIR}"
    doc = json.loads(files[-1].read_text())
    rows = doc["bedrock"] + doc["instances"] + doc["eks"]
    assert len(rows) >= len(REFERENCE_INSTANCES) + len(REFERENCE_BEDROCK) + 1
    for row in rows:
        assert len(row["as_of"]) == 10 and row["as_of"][4] == "-", row
        assert len(row["source"]) > 10, row


@pytest.mark.parametrize("name", sorted(REFERENCE_INSTANCES))
def test_instances_match_facts(table, name):
    ec2, sm, gpus, gpu, mem = REFERENCE_INSTANCES[name]
    inst = table.instance("ml." + name)
    assert (inst.name, inst.ec2_hourly, inst.sagemaker_hourly, inst.gpus, inst.gpu_type,
            inst.gpu_memory_gb_per_gpu) == (name, ec2, sm, gpus, gpu, mem)
    assert table.instance(name) is inst
    assert inst.vcpus >= 4 and inst.memory_gib >= 16
    if inst.usable_gpu_memory_gib_per_gpu is not None:
        assert inst.usable_gpu_memory_gib_per_gpu < inst.gpu_memory_gb_per_gpu


def test_a10g_usable_memory_is_below_nominal(table):
    assert table.instance("g5.xlarge").usable_gpu_memory_gib_per_gpu == pytest.approx(22.3)


@pytest.mark.parametrize("model_id", sorted(REFERENCE_BEDROCK))
def test_bedrock_prices_match_facts(table, model_id):
    price = table.bedrock(model_id)
    assert (price.input_per_million, price.output_per_million) == REFERENCE_BEDROCK[model_id]


@pytest.mark.parametrize("prefix", ["us.", "eu.", "apac.", "global."])
def test_cross_region_profiles_bill_as_the_base_model(table, prefix):
    assert table.bedrock(prefix + "anthropic.claude-3-haiku-20240307-v1:0").model_id == \
        "anthropic.claude-3-haiku-20240307-v1:0"


def test_tiers(table):
    haiku = table.bedrock("anthropic.claude-3-haiku-20240307-v1:0")
    assert haiku.per_million("batch") == (0.125, 0.625)
    qwen = table.bedrock("qwen.qwen3-32b-v1:0")
    assert qwen.per_million("priority") == pytest.approx((0.2625, 1.05))
    with pytest.raises(BadInput, match="no batch price for qwen.qwen3-32b-v1:0"):
        qwen.per_million("batch")


def test_eks_fee(table):
    assert table.eks_cluster_hourly == 0.10


def test_unknown_instance_names_the_closest(table):
    with pytest.raises(UnknownName) as err:
        table.instance("ml.g5.xlarg")
    assert isinstance(err.value, BadInput)
    assert "g5.xlarge" in err.value.closest and "'ml.g5.xlarg'" in str(err.value)


def test_unknown_model_names_the_closest(table):
    with pytest.raises(UnknownName, match="qwen.qwen3-32b-v1:0"):
        table.bedrock("qwen.qwen3-32b")


def test_hourly_cost_line():
    line = cost.hourly_cost_line("ml.g5.xlarge", count=2)
    assert line["instance_type"] == "ml.g5.xlarge" and line["platform"] == "sagemaker"
    assert line["hourly_usd"] == pytest.approx(2 * 1.408)
    assert line["monthly_usd"] == pytest.approx(2 * 1.408 * HOURS_PER_MONTH, abs=0.01)
    assert line["price_as_of"] == "2026-11-29" and line["source"]
    ec2 = cost.hourly_cost_line("g5.xlarge", platform="ec2", extra_hourly=0.10)
    assert ec2["hourly_usd"] == pytest.approx(1.106)
    with pytest.raises(BadInput, match="count"):
        cost.hourly_cost_line("g5.xlarge", count=0)
    with pytest.raises(BadInput, match="platform"):
        cost.hourly_cost_line("g5.xlarge", platform="lambda")


def test_token_cost():
    # Claude 3 Haiku: 1000 in x $0.25/M + 2000 out x $1.25/M
    assert cost.token_cost("us.anthropic.claude-3-haiku-20240307-v1:0", 1000, 2000) == \
        pytest.approx(0.00025 + 0.0025)


def test_bad_price_file(tmp_path):
    bad = tmp_path / "prices.json"
    bad.write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        load_prices(bad)
    bad.write_text("{}")
    with pytest.raises(BadInput, match="schema"):
        load_prices(bad)


def test_the_shipped_file_is_in_the_writer_format(tmp_path):
    """--refresh writes with dump_prices: the shipped file must read back and re-write byte for byte."""
    from cost.prices import dump_prices

    shipped = data_files()[-1]
    again = dump_prices(json.loads(shipped.read_text()), tmp_path / shipped.name)
    assert again.read_text() == shipped.read_text()
