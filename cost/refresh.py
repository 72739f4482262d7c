"""Rebuild the price table from the AWS Price List API (boto3 ``pricing`` get_products).

Traps of the AWS Price List this handles:
- Bedrock lists several rows per model and direction: standard, batch, flex, priority (the
  first row returned is often the priority one), plus cache, provisioned and customisation
  rows. The tier is read from ``service_tier``/``feature``/``usagetype``, never from row order.
- SageMaker lists the same instance for Hosting, Training, Notebook, Processing...: only
  ``component == "Hosting"`` is an endpoint's price.
- AmazonBedrock prices most models per 1K tokens, AmazonBedrockFoundationModels per 1M:
  the unit is read from each price dimension and converted to per 1M.
Every value found gets the row a new ``as_of`` and a ``source`` naming the query; a row the
API did not answer for keeps its old date and source, so the table never claims more than it knows.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Iterator

from cost.prices import DATA_DIR, PriceTable, dump_prices
from options.core import BadInput

PRICING_ENDPOINT_REGION = "us-east-1"   # the Price List API answers from us-east-1 for every region
REGION_CODE = re.compile(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}")
BEDROCK_SERVICES = ("AmazonBedrock", "AmazonBedrockFoundationModels")
# Bedrock rows that are not a per-token inference price for text.
_NOT_TOKEN_PRICE = re.compile(r"cache|provisioned|customi[sz]ation|custom-model|reserved|latency|"
                              r"image|video|audio|speech|embed|guardrail|knowledge", re.IGNORECASE)
_MARKETPLACE_SUFFIX = re.compile(r"\s*\(amazon bedrock edition\)\s*$", re.IGNORECASE)


class RefreshFailed(RuntimeError):
    """The Price List API could not be read; nothing was written."""


@dataclass
class RefreshReport:
    region: str
    as_of: str
    refreshed: dict[str, list[str]] = field(default_factory=lambda: {"ec2": [], "sagemaker": [], "bedrock": []})
    missing: dict[str, list[str]] = field(default_factory=lambda: {"ec2": [], "sagemaker": [], "bedrock": []})
    skipped_rows: dict[str, int] = field(default_factory=dict)   # why -> count
    path: str | None = None

    def skip(self, why: str) -> None:
        self.skipped_rows[why] = self.skipped_rows.get(why, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {"region": self.region, "as_of": self.as_of, "path": self.path,
                "refreshed": {k: len(v) for k, v in self.refreshed.items()},
                "not_found": self.missing, "skipped_rows": self.skipped_rows}


def normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _MARKETPLACE_SUFFIX.sub("", name).lower())


def products(client, service: str, filters: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Every product document for the filters; PriceList entries arrive as JSON strings."""
    paginator = client.get_paginator("get_products")
    terms = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()]
    for page in paginator.paginate(ServiceCode=service, Filters=terms, FormatVersion="aws_v1"):
        for entry in page.get("PriceList", []):
            yield json.loads(entry) if isinstance(entry, str) else entry


def on_demand_dimensions(product: dict[str, Any]) -> list[dict[str, Any]]:
    dims = []
    for term in (product.get("terms", {}).get("OnDemand") or {}).values():
        dims.extend((term.get("priceDimensions") or {}).values())
    return dims


def usd(dimension: dict[str, Any]) -> float | None:
    try:
        return float(dimension["pricePerUnit"]["USD"])
    except (KeyError, TypeError, ValueError):
        return None


def hourly_price(product: dict[str, Any]) -> float | None:
    prices = [usd(d) for d in on_demand_dimensions(product) if str(d.get("unit", "")).lower() in ("hrs", "hours", "hour")]
    prices = [p for p in prices if p is not None and p > 0]
    return prices[0] if prices else None


def per_million(dimension: dict[str, Any], service: str) -> float | None:
    """A Bedrock token price converted to USD per 1M tokens, whatever unit the row uses."""
    price = usd(dimension)
    if price is None:
        return None
    text = f"{dimension.get('unit', '')} {dimension.get('description', '')}".lower()
    if re.search(r"\b1k\b|1,000 |thousand|per 1k", text):
        return price * 1000
    if re.search(r"\b1m\b|million|1,000,000", text):
        return price
    if re.search(r"\btokens?\b", str(dimension.get("unit", "")).lower()):
        return price * 1e6  # per single token
    # No unit in the row: each offer's convention (AmazonBedrock per 1K, the marketplace per 1M).
    return price * 1000 if service == "AmazonBedrock" else price


def bedrock_tier(attrs: dict[str, Any]) -> str:
    text = " ".join(str(attrs.get(k, "")) for k in ("service_tier", "feature", "usagetype", "inferenceType")).lower()
    for tier in ("priority", "flex", "batch"):
        if tier in text:
            return tier
    return "on_demand"


def bedrock_direction(attrs: dict[str, Any]) -> str | None:
    text = f"{attrs.get('inferenceType', '')} {attrs.get('usagetype', '')}".lower().replace("_", "-")
    if "input" in text and "token" in text:
        return "input"
    if "output" in text and "token" in text:
        return "output"
    return None


