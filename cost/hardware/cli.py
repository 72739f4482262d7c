"""``python -m cost capacity`` and ``python -m cost predict``: one replica's capacity from a model's
config and a GPU's specs, and the latency one fixed deployment gives a trace.

The spec flags (``add_spec_arguments``) are the same wherever a capacity can come from specs
(``capacity``, ``predict``, and ``--hf-model`` in breakeven, compare, simulate and recommend).
"""
from __future__ import annotations

import argparse
from typing import Any

from options.core import BadInput


def add_spec_arguments(p: argparse.ArgumentParser, model_flag: str = "--model", required: bool = True,
                       gpu_flags: bool = True) -> None:
    """The model, the hardware, the weights' format and vLLM's engine flags. ``--hf-model``
    (``model_flag``) beside a Bedrock ``--model`` in the pricing commands, where the priced
    ``--instance`` is the hardware (``gpu_flags=False``)."""
    g = p.add_argument_group("capacity from specs (vLLM's defaults where a flag is not given)")
    g.add_argument(model_flag, dest="spec_model", metavar="MODEL", required=required,
                   help="a Hugging Face id from the catalog (cost/hardware/data), a config.json or a folder "
                        "holding one, or a Bedrock id of an open-weights model"
                        + ("; without --capacity/--bench the replica's capacity comes from it and the "
                           "instance's specs" if model_flag != "--model" else ""))
    if gpu_flags:
        g.add_argument("--gpu", metavar="NAME", help="a10g, l4, l40s, a100-40gb, a100-80gb, h100, h200, b200")
        g.add_argument("--gpus", type=int, metavar="N", help="GPUs with --gpu (default: --tp)")
    if not any(a.dest == "instance" for a in p._actions):
        g.add_argument("--instance", metavar="TYPE", help="an AWS GPU instance (its GPU, count and link)")
    g.add_argument("--tp", type=int, metavar="N", help="tensor-parallel degree (default 1 with --gpu, every GPU "
                                                       "of --instance: LMI's default)")
    g.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp16", "fp8", "fp4", "int4"),
                   help="weights' format (default auto: the checkpoint's own)")
    g.add_argument("--kv-dtype", default="auto", choices=("auto", "fp8"), help="KV cache format (default auto: 16-bit)")
    g.add_argument("--max-num-seqs", type=int, metavar="N")
    g.add_argument("--max-num-batched-tokens", type=int, metavar="N")
    g.add_argument("--max-model-len", type=int, metavar="N")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="F")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM schedules each step while the one before it runs (default: on, as vLLM since "
                        "0.14.0; --no-async-scheduling for an older vLLM or a server started without it)")
    add_prefix_cache_argument(p)


def add_prefix_cache_argument(p: argparse.ArgumentParser) -> None:
    """``--prefix-cache-hit-rate``: the traffic's reuse of prompts, for any capacity model (from
    specs or a bench), so it sits beside the spec flags, not among them."""
    p.add_argument("--prefix-cache-hit-rate", type=float, metavar="F",
                   help="share of prompt tokens vLLM's prefix cache serves (0 to < 1; default: every prompt "
                        "new, or what a saved capacity model carries). Shared system prompts, multi-turn chats "
                        "and agents re-sending their context reuse prompts; vLLM reports it as "
                        "prefix_cache_hits / prefix_cache_queries, and `python -m options.bench` replays print "
                        "it. Cached tokens cost no prefill, but stay in the KV cache")


def capacity_from_spec_args(args, input_tokens=None, output_tokens=None):
    """(CapacityModel, details) from ``add_spec_arguments``' flags."""
    from cost.hardware.predict import capacity_for

    return capacity_for(args.spec_model, gpu=getattr(args, "gpu", None), gpus=getattr(args, "gpus", None),
                        instance=_instance(args), tp=args.tp,
                        dtype=args.dtype, kv_dtype=args.kv_dtype, max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        input_tokens=input_tokens, output_tokens=output_tokens,
                        prefix_cache_hit_rate=getattr(args, "prefix_cache_hit_rate", None) or 0.0,
                        async_scheduling=getattr(args, "async_scheduling", True))


