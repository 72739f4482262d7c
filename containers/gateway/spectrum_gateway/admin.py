"""``admin``: API keys and usage, against the same store the server uses.

    admin --config gateway.yaml keys create --tenant T [--models a,b] [--json]
    admin --config gateway.yaml keys list [--json]
    admin --config gateway.yaml keys revoke ID [--json]
    admin --config gateway.yaml usage [--tenant T] [--since ISO] [--json]

A new key is printed once and never again: the store keeps only its HMAC.
Exit codes: 0 ok, 2 bad input, 1 failure (the store unreachable).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime, timezone

from .auth import key_digest, load_secret, new_key
from .config import ConfigError, GatewayConfig, load_config
from .errors import GatewayError
from .store import open_store


class BadInput(Exception):
    pass


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_since(text: str) -> int:
    """An ISO date or time (UTC unless it says otherwise) → epoch milliseconds."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"--since {text!r} is not an ISO date or time; "
                       "write e.g. 2026-11-01 or 2026-11-30T12:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


async def create_key(config: GatewayConfig, store, tenant: str, models: list[str] | None) -> dict:
    if config.tenant(tenant) is None:
        raise BadInput(f"tenant {tenant!r} is not in the config and there is no default tenant; "
                       f"tenants: {', '.join(sorted(config.tenants)) or 'none'}")
    for m in models or []:
        if m not in config.models:
            raise BadInput(f"model {m!r} does not exist; models: {', '.join(sorted(config.models))}")
        if not config.tenant(tenant).allows(m):
            raise BadInput(f"tenant {tenant!r} may not use model {m!r}; give the tenant the "
                           "model in the config first")
    key_id, key = new_key()
    record = {"id": key_id, "hash": key_digest(load_secret(config), key), "tenant": tenant,
              "models": models or None, "created_at": _now_iso(), "revoked_at": None}
    await store.put_key(record)
    return {"id": key_id, "key": key, "tenant": tenant, "models": models or None}


async def revoke_key(store, key_id: str) -> dict:
    record = next((r for r in await store.all_keys() if r["id"] == key_id), None)
    if record is None:
        raise BadInput(f"no key with id {key_id!r}; 'keys list' shows the ids")
    if not record.get("revoked_at"):
        record["revoked_at"] = _now_iso()
        await store.put_key(record)
    return _public(record)


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "hash"}


class Summary:
    """Usage per (tenant, model, upstream), added to a page of the ledger at a time."""

    def __init__(self) -> None:
        self.rows: dict[tuple, dict] = {}

    def add(self, entries) -> None:
        rows = self.rows
        for e in entries:
            key = (e["tenant"], e.get("model"), e.get("upstream"))
            row = rows.get(key)
            if row is None:
                row = rows[key] = {"tenant": key[0], "model": key[1], "upstream": key[2],
                                   "requests": 0, "errors": 0, "input_tokens": 0,
                                   "output_tokens": 0, "cost_usd": 0.0}
            row["requests"] += 1
            row["errors"] += e["status"] >= 400
            row["input_tokens"] += e["input_tokens"]
            row["output_tokens"] += e["output_tokens"]
            row["cost_usd"] = round(row["cost_usd"] + e.get("cost_usd", 0.0), 8)

    def result(self) -> list[dict]:
        return list(self.rows.values())


def summarize(entries: list[dict]) -> list[dict]:
    """Usage per (tenant, model, upstream)."""
    summary = Summary()
    summary.add(entries)
    return summary.result()


async def usage(store, out, tenant: str | None, since_ms: int | None, as_json: bool) -> None:
    """The ledger (``--json``: ``{"entries": [...], "summary": [...]}``) or its summary table,
    read and written a page at a time: a ledger of millions of entries is never held whole."""
    import orjson
    summary = Summary()
    if as_json:
        out.write(b'{"entries": [')
    first = True
    async for page in store.ledger_pages(since_ms):
        if tenant is not None:
            page = [e for e in page if e["tenant"] == tenant]
        if not page:
            continue
        summary.add(page)
        if as_json:
            if not first:
                out.write(b", ")
            out.write(orjson.dumps(page)[1:-1])      # the page's entries, without its brackets
            first = False
    if as_json:
        out.write(b'], "summary": ' + orjson.dumps(summary.result()) + b"}\n")
        out.flush()
    else:
        _table(summary.result(), ["tenant", "model", "upstream", "requests", "errors",
                                  "input_tokens", "output_tokens", "cost_usd"], "Usage")


def _table(rows: list[dict], columns: list[str], title: str) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*["" if r.get(c) is None else str(r.get(c)) for c in columns])
    Console().print(table)


async def run(args) -> int:
    config = load_config(args.config)
    store = open_store(config)
    try:
        if args.command == "keys" and args.keys_command == "create":
            models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
            out = await create_key(config, store, args.tenant, models)
            if args.json:
                print(json.dumps(out))
            else:
                print(f"key {out['id']} for tenant {out['tenant']} (shown once; store it now):\n{out['key']}")
        elif args.command == "keys" and args.keys_command == "list":
            keys = sorted((_public(r) for r in await store.all_keys()), key=lambda r: r["created_at"])
            if args.json:
                print(json.dumps(keys))
            else:
                _table(keys, ["id", "tenant", "models", "created_at", "revoked_at"], "API keys")
        elif args.command == "keys" and args.keys_command == "revoke":
            out = await revoke_key(store, args.id)
            print(json.dumps(out) if args.json else f"key {out['id']} revoked at {out['revoked_at']}")
        elif args.command == "usage":
            since = parse_since(args.since) if args.since else None
            await usage(store, sys.stdout.buffer, args.tenant, since, args.json)
        return 0
    finally:
        await store.close()


def parser(prog: str = "admin") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="API keys and usage of Spectrum's gateway")
    p.add_argument("--config", default="gateway.yaml")
    sub = p.add_subparsers(dest="command", required=True)
    keys = sub.add_parser("keys", help="create, list or revoke API keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    create = ksub.add_parser("create", help="a new key, printed once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--models", help="comma-separated models this key may use (default: the tenant's)")
    create.add_argument("--json", action="store_true")
    lst = ksub.add_parser("list")
    lst.add_argument("--json", action="store_true")
    revoke = ksub.add_parser("revoke", help="stop a key working (every worker, within a second)")
    revoke.add_argument("id")
    revoke.add_argument("--json", action="store_true")
    usage = sub.add_parser("usage", help="the metered ledger")
    usage.add_argument("--tenant")
    usage.add_argument("--since", help="ISO date or time, UTC unless it says otherwise")
    usage.add_argument("--json", action="store_true")
    return p


def main(argv: list[str], prog: str = "admin") -> int:
    args = parser(prog).parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (ConfigError, BadInput) as e:
        print(f"admin: {e}", file=sys.stderr)
        return 2
    except GatewayError as e:
        print(f"admin: {e.message}", file=sys.stderr)
        return 1
