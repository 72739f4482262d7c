"""Many fine-tunes on one base: the bench's ``--adapters`` run.

    python -m options.bench --adapters a1,a2,a3,a4,a5,a6,a7,a8 --adapter-mix zipf:1.1 \\
        --concurrency 8,32 --rounds 3 --json adapters.json

Each request of the mix asks for one LoRA adapter (OpenAI ``"model"``), drawn from the mix:
``zipf:S`` gives the adapter of rank i (in the order listed) weight 1/i^S, ``uniform`` equal
weights; the draw is seeded (``--seed``), so a run sends the same adapters in the same order
every time. Against it runs the base model alone, the same prompts, lengths and concurrency.
Rounds alternate which goes first; each (round, concurrency) pair draws its own prompt words,
so no run finds another's prompts in the prefix cache. Swaps are read from the server's
``/metrics`` (``byo_adapter_loads_total``, ``byo_adapter_evictions_total``, ``..._hits_total``)
before and after every run. First, a cold burst: ``--cold-burst`` concurrent requests for an
adapter that is not loaded yet, then the same again warm, give the cold-load TTFT and the
loads one burst caused.

The JSON is a ``spectrum.bench/1`` document with an ``adapters`` object (read by
``python -m cost consolidate --adapter-bench FILE``):

- ``adapters.throughput_ratio``: output tok/s of the mix / of the base alone, at the highest
  concurrency measured (the capacity regime that sets cost): the median over rounds of each
  round's ratio. ``adapters.ttft_ratio_p50`` and ``adapters.ttft_ratio_p99``: TTFT of the mix /
  of the base, the same way. ``adapters.concurrency``: that concurrency.
- ``adapters.loads``, ``adapters.evictions``, ``adapters.hits``: totals over every mix run;
  ``adapters.load_ms_mean``: mean time of one load over those loads, from its start until the
  adapter is ready (waiting for a free slot included).
- ``adapters.requests_per_adapter``: requests each adapter gets in one mix run (sums to
  ``adapters.requests``); ``adapters.names``, ``adapters.mix``, ``adapters.rounds``.
- ``adapters.cold_burst``: ``{adapter, requests, loads, ttft_ms, warm_ttft_ms}`` (TTFT as
  ``{p50, p99}``), or ``{"skipped": why}``.
- ``adapters.by_concurrency["C"]``: for each concurrency C, ``base`` and ``mix`` with
  ``output_tokens_per_second``, ``ttft_ms_p50``, ``ttft_ms_p99`` (each ``{median, min, max}``
  over rounds), the ratios ``throughput_ratio``, ``ttft_ratio_p50``, ``ttft_ratio_p99`` (each
  ``{median, min, max}`` of the per-round ratios), and ``loads``, ``evictions``, ``hits``.
- ``adapters.runs``: every run as it happened (round, concurrency, contender, tok/s, TTFT
  p50/p99, swaps, errors).
The document's ``metrics`` and ``counts`` are those of the mix's median round at that
highest concurrency, so tools that read any bench document read this one too.
"""
from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from options.bench.metrics import percentile, prometheus_samples, ratio, spread
from options.bench.runner import metrics_page
from options.core import BadInput

ADAPTER_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# The server's adapter counters (containers/byo-vllm/byo_vllm/metrics.py), per adapter.
COUNTERS = {"byo_adapter_loads_total": "loads", "byo_adapter_evictions_total": "evictions",
            "byo_adapter_hits_total": "hits", "byo_adapter_load_seconds_sum": "load_s",
            "byo_adapter_load_seconds_count": "timed_loads"}
CONTENDERS = ("base", "mix")
# Rank of the adapters the bench writes for a local server, and the modules they change.
LOCAL_RANK = 8
LOCAL_TARGETS = ("q_proj", "v_proj")
LOCAL_SLOTS = 4