def throughput_from_spec_args(args, mix=None):
    """``cost.breakeven.Capacity`` (output tok/s at saturation, at the traffic's mix) from
    ``--hf-model`` and the priced instance, for breakeven and compare; None without --hf-model."""
    from cost.breakeven import Capacity, parse_mix

    if not getattr(args, "spec_model", None):
        return None
    mix = mix or parse_mix(None)
    out = 200.0
    capacity, details = capacity_from_spec_args(args, out * mix.input / mix.output, out)
    origin = (f"{capacity.source} (saturated, at {mix.label}; KV cache {details['kv_cache_tokens']:,} tokens; "
              f"python -m cost capacity shows every assumption)")
    return Capacity(details["saturated_output_tok_s"], origin,
                    measured_at={"from_specs": {k: details[k] for k in ("model", "hardware")}})


def _instance(args) -> str | None:
    name = getattr(args, "instance", None)
    return name[3:] if name and name.startswith("ml.") else name


def add_capacity_command(sub, common) -> None:
    c = sub.add_parser("capacity", parents=[common], help="one replica's capacity from the model's config and the "
                                                          "GPU's specs, before any deployment",
                       description="vLLM's memory arithmetic and roofline step times, calibrated on public "
                                   "measurements: whether the model fits, its KV cache, its saturated output tok/s, "
                                   "and with --concurrency the latency C requests in flight see.")
    add_spec_arguments(c)
    w = c.add_argument_group("the request mix (default chat: 1,000 in / 200 out)")
    w.add_argument("--input-tokens", type=int, metavar="I")
    w.add_argument("--output-tokens", type=int, metavar="O")
    w.add_argument("--concurrency", type=int, metavar="C", help="closed loop: C requests always in flight")
    c.set_defaults(handler=cmd_capacity)


