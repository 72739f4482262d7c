"""Benchmark: this server (a) against vLLM's own OpenAI server (b, the anchor) and a naive
from-scratch server (c, baseline only), same tiny model, same engine settings, same client.

Servers run one at a time (two engines on two cores disturb each other), in rounds whose
order alternates (a b c, c b a, a b c ...), so drift in the machine's load hits every server
alike. Each figure is the median of a server's rounds, with the spread of its own rounds
beside it; ratios are of medians.

Client: streaming ``POST /v1/completions`` with ``ignore_eos`` and fixed output length.
Metrics follow ``vllm bench serve``: TTFT = first content chunk; TPOT = (E2E − TTFT) /
(output tokens − 1); output tok/s = output tokens / wall time. Front-end CPU per output token:
user+sys CPU time of every process in the server's tree except vLLM's engine processes
(titled ``VLLM::EngineCore`` / ``VLLM::Worker``, which busy-wait), divided by output tokens.

Servers start as ``options.local_server`` starts them: a process group of their own in this
process's session. A name ending in ``:own-session`` (``vllm:own-session``) starts that
server in a session of its own instead, as before 2026-12-01 (see this folder's README, "Long streams
stalled by how the server was started").

    flock /tmp/spectrum-engine.lock .venv/bin/python benchmarks/server-vs-vllm/run.py \\
        --rounds 3 --json /tmp/byo-bench.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from options.bench.cpu import cpu_used, frontend_cpu_s  # noqa: E402
from options.local_server import LocalServer, free_port, own_process_group  # noqa: E402
from options.tiny_model import tiny_model_dir  # noqa: E402

MAX_MODEL_LEN = 1024
WORDS = ("the model server engine token batch cache request answer stream price hour "
         "instance spectrum latency throughput memory prompt output user").split()


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    output_tokens: int
    duration_s: float
    ttft_s: list[float]
    tpot_s: list[float]
    frontend_cpu_s: float
    errors: int = 0

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.duration_s

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.frontend_cpu_s / max(1, self.output_tokens)

    def summary(self) -> dict:
        return {"concurrency": self.concurrency, "requests": self.requests,
                "output_tokens": self.output_tokens, "duration_s": round(self.duration_s, 3),
                "output_tok_s": round(self.tok_s, 1),
                "ttft_ms_p50": round(1000 * _pct(self.ttft_s, 50), 2),
                "ttft_ms_p99": round(1000 * _pct(self.ttft_s, 99), 2),
                "tpot_ms_p50": round(1000 * _pct(self.tpot_s, 50), 3),
                "frontend_cpu_ms_per_token": round(self.cpu_ms_per_token, 4),
                "errors": self.errors}


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# -- servers ----------------------------------------------------------------------------------
@dataclass
class Server:
    name: str
    label: str
    process: subprocess.Popen | None = None
    port: int = 0
    local: LocalServer | None = None
    log: Path | None = None
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# "NAME:own-session": the server in a session, so a scheduling autogroup, of its own, as every
# server here was started before 2026-12-01; to measure what that launch cost in one run.
OWN_SESSION = ":own-session"


def start_server(name: str, model: str, kv_gib: str, log_dir: Path) -> Server:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=kv_gib)
    log = log_dir / f"{name.replace(':', '_')}-{time.strftime('%H%M%S')}.log"
    port = free_port()
    own_session = name.endswith(OWN_SESSION)
    placement = {"start_new_session": True} if own_session else own_process_group()
    server = _start(name.removesuffix(OWN_SESSION), placement, model, kv_gib, env, log, port)
    server.name = name
    if own_session:
        server.label += " [own session]"
    wait_healthy(server)
    return server


def _start(name: str, placement: dict, model: str, kv_gib: str, env: dict, log: Path,
           port: int) -> Server:
    if name == "byo" or name.startswith("byo@"):
        settings = {"HF_MODEL_ID": model, "SM_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
                    "SM_VLLM_ENFORCE_EAGER": "", "VLLM_CPU_KVCACHE_SPACE": kv_gib}
        if name.startswith("byo@git:"):
            # "byo@git:REV": this server as it was at git revision REV, to measure a change
            # against what it replaced in the same alternating rounds.
            rev = name[len("byo@git:"):]
            local = _ServerAtRevision(_worktree(rev), settings, port=port, log_path=log)
            label = f"(a') this server at {rev}"
        else:
            # "byo@KEY=VALUE+KEY=VALUE": this server with extra settings, to A/B a setting in
            # one run (e.g. byo@SPECTRUM_SERVER_READ_TIMEOUT=5).
            variant = dict(item.split("=", 1) for item in name[4:].split("+") if item)
            local = LocalServer({**settings, **variant}, port=port, log_path=log)
            label = "(a) this server" + (f" [{name[4:]}]" if variant else "")
        local.spawn_options = lambda: placement      # this run's placement (see OWN_SESSION)
        local.start()
        server = Server(name, label, local.process, port, local, log)
    else:
        if name == "vllm":
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                   "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
                   "--host", "127.0.0.1", "--port", str(port),
                   "--disable-uvicorn-access-log"]
            label = "(b) vLLM's own server"
        else:
            cmd = [sys.executable, str(HERE / "naive_server.py"), "--model", model,
                   "--port", str(port)]
            label = "(c) naive baseline"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, **placement)
        server = Server(name, label, proc, port, None, log)
    return server


def _worktree(rev: str) -> Path:
    """A checkout of ``rev`` beside this one (made once, reused)."""
    folder = Path("/tmp") / f"spectrum-bench-{rev.replace('/', '_').replace('~', '-')}"
    if not (folder / "containers" / "byo-vllm" / "serve").is_file():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--force", "--detach",
                        str(folder), rev], check=True, capture_output=True)
    return folder


class _ServerAtRevision(LocalServer):
    def __init__(self, checkout: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checkout = checkout

    def command(self) -> list[str]:
        return [self.python, str(self.checkout / "containers" / "byo-vllm" / "serve"), "serve"]


def wait_healthy(server: Server, timeout_s: float = 400) -> None:
    import urllib.request
    path = "/health" if server.name.startswith("vllm") else "/ping"
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited; see {server.log}")
        try:
            with urllib.request.urlopen(server.url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{server.name} not healthy after {timeout_s} s; see {server.log}")


def stop_server(server: Server) -> None:
    if server.local is not None:
        server.local.stop()
        return
    proc = server.process
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# -- client -----------------------------------------------------------------------------------
def make_prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


async def one_request(session, url: str, model: str, prompt: str, max_tokens: int):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft = None
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        buffer = b""
        async for data in r.content.iter_any():
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                payload = json.loads(event[6:])
                if payload.get("usage"):
                    tokens = payload["usage"]["completion_tokens"]
                elif payload["choices"] and payload["choices"][0].get("text") and ttft is None:
                    ttft = time.perf_counter() - started
    e2e = time.perf_counter() - started
    tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 and ttft is not None else None
    return ttft, tpot, tokens


async def run_level(server: Server, model: str, concurrency: int, requests: int,
                    max_tokens: int, prompts: list[str]) -> LevelResult:
    import aiohttp
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm-up: a few requests at this concurrency, not measured.
        await asyncio.gather(*(one_request(session, server.url, model, prompts[i], 8)
                               for i in range(min(concurrency, 8))))
        queue: asyncio.Queue[str] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(prompts[i % len(prompts)])
        ttfts, tpots, total, errors = [], [], 0, 0

        async def user():
            nonlocal total, errors
            while not queue.empty():
                prompt = queue.get_nowait()
                try:
                    ttft, tpot, tokens = await one_request(session, server.url, model, prompt,
                                                           max_tokens)
                except Exception:      # noqa: BLE001 - counted, the run goes on
                    errors += 1
                    continue
                total += tokens
                if ttft is not None:
                    ttfts.append(ttft)
                if tpot is not None:
                    tpots.append(tpot)

        cpu_before = frontend_cpu_s(server.process.pid)
        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        duration = time.perf_counter() - started
        cpu_after = frontend_cpu_s(server.process.pid)
    cpu = cpu_used(cpu_before, cpu_after)
    return LevelResult(concurrency, requests, total, duration, ttfts, tpots, cpu, errors)


# -- report -----------------------------------------------------------------------------------
def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def spread(runs: list[dict], key: str) -> str:
    """Half the range of a server's own rounds, relative to their median: a ratio between
    two servers means something only where it is larger than both servers' spreads."""
    values = [r[key] for r in runs]
    mid = statistics.median(values)
    return f"±{100 * (max(values) - min(values)) / (2 * mid):.0f}%" if mid else "±0%"