def add_arguments(parser) -> None:
    g = parser.add_argument_group("many adapters on one base (--adapters)")
    g.add_argument("--adapters", metavar="A1,A2,...",
                   help="LoRA adapters the target serves: each request of the mix asks for one, "
                        "against runs of the base model alone")
    g.add_argument("--adapter-mix", default="zipf:1.1", metavar="MIX",
                   help="how requests pick an adapter: zipf:S (the i-th listed gets weight 1/i^S; "
                        "default zipf:1.1) or uniform")
    g.add_argument("--rounds", type=int, default=3,
                   help="alternating rounds of the contenders: base vs mix with --adapters, "
                        "priority off vs on with --priority compare, the plain server vs "
                        "Ray Serve with --level 6 --target local (3)")
    g.add_argument("--cold-burst", type=int, metavar="N",
                   help="concurrent first requests for a cold adapter, measured once before the "
                        "rounds (default: the first --concurrency; 0 skips it)")
    g.add_argument("--adapter-slots", type=int, default=LOCAL_SLOTS,
                   help="with a server the bench starts: adapters it keeps loaded at once "
                        f"(SM_VLLM_MAX_CPU_LORAS; {LOCAL_SLOTS}, fewer than a mix of 8, so it swaps)")


# --- the mix (pure) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Mix:
    """How requests pick an adapter: ``zipf`` with exponent ``s``, or ``uniform``."""
    kind: str
    s: float = 0.0

    def weights(self, n: int) -> list[float]:
        """Each of ``n`` adapters' share of requests, in the order listed (sums to 1)."""
        raw = [1.0] * n if self.kind == "uniform" else [1 / (i ** self.s) for i in range(1, n + 1)]
        total = sum(raw)
        return [w / total for w in raw]

    def assign(self, names: Sequence[str], requests: int, seed: int) -> list[str]:
        """The adapter of each request: a seeded draw, the same for the same arguments."""
        rng = random.Random(f"adapter-mix/{seed}")
        return rng.choices(list(names), weights=self.weights(len(names)), k=requests)

    def __str__(self) -> str:
        return "uniform" if self.kind == "uniform" else f"zipf:{self.s:g}"


def parse_mix(spec: str) -> Mix:
    usage = (f"--adapter-mix {spec!r} is not a mix: give zipf:S with an exponent S > 0 "
             "(e.g. zipf:1.1; larger S puts more requests on the first adapters) or uniform")
    if spec.strip() == "uniform":
        return Mix("uniform")
    kind, _, rest = spec.strip().partition(":")
    if kind != "zipf":
        raise BadInput(usage)
    try:
        s = float(rest)
    except ValueError:
        raise BadInput(usage) from None
    if not (s > 0 and s < float("inf")):
        raise BadInput(f"--adapter-mix zipf:{rest} needs an exponent S > 0 (got {rest}); "
                       "zipf:1.1 is a common choice, uniform gives every adapter the same share")
    return Mix("zipf", s)


def parse_adapters(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",")]
    if not names or any(not n for n in names):
        raise BadInput(f"--adapters {spec!r} has an empty name: give names separated by commas, "
                       "e.g. --adapters a1,a2,a3")
    bad = [n for n in names if not set(n) <= ADAPTER_NAME_CHARS]
    if bad:
        raise BadInput(f"--adapters: {bad[0]!r} is not an adapter name (letters, digits, '.', "
                       "'_' and '-' only)")
    seen = {n for n in names if names.count(n) > 1}
    if seen:
        raise BadInput(f"--adapters names {sorted(seen)[0]!r} twice: list each adapter once "
                       "(the mix gives weights by position)")
    return names


def request_counts(assigned: Sequence[str], names: Sequence[str]) -> dict[str, int]:
    return {n: sum(1 for a in assigned if a == n) for n in names}


def adapter_counters(metrics_text: str | None) -> dict[str, dict[str, float]] | None:
    """``{counter: {adapter: value}}`` from the server's /metrics; None if it has none."""
    if metrics_text is None:
        return None
    out: dict[str, dict[str, float]] = {v: {} for v in COUNTERS.values()}
    seen = False
    for name, labels, value in prometheus_samples(metrics_text):
        key = COUNTERS.get(name)
        if key and "adapter" in labels:
            out[key][labels["adapter"]] = out[key].get(labels["adapter"], 0.0) + value
            seen = True
    return out if seen or "byo_adapter" in metrics_text else None


def counter_delta(before, after, names: Sequence[str] | None = None) -> dict[str, float] | None:
    """Each counter's growth between two readings, summed over ``names`` (or every adapter)."""
    if before is None or after is None:
        return None
    out = {}
    for key, now in after.items():
        chosen = now if names is None else {n: v for n, v in now.items() if n in names}
        out[key] = sum(v - before.get(key, {}).get(n, 0.0) for n, v in chosen.items())
    return out


