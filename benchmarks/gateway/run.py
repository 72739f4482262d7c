"""Benchmark: clients → this gateway → upstream, clients → upstream directly, and clients →
LiteLLM's proxy → upstream, side by side in one run.

The upstream is the gateway tests' fake OpenAI server (tests/gateway/fake_upstream.py) streaming
one token every 2 ms, so only what sits between client and upstream is measured. Every
contender runs the whole time; each round goes through the concurrency levels and, at each
level, through the contenders in an order that alternates from round to round (a b c, c b a, ...),
so drift in the machine's load hits every contender alike.

Per contender, level and round:
- TTFT p50 / p99 (request sent → first chunk with text), and the same minus the direct path's
  figure of that round and level ("added");
- throughput: streamed tokens / wall time;
- proxy CPU: user + sys seconds of the proxy's process tree (psutil, read before and after the
  level), per streamed token and per stream; the upstream's CPU the same way for reference;
- streams lost: errors, or answers with other than ``max_tokens`` tokens.
"Whole answers" (``max_tokens: 1``, not streamed) measure the proxy's CPU per request.

Tables show each figure's median over the rounds with the range of the rounds beside it; a gap
between contenders means something only where it is wider than those ranges.

    .venv/bin/python benchmarks/gateway/run.py --rounds 3 --concurrency 1,8,32,64 \\
        --contenders direct,gateway,gateway-redis \\
        --json /tmp/gateway-bench.json

(``gateway-redis``: two gunicorn/uvicorn workers sharing a ``redis-server`` the bench starts;
``gateway@git:REV``, ``gateway-redis@git:REV``: the gateway as it was at git revision REV, to
measure a change against what it replaced.)

Two baselines say what the goals can be measured against: ``floor`` (``floor_relay.py``, the
gateway's own stack, uvicorn + the gateway's upstream client, passing bytes on and checking nothing: what any gateway
on this stack costs at least) and ``nginx`` (a proxy written in C, ``proxy_buffering off``,
checking nothing; needs ``nginx`` installed).

LiteLLM's proxy runs from an environment of its own (``--litellm-venv``, made on first use with
``pip install 'litellm[proxy]==1.108.7'``; ``--no-litellm`` leaves it out), one worker, its
master key as the clients' key (its other keys need a database).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GATEWAY_DIR = REPO / "containers" / "gateway"
sys.path.insert(0, str(REPO))

from options.bench.metrics import percentile  # noqa: E402
from options.local_server import free_port  # noqa: E402

FAKE_UPSTREAM = REPO / "tests" / "gateway" / "fake_upstream.py"
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"   # 1.110's proxy extra needs a package PyPI lacks
UPSTREAM_NAME = "fake"
MODEL = "chat"
PROMPT = [{"role": "user", "content": "say something about the price of a GPU hour"}]
START_TIMEOUT_S = 180
LABELS = {"direct": "direct (no proxy)",
          "nginx": "nginx, 1 worker process, proxy_buffering off: a C proxy, nothing checked",
          "floor": "floor_relay.py: uvicorn + the gateway's upstream client pushing bytes on "
                   "as the gateway does, nothing checked",
          "gateway": "this gateway, 1 worker, store: memory",
          "gateway-redis": "this gateway, store: redis", "litellm": "LiteLLM proxy 1.108.7, 1 worker"}


# -- processes --------------------------------------------------------------------------------
@dataclass
class Process:
    """A server this bench started, in a session of its own (so it is stopped as a group)."""
    name: str
    process: subprocess.Popen
    url: str
    log: Path
    health: str

    def cpu_s(self) -> tuple[float, float]:
        """User and kernel CPU seconds of the whole process tree (workers included)."""
        import psutil
        try:
            root = psutil.Process(self.process.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            raise RuntimeError(f"{self.name} has exited; see {self.log}") from None
        user = system = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                user, system = user + t.user, system + t.system
            except psutil.NoSuchProcess:
                pass
        return user, system

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start(name: str, cmd: list[str], port: int, health: str, log_dir: Path,
          env: dict | None = None) -> Process:
    log = log_dir / f"{name}.log"
    # A session, so a scheduling autogroup, of its own, as the README's tables were measured.
    # Harmless here: no contender busy-polls, so none keeps the clients' group off the CPU
    # (vLLM's engine does; benchmarks/server-vs-vllm/README.md, "Long streams stalled").
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    server = Process(name, proc, f"http://127.0.0.1:{port}", log, health)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} at start; see {log}:\n"
                               + log.read_text()[-2000:])
        try:
            with urllib.request.urlopen(server.url + health, timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"{name} did not answer {health} within {START_TIMEOUT_S} s; see {log}")


def start_upstream(log_dir: Path, interval_s: float, usage_nulls: bool = False) -> Process:
    port = free_port()
    up = start("upstream", [sys.executable, str(FAKE_UPSTREAM), str(port)], port,
               f"/control/{UPSTREAM_NAME}", log_dir)
    body = json.dumps({"mode": "ok", "interval_s": interval_s,
                       "usage_nulls": usage_nulls}).encode()
    urllib.request.urlopen(urllib.request.Request(
        f"{up.url}/control/{UPSTREAM_NAME}", data=body, method="POST",
        headers={"content-type": "application/json"}), timeout=10).read()
    return up


def start_redis(log_dir: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("gateway-redis needs redis-server (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(log_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    import redis
    for _ in range(100):
        try:
            if redis.Redis(port=port).ping():
                return proc, f"redis://127.0.0.1:{port}/0"
        except redis.RedisError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("redis-server did not answer")


def gateway_at(rev: str, log_dir: Path) -> Path:
    """The gateway's folder as it was at git revision ``rev`` (exported into ``log_dir``), to
    measure a change against what it replaced in the same alternating rounds."""
    folder = log_dir / f"gateway-at-{rev.replace('/', '_')}"
    if not (folder / "containers" / "gateway" / "serve").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "containers/gateway"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "containers" / "gateway"


def start_gateway(name: str, upstream: Process, log_dir: Path, store: str,
                  workers: int, gateway_dir: Path = GATEWAY_DIR) -> tuple[Process, str]:
    """The gateway through its own ``serve``, a tenant with limits far above the load (so the
    quota path runs in full), and a key made with ``admin``."""
    folder = log_dir / name
    folder.mkdir(exist_ok=True)
    config = folder / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "store": store,
        "tenants": {"bench": {"rpm": 10_000_000, "tpm": 10_000_000_000, "max_concurrency": 10_000,
                              "models": [MODEL]}},
        "models": {MODEL: {"upstreams": [
            {"name": UPSTREAM_NAME, "url": f"{upstream.url}/u/{UPSTREAM_NAME}/v1"}]}},
    }, sort_keys=False))
    created = subprocess.run([sys.executable, str(gateway_dir / "admin"), "--config", str(config),
                              "keys", "create", "--tenant", "bench", "--json"],
                             capture_output=True, text=True, timeout=120)
    if created.returncode != 0:
        raise RuntimeError(f"admin keys create failed: {created.stderr}")
    port = free_port()
    gw = start(name, [sys.executable, str(gateway_dir / "serve"), "--config", str(config),
                      "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
                      "--log-level", "warning"], port, "/readyz", log_dir)
    return gw, json.loads(created.stdout)["key"]


def start_floor(upstream: Process, log_dir: Path) -> Process:
    """The floor: the gateway's stack (one uvicorn process, uvloop, httptools, its upstream
    client) with nothing of the gateway in it, relaying as the gateway does (each chunk pushed
    on from the upstream connection's callback)."""
    port = free_port()
    return start("floor", [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE),
                           "floor_relay:app", "--host", "127.0.0.1", "--port", str(port),
                           "--loop", "uvloop", "--http", "httptools", "--log-level", "warning",
                           "--no-access-log"], port, "/", log_dir,
                 env={"SPECTRUM_FLOOR_UPSTREAM": f"{upstream.url}/u/{UPSTREAM_NAME}/v1"})


