"""Each tenant's bill for one month, from the gateway's metered ledger (containers/gateway).

The ledger holds one record per request (``spectrum_gateway.meter.ledger_entry``): tenant, key
id, model, upstream, input/output tokens, status, latency. Priced from ``cost/data``:

- per-token upstreams (a Bedrock model id, from the gateway config or ``--per-token``) at
  their on-demand token prices; an upstream the config prices itself (``usd_per_mtok_*``, e.g.
  a third-party API behind a url) at those configured prices;
- self-hosted upstreams (a url to rung 5/6 or vLLM, a SageMaker endpoint) by the tenant's share
  of the fleet's hours: the fleet (``--fleet UPSTREAM=INSTANCE[:COUNT]``) runs the whole
  calendar month, and each tenant pays the part of it equal to its share of the input + output
  tokens that fleet served that month. A fleet nobody used that month stays unallocated.

The gateway's config format is the gateway's business: this module takes what it needs
(upstream kinds, model ids, configured prices, budgets) as plain values, so it imports
nothing of the gateway.
"""
from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from cost.prices import InstanceType, PriceTable, TokenPrice, UnknownName
from options.core import BadInput

MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")
# What every ledger record must carry for a bill (model and upstream may be null: a request
# refused before routing, e.g. a 429, is counted but costs nothing).
RECORD_FIELDS = {"ts_ms": int, "tenant": str, "model": (str, type(None)), "upstream": (str, type(None)),
                 "input_tokens": int, "output_tokens": int, "status": int}
FLEET_SYNTAX = "UPSTREAM=INSTANCE[:COUNT] or MODEL/UPSTREAM=INSTANCE[:COUNT], e.g. stable=ml.g5.xlarge:2"
PER_TOKEN_SYNTAX = "UPSTREAM=BEDROCK_MODEL_ID or MODEL/UPSTREAM=BEDROCK_MODEL_ID, e.g. managed=amazon.nova-lite-v1:0"


# --- the month -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Month:
    label: str                 # "2026-11"
    start_ms: int              # first millisecond, UTC
    end_ms: int                # first millisecond of the next month
    hours: int                 # calendar hours: what a fleet running all month bills

    def holds(self, ts_ms: int) -> bool:
        return self.start_ms <= ts_ms < self.end_ms


def parse_month(text: str) -> Month:
    m = MONTH_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or not 1 <= int(m.group(2)) <= 12 or int(m.group(1)) < 1970:
        raise BadInput(f"month {text!r} is not a month: write YYYY-MM, e.g. 2026-11")
    year, month = int(m.group(1)), int(m.group(2))
    start = datetime(year, month, 1, tzinfo=timezone.utc)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=timezone.utc)
    days = calendar.monthrange(year, month)[1]
    return Month(f"{year:04d}-{month:02d}", int(start.timestamp() * 1000), int(end.timestamp() * 1000), days * 24)


# --- the ledger ----------------------------------------------------------------------------------

def check_record(record: Any, where: str) -> dict:
    """The record if it carries every field a bill needs, with the right types; else BadInput."""
    if not isinstance(record, dict):
        raise BadInput(f"{where}: a ledger record is a JSON object, got {type(record).__name__}")
    for name, kind in RECORD_FIELDS.items():
        if name not in record:
            raise BadInput(f"{where}: ledger record is missing {name!r} (a record carries "
                           f"{', '.join(RECORD_FIELDS)}; `containers/gateway/admin usage --json` prints them)")
        value = record[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BadInput(f"{where}: ledger record field {name!r} is {value!r}; expected "
                           f"{'a whole number' if kind is int else 'a string or null' if isinstance(kind, tuple) else 'a string'}")
        if name.endswith("_tokens") and value < 0:
            raise BadInput(f"{where}: ledger record field {name!r} is {value}; token counts are >= 0")
    return record


def read_usage(path: str | Path) -> list[dict]:
    """Ledger records from a file: JSON lines (the memory store's usage.jsonl, or a Redis
    stream dumped one record a line) or the document ``admin usage --json`` prints
    (``{"entries": [...], "summary": [...]}``)."""
    path = Path(path)
    where = f"usage file {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")   # the ledger is UTF-8 JSON
    except FileNotFoundError:
        raise BadInput(f"{where} does not exist (write one with `containers/gateway/admin --config "
                       f"gateway.yaml usage --json > usage.json`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{where} is not readable: {exc}") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "entries" in whole:
        if not isinstance(whole["entries"], list):
            raise BadInput(f"{where}: \"entries\" must be a list of ledger records")
        return [check_record(r, f"{where} entry {i}") for i, r in enumerate(whole["entries"])]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where} line {number} is not JSON ({exc.msg}): give JSON lines, one ledger "
                           f"record each, or the output of `admin usage --json`") from None
        records.append(check_record(record, f"{where} line {number}"))
    return records