def summarize_runs(runs: list[dict[str, Any]], concurrencies: Sequence[int]) -> dict[str, Any]:
    """Per concurrency: each contender's figures over rounds, and the per-round mix/base ratios."""
    by: dict[str, Any] = {}
    for c in concurrencies:
        here = [r for r in runs if r["concurrency"] == c]
        rounds = sorted({r["round"] for r in here})
        pick = {(r["round"], r["contender"]): r for r in here}
        entry: dict[str, Any] = {}
        for who in CONTENDERS:
            mine = [r for r in here if r["contender"] == who]
            entry[who] = {k: spread([r[k] for r in mine])
                          for k in ("output_tokens_per_second", "ttft_ms_p50", "ttft_ms_p99")}
        for key, field in (("throughput_ratio", "output_tokens_per_second"),
                           ("ttft_ratio_p50", "ttft_ms_p50"), ("ttft_ratio_p99", "ttft_ms_p99")):
            entry[key] = spread([ratio(pick[(n, "mix")][field], pick[(n, "base")][field])
                                 for n in rounds if (n, "mix") in pick and (n, "base") in pick])
        mixes = [r for r in here if r["contender"] == "mix"]
        for key in ("loads", "evictions", "hits"):
            entry[key] = (None if any(r["swaps"] is None for r in mixes)
                          else round(sum(r["swaps"][key] for r in mixes)))
        by[str(c)] = entry
    return by


# --- the target -------------------------------------------------------------------------------

def served_models(base_url: str) -> tuple[str | None, set[str]]:
    """(the base model's name, the adapters) a server lists at GET /v1/models."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=30) as r:
            data = json.load(r)["data"]
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError) as exc:
        raise BadInput(f"--adapters: {base_url}/v1/models does not list what the server serves "
                       f"({exc}); the adapter bench needs a server that lists its adapters there, "
                       "such as the bring-your-own server with SM_VLLM_ENABLE_LORA=true") from None
    base = next((m.get("id") for m in data if isinstance(m, dict) and not m.get("parent")), None)
    return base, {m["id"] for m in data if isinstance(m, dict) and m.get("parent")}


def check_served(names: Sequence[str], base_url: str) -> str | None:
    """The base model's name, once every adapter in ``names`` is known to the server."""
    base, known = served_models(base_url)
    missing = [n for n in names if n not in known]
    if missing:
        listed = ", ".join(sorted(known)) or "none (is LoRA on? SM_VLLM_ENABLE_LORA=true)"
        raise BadInput(f"--adapters: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                       f"not served by {base_url} (its adapters: {listed}); put the adapter in "
                       "the model folder's adapters/<name>/ or load it with POST /models")
    return base


