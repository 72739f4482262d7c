"""python -m cost bill: each gateway tenant's month, from ledgers the gateway's own store wrote.

Expected dollars are computed here from the price file's rows (read as plain JSON), never from
the code under test.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cost.prices import data_files

REPO = Path(__file__).resolve().parents[2]
GATEWAY_DIR = REPO / "containers" / "gateway"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOV_2026_MS = 1793491200000          # 2026-11-01T00:00:00Z
DEC_2026_MS = 1796083200000          # 2026-12-01T00:00:00Z
NOVEMBER_HOURS = 30 * 24
NOVA_LITE = "amazon.nova-lite-v1:0"


def price_rows() -> tuple[dict, dict]:
    """(instances by name, bedrock by model id) straight from the newest price file."""
    doc = json.loads(data_files()[-1].read_text())
    return {r["name"]: r for r in doc["instances"]}, {r["model_id"]: r for r in doc["bedrock"]}


INSTANCES, BEDROCK = price_rows()


def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cost", "bill", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def run_in_process(capsys, *args: str) -> tuple[int, str]:
    """(exit code, stderr) of `python -m cost bill ARGS`, run here: bad input needs no new process."""
    from cost.__main__ import main
    code = main(["bill", *args])
    return code, capsys.readouterr().err


def bill(*args: str) -> dict:
    return json.loads(cli(*args, "--json").stdout)


def gateway_modules():
    if str(GATEWAY_DIR) not in sys.path:
        sys.path.insert(0, str(GATEWAY_DIR))
    from spectrum_gateway import config, meter, store
    return config, meter, store


def entry(ts_ms: int, tenant: str, upstream: str | None, tokens_in: int, tokens_out: int,
          status: int = 200, model: str = "chat") -> dict:
    """One ledger record as the gateway's meter makes it, at a chosen time."""
    _, meter, _ = gateway_modules()
    record = meter.ledger_entry(request_id=f"r{ts_ms}", tenant=tenant, key_id="k1", model=model,
                                upstream=upstream, fallback_from=[], input_tokens=tokens_in,
                                output_tokens=tokens_out, usage_source="upstream", status=status,
                                latency_s=0.01, stream=False, cost_usd=0.0)
    record["ts_ms"] = ts_ms
    return record


# November: acme uses the self-hosted fleet and Bedrock, beta the fleet, gamma is refused;
# one record from October and one from December must not count.
LEDGER = [
    entry(NOV_2026_MS + 1_000, "acme", "stable", 30_000, 10_000),
    entry(NOV_2026_MS + 2_000, "acme", "stable", 50_000, 30_000),
    entry(NOV_2026_MS + 3_000, "beta", "stable", 15_000, 5_000),
    entry(NOV_2026_MS + 4_000, "acme", "managed", 2_000_000, 1_000_000),
    entry(NOV_2026_MS + 5_000, "gamma", None, 0, 0, status=429),
    entry(NOV_2026_MS - 1, "acme", "stable", 999, 999),
    entry(DEC_2026_MS, "beta", "managed", 999, 999),
]


def write_config(folder: Path, store: str = "memory") -> Path:
    path = folder / "gateway.yaml"
    path.write_text(f"""store: {store}
tenants:
  acme: {{rpm: 600, models: [chat], budget_usd_month: 2000}}
  default: {{rpm: 60, models: [chat], budget_usd_month: 800}}
models:
  chat:
    upstreams:
      - {{name: stable, url: "http://127.0.0.1:8080", weight: 90}}
      - name: managed
        weight: 10
        bedrock: {{model_id: "{NOVA_LITE}"}}
""")
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def expected_november(instance: str = "g5.xlarge", platform: str = "sagemaker_hourly", count: int = 2) -> dict:
    """The bill by hand: the fleet's month split by tokens, Bedrock at its token prices."""
    fleet = INSTANCES[instance][platform] * count * NOVEMBER_HOURS
    acme_tokens, beta_tokens = 30_000 + 10_000 + 50_000 + 30_000, 15_000 + 5_000
    nova = BEDROCK[NOVA_LITE]
    managed = (2_000_000 * nova["input_per_million"] + 1_000_000 * nova["output_per_million"]) / 1e6
    return {"fleet": fleet,
            "acme_stable": fleet * acme_tokens / (acme_tokens + beta_tokens),
            "beta_stable": fleet * beta_tokens / (acme_tokens + beta_tokens),
            "acme_managed": managed}


def by_tenant(data: dict) -> dict:
    return {t["tenant"]: t for t in data["tenants"]}