# --- how each upstream is priced -----------------------------------------------------------------

@dataclass(frozen=True)
class UpstreamInfo:
    """What the gateway config says about one (model, upstream)."""
    kind: str                                  # "bedrock" | "sagemaker" | "openai" (a url)
    where: str                                 # its url, endpoint or model id, for messages
    bedrock_model_id: str | None = None
    configured_per_million: tuple[float, float] = (0.0, 0.0)   # usd_per_mtok_input/output


@dataclass(frozen=True)
class FleetSpec:
    key: str                                   # "stable" or "chat/stable", as given
    instance: InstanceType
    platform: str                              # "sagemaker" (ml. name) | "ec2"
    count: int

    @property
    def hourly(self) -> float:
        return self.instance.hourly(self.platform) * self.count

    @property
    def instance_type(self) -> str:
        return self.instance.sagemaker_name if self.platform == "sagemaker" else self.instance.name


def _split_assignment(spec: str, flag: str, syntax: str) -> tuple[str, str]:
    key, sep, value = spec.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value or key.count("/") > 1 or key.startswith("/") or key.endswith("/"):
        raise BadInput(f"{flag} {spec!r} is not understood: write {syntax}")
    return key, value


def parse_fleet(spec: str, table: PriceTable) -> FleetSpec:
    """'stable=ml.g5.xlarge:2' -> 2 x ml.g5.xlarge at SageMaker prices; 'g5.xlarge' (no ml.)
    is priced as EC2 (rung 6 on EKS, or vLLM on your own instances)."""
    key, value = _split_assignment(spec, "--fleet", FLEET_SYNTAX)
    name, _, count_text = value.partition(":")
    count_text = count_text.strip() or "1"
    if not count_text.isdigit() or int(count_text) < 1:
        raise BadInput(f"--fleet {spec!r}: instance count {count_text!r} must be a whole number >= 1 "
                       f"({FLEET_SYNTAX})")
    platform = "sagemaker" if name.strip().lower().startswith("ml.") else "ec2"
    instance = table.instance(name)            # UnknownName (BadInput) names the closest types
    instance.hourly(platform)                  # BadInput when the table has no such price
    if instance.gpus == 0:
        raise BadInput(f"--fleet {spec!r}: {instance.name} has no accelerator; a serving fleet runs on a "
                       f"GPU or Inferentia instance (list them with `python -m cost prices --kind instance`)")
    return FleetSpec(key, instance, platform, int(count_text))


def parse_per_token(spec: str, table: PriceTable) -> tuple[str, TokenPrice]:
    key, value = _split_assignment(spec, "--per-token", PER_TOKEN_SYNTAX)
    return key, table.bedrock(value)


@dataclass(frozen=True)
class Pricing:
    basis: str                                 # "per_token" | "fleet_share"
    describe: str
    per_million: tuple[float, float] = (0.0, 0.0)
    fleet: FleetSpec | None = None


def _lookup(mapping: dict, model: str | None, upstream: str):
    for key in (f"{model}/{upstream}", upstream):
        if key in mapping:
            return mapping[key]
    return None