def residency(base_url: str, name: str) -> str | None:
    """Where the server holds an adapter now (gpu, cpu, registered); None if it does not say."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/models/{name}", timeout=30) as r:
            return json.load(r).get("residency")
    except (OSError, ValueError, urllib.error.URLError):
        return None


# --- a local server with adapters -------------------------------------------------------------

def write_random_adapter(folder: Path, model_dir: Path, seed: int, rank: int = LOCAL_RANK) -> Path:
    """A rank-``rank`` LoRA adapter in peft's layout on the base model's q_proj and v_proj,
    with random weights: what an adapter costs to serve depends on its rank and shapes only."""
    import numpy as np
    from safetensors.numpy import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    shapes = {"q_proj": heads * head_dim, "v_proj": cfg.get("num_key_value_heads", heads) * head_dim}
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, out in shapes.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.standard_normal((rank, hidden)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.standard_normal((out, rank)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "bias": "none", "target_modules": list(LOCAL_TARGETS), "task_type": "CAUSAL_LM"}))
    return folder


def model_with_adapters(model_dir: Path, names: Sequence[str], cache: Path) -> Path:
    """A model folder for the local server: the base model's files (linked) and
    ``adapters/<name>/`` for each name; the model's own adapters are used where it has them,
    the others are written with random weights. Built once per base model and names."""
    if not (model_dir / "config.json").is_file():
        raise BadInput(f"--adapters with a server the bench starts needs a local model folder "
                       f"(config.json in it); {str(model_dir)!r} is not one. Give --url of a "
                       "server that serves the adapters instead")
    import hashlib
    key = hashlib.sha256(f"{model_dir.resolve()}|{','.join(names)}|{LOCAL_RANK}".encode()).hexdigest()[:16]
    folder = cache / "bench-adapters" / key
    if (folder / ".complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "adapters" and not (folder / item.name).exists():
            (folder / item.name).symlink_to(item.resolve())
    for seed, name in enumerate(names, start=1):
        own = model_dir / "adapters" / name
        target = folder / "adapters" / name
        if target.exists():
            continue
        if own.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(own.resolve())
        else:
            write_random_adapter(target, model_dir, seed)
    (folder / ".complete").write_text("")
    return folder


def local_server_env(args) -> dict[str, str]:
    """What the started server needs for the adapters: LoRA on, the cache size, the rank."""
    slots = args.adapter_slots
    if not isinstance(slots, int) or slots < 1:
        raise BadInput(f"--adapter-slots {slots!r} must be a whole number >= 1 (adapters the "
                       "server keeps loaded at once)")
    return {"SM_VLLM_ENABLE_LORA": "true", "SM_VLLM_MAX_LORAS": str(slots),
            "SM_VLLM_MAX_CPU_LORAS": str(slots), "SM_VLLM_MAX_LORA_RANK": str(LOCAL_RANK)}


# --- the run ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdapterPlan:
    names: list[str]
    mix: Mix
    concurrencies: list[int]
    rounds: int
    cold_burst: int

    @classmethod
    def from_args(cls, args, concurrencies: list[int]) -> "AdapterPlan":
        names = parse_adapters(args.adapters)
        mix = parse_mix(args.adapter_mix)
        if not isinstance(args.rounds, int) or args.rounds < 1:
            raise BadInput(f"--rounds {args.rounds!r} must be a whole number >= 1 (3 or more to "
                           "read medians with a spread)")
        if args.request_rate is not None:
            raise BadInput("--adapters compares the mix and the base at equal concurrency: leave "
                           "out --request-rate and give --concurrency (e.g. 8,32)")
        burst = concurrencies[0] if args.cold_burst is None else args.cold_burst
        if not isinstance(burst, int) or burst < 0:
            raise BadInput(f"--cold-burst {burst!r} must be a whole number >= 0 (0 skips it)")
        return cls(names, mix, concurrencies, args.rounds, burst)


def _run_figures(summary) -> dict[str, Any]:
    return {"output_tokens_per_second": summary.output_tokens_per_second,
            "ttft_ms_p50": summary.ttft_ms["p50"], "ttft_ms_p99": summary.ttft_ms["p99"],
            "completed": summary.completed, "errors": dict(summary.errors)}


def cold_burst(plan: AdapterPlan, send, template, url: str | None, say) -> dict[str, Any]:
    """``plan.cold_burst`` concurrent requests for the least-used adapter while it is not loaded,
    then as many again warm: TTFT of each, and the loads the cold burst caused."""
    from concurrent.futures import ThreadPoolExecutor

    from options.bench.runner import measure

    if plan.cold_burst == 0:
        return {"skipped": "--cold-burst 0"}
    name = plan.names[-1]
    where = residency(url, name) if url else None
    if where is None:
        return {"skipped": "the target does not say which adapters are loaded (GET /models/<name>)"}
    if where != "registered":
        return {"skipped": f"{name} is already loaded ({where}): no cold adapter to measure"}
    req = replace(template, prompt="cold adapter burst", messages=None, max_tokens=8,
                  stream=True, model=name)

    def burst() -> list[float]:
        with ThreadPoolExecutor(plan.cold_burst) as pool:
            recs = list(pool.map(lambda _: measure(send, req), range(plan.cold_burst)))
        failed = [r.error for r in recs if not r.ok]
        if failed:
            raise RuntimeError(f"the cold burst for adapter {name} failed: {failed[0]}")
        return [r.ttft_s * 1000 for r in recs]

    before = adapter_counters(metrics_page(url))
    cold = burst()
    loads = counter_delta(before, adapter_counters(metrics_page(url)), [name])
    warm = burst()
    out = {"adapter": name, "requests": plan.cold_burst,
           "loads": None if loads is None else round(loads["loads"]),
           "ttft_ms": {"p50": percentile(cold, 50), "p99": percentile(cold, 99)},
           "warm_ttft_ms": {"p50": percentile(warm, 50), "p99": percentile(warm, 99)}}
    say(f"cold burst: {plan.cold_burst} requests for {name} → {out['loads']} load(s), TTFT p50 "
        f"{out['ttft_ms']['p50']:.0f} ms cold vs {out['warm_ttft_ms']['p50']:.0f} ms warm")
    return out


def run_rounds(plan: AdapterPlan, profile_for: Callable[[int, int], Any], send, template,
               tokens, url: str | None, say) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every round: at each concurrency the base alone and the mix, in alternating order.

    ``profile_for(concurrency, seed)`` gives the traffic profile. Returns the runs, and the
    mix's summary of the median round at the highest concurrency (for the document's metrics)."""
    from options.bench import runner
    from options.bench.metrics import summarize

    first = profile_for(plan.concurrencies[0], 0)
    assigned = plan.mix.assign(plan.names, first.requests, first.seed)
    runs: list[dict[str, Any]] = []
    summaries = {}
    n = 0
    for rnd in range(1, plan.rounds + 1):
        for c in plan.concurrencies:
            profile = profile_for(c, n)           # its own prompt words (see the module's text)
            n += 1
            order = CONTENDERS if rnd % 2 else CONTENDERS[::-1]
            for who in order:
                before = adapter_counters(metrics_page(url))
                result = runner.run(profile, send, template, tokens=tokens,
                                    models=assigned if who == "mix" else None)
                swaps = counter_delta(before, adapter_counters(metrics_page(url)))
                summary = summarize(result.records, result.duration_s)
                run = {"round": rnd, "concurrency": c, "contender": who, **_run_figures(summary),
                       "swaps": None if swaps is None else
                       {k: round(swaps[k]) for k in ("loads", "evictions", "hits")} |
                       {"load_s": swaps["load_s"], "timed_loads": round(swaps["timed_loads"])}}
                runs.append(run)
                summaries[(rnd, c, who)] = summary
                say(f"round {rnd} · concurrency {c} · {who}: {run['output_tokens_per_second']:.0f} "
                    f"tok/s, TTFT p50 {run['ttft_ms_p50'] or 0:.0f} ms"
                    + (f", {run['swaps']['loads']} loads, {run['swaps']['evictions']} evictions"
                       if run["swaps"] and who == "mix" else ""))
    top = max(plan.concurrencies)
    mixes = sorted((r for r in runs if r["concurrency"] == top and r["contender"] == "mix"),
                   key=lambda r: r["output_tokens_per_second"])
    median_round = mixes[(len(mixes) - 1) // 2]["round"]
    return runs, {"summary": summaries[(median_round, top, "mix")], "assigned": assigned}


def adapters_json(plan: AdapterPlan, runs, assigned, cold: dict[str, Any]) -> dict[str, Any]:
    by = summarize_runs(runs, plan.concurrencies)
    top = str(max(plan.concurrencies))
    mixes = [r for r in runs if r["contender"] == "mix"]
    swaps = None if any(r["swaps"] is None for r in mixes) else {
        k: sum(r["swaps"][k] for r in mixes) for k in ("loads", "evictions", "hits", "load_s",
                                                        "timed_loads")}
    return {
        "names": plan.names, "mix": str(plan.mix), "rounds": plan.rounds,
        "requests": len(assigned), "requests_per_adapter": request_counts(assigned, plan.names),
        "mix_weights": dict(zip(plan.names, plan.mix.weights(len(plan.names)))),
        "concurrency": int(top),
        "throughput_ratio": by[top]["throughput_ratio"]["median"],
        "ttft_ratio_p50": by[top]["ttft_ratio_p50"]["median"],
        "ttft_ratio_p99": by[top]["ttft_ratio_p99"]["median"],
        "loads": None if swaps is None else round(swaps["loads"]),
        "evictions": None if swaps is None else round(swaps["evictions"]),
        "hits": None if swaps is None else round(swaps["hits"]),
        "load_ms_mean": (1000 * swaps["load_s"] / swaps["timed_loads"])
        if swaps and swaps["timed_loads"] else None,
        "swaps_source": "the server's /metrics (byo_adapter_*_total)" if swaps is not None else
        "not measured: the target's /metrics has no byo_adapter_* counters",
        "cold_burst": cold,
        "by_concurrency": by,
        "runs": runs,
    }


def bench_adapters(args, plan: AdapterPlan, template, send, details, console) -> int:
    """``python -m options.bench --adapters ...``: check, cold burst, rounds, JSON, table."""
    from options.bench import report
    from options.bench.profile import profile_from_args
    from options.bench.warmup import warm_up_and_calibrate

    url = details.get("url")
    if url is None:
        raise BadInput("--adapters measures a server that lists its adapters: give its --url "
                       "(or leave out --target/--url to start the local server with adapters)")
    check_served(plan.names, url)
    say = (lambda *_: None) if args.no_progress else console.print
    ready, tokens = warm_up_and_calibrate(args, send, template, console, args.seed)
    if not ready:
        return 1
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cold = cold_burst(plan, send, template, url, say)

    def profile_for(c: int, n: int):
        args_c = replace_args(args, concurrency=[c], seed=args.seed + n)
        return profile_from_args(args_c)

    runs, picked = run_rounds(plan, profile_for, send, template, tokens, url, say)
    summary, assigned = picked["summary"], picked["assigned"]
    profile = profile_for(max(plan.concurrencies), 0)
    doc = report.bench_json(summary, profile, level=args.level, target=args.target,
                            model=template.model or args.model or details.get("served_model"),
                            started_at=started_at,
                            details={**details, "warmup_requests": args.warmup,
                                     "prompt_calibration": tokens.to_json() if tokens else None})
    doc["profile"]["concurrency"] = plan.concurrencies
    doc["adapters"] = adapters_json(plan, runs, assigned, cold)
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(render_table(doc))
    failed = [r for r in runs if r["completed"] == 0]
    if failed:
        console.print(f"[red]every request of a run failed:[/red] {failed[0]['errors']}")
        return 1
    return 0


def replace_args(args, **changes):
    import argparse
    return argparse.Namespace(**{**vars(args), **changes})


def render_table(doc: dict[str, Any]):
    from rich.console import Group
    from rich.table import Table

    a = doc["adapters"]
    f = lambda x, fmt="{:,.0f}": "-" if x is None else fmt.format(x)  # noqa: E731
    band = lambda s, fmt="{:.2f}": (f"{f(s['median'], fmt)} ({f(s['min'], fmt)}–{f(s['max'], fmt)})")  # noqa: E731
    t = Table(title=f"{len(a['names'])} adapters mixed ({a['mix']}) vs the base alone · "
                    f"{a['rounds']} alternating rounds, medians (min–max)",
              caption=f"{a['requests']} requests a run; per adapter: "
                      + ", ".join(f"{k} {v}" for k, v in a["requests_per_adapter"].items()))
    for col in ("concurrency", "base tok/s", "mix tok/s", "tok/s ratio", "TTFT p50 ratio",
                "TTFT p99 ratio", "loads", "evictions"):
        t.add_column(col, justify="right")
    for c, e in a["by_concurrency"].items():
        t.add_row(c, band(e["base"]["output_tokens_per_second"], "{:,.0f}"),
                  band(e["mix"]["output_tokens_per_second"], "{:,.0f}"), band(e["throughput_ratio"]),
                  band(e["ttft_ratio_p50"]), band(e["ttft_ratio_p99"]), f(e["loads"]), f(e["evictions"]))
    cold = a["cold_burst"]
    extra = Table(show_header=False)
    if "skipped" in cold:
        extra.add_row("cold burst", f"skipped: {cold['skipped']}")
    else:
        extra.add_row("cold burst", f"{cold['requests']} concurrent first requests for {cold['adapter']}: "
                      f"{f(cold['loads'])} load(s); TTFT p50/p99 {f(cold['ttft_ms']['p50'])}/"
                      f"{f(cold['ttft_ms']['p99'])} ms cold vs {f(cold['warm_ttft_ms']['p50'])}/"
                      f"{f(cold['warm_ttft_ms']['p99'])} ms warm")
    extra.add_row("adapter load time (mean)", f(a["load_ms_mean"], "{:.1f} ms"))
    extra.add_row("swaps", a["swaps_source"])
    return Group(t, extra)
