"""A bad config stops start-up naming the line and the key; so does an unsafe set-up."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from gateway_harness import GATEWAY_DIR
from spectrum_gateway.config import ConfigError, load_config

GOOD = """\
store: memory
tenants:
  acme: {rpm: 600, tpm: 200000, max_concurrency: 16, models: [chat], budget_usd_month: 500}
  default: {rpm: 60, models: [chat]}
models:
  chat:
    upstreams:
      - {name: stable, url: "http://127.0.0.1:8080", weight: 90}
      - {name: canary, url: "http://127.0.0.1:8081", weight: 10}
      - {name: managed, bedrock: {model_id: "amazon.nova-lite-v1:0"}, weight: 0}
    tenants: {acme: stable}
    fallback: [managed]
"""


def write(tmp_path, text: str):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


def test_the_issue_example_loads(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert config.store == "memory" and not config.uses_redis
    assert config.tenants["acme"].rpm == 600 and config.tenants["acme"].budget_usd_month == 500
    chat = config.models["chat"]
    assert [u.name for u in chat.upstreams] == ["stable", "canary", "managed"]
    assert chat.upstream("managed").kind == "bedrock" and chat.fallback == ("managed",)
    assert config.max_body_bytes == 6 * 1024 * 1024
    # A tenant that is not listed gets default's limits under its own name.
    assert config.tenant("someone").rpm == 60 and config.tenant("someone").name == "someone"


def test_the_example_config_shipped_beside_serve_loads():
    config = load_config(GATEWAY_DIR / "gateway.example.yaml")
    assert config.models["chat"].upstream("managed").bedrock["model_id"] == "amazon.nova-lite-v1:0"
    assert config.models["chat"].tenant_overrides == {"acme": "stable"}


def test_weights_summing_to_zero_name_their_line(tmp_path):
    message = error_of(tmp_path, GOOD.replace("weight: 90", "weight: 0").replace("weight: 10", "weight: 0"))
    assert "line 7: models.chat.upstreams: the weights sum to 0" in message


def test_unknown_fallback_names_its_line_and_the_choices(tmp_path):
    message = error_of(tmp_path, GOOD.replace("fallback: [managed]", "fallback: [managd]"))
    assert "line 12: models.chat.fallback[0]: 'managd' is not an upstream of model 'chat'" in message
    assert "stable, canary, managed" in message


def test_tenant_allowed_a_missing_model(tmp_path):
    message = error_of(tmp_path, GOOD.replace("models: [chat], budget", "models: [chat, code], budget"))
    assert "line 3: tenants.acme.models[1]: model 'code' does not exist; models: chat" in message


def test_unknown_keys_are_named_with_a_suggestion(tmp_path):
    message = error_of(tmp_path, GOOD.replace("rpm: 600", "rmp: 600").replace("store: memory", "stor: memory"))
    assert "line 1: stor: unknown key; did you mean 'store'?" in message
    assert "line 3: tenants.acme.rmp: unknown key; did you mean 'rpm'?" in message


def test_every_error_at_once_and_bad_values(tmp_path):
    message = error_of(tmp_path, GOOD.replace("rpm: 600", "rpm: -1")
                       .replace("store: memory", "store: mysql://x")
                       .replace("tenants: {acme: stable}", "tenants: {acme: stabel}"))
    assert "tenants.acme.rpm: must be a whole number >= 1, got -1" in message
    assert "store: 'mysql://x' is not a store" in message
    assert "models.chat.tenants.acme: 'stabel' is not an upstream" in message


def test_serve_exits_2_naming_the_line(tmp_path):
    path = write(tmp_path, GOOD.replace("fallback: [managed]", "fallback: [nope]"))
    result = subprocess.run([sys.executable, str(GATEWAY_DIR / "serve"), "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "gateway.yaml line 12: models.chat.fallback[0]: 'nope'" in result.stderr


def test_several_workers_without_redis_are_refused(tmp_path):
    path = write(tmp_path, GOOD)
    result = subprocess.run([sys.executable, str(GATEWAY_DIR / "serve"), "--config", str(path),
                             "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--workers 2 needs a shared store" in result.stderr
    assert "every limit would become 2 times the limit" in result.stderr
    assert "store: redis://HOST:PORT/DB" in result.stderr


def test_redis_store_url_is_accepted(tmp_path):
    config = load_config(write(tmp_path, GOOD.replace("store: memory", "store: redis://127.0.0.1:6379/0")))
    assert config.uses_redis and config.store == "redis://127.0.0.1:6379/0"
    assert yaml.safe_load(GOOD)["models"]["chat"]["fallback"] == ["managed"]


def test_a_redis_password_never_shows_in_the_store_name(tmp_path):
    """/readyz, 503 errors and the start-up line name the store: never with its password."""
    from spectrum_gateway.store import RedisStore
    text = GOOD.replace("store: memory", "store: redis://:s3cret-pw@redis.internal:6379/2")
    config = load_config(write(tmp_path, text))
    assert config.store_name == "redis://:***@redis.internal:6379/2"
    assert RedisStore(config).name == config.store_name          # no connection made yet
    text = GOOD.replace("store: memory", "store: rediss://gateway:pw@redis.internal:6380")
    assert load_config(write(tmp_path, text)).store_name == "rediss://gateway:***@redis.internal:6380"
    assert load_config(write(tmp_path, GOOD.replace("store: memory", "store: redis://h:1/0"))
                       ).store_name == "redis://h:1/0"
