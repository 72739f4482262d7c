"""What the Ray hop costs: ``python -m options.bench --level 6 --target local``.

    python -m options.bench --level 6 --target local --concurrency 1,8,32 --rounds 3 \\
        --json ray-hop.json

Two contenders, the same tiny model (or ``--model``) and the same engine settings
(``--option``), the same client and load:

- ``plain``: the bring-your-own server as level 5 runs it here (``options.deploy``'s
  ``local_server_env(5)``: gunicorn, the App, vLLM's engine).
- ``ray``: rung 6 on a local Ray, as ``python -m options.deploy --level 6 --engine rayservice
  --target local`` runs it (``options.eks.ray_local``: one Ray head, Serve's HTTP proxy, one
  ``ingress`` replica relaying each request through a ``DeploymentHandle`` to one ``engine``
  replica holding the same App and engine), in a process of its own (``python -m
  options.bench.ray_hop serve``) so that its process tree is the whole cluster.
  ``--ray-ingress-replicas 0`` deploys the engine as its own ingress; ``--ray-proxy haproxy``
  puts Ray's high-throughput mode in front (``options.core.ray_proxy``), as the RayService
  renders it with the same flag.

One contender at a time: each round starts a contender, measures every concurrency, stops it,
then does the same for the other; rounds alternate which goes first (plain ray, ray plain,
...), so drift in the machine's load hits both alike. Not both up at once: two engines on
two cores take CPU from each other even idle (vLLM's engine processes poll), so whichever was
measured would carry the other's noise, and an idle Ray cluster (raylet, GCS, Serve
controller, proxy) uses CPU of its own. Starting each contender per round costs a minute or
so; ``benchmarks/server-vs-vllm/run.py`` does the same.

Per run: ``--requests`` streaming requests at each ``--concurrency`` (closed loop, with
``ignore_eos`` so every request makes exactly ``--output-tokens``), after a warm-up burst of
min(C, 8) short unmeasured requests; each concurrency draws its own prompts (seed + its
index) so no run finds another's in the prefix cache; rounds repeat them, on fresh servers.
Figures, with ``options.bench.metrics``' definitions: TTFT p50 and p99, TPOT p50, output
tok/s, and front-end CPU per output token (``options.bench.cpu``): user+sys CPU time, over
the run, of every process of the contender's tree except vLLM's engine processes. For Ray
that is every process of the local cluster (driver, GCS, raylet and its agents, the Serve
controller, the proxy, the ingress and engine replica actors, idle workers); for the plain
server, gunicorn and its worker. Each run's CPU is also split by process (``cpu_s_by_process``)
and summed over the serving path alone (``serving_cpu_ms_per_token``: Ray's replicas, proxy
and HAProxy, RAY_SERVING_PATH; all of the plain server), and each contender is read idle for
IDLE_S once a round (``idle``): Ray's control plane costs CPU every second whatever the
traffic, so its share of CPU per token falls as the load rises.

The verdict (``GOAL``): at each concurrency, the added TTFT p50 (ray − plain, the medians
over rounds, in ms) and the CPU ratio (ray / plain, medians; ``serving_cpu_ratio`` the same
for the serving path, reported beside it, not part of the verdict). A difference is claimed only
when it is larger than the noise, the sum of both contenders' half-ranges over rounds:
``met`` when the figure is within the goal; ``not met`` when it is past the goal by more than
the noise; ``unclear`` when it is past the goal by less than the noise.

The JSON: ``schema`` ``spectrum.bench.ray-hop/1``, ``runs`` (every contender, round and
concurrency), ``by_concurrency["C"]`` (each contender's figures as ``{median, min, max}``,
``added_ttft_ms_p50``, ``cpu_ratio``, ``serving_cpu_ratio`` and their verdicts), ``verdict``
(all concurrencies, of the first two), ``idle`` (each contender's idle CPU per second over
rounds, and every reading by process), ``loadavg`` before and after, the settings and the
command.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from options.bench.metrics import spread
from options.core import BadInput
from options.core.ray_proxy import RAY_PROXIES

SCHEMA = "spectrum.bench.ray-hop/1"
CONTENDERS = ("plain", "ray")
DEFAULT_CONCURRENCY = (1, 8, 32)
# The goal for the Ray hop: at most this much TTFT p50 added, this CPU per token ratio.
GOAL = {"added_ttft_ms_p50": 5.0, "cpu_ratio": 1.15}
FIGURES = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "output_tokens_per_second",
           "cpu_ms_per_token", "serving_cpu_ms_per_token")
# Ray's processes that carry requests (their CPU grows with traffic): the replicas, Serve's
# proxy actor and HAProxy. The rest (Serve controller, GCS, raylet, the dashboard, runtime-env
# and log agents, the HAProxy manager, the driver) keep the cluster up at a fixed cost per
# cluster or per node, whatever the traffic: on a RayService the controller and GCS run on the
# head pod.
RAY_SERVING_PATH = ("ray::ServeReplica", "ray::ProxyActor", "haproxy")
READY_TIMEOUT_S = 600.0
IDLE_S = 10.0          # how long each contender is read idle, once a round after its warm-up
STOP_TIMEOUT_S = 60.0


# --- the comparison (pure) --------------------------------------------------------------------

def noise(a: dict[str, float | None], b: dict[str, float | None]) -> float:
    """The sum of two spreads' half-ranges: what a difference of medians must exceed."""
    half = lambda s: (s["max"] - s["min"]) / 2 if s["max"] is not None else 0.0  # noqa: E731
    return half(a) + half(b)