def table(results: dict, concurrencies: list[int]) -> str:
    rows = ["| conc | server | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
            "front-end CPU ms/token | tok/s vs (b) | TTFT p50 vs (b) | TTFT p99 vs (b) | "
            "CPU/token vs (b) | tok/s vs (c) |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in concurrencies:
        per = {name: [r for r in runs if r["concurrency"] == c] for name, runs in results.items()}
        ref_b, ref_c = per.get("vllm"), per.get("naive")
        for name, runs in per.items():
            if not runs:
                continue
            tok = median(runs, "output_tok_s")
            ttft50, ttft99 = median(runs, "ttft_ms_p50"), median(runs, "ttft_ms_p99")
            cpu = median(runs, "frontend_cpu_ms_per_token")
            cells = [str(c), runs[0]["label"],
                     f"{tok:.0f} ({spread(runs, 'output_tok_s')})",
                     f"{ttft50:.1f} ({spread(runs, 'ttft_ms_p50')})",
                     f"{ttft99:.1f} ({spread(runs, 'ttft_ms_p99')})",
                     f"{median(runs, 'tpot_ms_p50'):.2f}",
                     f"{cpu:.3f} ({spread(runs, 'frontend_cpu_ms_per_token')})"]
            if ref_b and name != "vllm":
                cells += [f"{tok / median(ref_b, 'output_tok_s'):.2f}×",
                          f"{ttft50 / median(ref_b, 'ttft_ms_p50'):.2f}×",
                          f"{ttft99 / median(ref_b, 'ttft_ms_p99'):.2f}×",
                          f"{cpu / median(ref_b, 'frontend_cpu_ms_per_token'):.2f}×"]
            else:
                cells += ["", "", "", ""]
            cells.append(f"{tok / median(ref_c, 'output_tok_s'):.1f}×"
                         if ref_c and name != "naive" else "")
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description="byo server vs vLLM's server vs naive")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="byo,vllm,naive")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--requests-per-user", type=int, default=6,
                        help="measured requests per concurrent user (at least 16 in all)")
    parser.add_argument("--kv-cache-gib", default="2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every round's results here")
    parser.add_argument("--log-dir", default="/tmp/byo-bench-logs")
    args = parser.parse_args()

    model = str(tiny_model_dir())
    names = args.servers.split(",")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    prompts = make_prompts(256, args.prompt_words, args.seed)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {n: [] for n in names}
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for round_no in range(args.rounds):
        order = names if round_no % 2 == 0 else list(reversed(names))
        for name in order:
            print(f"round {round_no + 1}: {name} starting", file=sys.stderr, flush=True)
            server = start_server(name, model, args.kv_cache_gib, log_dir)
            try:
                for c in concurrencies:
                    n = max(16, c * args.requests_per_user)
                    level = asyncio.run(run_level(server, model, c, n, args.max_tokens,
                                                  prompts))
                    row = dict(level.summary(), round=round_no + 1, label=server.label)
                    results[name].append(row)
                    print(f"  {name} c={c}: {row}", file=sys.stderr, flush=True)
            finally:
                stop_server(server)
    report = table(results, concurrencies)
    print(report)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "started_at": started_at, "command": " ".join(sys.argv), "model": model,
            "settings": {"max_model_len": MAX_MODEL_LEN, "enforce_eager": True,
                         "kv_cache_gib": args.kv_cache_gib, "max_tokens": args.max_tokens,
                         "prompt_words": args.prompt_words, "rounds": args.rounds},
            "results": results, "table": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
