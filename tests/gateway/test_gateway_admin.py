"""``admin``: keys create / list / revoke and usage, against the Redis the workers share."""
from __future__ import annotations

import json

import openai
import pytest

HI = [{"role": "user", "content": "hi"}]


def test_keys_create_list_revoke(gateway):
    created = gateway.create_key("acme", models="chat,flaky")
    assert set(created) == {"id", "key", "tenant", "models"}
    assert created["key"].startswith(f"sk-spg-{created['id']}-") and created["tenant"] == "acme"
    listed = {k["id"]: k for k in json.loads(gateway.admin("keys", "list", "--json").stdout)}
    record = listed[created["id"]]
    assert record["tenant"] == "acme" and record["models"] == ["chat", "flaky"]
    assert "hash" not in record and "key" not in record and record["revoked_at"] is None
    table = gateway.admin("keys", "list").stdout
    assert created["id"] in table and created["key"] not in table

    revoked = json.loads(gateway.admin("keys", "revoke", created["id"], "--json").stdout)
    assert revoked["id"] == created["id"] and revoked["revoked_at"]
    with pytest.raises(openai.AuthenticationError):
        gateway.client(created["key"]).chat.completions.create(model="chat", messages=HI, max_tokens=1)
    text = gateway.admin("keys", "create", "--tenant", "acme").stdout
    assert "shown once" in text and "sk-spg-" in text


@pytest.mark.parametrize("args, message", [
    (["keys", "create", "--tenant", "acme", "--models", "chat,nope"], "model 'nope' does not exist"),
    (["keys", "create", "--tenant", "acme", "--models", "priced"], "tenant 'acme' may not use model 'priced'"),
    (["keys", "revoke", "000000000000"], "no key with id '000000000000'; 'keys list' shows the ids"),
    (["usage", "--since", "last tuesday"], "--since 'last tuesday' is not an ISO date or time"),
])
def test_bad_input_exits_2_saying_what_is_wrong(gateway, args, message):
    result = gateway.admin(*args, check=False)
    assert result.returncode == 2 and message in result.stderr


def test_unknown_tenant_without_default(tmp_path):
    from gateway_harness import GATEWAY_DIR
    import subprocess
    import sys
    config = tmp_path / "gateway.yaml"
    config.write_text("tenants: {acme: {}}\nmodels: {chat: {upstreams: [{name: a, url: 'http://x'}]}}\n")
    result = subprocess.run([sys.executable, str(GATEWAY_DIR / "admin"), "--config", str(config),
                             "keys", "create", "--tenant", "ghost"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "tenant 'ghost' is not in the config and there is no default tenant; tenants: acme" in result.stderr


def test_usage_since_and_per_tenant(gateway):
    key = gateway.create_key("pinned")
    gateway.client(key["key"]).chat.completions.create(model="chat", messages=HI, max_tokens=2)
    usage = json.loads(gateway.admin("usage", "--tenant", "pinned", "--json").stdout)
    assert {e["tenant"] for e in usage["entries"]} == {"pinned"}
    [row] = [r for r in usage["summary"] if r["upstream"] == "canary"]
    assert row["requests"] >= 1 and row["output_tokens"] >= 2
    future = json.loads(gateway.admin("usage", "--since", "2999-01-01", "--json").stdout)
    assert future == {"entries": [], "summary": []}
    table = gateway.admin("usage", "--tenant", "pinned").stdout
    assert "pinned" in table and "canary" in table