def resolve_pricing(model: str | None, upstream: str, table: PriceTable, info: UpstreamInfo | None,
                    fleets: dict[str, FleetSpec], per_token: dict[str, TokenPrice]) -> Pricing | str:
    """How (model, upstream) is priced, or a line saying what is missing."""
    fleet = _lookup(fleets, model, upstream)
    if fleet is not None:
        return Pricing("fleet_share", f"share of {fleet.count} x {fleet.instance_type} "
                                      f"(${fleet.instance.hourly(fleet.platform):g}/h each, {fleet.platform})",
                       fleet=fleet)
    price = _lookup(per_token, model, upstream)
    if price is None and info is not None and info.bedrock_model_id:
        try:
            price = table.bedrock(info.bedrock_model_id)
        except UnknownName:
            if info.configured_per_million == (0.0, 0.0):
                raise
    if price is not None:
        p_in, p_out = price.per_million()
        return Pricing("per_token", f"Bedrock {price.model_id} ${p_in:g}/${p_out:g} per 1M in/out "
                                    f"(as of {price.as_of})", (p_in, p_out))
    name = f"{model}/{upstream}"
    if info is not None and info.configured_per_million != (0.0, 0.0):
        p_in, p_out = info.configured_per_million
        return Pricing("per_token", f"the gateway config's usd_per_mtok_input/output ${p_in:g}/${p_out:g} "
                                    f"per 1M (not in cost/data)", (p_in, p_out))
    if info is not None:
        return (f"{name} ({info.kind} {info.where}) is self-hosted: give its fleet with "
                f"--fleet {upstream}=ml.g5.xlarge:2 (instance type and count)")
    return (f"{name} is not described: give --fleet {upstream}=INSTANCE[:COUNT] (self-hosted) or "
            f"--per-token {upstream}=BEDROCK_MODEL_ID, or --config gateway.yaml")


# --- the bill --------------------------------------------------------------------------------------

@dataclass
class Line:
    """One tenant's use of one (model, upstream) in the month."""
    tenant: str
    model: str | None
    upstream: str | None
    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    pricing: Pricing | None = None
    share: float | None = None                 # of the fleet's tokens

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        out = {"model": self.model, "upstream": self.upstream, "requests": self.requests, "errors": self.errors,
               "input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "usd": round(self.usd, 6),
               "basis": self.pricing.basis if self.pricing else "none",
               "pricing": self.pricing.describe if self.pricing else "refused before an upstream: no cost"}
        if self.share is not None:
            out["fleet"] = self.pricing.fleet.key
            out["fleet_share_pct"] = round(self.share * 100, 4)
        return out


@dataclass
class FleetUse:
    spec: FleetSpec
    hours: int
    lines: list[Line] = field(default_factory=list)

    @property
    def monthly(self) -> float:
        return self.spec.hourly * self.hours