def start_nginx(upstream: Process, log_dir: Path) -> Process:
    """nginx as a plain streaming reverse proxy: what a proxy written in C costs per token."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        raise SystemExit("the nginx contender needs nginx (Debian: apt-get install nginx)")
    port = free_port()
    folder = log_dir / "nginx"
    folder.mkdir(exist_ok=True)
    upstream_port = upstream.url.rsplit(":", 1)[1]
    (folder / "nginx.conf").write_text(f"""
daemon off;
master_process on;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {folder}/body;
  proxy_temp_path {folder}/proxy;
  upstream fake {{ server 127.0.0.1:{upstream_port}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location = /health {{ return 200 "ok"; }}
    location /v1/ {{
      proxy_pass http://fake/u/{UPSTREAM_NAME}/v1/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
    return start("nginx", [binary, "-c", str(folder / "nginx.conf"), "-p", str(folder)], port,
                 "/health", log_dir)


def litellm_python(venv: Path) -> Path:
    """LiteLLM's environment, made on first use: it pins packages the project also uses."""
    python = venv / "bin" / "python"
    if not (venv / "bin" / "litellm").exists():
        print(f"making {venv} with {LITELLM_REQUIREMENT} (a few minutes, once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        LITELLM_REQUIREMENT], check=True)
    return python


def start_litellm(venv: Path, upstream: Process, log_dir: Path) -> tuple[Process, str]:
    litellm_python(venv)
    master_key = "sk-bench-" + os.urandom(8).hex()
    config = log_dir / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": MODEL, "litellm_params": {
            "model": f"openai/{MODEL}", "api_base": f"{upstream.url}/u/{UPSTREAM_NAME}/v1",
            "api_key": "none"}}],
        "general_settings": {"master_key": master_key},
        "litellm_settings": {"telemetry": False},
    }, sort_keys=False))
    port = free_port()
    proxy = start("litellm", [str(venv / "bin" / "litellm"), "--config", str(config),
                              "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                  port, "/health/liveliness", log_dir,
                  env={"LITELLM_MASTER_KEY": master_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                       "LITELLM_LOG": "ERROR"})
    return proxy, master_key


@dataclass
class Contender:
    name: str
    base_url: str                 # ends in /v1
    key: str | None
    proxy: Process | None         # None for the direct path
    extra: dict = field(default_factory=dict)


# -- client -----------------------------------------------------------------------------------
async def one_stream(session, c: Contender, max_tokens: int) -> tuple[float | None, int, str | None]:
    """TTFT, tokens with text, and an error (or None)."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": max_tokens, "stream": True}
    headers = {"Authorization": f"Bearer {c.key}"} if c.key else {}
    started = time.perf_counter()
    ttft, tokens, done = None, 0, False
    try:
        async with session.post(c.base_url + "/chat/completions", json=body,
                                headers=headers) as r:
            if r.status != 200:
                return None, 0, f"HTTP {r.status}: {(await r.text())[:200]}"
            buffer = b""
            async for data in r.content.iter_any():
                buffer += data
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    event = event.strip()
                    if event == b"data: [DONE]":
                        done = True
                    elif event.startswith(b"data: "):
                        choices = json.loads(event[6:]).get("choices") or []
                        if choices and (choices[0].get("delta") or {}).get("content"):
                            tokens += 1
                            if ttft is None:
                                ttft = time.perf_counter() - started
    except Exception as e:      # noqa: BLE001 - a lost stream is counted, the run goes on
        return ttft, tokens, f"{type(e).__name__}: {e}"
    if not done:
        return ttft, tokens, "no [DONE]"
    return ttft, tokens, None if tokens == max_tokens else f"{tokens} tokens"


async def one_whole(session, c: Contender) -> tuple[float, str | None]:
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 1}
    headers = {"Authorization": f"Bearer {c.key}"} if c.key else {}
    started = time.perf_counter()
    try:
        async with session.post(c.base_url + "/chat/completions", json=body,
                                headers=headers) as r:
            answer = await r.read()
            if r.status != 200:
                return 0.0, f"HTTP {r.status}: {answer[:200]!r}"
            if not json.loads(answer)["choices"][0]["message"]["content"]:
                return 0.0, "empty answer"
    except Exception as e:      # noqa: BLE001
        return 0.0, f"{type(e).__name__}: {e}"
    return time.perf_counter() - started, None


async def run_level(c: Contender, upstream: Process, concurrency: int, requests: int,
                    whole: bool, max_tokens: int) -> dict:
    import aiohttp
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        # Warm-up, not measured: connections opened, caches filled.
        await asyncio.gather(*(one_whole(session, c) for _ in range(concurrency)))
        remaining = requests
        latencies, ttfts, tokens, errors = [], [], 0, []

        async def user():
            nonlocal remaining, tokens
            while remaining > 0:
                remaining -= 1
                if whole:
                    latency, error = await one_whole(session, c)
                    if error is None:
                        latencies.append(latency)
                else:
                    ttft, n, error = await one_stream(session, c, max_tokens)
                    tokens += n
                    if error is None:
                        ttfts.append(ttft)
                if error is not None:
                    errors.append(error)

        proxy_before = c.proxy.cpu_s() if c.proxy else None
        upstream_before = upstream.cpu_s()
        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        proxy_cpu = proxy_kernel = None
        if c.proxy:
            (user_after, kernel_after), (user_before, kernel_before) = c.proxy.cpu_s(), proxy_before
            proxy_kernel = kernel_after - kernel_before
            # The kernel's delta plus the user's, so the total is never a float's hair below
            # its kernel share (CPU times come in 10 ms ticks: the user's may be 0).
            proxy_cpu = (user_after - user_before) + proxy_kernel
        upstream_cpu = sum(upstream.cpu_s()) - sum(upstream_before)
    row = {"contender": c.name, "mode": "whole" if whole else "stream",
           "concurrency": concurrency, "requests": requests, "wall_s": round(wall, 3),
           "lost": len(errors), "errors": sorted(set(errors))[:5],
           "requests_per_s": round(requests / wall, 1),
           "proxy_cpu_ms_per_request": None if proxy_cpu is None else
           round(1000 * proxy_cpu / requests, 3),
           "upstream_cpu_ms_per_request": round(1000 * upstream_cpu / requests, 3)}
    if whole:
        row.update(latency_ms_p50=round(1000 * percentile(latencies, 50), 2),
                   latency_ms_p99=round(1000 * percentile(latencies, 99), 2))
    else:
        row.update(tokens=tokens, tok_s=round(tokens / wall, 1),
                   ttft_ms_p50=round(1000 * percentile(ttfts, 50), 2) if ttfts else None,
                   ttft_ms_p99=round(1000 * percentile(ttfts, 99), 2) if ttfts else None,
                   proxy_cpu_ms_per_token=None if proxy_cpu is None else
                   round(1000 * proxy_cpu / max(1, tokens), 4),
                   # The kernel's share (a read from the upstream and a write to the client per
                   # token, whatever the proxy is written in): the floor no proxy goes under.
                   proxy_kernel_cpu_ms_per_token=None if proxy_kernel is None else
                   round(1000 * proxy_kernel / max(1, tokens), 4))
    return row


# -- report -----------------------------------------------------------------------------------
def added_vs_direct(rows: list[dict]) -> None:
    """Each row's TTFT (or latency) minus the direct path's in the same round and level."""
    direct = {(r["round"], r["mode"], r["concurrency"]): r for r in rows
              if r["contender"] == "direct"}
    for r in rows:
        d = direct.get((r["round"], r["mode"], r["concurrency"]))
        for key in ("ttft_ms_p50", "ttft_ms_p99", "latency_ms_p50", "latency_ms_p99"):
            if d is not None and r.get(key) is not None and d.get(key) is not None:
                r[key.replace("_ms_", "_added_ms_")] = round(r[key] - d[key], 2)


def relative_to_floor(rows: list[dict]) -> None:
    """Each row's proxy CPU (per token of a stream, per whole answer) as a multiple of the
    floor's in the same round and level. The floor is what any relay on this stack costs at
    least, and it moves with the host (the same code measured three times apart on different
    evenings here), so this ratio is what compares across runs and machines."""
    floor = {(r["round"], r["mode"], r["concurrency"]): r for r in rows
             if r["contender"] == "floor"}
    for r in rows:
        f = floor.get((r["round"], r["mode"], r["concurrency"]))
        key = "proxy_cpu_ms_per_token" if r["mode"] == "stream" else "proxy_cpu_ms_per_request"
        if f is not None and r.get(key) and f.get(key):
            r["proxy_cpu_vs_floor"] = round(r[key] / f[key], 2)


def spread(values: list) -> dict | None:
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def cell(s: dict | None, digits: int) -> str:
    if s is None:
        return "–"
    f = f"{{:.{digits}f}}"
    if s["min"] == s["max"]:
        return f.format(s["median"])
    return f"{f.format(s['median'])} [{f.format(s['min'])}, {f.format(s['max'])}]"


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    keys = ("ttft_ms_p50", "ttft_ms_p99", "ttft_added_ms_p50", "ttft_added_ms_p99", "tok_s",
            "proxy_cpu_ms_per_token", "proxy_kernel_cpu_ms_per_token", "proxy_cpu_ms_per_request",
            "upstream_cpu_ms_per_request", "proxy_cpu_vs_floor",
            "latency_ms_p50", "latency_ms_p99", "latency_added_ms_p50", "latency_added_ms_p99",
            "requests_per_s")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["concurrency"], r["contender"]), []).append(r)
    for (mode, conc, name), rs in groups.items():
        entry = {"mode": mode, "concurrency": conc, "contender": name, "rounds": len(rs),
                 "lost": sum(r["lost"] for r in rs), "requests": sum(r["requests"] for r in rs)}
        for k in keys:
            s = spread([r.get(k) for r in rs])
            if s is not None:
                entry[k] = s
        out.append(entry)
    order = list(LABELS)        # a gateway@git:REV row just before the gateway's own
    return sorted(out, key=lambda e: (e["mode"] == "whole", e["concurrency"],
                                      order.index(e["contender"].split("@")[0]),
                                      "@" not in e["contender"]))


def tables(summary: list[dict]) -> str:
    lines = ["Streams (128 tokens, 2 ms apart): median over rounds [min, max]", "",
             "| conc | contender | TTFT p50 ms | added p50 | TTFT p99 ms | added p99 | tok/s | "
             "proxy CPU ms/token | of it kernel | × floor's | proxy CPU ms/stream | lost |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        if s["mode"] != "stream":
            continue
        lines.append("| " + " | ".join([
            str(s["concurrency"]), s["contender"], cell(s.get("ttft_ms_p50"), 1),
            cell(s.get("ttft_added_ms_p50"), 1) if s["contender"] != "direct" else "",
            cell(s.get("ttft_ms_p99"), 1),
            cell(s.get("ttft_added_ms_p99"), 1) if s["contender"] != "direct" else "",
            cell(s.get("tok_s"), 0), cell(s.get("proxy_cpu_ms_per_token"), 3),
            cell(s.get("proxy_kernel_cpu_ms_per_token"), 3), cell(s.get("proxy_cpu_vs_floor"), 2),
            cell(s.get("proxy_cpu_ms_per_request"), 1), f"{s['lost']}/{s['requests']}"]) + " |")
    whole = [s for s in summary if s["mode"] == "whole"]
    if whole:
        lines += ["", "Whole answers (max_tokens 1, not streamed)", "",
                  "| conc | contender | latency p50 ms | added p50 | latency p99 ms | req/s | "
                  "proxy CPU ms/request | × floor's | upstream CPU ms/request | lost |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in whole:
            lines.append("| " + " | ".join([
                str(s["concurrency"]), s["contender"], cell(s.get("latency_ms_p50"), 1),
                cell(s.get("latency_added_ms_p50"), 1) if s["contender"] != "direct" else "",
                cell(s.get("latency_ms_p99"), 1), cell(s.get("requests_per_s"), 0),
                cell(s.get("proxy_cpu_ms_per_request"), 2), cell(s.get("proxy_cpu_vs_floor"), 2),
                cell(s.get("upstream_cpu_ms_per_request"), 2),
                f"{s['lost']}/{s['requests']}"]) + " |")
    return "\n".join(lines)


def report_of(rows: list[dict]) -> tuple[list[dict], str]:
    """The summary and tables of a run's rows (each row gains its figures relative to the
    direct path's and the floor's)."""
    added_vs_direct(rows)
    relative_to_floor(rows)
    summary = summarize(rows)
    return summary, tables(summary)


# -- main -------------------------------------------------------------------------------------
def label(name: str, gateway_workers: int) -> str:
    base, _, rev = name.partition("@git:")
    text = LABELS[base] + (f", {gateway_workers} workers" if base == "gateway-redis" else "")
    return text + (f", as at git revision {rev}" if rev else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--contenders", default="direct,gateway",
                        help="from direct, nginx, floor, gateway, gateway-redis; gateway@git:REV "
                             "or gateway-redis@git:REV is the gateway as at git revision REV "
                             "(litellm: --litellm)")
    parser.add_argument("--litellm", action=argparse.BooleanOptionalAction, default=True,
                        help="also LiteLLM's proxy (its environment is made on first use)")
    parser.add_argument("--litellm-venv", default=str(REPO / ".venv-litellm"))
    parser.add_argument("--gateway-workers", type=int, default=2,
                        help="workers of the gateway-redis contender")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--interval-ms", type=float, default=2.0,
                        help="the fake upstream's time between tokens")
    parser.add_argument("--usage-nulls", action="store_true",
                        help="the upstream puts \"usage\": null in every chunk of a stream that "
                             "asked for usage, as OpenAI's API does")
    parser.add_argument("--streams-per-user", type=int, default=4,
                        help="measured streams per concurrent client (at least --min-streams)")
    parser.add_argument("--min-streams", type=int, default=48)
    parser.add_argument("--whole", action=argparse.BooleanOptionalAction, default=True,
                        help="also whole answers (max_tokens 1), for CPU per request")
    parser.add_argument("--whole-concurrency", type=int, default=8)
    parser.add_argument("--whole-requests", type=int, default=400)
    parser.add_argument("--json", help="write every round's rows and the summary here")
    parser.add_argument("--log-dir", help="servers' logs and configs (default: a temporary folder)")
    parser.add_argument("--tables-of", metavar="JSON",
                        help="measure nothing: print the tables of an earlier run's --json rows")
    args = parser.parse_args()
    if args.tables_of:
        print(report_of(json.loads(Path(args.tables_of).read_text())["rows"])[1])
        return 0

    names = [n for n in args.contenders.split(",") if n]
    unknown = {n for n in names if n.partition("@git:")[0] not in LABELS} - {"litellm"}
    if unknown or "direct" not in names:
        parser.error(f"--contenders: {sorted(unknown) or 'direct is missing'}; choose from "
                     "direct (required: the others are measured against it), nginx, floor, "
                     "gateway, gateway-redis")
    if args.litellm and "litellm" not in names:
        names.append("litellm")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="gateway-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"logs in {log_dir}", file=sys.stderr)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    started = []
    redis_procs = []
    try:
        upstream = start_upstream(log_dir, args.interval_ms / 1000, args.usage_nulls)
        started.append(upstream)
        contenders = []
        for name in names:
            if name == "direct":
                contenders.append(Contender(name, f"{upstream.url}/u/{UPSTREAM_NAME}/v1", None,
                                            None))
            elif name in ("floor", "nginx"):
                proxy = (start_floor if name == "floor" else start_nginx)(upstream, log_dir)
                started.append(proxy)
                contenders.append(Contender(name, proxy.url + "/v1", None, proxy))
            elif name.partition("@git:")[0] in ("gateway", "gateway-redis"):
                base, _, rev = name.partition("@git:")
                folder = gateway_at(rev, log_dir) if rev else GATEWAY_DIR
                store, workers = "memory", 1
                if base == "gateway-redis":
                    redis_proc, store = start_redis(log_dir)
                    redis_procs.append(redis_proc)
                    workers = args.gateway_workers
                gw, key = start_gateway(name, upstream, log_dir, store, workers, folder)
                started.append(gw)
                contenders.append(Contender(name, gw.url + "/v1", key, gw))
            elif name == "litellm":
                proxy, key = start_litellm(Path(args.litellm_venv), upstream, log_dir)
                started.append(proxy)
                contenders.append(Contender(name, proxy.url + "/v1", key, proxy))

        levels = [("stream", c) for c in concurrencies]
        if args.whole:
            levels.append(("whole", args.whole_concurrency))
        rows = []
        began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for round_no in range(1, args.rounds + 1):
            for mode, conc in levels:
                order = contenders if (round_no + conc) % 2 else list(reversed(contenders))
                for c in order:
                    n = (args.whole_requests if mode == "whole"
                         else max(args.min_streams, conc * args.streams_per_user))
                    row = asyncio.run(run_level(c, upstream, conc, n, mode == "whole",
                                                args.max_tokens))
                    row["round"] = round_no
                    rows.append(row)
                    print(f"round {round_no} {mode} c={conc} {c.name}: " + json.dumps(
                        {k: v for k, v in row.items() if k not in ("contender", "mode",
                                                                    "concurrency", "round")}),
                          file=sys.stderr, flush=True)
    finally:
        for p in reversed(started):
            p.stop()
        for redis_proc in redis_procs:
            redis_proc.terminate()
            redis_proc.wait()

    summary, report = report_of(rows)
    print(report)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "started_at": began, "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_at_end": os.getloadavg()},
            "contenders": {c.name: label(c.name, args.gateway_workers) for c in contenders},
            "settings": {"max_tokens": args.max_tokens, "interval_ms": args.interval_ms,
                         "usage_nulls": args.usage_nulls,
                         "rounds": args.rounds, "concurrency": concurrencies,
                         "streams_per_user": args.streams_per_user,
                         "min_streams": args.min_streams,
                         "whole": {"concurrency": args.whole_concurrency,
                                   "requests": args.whole_requests} if args.whole else None},
            "summary": summary, "rows": rows, "table": report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