def test_bill_prices_tokens_and_shares_the_fleet(tmp_path):
    usage = write_jsonl(tmp_path / "usage.jsonl", LEDGER)
    data = bill("--usage", str(usage), "--config", str(write_config(tmp_path)), "--month", "2026-11",
                "--fleet", "stable=ml.g5.xlarge:2")
    want = expected_november()
    tenants = by_tenant(data)
    assert data["hours"] == NOVEMBER_HOURS and data["records_outside_month"] == 2
    acme = tenants["acme"]
    assert (acme["requests"], acme["input_tokens"], acme["output_tokens"]) == (3, 2_080_000, 1_040_000)
    lines = {ln["upstream"]: ln for ln in acme["upstreams"]}
    assert lines["managed"]["usd"] == pytest.approx(want["acme_managed"], abs=1e-6)
    assert lines["managed"]["basis"] == "per_token"
    assert lines["stable"]["usd"] == pytest.approx(want["acme_stable"], abs=1e-6)
    assert lines["stable"]["fleet_share_pct"] == pytest.approx(100 * 120 / 140, abs=1e-4)
    assert acme["usd"] == pytest.approx(want["acme_stable"] + want["acme_managed"], abs=0.005)
    assert acme["budget_used_pct"] == pytest.approx(acme["usd"] / 2000 * 100, abs=0.01)
    beta = tenants["beta"]
    assert beta["usd"] == pytest.approx(want["beta_stable"], abs=0.005)
    # beta and gamma are not listed: the default tenant's budget applies to them
    assert beta["budget_usd_month"] == 800
    gamma = tenants["gamma"]
    assert (gamma["requests"], gamma["errors"], gamma["usd"]) == (1, 1, 0)
    assert gamma["upstreams"][0]["basis"] == "none"
    assert data["fleets"][0]["monthly_usd"] == pytest.approx(want["fleet"], abs=0.005)
    assert data["fleets"][0]["unallocated_usd"] == 0
    assert data["total_usd"] == pytest.approx(want["fleet"] + want["acme_managed"], abs=0.01)


def test_admin_usage_json_and_flags_alone_give_the_same_bill(tmp_path):
    """`admin usage --json` prints {"entries", "summary"}; without a config, flags say how to price."""
    doc = tmp_path / "usage.json"
    doc.write_text(json.dumps({"entries": LEDGER, "summary": []}))
    data = bill("--usage", str(doc), "--month", "2026-11", "--fleet", "chat/stable=g5.xlarge:2",
                "--per-token", f"managed=us.{NOVA_LITE}")
    want = expected_november(platform="ec2_hourly")            # no ml.: EC2 hours
    tenants = by_tenant(data)
    assert data["fleets"][0]["platform"] == "ec2"
    assert data["fleets"][0]["monthly_usd"] == pytest.approx(want["fleet"], abs=0.005)
    assert tenants["beta"]["usd"] == pytest.approx(want["beta_stable"], abs=0.005)
    assert tenants["acme"]["budget_usd_month"] is None and tenants["acme"]["budget_used_pct"] is None
    assert tenants["acme"]["usd"] == pytest.approx(want["acme_stable"] + want["acme_managed"], abs=0.005)


def test_an_unused_fleet_stays_unallocated(tmp_path):
    usage = write_jsonl(tmp_path / "usage.jsonl", [r for r in LEDGER if r["upstream"] != "stable"])
    data = bill("--usage", str(usage), "--config", str(write_config(tmp_path)), "--month", "2026-11",
                "--fleet", "stable=ml.g5.xlarge")
    fleet = INSTANCES["g5.xlarge"]["sagemaker_hourly"] * NOVEMBER_HOURS
    assert data["fleets"][0]["unallocated_usd"] == pytest.approx(fleet, abs=0.005)
    assert data["unallocated_usd"] == pytest.approx(fleet, abs=0.005)
    assert data["total_usd"] == pytest.approx(fleet + expected_november()["acme_managed"], abs=0.01)


def written_by_the_gateway(config_path: Path) -> Path:
    """The ledger appended through the gateway's own store, as its request path does."""
    config_mod, _, store_mod = gateway_modules()
    store = store_mod.open_store(config_mod.load_config(config_path))

    async def write():
        for record in LEDGER:
            await store.finish(None, record["request_id"], 0, 0.0, record, {})
        await store.close()
    asyncio.run(write())
    return config_path


def test_memory_store_ledger_as_the_gateway_wrote_it(tmp_path):
    config_path = written_by_the_gateway(write_config(tmp_path))
    data = bill("--config", str(config_path), "--month", "2026-11", "--fleet", "stable=ml.g5.xlarge:2")
    assert data["source"].startswith("memory store ledger")
    assert by_tenant(data)["beta"]["usd"] == pytest.approx(expected_november()["beta_stable"], abs=0.005)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (tests/run.sh installs it: apt-get install redis-server)")
    import redis
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                                "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail("redis-server did not answer within 15 s")
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(timeout=10)