def build_bill(records: Iterable[dict], month: Month, table: PriceTable, *,
               upstreams: dict[tuple[str, str], UpstreamInfo] | None = None,
               fleets: Iterable[FleetSpec] = (), per_token: dict[str, TokenPrice] | None = None,
               budget: Callable[[str], float | None] = lambda tenant: None, source: str = "") -> dict[str, Any]:
    """The month's bill per tenant. ``upstreams`` comes from the gateway config (None without
    one); ``budget(tenant)`` is the tenant's budget_usd_month or None."""
    records = list(records)
    per_token = per_token or {}
    fleet_specs: dict[str, FleetSpec] = {}
    for spec in fleets:
        if spec.key in fleet_specs:
            raise BadInput(f"--fleet {spec.key!r} is given twice: give each fleet once")
        fleet_specs[spec.key] = spec
    clash = sorted(set(fleet_specs) & set(per_token))
    if clash:
        raise BadInput(f"{', '.join(clash)} has both --fleet and --per-token: an upstream is billed one way")
    known = _known_upstreams(upstreams, records)
    for key in [*fleet_specs, *per_token]:
        if key not in known:
            raise BadInput(f"--fleet/--per-token names {key!r}, which is no upstream "
                           f"of the gateway config or in the ledger; "
                           f"known: {', '.join(sorted(known)) or 'none'}")
        if upstreams and fleet_specs.get(key):
            kinds = {info.kind for (m, u), info in upstreams.items() if key in (u, f"{m}/{u}")}
            if kinds == {"bedrock"}:
                raise BadInput(f"--fleet {key!r}: that upstream is Bedrock, billed per token; a fleet "
                               f"is for self-hosted upstreams (url or sagemaker)")

    lines: dict[tuple, Line] = {}
    outside = 0
    for record in records:
        if not month.holds(record["ts_ms"]):
            outside += 1
            continue
        key = (record["tenant"], record["model"], record["upstream"])
        line = lines.get(key) or lines.setdefault(key, Line(*key))
        line.requests += 1
        line.errors += record["status"] >= 400
        line.input_tokens += record["input_tokens"]
        line.output_tokens += record["output_tokens"]

    missing, pricings = [], {}
    for (_, model, upstream) in lines:
        if upstream is None or (model, upstream) in pricings:
            continue
        info = (upstreams or {}).get((model, upstream))
        found = resolve_pricing(model, upstream, table, info, fleet_specs, per_token)
        if isinstance(found, str):
            missing.append(found)
        pricings[(model, upstream)] = found
    if missing:
        raise BadInput("cannot price every upstream in the ledger: " + "; ".join(sorted(set(missing))))

    uses = {key: FleetUse(spec, month.hours) for key, spec in fleet_specs.items()}
    for line in lines.values():
        if line.upstream is None:
            continue
        line.pricing = pricings[(line.model, line.upstream)]
        if line.pricing.basis == "per_token":
            p_in, p_out = line.pricing.per_million
            line.usd = (line.input_tokens * p_in + line.output_tokens * p_out) / 1e6
        else:
            uses[line.pricing.fleet.key].lines.append(line)
    for use in uses.values():
        # The fleet's month is shared by tokens served; a month of only token-less requests
        # (all refused by the upstream) is shared by requests instead.
        weight = (lambda ln: ln.tokens) if sum(ln.tokens for ln in use.lines) else (lambda ln: ln.requests)
        total = sum(weight(ln) for ln in use.lines)
        for line in use.lines:
            line.share = weight(line) / total
            line.usd = use.monthly * line.share

    tenants = []
    for name in sorted({t for t, _, _ in lines}):
        own = sorted((ln for ln in lines.values() if ln.tenant == name),
                     key=lambda ln: (str(ln.model), str(ln.upstream)))
        usd = sum(ln.usd for ln in own)
        limit = budget(name)
        tenants.append({
            "tenant": name, "requests": sum(ln.requests for ln in own), "errors": sum(ln.errors for ln in own),
            "input_tokens": sum(ln.input_tokens for ln in own), "output_tokens": sum(ln.output_tokens for ln in own),
            "usd": round(usd, 2), "budget_usd_month": limit,
            "budget_used_pct": None if not limit else round(usd / limit * 100, 2),
            "upstreams": [ln.to_json() for ln in own]})
    fleet_rows = [{"fleet": u.spec.key, "instance_type": u.spec.instance_type, "platform": u.spec.platform,
                   "count": u.spec.count, "hourly_usd": round(u.spec.hourly, 6), "hours": u.hours,
                   "monthly_usd": round(u.monthly, 2), "tokens": sum(ln.tokens for ln in u.lines),
                   "requests": sum(ln.requests for ln in u.lines),
                   "unallocated_usd": 0.0 if u.lines else round(u.monthly, 2)} for u in uses.values()]
    unallocated = sum(r["unallocated_usd"] for r in fleet_rows)
    assumptions = [
        f"month {month.label}: {month.hours} calendar hours (UTC); records outside it are left out "
        f"({outside} of them)",
        f"per-token upstreams at on-demand prices from {table.path.name if table.path else 'the price table'} "
        f"(as of {table.as_of}) unless the line says otherwise",
    ]
    if fleet_rows:
        assumptions += [
            "a fleet bills instance-hours for the whole month whether busy or idle; each tenant pays its share "
            "of the input + output tokens the fleet served; a fleet nobody used stays unallocated",
            "instance names with ml. are priced as SageMaker instance-hours, without as EC2 (rung 6 adds the EKS "
            "control plane and system nodes, not counted here); storage, data transfer and load balancers "
            "are not counted"]
    return {"month": month.label, "hours": month.hours, "source": source, "tenants": tenants, "fleets": fleet_rows,
            "total_usd": round(sum(t["usd"] for t in tenants) + unallocated, 2),
            "unallocated_usd": round(unallocated, 2), "records_outside_month": outside,
            "assumptions": assumptions}