def refresh(client, table: PriceTable, region: str = "us-east-1", today: str | None = None,
            progress=None) -> tuple[dict[str, Any], RefreshReport]:
    """A new price document: the old one with every value the Price List API gave replaced."""
    from botocore.exceptions import BotoCoreError, ClientError

    if not REGION_CODE.fullmatch(region):
        raise BadInput(f"region {region!r} is not an AWS region code: use one like us-east-1, eu-west-1, "
                       f"ap-southeast-2 or us-gov-west-1")
    today = today or date.today().isoformat()
    report = RefreshReport(region, today)
    doc = copy.deepcopy(table.doc)
    doc.update(as_of=today, region=region)
    step = progress or (lambda message: None)
    try:
        for row in doc["instances"]:
            step(f"EC2 and SageMaker prices for {row['name']}")
            _refresh_instance(client, row, region, today, report)
        step("Bedrock token prices")
        _refresh_bedrock(client, doc["bedrock"], region, today, report)
    except (BotoCoreError, ClientError) as exc:
        raise RefreshFailed(f"the AWS Price List API could not be read ({exc}); no file was written") from None
    if not any(report.refreshed.values()):
        raise RefreshFailed(f"the AWS Price List returned no price for any row in region {region}: is the region "
                            f"offered for these services? No file was written")
    return doc, report


def _refresh_instance(client, row: dict[str, Any], region: str, today: str, report: RefreshReport) -> None:
    ec2_filters = {"instanceType": row["name"], "regionCode": region, "operatingSystem": "Linux",
                   "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
                   "marketoption": "OnDemand"}
    ec2 = [p for p in (hourly_price(d) for d in products(client, "AmazonEC2", ec2_filters)) if p]
    sm = []
    for doc in products(client, "AmazonSageMaker", {"instanceName": "ml." + row["name"], "regionCode": region}):
        if doc.get("product", {}).get("attributes", {}).get("component") != "Hosting":
            report.skip("SageMaker rows for a component other than Hosting")
            continue
        price = hourly_price(doc)
        if price:
            sm.append(price)
    found = []
    for kind, key, prices, service in (("ec2", "ec2_hourly", ec2, "AmazonEC2"),
                                       ("sagemaker", "sagemaker_hourly", sm, "AmazonSageMaker (component Hosting)")):
        if prices:
            row[key] = min(prices)
            report.refreshed[kind].append(row["name"])
            found.append(service)
        else:
            report.missing[kind].append(row["name"])
    if found:
        kept = "" if len(found) == 2 else f"; {'SageMaker' if ec2 else 'EC2'} price kept from {row['as_of']}"
        row["source"] = _source(" and ".join(found), region, today) + kept + _specs_source(row["source"])
        row["as_of"] = today


def _refresh_bedrock(client, rows: list[dict[str, Any]], region: str, today: str, report: RefreshReport) -> None:
    by_name: dict[str, dict[str, Any]] = {}
    for row in rows:
        for alias in [row["name"], *row.get("price_list_names", [])]:
            by_name[normalise(alias)] = row
    found: dict[str, dict[str, float]] = {}       # model_id -> {"on_demand_input": ...}
    services: dict[str, set[str]] = {}
    for service in BEDROCK_SERVICES:
        for doc in products(client, service, {"regionCode": region}):
            attrs = doc.get("product", {}).get("attributes", {})
            name = attrs.get("model") or attrs.get("titanModel") or attrs.get("servicename") or ""
            row = by_name.get(normalise(name))
            if row is None:
                report.skip("Bedrock rows for models not in the table")
                continue
            usage = f"{attrs.get('usagetype', '')} {attrs.get('feature', '')}"
            if _NOT_TOKEN_PRICE.search(usage) or "global" in usage.lower():
                report.skip("Bedrock rows that are not regional per-token inference (cache, provisioned, global...)")
                continue
            direction = bedrock_direction(attrs)
            if direction is None:
                report.skip("Bedrock rows without an input/output token direction")
                continue
            tier = bedrock_tier(attrs)
            if tier != "on_demand":
                report.skip(f"Bedrock {tier} rows (kept as {tier} prices, not on-demand)")
            for dim in on_demand_dimensions(doc):
                price = per_million(dim, service)
                if price is not None and price > 0:
                    found.setdefault(row["model_id"], {})[f"{tier}_{direction}"] = round(price, 8)
                    services.setdefault(row["model_id"], set()).add(service)
    for row in rows:
        prices = found.get(row["model_id"], {})
        if "on_demand_input" not in prices or "on_demand_output" not in prices:
            report.missing["bedrock"].append(row["model_id"])
            continue
        row["input_per_million"] = prices["on_demand_input"]
        row["output_per_million"] = prices["on_demand_output"]
        tiers = []
        for tier in ("batch", "flex", "priority"):
            if f"{tier}_input" in prices and f"{tier}_output" in prices:
                row[f"{tier}_input_per_million"] = prices[f"{tier}_input"]
                row[f"{tier}_output_per_million"] = prices[f"{tier}_output"]
                tiers.append(tier)
        kept = [t for t in ("batch", "flex", "priority") if t not in tiers and row.get(f"{t}_input_per_million") is not None]
        row["source"] = (_source(" and ".join(sorted(services[row["model_id"]])), region, today)
                         + (f" (tiers: on-demand, {', '.join(tiers)})" if tiers else " (on-demand)")
                         + (f"; {', '.join(kept)} kept from {row['as_of']}" if kept else ""))
        row["as_of"] = today
        report.refreshed["bedrock"].append(row["model_id"])


def _source(services: str, region: str, today: str) -> str:
    return f"AWS Price List API get_products {services}, regionCode={region}, read {today}"


def _specs_source(old: str) -> str:
    """Keep the part of an old source that speaks for the specs, not the price."""
    parts = [p for p in old.split("; ") if p.startswith(("specs", "usable GPU memory"))]
    return "".join("; " + p for p in parts)


def default_path(today: str) -> Path:
    return DATA_DIR / f"prices-{today}.json"


def write(doc: dict[str, Any], report: RefreshReport, out: Path | None = None) -> Path:
    path = dump_prices(doc, Path(out) if out else default_path(report.as_of))
    report.path = str(path)
    return path