def cmd_capacity(args) -> tuple[dict[str, Any], Any]:
    from cost.hardware.predict import closed_loop

    if (args.input_tokens is None) != (args.output_tokens is None):
        raise BadInput("give --input-tokens and --output-tokens together (the request mix), or neither for chat "
                       "1,000 / 200")
    for name in ("input_tokens", "output_tokens"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "input_tokens" else 1):
            raise BadInput(f"--{name.replace('_', '-')} {value} must be >= {0 if name == 'input_tokens' else 1}")
    if args.concurrency is not None and args.input_tokens is None:
        raise BadInput(f"--concurrency {args.concurrency} needs the request mix: --input-tokens I --output-tokens O")
    capacity, details = capacity_from_spec_args(args, args.input_tokens, args.output_tokens)
    data = {**details, "capacity": capacity.to_json()}
    if args.concurrency is not None:
        run = closed_loop(capacity, args.concurrency, args.input_tokens, args.output_tokens)
        varied = closed_loop(capacity, args.concurrency, args.input_tokens, args.output_tokens,
                             answer_spread=VARIED_ANSWERS)
        data["at_concurrency"] = {"concurrency": args.concurrency,
                                  "ttft_ms": run["ttft_ms"]["mean"], "tpot_ms": run["tpot_ms"]["mean"],
                                  "e2e_ms": run["e2e_ms"]["mean"], "output_tok_s": run["output_tok_s"],
                                  "percentiles": {k: run[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms")},
                                  "answers_varied": {"spread": VARIED_ANSWERS, "ttft_ms": varied["ttft_ms"]["mean"],
                                                     "tpot_ms": varied["tpot_ms"]["mean"],
                                                     "e2e_ms": varied["e2e_ms"]["mean"],
                                                     "output_tok_s": varied["output_tok_s"]}}
        data["assumptions"] = data["assumptions"] + [{
            "what": f"closed loop: {args.concurrency} requests of exactly {args.input_tokens} in / "
                    f"{args.output_tokens} out always in flight, steady state (the first and last "
                    f"{args.concurrency} left out)",
            "value": "identical requests stay in step here (those that finish in one step are prefilled together "
                     "again), which servers measured with identical requests did not keep up: their first tokens "
                     f"fell between this loop's and the same loop's with answers within ±{VARIED_ANSWERS / 2:.0%} of "
                     "their length (at_concurrency.answers_varied)",
            "source": "benchmarks/capacity-heldout/README.md, closed loops of identical requests: AIConfigurator's "
                      "Hopper points against InferenceX's at the same GPU, TP and shape"}]
    return data, render_capacity


def render_capacity(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m, h, mem = data["model"], data["hardware"], data["memory"]
    t = Table(title=f"{m['name']} on {h['tp']}× {h['gpu']}" + (f" ({h['instance']})" if h["instance"] else ""),
              show_header=False)
    t.add_row("parameters", f"{m['params'] / 1e9:,.2f} B ({m['active_params'] / 1e9:,.2f} B active a token)")
    t.add_row("weights", f"{m['weights_gib']:,.1f} GiB in {m['dtype']}; {data['weights_gib']:,.2f} GiB per GPU")
    t.add_row("GPU memory", f"{mem['gpu_total_gib']:g} GiB × {mem['utilization']:g}; activations "
                            f"{mem['activation_gib']:.2f}, non-torch {mem['non_torch_gib']:.2f} GiB")
    whole = f" over its {h['tp']} GPUs" if h["tp"] > 1 else ""
    t.add_row("KV cache", f"{data['kv_cache_tokens']:,} tokens ({mem['kv_budget_gib']:.1f} GiB a GPU, "
                          f"{m['kv_bytes_per_token']:,.0f} bytes a token{whole})")
    t.add_row("max_model_len", f"{mem['max_model_len']:,}")
    mix = data["mix"]
    t.add_row("sequences at once", f"{data['max_concurrent_seqs']:,} at {mix['input_tokens']:,.0f} in / "
                                   f"{mix['output_tokens']:,.0f} out (max_num_seqs {mem['max_num_seqs']})")
    reuse = (data.get("capacity") or {}).get("prefix_cache_hit_rate")
    t.add_row("saturated output", f"{data['saturated_output_tok_s']:,.0f} tok/s"
              + (f" ({reuse:.0%} of prompt tokens from the prefix cache)" if reuse else ""))
    if "at_concurrency" in data:
        a = data["at_concurrency"]
        t.add_row(f"at concurrency {a['concurrency']}", f"TTFT {a['ttft_ms']:,.1f} ms, TPOT {a['tpot_ms']:,.2f} ms, "
                                                         f"E2E {a['e2e_ms']:,.0f} ms, {a['output_tok_s']:,.0f} tok/s")
        v = a["answers_varied"]
        t.add_row(f"answers ±{v['spread'] / 2:.0%}", f"TTFT {v['ttft_ms']:,.1f} ms, TPOT {v['tpot_ms']:,.2f} ms, "
                                                   f"E2E {v['e2e_ms']:,.0f} ms, {v['output_tok_s']:,.0f} tok/s")
    console = Console()
    console.print(t)
    a = Table(title="assumptions", show_lines=False)
    for col in ("what", "value", "source"):
        a.add_column(col, overflow="fold")
    for row in data["assumptions"]:
        source = row["source"] if len(row["source"]) <= SOURCE_WIDTH else row["source"][:SOURCE_WIDTH - 1] + "…"
        a.add_row(row["what"], str(row["value"]), source)
    console.print(a)
    console.print("(sources cut short here: --json gives each in full)")


SOURCE_WIDTH = 110      # a source's characters in the readable table
# The closed loop's other figure: answers within ±10 % of their length, which keeps no loop in step
# (the servers' first tokens fell between the two: benchmarks/capacity-heldout/README.md).
VARIED_ANSWERS = 0.2


# --- predict -------------------------------------------------------------------------------------

def add_predict_command(sub, common) -> None:
    from cost.traces import add_trace_arguments

    p = sub.add_parser("predict", parents=[common], help="the latency one fixed deployment gives a trace (no "
                                                         "autoscaling)",
                       description="A trace through N replicas of one capacity model: from a bench (--bench) or "
                                   "from specs (--model with --gpu or --instance).")
    add_trace_arguments(p, flag="--trace")
    p.add_argument("--bench", metavar="FILE", help="a capacity bench (python -m options.bench --profile capacity)")
    add_spec_arguments(p, required=False)
    p.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas behind a least-outstanding "
                                                                        "router (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=cmd_predict)


def cmd_predict(args) -> tuple[dict[str, Any], Any]:
    import numpy as np

    from cost.simulate.capacity import load_capacity
    from cost.simulate.fleet import SERVED, run_fleet
    from cost.simulate.prefix import prefix_of
    from cost.simulate.scaling import Fixed
    from cost.traces import trace_from_args

    if (args.bench is None) == (args.spec_model is None):
        raise BadInput("give the capacity as --bench FILE or as --model M with --gpu/--instance (one of them)")
    if not (isinstance(args.replicas, int) and args.replicas >= 1):
        raise BadInput(f"--replicas {args.replicas!r} must be a whole number >= 1")
    trace = trace_from_args(args)
    if trace is None:
        raise BadInput("give --trace FILE: the requests whose latency to predict")
    mean_in, mean_out = float(trace.input_tokens.mean()), float(trace.output_tokens.mean())
    if args.bench:
        capacity = load_capacity(args.bench).with_prefix_cache(args.prefix_cache_hit_rate)
        origin = {"bench": args.bench}
    else:
        capacity, details = capacity_from_spec_args(args, mean_in, mean_out)
        origin = {k: details[k] for k in ("model", "hardware", "kv_cache_tokens", "assumptions")}
    run = run_fleet(trace.arrival_s, trace.input_tokens, trace.output_tokens, capacity, Fixed(args.replicas),
                    span_s=trace.span_s, seed=args.seed, prefix=prefix_of(trace, args.block_tokens))
    served = run.status == SERVED
    ttft = np.where(served, run.first_token_s - trace.arrival_s, np.nan)
    e2e = np.where(served, run.finish_s - trace.arrival_s, np.nan)
    out = trace.output_tokens.astype(float)
    itl = np.where(served & (out > 1), (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    from cost.hardware.predict import _stats
    span = float(np.nanmax(np.where(served, run.finish_s, np.nan)) - trace.arrival_s.min()) if served.any() else 0
    data = {"capacity_source": capacity.source, "origin": origin, "replicas": args.replicas,
            "requests": len(trace), "served": int(served.sum()), "failed": int((~served).sum()),
            "predicted": {"ttft_ms": _stats(ttft), "itl_ms": _stats(itl), "e2e_ms": _stats(e2e)},
            "throughput": {"output_tok_s": round(float(out[served].sum() / span), 1) if span > 0 else None,
                           "requests_per_s": round(float(served.sum() / span), 3) if span > 0 else None},
            **({"prefix_cache": run.prefix_cache} if run.prefix_cache else {}),
            "preemptions": 0,
            "preemptions_note": "the simulator reserves each request's whole KV (prompt + answer) at admission, "
                                "so it never preempts: a request waits in the queue instead (the cautious side)",
            "mix": {"input_tokens": round(mean_in, 1), "output_tokens": round(mean_out, 1)},
            "capacity": capacity.to_json()}
    return data, render_predict


def render_predict(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{data['requests']:,} requests on {data['replicas']} replica(s): {data['capacity_source']}")
    for col in ("", "mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for key, label in (("ttft_ms", "TTFT ms"), ("itl_ms", "ITL ms"), ("e2e_ms", "E2E ms")):
        row = data["predicted"][key]
        t.add_row(label, *("—" if row[s] is None else f"{row[s]:,.1f}" for s in ("mean", "p50", "p90", "p99")))
    console = Console()
    console.print(t)
    tp = data["throughput"]
    console.print(f"served {data['served']:,}, failed {data['failed']:,}; {tp['output_tok_s'] or 0:,.0f} output tok/s, "
                  f"{tp['requests_per_s'] or 0:,.2f} req/s")
    hits = data.get("prefix_cache")
    if hits and hits["hit_rate"] is not None:
        console.print(f"prefix cache: {hits['hit_rate']:.1%} of {hits['queried_tokens']:,} prompt tokens served from it "
                      "(the trace's prompt blocks)")