def judge(value: float | None, goal: float, noise_: float | None) -> str:
    """``met``, ``not met`` (past the goal by more than the noise) or ``unclear`` (past it
    by less, or with no noise known: a single round)."""
    if value is None:
        return "unmeasured"
    if value <= goal:
        return "met"
    return "not met" if noise_ is not None and value - goal > noise_ else "unclear"


def gap(difference: float | None, noise_: float | None) -> str:
    """``ray slower``, ``ray faster``, ``none measured`` (within the noise) or ``unknown``
    (a single round has no spread to judge it by)."""
    if difference is None:
        return "none measured"
    if noise_ is None:
        return "unknown (one round)"
    if abs(difference) <= noise_:
        return "none measured"
    return "ray slower" if difference > 0 else "ray faster"


def ratio_verdict(pc: dict[str, Any], rc: dict[str, Any], known: bool) -> dict[str, Any]:
    """Ray's CPU per token over the plain server's (medians), its noise and verdict."""
    ratio = (rc["median"] / pc["median"]) if pc["median"] and rc["median"] is not None else None
    # Relative noise of each side, as a ratio's: ratio × (half-range / median summed).
    rel = (noise(pc, {"min": None, "max": None}) / pc["median"] if pc["median"] else 0.0) + \
          (noise(rc, {"min": None, "max": None}) / rc["median"] if rc["median"] else 0.0)
    ratio_noise = (ratio or 0.0) * rel if known else None
    return {"value": ratio, "noise": ratio_noise, "gap": gap(None if ratio is None else ratio - 1, ratio_noise),
            "goal": GOAL["cpu_ratio"], "verdict": judge(ratio, GOAL["cpu_ratio"], ratio_noise)}


def serving_cpu_s(contender: str, by_process: dict[str, float]) -> float:
    """CPU seconds of the processes that carry requests: all of the plain server's; Ray's
    RAY_SERVING_PATH."""
    if contender != "ray":
        return sum(by_process.values())
    return sum(v for k, v in by_process.items() if k.startswith(RAY_SERVING_PATH))