def _known_upstreams(upstreams: dict | None, records: Iterable[dict]) -> set[str]:
    """Names --fleet/--per-token may use: UPSTREAM and MODEL/UPSTREAM."""
    pairs = set(upstreams or {}) | {(r["model"], r["upstream"]) for r in records if r["upstream"] is not None}
    return {u for _, u in pairs} | {f"{m}/{u}" for m, u in pairs}


def upstreams_from_config(config) -> dict[tuple[str, str], UpstreamInfo]:
    """(model, upstream) -> UpstreamInfo from a loaded gateway config (duck-typed: its
    ``models[name].upstreams`` with ``kind``, ``url``, ``bedrock``, ``sagemaker`` and prices)."""
    out = {}
    for model in config.models.values():
        for u in model.upstreams:
            where = u.url or (u.bedrock or {}).get("model_id") or (u.sagemaker or {}).get("endpoint", "")
            out[(model.name, u.name)] = UpstreamInfo(
                u.kind, where, (u.bedrock or {}).get("model_id"),
                (float(u.usd_per_mtok_input), float(u.usd_per_mtok_output)))
    return out


# --- for people ------------------------------------------------------------------------------------

def render(data: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    from cost.render import _assumptions, _money, console

    t = Table(box=box.SIMPLE_HEAD, title=f"Bill for {data['month']} ({data['source']})", collapse_padding=True)
    for col in ("tenant", "model/upstream", "requests", "input tok", "output tok", "basis", "USD", "budget used"):
        t.add_column(col, justify="left" if col in ("tenant", "model/upstream", "basis") else "right", no_wrap=True)
    for tenant in data["tenants"]:
        used = tenant["budget_used_pct"]
        t.add_row(tenant["tenant"], "all", f"{tenant['requests']:,}", f"{tenant['input_tokens']:,}",
                  f"{tenant['output_tokens']:,}", "", _money(tenant["usd"], 2),
                  "—" if used is None else f"{used:.0f} % of {_money(tenant['budget_usd_month'], 0)}",
                  style="bold red" if used is not None and used > 100 else "bold")
        for line in tenant["upstreams"]:
            basis = {"per_token": "per token", "fleet_share": f"fleet {line.get('fleet_share_pct', 0):.1f} %",
                     "none": "—"}[line["basis"]]
            where = (f"{line['model']}/{line['upstream']}" if line["upstream"] is not None
                     else f"{line['model'] or '—'} (refused)")
            t.add_row("", where, f"{line['requests']:,}", f"{line['input_tokens']:,}",
                      f"{line['output_tokens']:,}", basis, _money(line["usd"], 2), "")
    console.print(t)
    for fleet in data["fleets"]:
        console.print(f"fleet {fleet['fleet']}: {fleet['count']} x {fleet['instance_type']} x {fleet['hours']} h = "
                      f"{_money(fleet['monthly_usd'], 2)}"
                      + (f" (no traffic: {_money(fleet['unallocated_usd'], 2)} unallocated)"
                         if fleet["unallocated_usd"] else ""), highlight=False)
    console.print(f"[bold]Total {_money(data['total_usd'], 2)}[/bold]", highlight=False)
    if data.get("plot"):
        console.print(f"Plot written to {data['plot']}", highlight=False)
    _assumptions(data["assumptions"])