def test_redis_ledger_as_the_gateway_wrote_it(tmp_path, redis_url):
    config_path = written_by_the_gateway(write_config(tmp_path, store=redis_url))
    data = bill("--config", str(config_path), "--month", "2026-11", "--fleet", "stable=ml.g5.xlarge:2")
    want = expected_november()
    assert data["source"] == f"{redis_url} ledger"
    # The stream holds the records in the order written; the month still excludes October's.
    assert data["records_outside_month"] >= 1
    assert by_tenant(data)["acme"]["usd"] == pytest.approx(want["acme_stable"] + want["acme_managed"], abs=0.005)


def test_an_unreachable_redis_is_a_failure_naming_the_store(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = cli("--config", str(write_config(tmp_path, store=url)), "--month", "2026-11",
               "--fleet", "stable=ml.g5.xlarge", code=1)
    assert url in proc.stderr and "unreachable" in proc.stderr


def test_plot_is_a_png(tmp_path):
    usage = write_jsonl(tmp_path / "usage.jsonl", LEDGER)
    out = tmp_path / "bill.png"
    data = bill("--usage", str(usage), "--config", str(write_config(tmp_path)), "--month", "2026-11",
                "--fleet", "stable=ml.g5.xlarge:2", "--plot", str(out))
    assert data["plot"] == str(out)
    assert out.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("args, message", [
    (["--month", "2026-13"], "month '2026-13' is not a month: write YYYY-MM"),
    (["--month", "Nov 2026"], "month 'Nov 2026' is not a month"),
    (["--month", "2026-11", "--fleet", "stable=ml.g9.xlarge"], "unknown instance type 'ml.g9.xlarge'"),
    (["--month", "2026-11", "--fleet", "stable=ml.g5.xlarge:0"], "instance count '0' must be a whole number >= 1"),
    (["--month", "2026-11", "--fleet", "stable"], "--fleet 'stable' is not understood"),
    (["--month", "2026-11", "--fleet", "stable=m6i.large"], "m6i.large has no accelerator"),
    (["--month", "2026-11", "--fleet", "stabel=ml.g5.xlarge"], "names 'stabel', which is no upstream"),
    (["--month", "2026-11", "--fleet", "managed=ml.g5.xlarge"], "that upstream is Bedrock, billed per token"),
    (["--month", "2026-11"], "chat/stable (openai http://127.0.0.1:8080) is self-hosted: give its fleet"),
])
def test_bad_input_names_the_value(tmp_path, capsys, args, message):
    usage = write_jsonl(tmp_path / "usage.jsonl", LEDGER)
    code, err = run_in_process(capsys, "--usage", str(usage), "--config", str(write_config(tmp_path)), *args)
    assert code == 2 and message in err


@pytest.mark.parametrize("field", ["ts_ms", "tenant", "upstream", "input_tokens", "status"])
def test_a_record_missing_a_field_is_named(tmp_path, capsys, field):
    broken = dict(LEDGER[0])
    del broken[field]
    usage = write_jsonl(tmp_path / "usage.jsonl", [LEDGER[1], broken])
    code, err = run_in_process(capsys, "--usage", str(usage), "--month", "2026-11", "--fleet", "stable=ml.g5.xlarge")
    assert code == 2 and f"line 2: ledger record is missing {field!r}" in err


def test_bad_ledgers_and_missing_ones(tmp_path):
    usage = tmp_path / "usage.jsonl"
    usage.write_text(json.dumps(LEDGER[0]) + "\nnot json\n")
    assert "line 2 is not JSON" in cli("--usage", str(usage), "--month", "2026-11", code=2).stderr
    usage.write_text(json.dumps({**LEDGER[0], "output_tokens": -3}) + "\n")
    assert "'output_tokens' is -3" in cli("--usage", str(usage), "--month", "2026-11", code=2).stderr
    # No usage file and a memory store that never ran here: say where its ledger lives.
    proc = cli("--config", str(write_config(tmp_path)), "--month", "2026-11", code=2)
    assert "store is memory" in proc.stderr and "--usage FILE" in proc.stderr
    assert "give the ledger" in cli("--month", "2026-11", code=2).stderr


def test_the_table_for_people(tmp_path):
    usage = write_jsonl(tmp_path / "usage.jsonl", LEDGER)
    out = cli("--usage", str(usage), "--config", str(write_config(tmp_path)), "--month", "2026-11",
              "--fleet", "stable=ml.g5.xlarge:2").stdout
    fleet = expected_november()["fleet"]
    assert f"fleet stable: 2 x ml.g5.xlarge x {NOVEMBER_HOURS} h = ${fleet:,.2f}" in out
    assert "chat (refused)" in out and "of $2,000" in out
