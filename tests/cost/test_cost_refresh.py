"""`prices --refresh` against botocore's Stubber fed with Price List documents shaped like AWS's.

moto has no pricing API. The documents below follow the Price List's real shape: PriceList
entries are JSON strings; prices sit at terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD;
EC2 and SageMaker bill "Hrs"; AmazonBedrock bills per 1K tokens, the marketplace offer
(AmazonBedrockFoundationModels) per 1M. Each trap cost/refresh.py lists has a row here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from cost.prices import PriceTable, load_prices
from cost.refresh import RefreshFailed, refresh, write

REPO = Path(__file__).resolve().parents[2]
TODAY = "2026-12-01"
REGION = "us-east-1"
_sku = iter(range(10_000))


def product(service: str, attributes: dict, usd: str, unit: str, description: str,
            reserved_usd: str | None = None) -> str:
    """One Price List entry, serialised as the API serialises it (a JSON string)."""
    sku = f"SKU{next(_sku):06d}"
    doc = {
        "product": {"productFamily": attributes.pop("productFamily", "Compute Instance"),
                    "attributes": {"servicecode": service, "regionCode": REGION,
                                   "location": "US East (N. Virginia)", **attributes},
                    "sku": sku},
        "serviceCode": service,
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": unit, "endRange": "Inf", "description": description, "appliesTo": [],
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "beginRange": "0", "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261120231012", "publicationDate": "2026-11-20T23:10:12Z",
    }
    if reserved_usd:  # a cheaper 1-year reservation that must not be read as the on-demand price
        doc["terms"]["Reserved"] = {f"{sku}.4NA7Y494T4": {"priceDimensions": {f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
            "unit": "Hrs", "description": "Linux reserved", "pricePerUnit": {"USD": reserved_usd}}},
            "termAttributes": {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront"}}}
    return json.dumps(doc)


def ec2(instance: str, usd: str) -> str:
    return product("AmazonEC2", {"instanceType": instance, "operatingSystem": "Linux", "tenancy": "Shared",
                                 "preInstalledSw": "NA", "capacitystatus": "Used", "marketoption": "OnDemand",
                                 "usagetype": f"BoxUsage:{instance}", "operation": "RunInstances"},
                   usd, "Hrs", f"${float(usd):.3f} per On Demand Linux {instance} Instance Hour",
                   reserved_usd="0.5000000000")


def sagemaker(instance: str, component: str, usd: str) -> str:
    short = {"Hosting": "Host", "Training": "Train", "Notebook": "Notebk"}[component]
    return product("AmazonSageMaker", {"productFamily": "ML Instance", "instanceName": f"ml.{instance}",
                                       "instanceType": f"ml.{instance}", "component": component,
                                       "usagetype": f"USE1-{short}:ml.{instance}", "operation": "RunInstance"},
                   usd, "Hrs", f"${usd} per {component} ml.{instance} hour in US East (N. Virginia)")


def bedrock(model: str, usagetype: str, inference_type: str, usd_per_1k: str, tier: str = "standard",
            feature: str = "On-demand Inference") -> str:
    return product("AmazonBedrock", {"productFamily": "Amazon Bedrock", "model": model, "usagetype": usagetype,
                                     "inferenceType": inference_type, "feature": feature,
                                     "service_tier": tier, "operation": "Usage"},
                   usd_per_1k, "1K tokens", f"${usd_per_1k} per 1K {inference_type.lower()} for {model}")


def marketplace(name: str, usagetype: str, usd_per_1m: str, what: str) -> str:
    return product("AmazonBedrockFoundationModels",
                   {"productFamily": "Bedrock Foundation Models", "servicename": f"{name} (Amazon Bedrock Edition)",
                    "usagetype": usagetype, "operation": "Usage"},
                   usd_per_1m, "Units", f"AWS Marketplace software usage|{REGION}|Million {what} Tokens")


def filters(**kw: str) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in kw.items()]


@pytest.fixture
def small_table() -> PriceTable:
    """The shipped table cut to two instances and three models, so the stubbed calls stay readable."""
    doc = json.loads(json.dumps(load_prices().doc))
    doc["instances"] = [r for r in doc["instances"] if r["name"] in ("g5.xlarge", "g6e.xlarge")]
    doc["bedrock"] = [r for r in doc["bedrock"] if r["model_id"] in (
        "qwen.qwen3-32b-v1:0", "meta.llama3-1-8b-instruct-v1:0", "anthropic.claude-3-haiku-20240307-v1:0")]
    return PriceTable(doc)


def stub_price_list(stubber: Stubber) -> None:
    def add(service: str, entries: list[str], expected_filters, next_token: str | None = None,
            token_in: str | None = None) -> None:
        expected = {"ServiceCode": service, "Filters": expected_filters, "FormatVersion": "aws_v1"}
        if token_in:
            expected["NextToken"] = token_in
        response = {"FormatVersion": "aws_v1", "PriceList": entries}
        if next_token:
            response["NextToken"] = next_token
        stubber.add_response("get_products", response, expected)

    # g5.xlarge: EC2 price cut to $0.95; SageMaker lists Notebook and Training rows (cheaper) before Hosting.
    add("AmazonEC2", [ec2("g5.xlarge", "0.9500000000")],
        filters(instanceType="g5.xlarge", regionCode=REGION, operatingSystem="Linux", tenancy="Shared",
                preInstalledSw="NA", capacitystatus="Used", marketoption="OnDemand"))
    add("AmazonSageMaker", [sagemaker("g5.xlarge", "Notebook", "1.2100000000"),
                            sagemaker("g5.xlarge", "Training", "1.3100000000"),
                            sagemaker("g5.xlarge", "Hosting", "1.3800000000")],
        filters(instanceName="ml.g5.xlarge", regionCode=REGION))
    # g6e.xlarge: EC2 found; SageMaker answers only with a Training row, so its price must be kept.
    add("AmazonEC2", [ec2("g6e.xlarge", "1.8610000000")], ANY)
    add("AmazonSageMaker", [sagemaker("g6e.xlarge", "Training", "2.5000000000")], ANY)
    # AmazonBedrock, per 1K tokens. The Priority row comes first, as it often does.
    add("AmazonBedrock", [
        bedrock("Qwen3 32B", "USE1-Qwen3-32B-input-tokens-priority", "Input tokens", "0.0002625", "priority"),
        bedrock("Qwen3 32B", "USE1-Qwen3-32B-input-tokens", "Input tokens", "0.00015"),
        bedrock("Qwen3 32B", "USE1-Qwen3-32B-output-tokens-priority", "Output tokens", "0.00105", "priority"),
        bedrock("Qwen3 32B", "USE1-Qwen3-32B-output-tokens", "Output tokens", "0.0006"),
        bedrock("Qwen3 32B", "USE1-Qwen3-32B-input-tokens-flex", "Input tokens", "0.000075", "flex"),
        bedrock("Qwen3 32B", "USE1-Qwen3-32B-output-tokens-flex", "Output tokens", "0.0003", "flex"),
        bedrock("Llama 3.1 8B Instruct", "USE1-Llama3-1-8B-batch-input-tokens", "Input tokens", "0.00011",
                feature="Batch Inference"),
        bedrock("Llama 3.1 8B Instruct", "USE1-Llama3-1-8B-batch-output-tokens", "Output tokens", "0.00011",
                feature="Batch Inference"),
        bedrock("Llama 3.1 8B Instruct", "USE1-Llama3-1-8B-input-tokens", "Input tokens", "0.00022"),
        bedrock("Llama 3.1 8B Instruct", "USE1-Llama3-1-8B-output-tokens", "Output tokens", "0.00022"),
        bedrock("Llama 3.1 8B Instruct", "USE1-Llama3-1-8B-cache-read-input-tokens", "Cache read input tokens",
                "0.000022"),
        bedrock("Titan Text G1 - Express", "USE1-TitanTextExpress-input-tokens", "Input tokens", "0.0002"),
    ], filters(regionCode=REGION))
    # The marketplace offer, per 1M tokens, over two pages; a global (cross-region) row must be skipped.
    add("AmazonBedrockFoundationModels", [
        marketplace("Claude 3 Haiku", "USE1-MP:USE1_InputTokenCount_Global-Units", "0.2", "Input"),
        marketplace("Claude 3 Haiku", "USE1-MP:USE1_InputTokenCount-Units", "0.25", "Input"),
    ], filters(regionCode=REGION), next_token="page-2")
    add("AmazonBedrockFoundationModels", [
        marketplace("Claude 3 Haiku", "USE1-MP:USE1_OutputTokenCount-Units", "1.25", "Output"),
    ], filters(regionCode=REGION), token_in="page-2")


@pytest.fixture
def pricing():
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stubber:
        yield client, stubber


def test_refresh_reads_the_price_list_and_writes_a_new_dated_file(pricing, small_table, tmp_path):
    client, stubber = pricing
    stub_price_list(stubber)
    doc, report = refresh(client, small_table, region=REGION, today=TODAY)
    path = write(doc, report, tmp_path / f"prices-{TODAY}.json")
    stubber.assert_no_pending_responses()

    fresh = load_prices(path)
    assert fresh.as_of == TODAY
    g5 = fresh.instance("g5.xlarge")
    assert g5.ec2_hourly == 0.95                      # on-demand, not the $0.50 reservation
    assert g5.sagemaker_hourly == 1.38                # Hosting, not the cheaper Notebook or Training rows
    assert g5.as_of == TODAY and "AWS Price List API" in g5.source and "specs instances.vantage.sh" in g5.source
    g6e = fresh.instance("g6e.xlarge")
    assert g6e.sagemaker_hourly == 2.6054             # kept: no Hosting row came back
    assert "SageMaker price kept from 2026-11-29" in g6e.source

    qwen = fresh.bedrock("qwen.qwen3-32b-v1:0")
    assert (qwen.input_per_million, qwen.output_per_million) == (0.15, 0.6)   # not the priority row read first
    assert qwen.per_million("priority") == (0.2625, 1.05)
    assert qwen.per_million("flex") == (0.075, 0.3)
    llama = fresh.bedrock("meta.llama3-1-8b-instruct-v1:0")
    assert (llama.input_per_million, llama.output_per_million) == (0.22, 0.22)
    assert llama.per_million("batch") == (0.11, 0.11)
    haiku = fresh.bedrock("anthropic.claude-3-haiku-20240307-v1:0")
    assert (haiku.input_per_million, haiku.output_per_million) == (0.25, 1.25)  # per 1M, not x1000
    assert haiku.as_of == TODAY and "AmazonBedrockFoundationModels" in haiku.source

    summary = report.to_json()
    assert summary["refreshed"] == {"ec2": 2, "sagemaker": 1, "bedrock": 3}
    assert summary["not_found"]["sagemaker"] == ["g6e.xlarge"]
    skipped = summary["skipped_rows"]
    assert skipped["SageMaker rows for a component other than Hosting"] == 3
    assert skipped["Bedrock rows for models not in the table"] == 1
    assert skipped["Bedrock priority rows (kept as priority prices, not on-demand)"] == 2
    assert any("cache" in why for why in skipped)


def test_the_written_file_has_one_row_per_line_and_a_date_and_source_on_each(pricing, small_table, tmp_path):
    client, stubber = pricing
    stub_price_list(stubber)
    doc, report = refresh(client, small_table, region=REGION, today=TODAY)
    text = write(doc, report, tmp_path / "out.json").read_text()
    rows = [json.loads(line.rstrip(",")) for line in text.splitlines() if line.startswith("  {")]
    assert len(rows) == 2 + 3 + 2
    assert all(r["as_of"] and r["source"] for r in rows)


def test_an_unreadable_price_list_writes_nothing(pricing, small_table, tmp_path):
    client, stubber = pricing
    stubber.add_client_error("get_products", service_error_code="AccessDeniedException",
                             service_message="User is not authorized to perform: pricing:GetProducts",
                             http_status_code=400)
    with pytest.raises(RefreshFailed, match="pricing:GetProducts"):
        refresh(client, small_table, region=REGION, today=TODAY)
    assert list(tmp_path.iterdir()) == []


def test_cli_refresh_without_credentials_fails_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    out = tmp_path / "prices.json"
    proc = subprocess.run([sys.executable, "-m", "cost", "prices", "--refresh", "--out", str(out), "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Price List API could not be read" in proc.stderr and "credentials" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_the_cli_prices_with_a_refreshed_file(pricing, small_table, tmp_path):
    client, stubber = pricing
    stub_price_list(stubber)
    doc, report = refresh(client, small_table, region=REGION, today=TODAY)
    path = write(doc, report, tmp_path / f"prices-{TODAY}.json")
    proc = subprocess.run([sys.executable, "-m", "cost", "breakeven", "--prices", str(path), "--model",
                           "meta.llama3-1-8b-instruct-v1:0", "--instance", "ml.g5.xlarge", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["hourly_usd"] == 1.38 and data["blended_price_per_million"] == 0.22
    assert any(f"as of {TODAY}" in a for a in data["assumptions"])


def test_a_region_without_prices_writes_nothing(pricing, small_table):
    client, stubber = pricing
    for _ in range(2 * 2 + 2):  # EC2 and SageMaker per instance, then the two Bedrock offers: all empty
        stubber.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []})
    with pytest.raises(RefreshFailed, match="no price for any row in region ap-east-2"):
        refresh(client, small_table, region="ap-east-2", today=TODAY)
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize("region", ["moon-1", "US-EAST-1", "us-east"])
def test_a_malformed_region_is_bad_input(small_table, region):
    from options.core import BadInput
    with pytest.raises(BadInput, match="not an AWS region code"):
        refresh(None, small_table, region=region, today=TODAY)