def compare(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency, from every run (``contender``, ``round``, ``concurrency`` and the
    FIGURES): each contender's spread of each figure, the added TTFT p50 and the CPU ratio
    with their noise and verdicts; and the verdict over every concurrency."""
    by_c: dict[str, Any] = {}
    for c in sorted({r["concurrency"] for r in runs}):
        here = {k: [r for r in runs if r["concurrency"] == c and r["contender"] == k]
                for k in CONTENDERS}
        entry: dict[str, Any] = {k: {f: spread(r.get(f) for r in rs) for f in FIGURES}
                                 for k, rs in here.items()}
        entry["rounds"] = {k: len(rs) for k, rs in here.items()}
        plain, ray = entry["plain"], entry["ray"]
        p, r = plain["ttft_ms_p50"], ray["ttft_ms_p50"]
        added = (r["median"] - p["median"]) if None not in (p["median"], r["median"]) else None
        known = min(entry["rounds"].values()) >= 2        # one round: no spread to judge by
        ttft_noise = noise(p, r) if known else None
        entry["added_ttft_ms_p50"] = {
            "value": added, "noise": ttft_noise, "gap": gap(added, ttft_noise),
            "goal": GOAL["added_ttft_ms_p50"],
            "verdict": judge(added, GOAL["added_ttft_ms_p50"], ttft_noise)}
        entry["cpu_ratio"] = ratio_verdict(plain["cpu_ms_per_token"], ray["cpu_ms_per_token"], known)
        entry["serving_cpu_ratio"] = ratio_verdict(plain["serving_cpu_ms_per_token"],
                                                   ray["serving_cpu_ms_per_token"], known)
        by_c[str(c)] = entry
    verdicts = [e[k]["verdict"] for e in by_c.values() for k in ("added_ttft_ms_p50", "cpu_ratio")]
    overall = ("not met" if "not met" in verdicts else
               "unclear" if any(v != "met" for v in verdicts) else "met")
    return {"by_concurrency": by_c, "verdict": overall}


def idle_summary(idle: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each contender's idle CPU (core-seconds per second) over rounds, and every reading."""
    return {"cpu_s_per_s": {k: spread(r["cpu_s_per_s"] for r in idle if r["contender"] == k)
                            for k in CONTENDERS}, "readings": list(idle)}


def idle_share(doc: dict[str, Any], c: str) -> float | None:
    """The share of Ray's extra CPU per token at concurrency ``c`` that its extra idle CPU
    explains: (idle ray - idle plain) x run time / (run CPU ray - run CPU plain), medians."""
    idle = doc.get("idle", {}).get("cpu_s_per_s", {})
    runs = [r for r in doc["runs"] if str(r["concurrency"]) == c]
    med = lambda k, f: spread(r[f] for r in runs if r["contender"] == k)["median"]  # noqa: E731
    extra_idle = (idle.get("ray", {}).get("median") or 0.0) - (idle.get("plain", {}).get("median") or 0.0)
    extra_run = (med("ray", "frontend_cpu_s") or 0.0) - (med("plain", "frontend_cpu_s") or 0.0)
    duration = med("ray", "duration_s")
    if not idle or extra_run <= 0 or not duration:
        return None
    return extra_idle * duration / extra_run


def round_order(rounds: int) -> list[list[str]]:
    """Which contender goes first in each round: plain ray, ray plain, plain ray, ..."""
    return [list(CONTENDERS) if n % 2 == 0 else list(reversed(CONTENDERS)) for n in range(rounds)]


# --- the contenders ---------------------------------------------------------------------------

@dataclass
class Contender:
    name: str
    url: str
    root_pid: int              # its process tree is what its CPU is read from
    include_root: bool = True  # False: the root is the client's own process (a test's Ray)


def engine_settings(level5_env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The model folder or hub id and the engine settings of the level-5 server's environment:
    what the Ray application is given so that both run the same engine."""
    env = dict(level5_env)
    model = env.pop("SM_VLLM_MODEL", None) or env.pop("HF_MODEL_ID", None)
    env.pop("HF_MODEL_ID", None)
    if not model:
        raise BadInput("the level-5 server's environment names no model (SM_VLLM_MODEL or "
                       "HF_MODEL_ID)")
    return model, env


@contextlib.contextmanager
def plain_server(env: dict[str, str]) -> Iterator[Contender]:
    from options.local_server import LocalServer, log_path

    with LocalServer(env, log_path=log_path("ray-hop-plain")) as server:
        server.wait_ready(READY_TIMEOUT_S)
        yield Contender("plain", server.url, server.process.pid)


@contextlib.contextmanager
def ray_server(model: str, settings: dict[str, str], ingress_replicas: int = 1,
               proxy: str = "serve") -> Iterator[Contender]:
    """The Ray application in a process of its own (``python -m options.bench.ray_hop serve``):
    its own process group, stopped with SIGINT (``ray.shutdown()`` runs), then anything of its
    tree still there is killed by pid. ``proxy`` (``options.core.ray_proxy``) answers on its
    URL."""
    import psutil

    from options.local_server import free_port, log_path, own_process_group

    port = free_port()
    log = Path(log_path("ray-hop-ray"))
    cmd = [sys.executable, "-m", "options.bench.ray_hop", "serve", "--port", str(port),
           "--model", model, "--settings", json.dumps(settings),
           "--ingress-replicas", str(ingress_replicas), "--proxy", proxy]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, **own_process_group())
    tree: list[psutil.Process] = []
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, log)
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(proc.pid).children(recursive=True)
        yield Contender("ray", url, proc.pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(proc.pid).children(recursive=True)
    finally:
        _stop_ray(proc, tree)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the Ray application exited with code {proc.returncode} "
                               f"before it was ready (log {log}):\n{tail}")
        try:
            with urllib.request.urlopen(url + "/ping", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the Ray application was not ready after {READY_TIMEOUT_S:.0f} s "
                       f"(log {log})")


def _stop_ray(proc: subprocess.Popen, tree) -> None:
    import psutil

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in tree:                      # Ray processes that left the group, by pid
        with contextlib.suppress(psutil.Error):
            if p.is_running():
                p.kill()


def serve_main(argv: Sequence[str]) -> int:
    """``python -m options.bench.ray_hop serve --port P --model M --settings JSON``: a local
    Ray (options.eks.ray_local) running the application with these settings until SIGINT or
    SIGTERM; one engine replica, ``--ingress-replicas`` (1) ingress replicas and ``--proxy``
    (``options.core.ray_proxy``) in front of them."""
    p = argparse.ArgumentParser(prog="python -m options.bench.ray_hop serve")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--settings", default="{}")
    p.add_argument("--ingress-replicas", type=int, default=1)
    p.add_argument("--proxy", choices=RAY_PROXIES, default="serve")
    args = p.parse_args(argv)

    def stop(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    from options.eks.ray_local import LOCAL_ENGINE_CPUS, local_app_args, local_ray, run_app

    settings = json.loads(args.settings)
    try:
        with local_ray(num_cpus=max(int(LOCAL_ENGINE_CPUS), os.cpu_count() or 1),
                       http_port=args.port, proxy=args.proxy) as cluster:
            run_app(local_app_args(args.model, tuple(settings.items()),
                                   ingress_replicas=args.ingress_replicas))
            print(f"ready on {cluster.url}", flush=True)
            while True:
                time.sleep(1)
    except KeyboardInterrupt:
        print("stopping", flush=True)
    return 0


# --- the measurement --------------------------------------------------------------------------

def measure(contender: Contender, send, template, profile, tokens, concurrency: int
            ) -> dict[str, Any]:
    """One run of ``profile`` on a contender (after a short warm-up burst): its figures."""
    from concurrent.futures import ThreadPoolExecutor

    from options.bench import runner
    from options.bench.cpu import cpu_by_process
    from options.bench.metrics import summarize
    from options.contract import collect

    burst = min(concurrency, 8)
    with ThreadPoolExecutor(burst) as pool:     # unmeasured: every path warm at this width
        list(pool.map(lambda i: collect(send(replace(template, prompt=f"warm-up {i}",
                                                     max_tokens=8))), range(burst)))
    with cpu_by_process(contender.root_pid, contender.include_root) as by_process:
        result = runner.run(profile, send, template, None, tokens)
    s = summarize(result.records, result.duration_s)
    cpu_s = sum(by_process.values())
    return {"contender": contender.name, "concurrency": concurrency,
            "requests": profile.requests, "completed": s.completed, "errors": s.errors,
            "output_tokens": s.output_tokens, "duration_s": s.duration_s,
            "ttft_ms_p50": s.ttft_ms["p50"], "ttft_ms_p99": s.ttft_ms["p99"],
            "tpot_ms_p50": s.tpot_ms["p50"],
            "output_tokens_per_second": s.output_tokens_per_second,
            "frontend_cpu_s": cpu_s,
            "cpu_ms_per_token": 1000 * cpu_s / s.output_tokens if s.output_tokens else None,
            "cpu_s_by_process": {k: round(v, 3) for k, v in by_process.items()},
            "serving_cpu_ms_per_token": (1000 * serving_cpu_s(contender.name, by_process) / s.output_tokens
                                         if s.output_tokens else None),
            "started_at": result.started_at}


def measure_idle(contender: Contender, seconds: float | None = None) -> dict[str, Any]:
    """Front-end CPU with no request in flight for ``seconds`` (IDLE_S): what the contender
    costs to keep up (for Ray: the GCS, raylet and agents, the Serve controller, the proxy
    and the replicas' own loops), per second and by process."""
    from options.bench.cpu import cpu_by_process

    seconds = seconds or IDLE_S
    with cpu_by_process(contender.root_pid, contender.include_root) as by_role:
        time.sleep(seconds)
    return {"contender": contender.name, "seconds": seconds,
            "cpu_s_per_s": sum(by_role.values()) / seconds,
            "cpu_s_by_process": {k: round(v, 3) for k, v in by_role.items()}}


def loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def add_arguments(parser) -> None:
    g = parser.add_argument_group("the Ray hop (--level 6 --target local)")
    g.add_argument("--ray-ingress-replicas", type=int, default=1, metavar="N",
                   help="the Ray application's ingress replicas (1); 0: the engine deployment "
                        "takes HTTP from Serve's proxy itself, one hop less")
    g.add_argument("--ray-proxy", choices=RAY_PROXIES, default="serve",
                   help="what fronts the Ray application's ingress replicas: serve (default) "
                        "Serve's HTTP proxy; haproxy: Ray's high-throughput mode (HAProxy on "
                        "the Serve port, the replicas serving HTTP themselves)")


def check_args(args) -> None:
    """Bad input for a Ray-hop run, before anything starts."""
    if args.endpoint:
        raise BadInput("--level 6 --target local starts the plain server and the Ray "
                       "application itself: leave out --endpoint (or give the --url of a "
                       "running rung 6 to measure it alone)")
    for flag, given in (("--adapters", args.adapters), ("--replay", args.replay),
                        ("--request-rate", args.request_rate),
                        ("--profile " + args.profile, args.profile != "requests")):
        if given:
            raise BadInput(f"{flag}: --level 6 --target local measures the Ray hop with plain "
                           "requests at each --concurrency; leave it out")
    if args.ray_ingress_replicas < 0:
        raise BadInput(f"--ray-ingress-replicas {args.ray_ingress_replicas} must be 0 (the "
                       "engine deployment as the ingress) or more")
    if not isinstance(args.rounds, int) or args.rounds < 1:
        raise BadInput(f"--rounds {args.rounds!r} must be a whole number >= 1 (3 or more to "
                       "see a spread)")


def bench_ray_hop(args, console) -> int:
    """``python -m options.bench --level 6 --target local``: rounds, JSON, table."""
    from options.bench import report
    from options.bench.adapters import replace_args
    from options.bench.profile import profile_from_args
    from options.bench.runner import http_target
    from options.bench.warmup import warm_up_and_calibrate
    from options.contract import Request
    from options.core import OPENAI_CHAT
    from options.deploy import local_server_env

    check_args(args)
    concurrencies = args.concurrency or list(DEFAULT_CONCURRENCY)
    dialect = args.dialect or OPENAI_CHAT                  # rung 6's own
    say = (lambda *_: None) if args.no_progress else console.print
    template = Request(prompt="-", model=None, ignore_eos=True, temperature=args.temperature,
                       stream=True)
    profiles = {c: profile_from_args(replace_args(args, concurrency=[c], seed=args.seed + i))
                for i, c in enumerate(concurrencies)}
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = loadavg()
    runs: list[dict[str, Any]] = []
    idle: list[dict[str, Any]] = []
    with local_server_env(5, args.model, args.option) as (env, what):
        model, settings = engine_settings(env)
        settings.setdefault("VLLM_CPU_KVCACHE_SPACE", _kv_cache_default())
        env = {**env, "VLLM_CPU_KVCACHE_SPACE": settings["VLLM_CPU_KVCACHE_SPACE"]}
        start: dict[str, Callable[[], Any]] = {
            "plain": lambda: plain_server(env),
            "ray": lambda: ray_server(model, settings, args.ray_ingress_replicas,
                                      args.ray_proxy)}
        for n, order in enumerate(round_order(args.rounds), start=1):
            for name in order:
                say(f"round {n}/{args.rounds}: starting {name} ...")
                t0 = time.monotonic()
                with start[name]() as contender:
                    ready_s = time.monotonic() - t0
                    send = http_target(contender.url, dialect, args.path, args.timeout)
                    ok, tokens = warm_up_and_calibrate(args, send, template, console, args.seed)
                    if not ok:
                        return 1
                    idle.append({**measure_idle(contender), "round": n})
                    for c in concurrencies:
                        row = measure(contender, send, template, profiles[c], tokens, c)
                        row.update(round=n, ready_s=ready_s)
                        runs.append(row)
                        say(f"  {name} c={c}: TTFT p50 {_f(row['ttft_ms_p50'])} ms, "
                            f"{_f(row['output_tokens_per_second'], '{:.0f}')} tok/s, "
                            f"CPU {_f(row['cpu_ms_per_token'], '{:.3f}')} ms/token"
                            + (f", errors {row['errors']}" if row["errors"] else ""))
    doc = {"schema": SCHEMA, "level": 6, "target": "local", "started_at": started_at,
           "command": "python -m options.bench " + " ".join(sys.argv[1:]),
           "loadavg": {"before": load_before, "after": loadavg()},
           "settings": {"model": model, "engine": settings, "dialect": dialect,
                        "concurrency": concurrencies, "rounds": args.rounds,
                        "requests": args.requests, "prompt_tokens": args.prompt_tokens,
                        "output_tokens": args.output_tokens, "ignore_eos": True,
                        "seed": args.seed, "cpus": os.cpu_count(),
                        "ray_ingress_replicas": args.ray_ingress_replicas,
                        "ray_proxy": args.ray_proxy},
           "goal": GOAL, **compare(runs), "idle": idle_summary(idle), "runs": runs}
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(render_table(doc))
    if any(r["completed"] == 0 for r in runs):
        console.print("[red]every request of a run failed[/red]: "
                      f"{next(r['errors'] for r in runs if r['completed'] == 0)}")
        return 1
    return 0


def _kv_cache_default() -> str:
    from options.local_server import DEFAULT_CPU_KVCACHE_GIB
    return os.environ.get("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def render_table(doc: dict[str, Any]):
    from rich.console import Group
    from rich.table import Table

    def band(s, fmt):      # median ±half the range over rounds: narrow enough for 80 columns
        if s["median"] is None:
            return "-"
        return f"{fmt.format(s['median'])} ±{fmt.format((s['max'] - s['min']) / 2)}"

    s = doc["settings"]
    t = Table(title=f"the Ray hop · plain server vs Ray Serve, {s['rounds']} alternated rounds, "
                    "medians ±half-range",
              caption=f"{s['requests']} requests a run, prompt {s['prompt_tokens']}, output "
                      f"{s['output_tokens']} tokens, {s['dialect']}; load average "
                      f"{doc['loadavg']['before']} before, {doc['loadavg']['after']} after")
    for col in ("conc", "server", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "out tok/s",
                "CPU ms/token"):
        t.add_column(col, justify="right")
    for c, e in doc["by_concurrency"].items():
        for k in CONTENDERS:
            f = e[k]
            t.add_row(c, k, band(f["ttft_ms_p50"], "{:.1f}"), band(f["ttft_ms_p99"], "{:.1f}"),
                      band(f["tpot_ms_p50"], "{:.2f}"),
                      band(f["output_tokens_per_second"], "{:.0f}"),
                      band(f["cpu_ms_per_token"], "{:.3f}"))
    v = Table(title=f"against the goal (≤ {GOAL['added_ttft_ms_p50']:g} ms TTFT p50 added, "
                    f"≤ {GOAL['cpu_ratio']:g}× CPU per token): {doc['verdict']}")
    for col in ("conc", "TTFT p50 added ms", "noise", "verdict", "CPU ratio", "noise", "verdict",
                "serving path", "noise", "verdict"):
        v.add_column(col, justify="right")
    for c, e in doc["by_concurrency"].items():
        a, r = e["added_ttft_ms_p50"], e["cpu_ratio"]
        p = e.get("serving_cpu_ratio") or {"value": None, "noise": None, "verdict": "-"}
        v.add_row(c, _f(a["value"], "{:+.1f}"), _f(a["noise"], "±{:.1f}"), a["verdict"],
                  _f(r["value"], "{:.2f}×"), _f(r["noise"], "±{:.2f}"), r["verdict"],
                  _f(p["value"], "{:.2f}×"), _f(p["noise"], "±{:.2f}"), p["verdict"])
    parts = [t, v]
    idle = doc.get("idle", {}).get("cpu_s_per_s")
    if idle:
        lines = ["idle (no request, once a round): " + ", ".join(
            f"{k} {band({m: (None if x is None else 1000 * x) for m, x in idle[k].items()}, '{:.0f}')} "
            "ms CPU/s" for k in CONTENDERS if k in idle)]
        for c in doc["by_concurrency"]:
            share = idle_share(doc, c)
            ray_runs = [r for r in doc["runs"] if str(r["concurrency"]) == c and r["contender"] == "ray"]
            top = ray_runs[-1].get("cpu_s_by_process", {}) if ray_runs else {}
            lines.append(f"c={c}: Ray's extra idle CPU is {_f(None if share is None else 100 * share, '{:.0f}')} % "
                         "of its extra CPU in the run; its CPU by process (last round): "
                         + ", ".join(f"{k} {v:.1f} s" for k, v in list(top.items())[:5]))
        parts.append("\n".join(lines))
    return Group(*parts)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve_main(sys.argv[2:]))
    sys.exit("usage: python -m options.bench.ray_hop serve --port P --model M --settings JSON "
             "(what python -m options.bench --level 6 --target local starts)")
