"""Capacity without a deployment: one replica's ``CapacityModel`` from a model's config and a
GPU's specs (``capacity_for``), and the latencies it gives a workload, run through the
simulator's own replica (``closed_loop``, ``burst``, ``open_loop``).

``capacity_for`` checks what vLLM would refuse at start-up (a TP that does not divide the heads,
more GPUs than the instance has, weights that do not fit, a context the KV cache cannot hold)
and says what would work instead; it never guesses past a refusal.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from cost.hardware import catalog, gpus as gpu_table
from cost.hardware.memory import VLLM_DEFAULTS_SOURCE, EngineFlags, plan_memory
from cost.hardware.roofline import efficiency, step_model
from cost.simulate.capacity import (CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS, CapacityModel, check_hit_rate,
                                    reuse_note)
from options.core import BadInput

DTYPES = ("auto", "bf16", "fp16", "fp8", "fp4", "int4")
KV_DTYPES = {"auto": 2, "bf16": 2, "fp16": 2, "fp8": 1}
TP_CHOICES = (1, 2, 4, 8)


class DoesNotFit(BadInput):
    """The model cannot start on this hardware; the message names the figures and what fits."""


def resolve_hardware(gpu: str | None, gpus: int | None, instance: str | None, tp: int | None):
    """(GpuSpec, GPUs available, TP, link, link GB/s, instance name or None) from the flags."""
    if (gpu is None) == (instance is None):
        raise BadInput("give the hardware as --gpu NAME [--gpus N] or as --instance TYPE (one of them)")
    if tp is not None and (not isinstance(tp, int) or tp < 1):
        raise BadInput(f"--tp {tp!r} must be a whole number >= 1")
    if instance is not None:
        if gpus is not None:
            raise BadInput(f"--gpus {gpus} goes with --gpu; --instance {instance} brings its own GPU count")
        inst = gpu_table.instance(instance)
        tp = inst.gpus if tp is None else tp
        if tp > inst.gpus:
            raise BadInput(f"--tp {tp} is more than the {inst.gpus} GPU(s) of {inst.name}: give --tp <= {inst.gpus} "
                           f"or an instance with {tp} GPUs")
        return inst.gpu, inst.gpus, tp, inst.link, inst.link_gb_s, inst.name
    spec = gpu_table.gpu(gpu)
    tp = tp or 1
    count = gpus if gpus is not None else tp
    if not isinstance(count, int) or count < 1:
        raise BadInput(f"--gpus {gpus!r} must be a whole number >= 1")
    if tp > count:
        raise BadInput(f"--tp {tp} is more than --gpus {count}: a tensor-parallel group needs that many GPUs")
    return spec, count, tp, spec.link, spec.link_gb_s, None


def check_tp(model, tp: int) -> None:
    """vLLM's own rule: the attention heads split evenly, and the KV heads either split evenly or
    each GPU keeps a copy of one."""
    if model.heads % tp:
        raise BadInput(f"--tp {tp} does not divide {model.name}'s {model.heads} attention heads: vLLM "
                       f"refuses it; give one of {', '.join(str(t) for t in TP_CHOICES if model.heads % t == 0)}")
    kv = model.kv_heads
    if not model.kv_lora_rank and (kv % tp if kv >= tp else tp % kv):
        raise BadInput(f"--tp {tp} does not divide {model.name}'s {kv} KV heads (nor do they divide it): vLLM "
                       f"refuses it; give one of {', '.join(str(t) for t in TP_CHOICES if (kv % t == 0 if kv >= t else t % kv == 0) and model.heads % t == 0)}")


def resolve_dtype(model, dtype: str) -> str:
    if dtype not in DTYPES:
        raise BadInput(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return (model.quantization or "bf16") if dtype == "auto" else dtype


def capacity_for(model: Any, gpu: str | None = None, gpus: int | None = None, instance: str | None = None,
                 tp: int | None = None, dtype: str = "auto", kv_dtype: str = "auto",
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.9,
                 input_tokens: float | None = None, output_tokens: float | None = None,
                 efficiency_override=None, prefix_cache_hit_rate: float = 0.0, async_scheduling: bool = True
                 ) -> tuple[CapacityModel, dict[str, Any]]:
    """One replica's capacity model and the figures behind it (``details``: model, hardware,
    memory, assumptions). Raises ``DoesNotFit`` (a BadInput: exit 2) when vLLM could not start.
    ``efficiency_override`` (an ``Efficiency``) replaces the shipped one: the calibration's fit.
    ``async_scheduling``: vLLM's default since 0.14.0 (False: an older vLLM, or
    ``--no-async-scheduling``)."""
    spec = model if isinstance(model, catalog.ModelSpec) else catalog.resolve(model)
    gpu_spec, count, tp, link, link_gb_s, inst = resolve_hardware(gpu, gpus, instance, tp)
    check_tp(spec, tp)
    weights_dtype = resolve_dtype(spec, dtype)
    if kv_dtype not in KV_DTYPES:
        raise BadInput(f"--kv-dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
    check_hit_rate(prefix_cache_hit_rate, "--prefix-cache-hit-rate")
    flags = EngineFlags(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
    mix_in = float(input_tokens) if input_tokens is not None else CHAT_INPUT_TOKENS
    mix_out = float(output_tokens) if output_tokens is not None else CHAT_OUTPUT_TOKENS
    plan = plan_memory(spec, gpu_spec, tp, weights_dtype, KV_DTYPES[kv_dtype], flags,
                       context_tokens=int(mix_in + mix_out) if spec.sliding_layers else None)
    where = f"{spec.name} ({weights_dtype}) on {tp}× {gpu_spec.name}" + (f" ({inst})" if inst else "")
    if not plan.fits:
        raise DoesNotFit(_not_fit_message(spec, where, plan, gpu_spec, tp, weights_dtype, kv_dtype, flags,
                                          count, inst))
    eff = efficiency_override or efficiency(gpu_spec.family)
    source = f"specs: {where}, {eff.source.split(':')[0]}" + reuse_note(prefix_cache_hit_rate)
    capacity, assumptions = step_model(spec, gpu_spec, tp, weights_dtype, plan, eff, link, link_gb_s,
                                       mix_in, source, prefix_cache_hit_rate)
    capacity = dataclasses.replace(capacity, async_scheduling=bool(async_scheduling))
    assumptions = [
        {"what": "model config", "value": f"{spec.name} ({spec.architecture})", "source": spec.source},
        {"what": "GPU", "value": f"{gpu_spec.label}: {gpu_spec.memory_gib:g} GiB, {gpu_spec.bandwidth_gb_s:,.0f} GB/s",
         "source": f"{gpu_spec.source} ({gpu_spec.as_of})"},
        {"what": "engine defaults", "value": f"max_num_seqs {plan.max_num_seqs}, max_num_batched_tokens "
                                            f"{plan.max_num_batched_tokens:,}, gpu_memory_utilization "
                                            f"{plan.utilization:g}", "source": VLLM_DEFAULTS_SOURCE},
        {"what": "KV cache", "value": f"{plan.kv_cache_tokens:,} tokens ({plan.kv_budget_gib:.2f} GiB a GPU at "
                                      f"{plan.kv_bytes_per_token:,.0f} bytes a token on each GPU)",
         "source": "vLLM's memory arithmetic (cost/hardware/memory.py): fitted on four logged KV sizes, within "
                   "2.1 % of eleven more (benchmarks/capacity-heldout, 'KV cache')"},
        *assumptions,
        {"what": "async scheduling" + ("" if async_scheduling else " off"),
         "value": ("each step is scheduled while the one before it runs: a request reaching a busy engine "
                   "joins one step later than a synchronous scheduler takes it" if async_scheduling else
                   "each step is scheduled when the one before it ends (vLLM before 0.14.0, or "
                   "--no-async-scheduling)"),
         "source": "vLLM's default since 0.14.0 (vllm/config/vllm.py; the engine loop's batch queue of two, "
                   "vllm/v1/engine/core.py step_with_batch_queue)"}]
    if plan.max_model_len_lowered_from:
        assumptions.append({"what": "max_model_len lowered so vLLM starts",
                            "value": f"{plan.max_model_len:,} (the model's own {plan.max_model_len_lowered_from:,} "
                                     "would not fit the KV cache: pass --max-model-len to choose)",
                            "source": "vLLM refuses a max_model_len the KV cache cannot hold one of"})
    details = {
        "model": {"name": spec.name, "params": spec.params(), "active_params": spec.active_params(),
                  "weights_gib": round(spec.weight_bytes(weights_dtype) / 2**30, 3), "dtype": weights_dtype,
                  "kv_dtype": kv_dtype, "kv_bytes_per_token": spec.kv_bytes_per_token(KV_DTYPES[kv_dtype])},
        "hardware": {"gpu": gpu_spec.name, "gpus": count, "tp": tp, "instance": inst,
                     "memory_gib": gpu_spec.memory_gib, "bandwidth_gb_s": gpu_spec.bandwidth_gb_s,
                     "tflops": gpu_spec.tflops, "link": link, "link_gb_s": link_gb_s,
                     "replicas": count // tp},
        "memory": plan.to_json(),
        "fits": True,
        "weights_gib": round(plan.weights_gib, 3),
        "kv_cache_tokens": plan.kv_cache_tokens,
        "max_concurrent_seqs": plan.max_concurrent_seqs(mix_in, mix_out),
        "mix": {"input_tokens": mix_in, "output_tokens": mix_out},
        "saturated_output_tok_s": round(capacity.saturated_output_tok_s(mix_in, mix_out), 1),
        "assumptions": assumptions,
    }
    return capacity, details


def _not_fit_message(spec, where, plan, gpu_spec, tp, dtype, kv_dtype, flags, count, inst) -> str:
    left = plan.gpu_total_gib * plan.utilization - plan.activation_gib - plan.non_torch_gib
    if plan.weights_fit:
        head = (f"{where}: the KV cache holds {plan.kv_cache_tokens:,} tokens, fewer than --max-model-len "
                f"{plan.max_model_len:,}; vLLM would refuse to start. Give --max-model-len <= "
                f"{plan.kv_cache_tokens:,}")
    else:
        head = (f"{where} does not fit: weights {plan.weights_gib:.1f} GiB per GPU, {left:.1f} GiB left per GPU "
                f"for weights and KV ({plan.gpu_total_gib:g} GiB × {plan.utilization:g} − activations "
                f"{plan.activation_gib:.1f} − non-torch {plan.non_torch_gib:.2f})")
    hints = smallest_fits(spec, gpu_spec, tp, dtype, kv_dtype, flags, count, inst)
    return head + (". What fits: " + "; ".join(hints) if hints else ". Nothing in the GPU table fits it")


def smallest_fits(spec, gpu_spec, tp, dtype, kv_dtype, flags, count, inst) -> list[str]:
    """The nearest ways out: a larger TP on this GPU, a smaller weight format, or the smallest
    instance (fewest GPUs, then cheapest GPU memory) that holds it."""
    def fits(g, t, d) -> bool:
        try:
            check_tp(spec, t)
        except BadInput:
            return False
        return plan_memory(spec, g, t, d, KV_DTYPES[kv_dtype], flags).fits

    hints = []
    for t in TP_CHOICES:
        if t > tp and fits(gpu_spec, t, dtype):
            hints.append(f"--tp {t} on {t}× {gpu_spec.name}" + (" (more GPUs than the instance has)"
                                                                 if inst and t > count else ""))
            break
    for d in ("fp8", "int4"):
        if d != dtype and fits(gpu_spec, tp, d):
            hints.append(f"--dtype {d} at TP {tp}")
            break
    for candidate in sorted(gpu_table.instances(), key=lambda i: (i.gpus, i.gpu.memory_gib)):
        if candidate.name != inst and fits(candidate.gpu, candidate.gpus, dtype):
            hints.append(f"--instance {candidate.name} ({candidate.gpus}× {candidate.gpu.name}, TP {candidate.gpus})")
            break
    return hints


# --- workloads through the simulator's replica -------------------------------------------------

def _stats(values_s: np.ndarray) -> dict[str, float | None]:
    values = values_s[~np.isnan(values_s)] * 1000
    if not len(values):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": round(float(values.mean()), 3), **{f"p{q}": round(float(np.percentile(values, q)), 3)
                                                        for q in (50, 90, 99)}}


def _summary(arrival, first, last, outputs, keep) -> dict[str, Any]:
    ttft = (first - arrival)[keep]
    e2e = (last - arrival)[keep]
    out = outputs[keep].astype(float)
    tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    span = float(last[keep].max() - arrival[keep].min()) if keep.any() else math.nan
    return {"ttft_ms": _stats(ttft), "tpot_ms": _stats(tpot), "e2e_ms": _stats(e2e),
            "output_tok_s": round(float(out.sum() / span), 1) if span > 0 else None,
            "requests": int(keep.sum())}


def _run(capacity: CapacityModel, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
         closed_concurrency: int | None = None, sessions: int | None = None):
    """Requests through one replica, as the client sees them: (sent, first token, last token).
    With ``closed_concurrency`` C, request i + C is sent when the client has request i's last
    token (closed loop), else at its ``arrival``. With ``sessions`` U, request i is user
    (i mod U)'s and waits for that user's previous answer: it is sent at its arrival or when
    request i − U ends, whichever is later, and its clock starts then (a chat user cannot send
    the next turn before the answer; a benchmark client's wait for it is in no latency). The
    request overhead (HTTP, tokenising) is added to both times, as the fleet adds it, so a
    closed loop sends its next request that much after the engine's last step; its
    ``frontend_request_s`` share the replica spends before its engine sees the request, one
    request at a time (the API server's event loop), so requests sent together (a burst, a
    closed loop's wave) reach the engine spread out."""
    import heapq

    from cost.simulate.replica import BatchingReplica

    n = len(inputs)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    overhead = capacity.outside_replica_s
    done: list[int] = []

    def on_finish(request: int, first_s: float, last_s: float) -> None:
        first[request], last[request] = first_s + overhead, last_s + overhead
        done.append(request)

    replica = BatchingReplica(capacity, inputs.tolist(), outputs.tolist(), on_finish)
    if closed_concurrency is None and sessions is None:
        for i in np.argsort(arrival, kind="stable"):
            at = float(arrival[i])
            replica.advance_to(at)
            replica.arrive(int(i), at)
        replica.advance_to(math.inf)
        return arrival, first, last
    if closed_concurrency is not None:
        sent_at = np.zeros(n)
        waiting = min(closed_concurrency, n)
    else:
        sent_at = np.asarray(arrival, dtype=float).copy()
        waiting = min(sessions, n)
    pending = [(float(sent_at[i]), i) for i in range(waiting)]     # (sent, request): a heap
    heapq.heapify(pending)
    sent = waiting                       # the closed loop's next request to send
    while len(done) < n:
        t = min(replica.next_boundary_s(), pending[0][0] if pending else math.inf)
        if math.isinf(t):
            raise RuntimeError("the replica went idle with requests outstanding")
        seen = len(done)
        replica.advance_to(t)
        while pending and pending[0][0] <= t:
            at, request = heapq.heappop(pending)
            replica.arrive(request, at)
        for request in sorted(done[seen:], key=lambda r: last[r]):
            # who may go now: the closed loop's next request, or this user's next turn
            follower = sent if closed_concurrency is not None else request + sessions
            sent += closed_concurrency is not None
            if follower < n:
                sent_at[follower] = max(sent_at[follower], last[request])
                heapq.heappush(pending, (float(sent_at[follower]), follower))
    return sent_at, first, last


def closed_loop(capacity: CapacityModel, concurrency: int, input_tokens: int, output_tokens: int,
                requests: int | None = None, steady_state: bool = True, answer_spread: float = 0.0,
                seed: int = 0) -> dict[str, Any]:
    """C requests of these sizes always in flight (a benchmark client at fixed concurrency).
    Queueing is included where the KV cache or ``max_num_seqs`` cannot hold C.

    ``steady_state`` (the default): the first and last C requests (ramp-up and drain) are left
    out of the figures, which then say what a server kept at C sees. ``steady_state=False``
    reports what a benchmark client reports: its ``requests`` sent from an empty server, every
    one counted. ``vllm bench serve --max-concurrency C --num-prompts N`` and AIPerf (whose
    profiling phase starts once its warmup has drained) both start C requests at once, so their
    mean TTFT carries that first wave's prefill queue (C prompts through the step's token
    budget) at a weight of C / N.

    ``answer_spread`` F draws each answer's length uniformly within ±F/2 of ``output_tokens``
    (same mean; seeded). Identical requests stay in step here: those that finish in one step come
    back together and are prefilled together, round after round. Servers measured with identical
    requests did not keep them so (benchmarks/capacity-heldout/README.md, "closed loops of
    identical requests"): their first tokens fell between this loop's and the same loop's with
    answers varied by a fifth, which breaks the groups up."""
    if not (isinstance(concurrency, int) and concurrency >= 1):
        raise BadInput(f"--concurrency {concurrency!r} must be a whole number >= 1")
    if requests is not None and not (isinstance(requests, int) and requests >= 1):
        raise BadInput(f"requests {requests!r} must be a whole number >= 1")
    if not (isinstance(answer_spread, (int, float)) and 0 <= answer_spread < 2):
        raise BadInput(f"answer spread {answer_spread!r} must lie from 0 to < 2 (a share of the answer's length)")
    n = requests or max(10 * concurrency, 200)
    inputs = np.full(n, int(input_tokens))
    outputs = np.full(n, max(1, int(output_tokens)))
    if answer_spread:
        half = answer_spread / 2
        outputs = np.random.default_rng(seed).integers(max(1, round(output_tokens * (1 - half))),
                                                       round(output_tokens * (1 + half)) + 1, n)
    arrival, first, last = _run(capacity, np.zeros(n), inputs, outputs, closed_concurrency=concurrency)
    keep = np.zeros(n, dtype=bool)
    if steady_state:
        keep[concurrency:max(concurrency + 1, n - concurrency)] = True
    else:
        keep[:] = True
    return _summary(arrival, first, last, outputs, keep)


def burst(capacity: CapacityModel, input_tokens, output_tokens) -> dict[str, Any]:
    """Every request sent at once (an offline batch, or a benchmark's 'all prompts at t = 0')."""
    inputs = np.asarray(input_tokens, dtype=int)
    outputs = np.maximum(1, np.asarray(output_tokens, dtype=int))
    arrival, first, last = _run(capacity, np.zeros(len(inputs)), inputs, outputs)
    return _summary(arrival, first, last, outputs, np.ones(len(inputs), dtype=bool))


def open_loop(capacity: CapacityModel, rate_per_s: float, input_tokens, output_tokens, requests: int = 1000,
              seed: int = 0, sessions: int | None = None) -> dict[str, Any]:
    """Poisson arrivals at ``rate_per_s``; sizes fixed (numbers) or drawn in turn (sequences).
    ``sessions`` U: the requests are U users' turns in rotation, each sent no sooner than its
    user's previous answer (``_run``), so at most U are ever at the server and a rate above what
    it serves waits at the client, in no latency: a chat front end's users, or a benchmark
    client's multi-turn sessions (inference-perf's ``enable_multi_turn_chat``)."""
    if sessions is not None and not (isinstance(sessions, int) and not isinstance(sessions, bool) and sessions >= 1):
        raise BadInput(f"sessions {sessions!r} must be a whole number >= 1 (users, each with one request at a time)")
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, requests))
    inputs = np.resize(np.asarray(input_tokens, dtype=int), requests)
    outputs = np.maximum(1, np.resize(np.asarray(output_tokens, dtype=int), requests))
    arrival, first, last = _run(capacity, arrival, inputs, outputs, sessions=sessions)
    return _summary(arrival, first, last, outputs, np.ones(requests, dtype=bool))
