"""Which Bedrock text models a region offers, with their prices: live, or from the price table offline."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class CatalogueEntry:
    model_id: str
    name: str
    provider: str
    streaming: bool | None          # None: not known offline
    inference_types: list[str]      # ON_DEMAND, INFERENCE_PROFILE, PROVISIONED
    input_per_million: float | None
    output_per_million: float | None
    price_as_of: str | None
    source: str                     # "bedrock:ListFoundationModels (<region>)" or the price table's

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _price(table: Any, model_id: str):
    from cost.prices import UnknownName
    try:
        return table.bedrock(model_id)
    except UnknownName:
        return None


def from_price_table(table: Any) -> list[CatalogueEntry]:
    out = []
    for p in table.bedrock_models():
        out.append(CatalogueEntry(p.model_id, p.name, p.model_id.split(".")[0], None, [],
                                  p.input_per_million, p.output_per_million, p.as_of,
                                  f"offline price table: {p.source}"))
    return out


def list_models(bedrock_client: Any | None, table: Any = None) -> tuple[list[CatalogueEntry], str | None]:
    """Text models from ``bedrock_client.list_foundation_models``, priced from the table.

    Returns (entries, why_offline): when the live call is impossible (no credentials, no
    network, an emulator without the API) the price table's models are listed instead and
    ``why_offline`` says why.
    """
    from botocore.exceptions import BotoCoreError, ClientError
    from cost.prices import load_prices

    table = table or load_prices()
    if bedrock_client is None:
        return from_price_table(table), "no cloud target: listing the offline price table"
    try:
        summaries = bedrock_client.list_foundation_models(byOutputModality="TEXT")["modelSummaries"]
    except (BotoCoreError, ClientError) as exc:
        return from_price_table(table), f"ListFoundationModels failed ({exc}); listing the offline price table"
    region = bedrock_client.meta.region_name
    out = []
    for s in summaries:
        if (s.get("modelLifecycle") or {}).get("status", "ACTIVE") != "ACTIVE":
            continue
        price = _price(table, s["modelId"])
        out.append(CatalogueEntry(
            s["modelId"], s.get("modelName", s["modelId"]), s.get("providerName", ""),
            s.get("responseStreamingSupported"), list(s.get("inferenceTypesSupported") or []),
            price.input_per_million if price else None, price.output_per_million if price else None,
            price.as_of if price else None, f"bedrock:ListFoundationModels ({region})"))
    return out, None
