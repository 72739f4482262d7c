"""Step times from first principles: a model's weights, KV and FLOPs on a GPU's bandwidth, FLOP/s
and links, as the same ``CapacityModel`` a bench fit gives the simulator.

One engine step of a continuous batch (``cost.simulate.capacity``'s semantics), per GPU of a
tensor-parallel group of ``tp``:

- weight matmuls: the longer of reading the weights (dense layers, lm_head, and of a MoE's routed
  experts the share the step's tokens touch) at the achieved bandwidth, and computing
  2 FLOPs a weight a token at the achieved matmul rate (``CapacityModel.gemm_s``). The lm_head
  runs only for the sequences sampled (one token a sequence), not for every prompt token;
- attention: decode reads every KV token the batch holds (``step_per_kv_token_s``); prefill
  spends ``4 · heads · head_dim`` FLOPs a layer per prompt token per token it attends, charged at
  the mix's mean context (half the prompt) per prompt token (``prefill_per_token_s``);
- tensor parallelism: two all-reduces a layer of the step's hidden states, each a latency
  (``allreduce_s``, by link) and ``2 (tp − 1) / tp`` of the payload over the link;
- fixed costs: per layer a step (norms, rotary, kernel gaps CUDA graphs leave), per step
  (scheduler, input preparation), per sequence a step (sampling, bookkeeping), per request
  (HTTP, tokenising: ``request_overhead_s``), of which the API server spends
  ``frontend_request_s`` on each request in turn (one event loop).

The achieved fractions and fixed costs are ``Efficiency``, per GPU family, read from the dated
file ``data/efficiency-*.json`` where each is stated with the public measurement it was fitted on
(``benchmarks/capacity-calibration/``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from cost.simulate.capacity import CapacityModel
from options.core import BadInput

DATA = Path(__file__).parent / "data"
ACTIVATION_BYTES = 2            # bf16 hidden states crossing the all-reduce
# Matmul dtypes vLLM runs with both operands in the weight's format where the GPU has the
# instructions; elsewhere it dequantises in the kernel (Marlin) and multiplies in 16 bits.
SIXTEEN_BIT = ("bf16", "fp16")


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of a GPU family's peaks, and the fixed costs a roofline leaves out."""
    family: str
    bandwidth: float          # of peak memory bandwidth, streaming weights and KV
    gemm: float               # of dense peak FLOP/s, the weight matmuls of a large step
    attention: float          # of dense peak FLOP/s, prefill attention
    weight_only_gemm: float   # a weight-only quantised kernel's matmul rate relative to ``gemm``
    moe_gemm: float           # routed experts' grouped matmuls (few tokens an expert): their share of the
                              # matmul rate a dense layer reaches. Their weights stream at ``bandwidth``
                              # like a dense layer's: the public small-batch MoE decode checks
                              # (benchmarks/capacity-calibration/points.json ``checks``) say so
    kv_bandwidth: float       # paged attention's reads of the KV cache relative to ``bandwidth``
    layer_s: float            # per layer, per step
    step_s: float             # per step
    seq_s: float              # per sequence, per step
    request_s: float          # per request, outside steps
    allreduce_s: dict         # latency of one all-reduce, by link ("nvlink", "pcie")
    link: float               # of the link's bandwidth, all-reduce payloads
    source: str
    frontend_request_s: float = 0.0   # of request_s, spent one request at a time on the API server's event loop
    # The fused-MoE kernels' time beyond their routed experts' bytes and FLOPs, fitted per family on
    # public kernel timings (benchmarks/capacity-calibration/moe-kernels.json): a floor per MoE
    # layer a step, and a cost per expert the step's tokens touch (a tile pipeline to fill).
    moe_layer_s: float = 0.0
    moe_expert_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@lru_cache(maxsize=None)
def efficiency_table() -> dict:
    """The newest ``data/efficiency-YYYY-MM-DD.json``: per family, with sources."""
    files = sorted(DATA.glob("efficiency-*.json"))
    if not files:
        raise BadInput(f"no efficiency table under {DATA}")
    doc = json.loads(files[-1].read_text())
    doc["file"] = files[-1].name
    return doc


# Fixed costs a family's entry may set for itself (the rest are shared by every family): a GPU
# generation's kernels and their gaps differ, and the fused-MoE terms are fitted per family.
FAMILY_FIXED_COSTS = ("layer_s", "seq_s", "moe_layer_s", "moe_expert_s")


def efficiency(family: str) -> Efficiency:
    """The family's efficiencies: its own shares of peak, the shared fixed costs unless its entry
    sets them (``FAMILY_FIXED_COSTS``). A family without its own throughput measurements borrows
    the shares of the one its entry names (``same_as``) and says so in ``source``."""
    doc = efficiency_table()
    families = doc["families"]
    if family not in families:
        raise BadInput(f"no efficiencies for GPU family {family!r}: known {', '.join(sorted(families))}")
    entry = dict(families[family])
    note = ""
    if "same_as" in entry:
        base = entry.pop("same_as")
        note = f"{family}'s shares of peak are {base}'s ({entry.pop('why', '')})"
        entry = {**families[base], **entry}
    shared = doc["shared"]
    # The MoE kernel terms default to 0 (a table from before they were fitted); the others are required.
    fixed = {k: entry.get(k, shared.get(k, 0.0) if k.startswith("moe_") else shared[k]) for k in FAMILY_FIXED_COSTS}
    return Efficiency(family=family, bandwidth=entry["bandwidth"], gemm=entry["gemm"],
                      attention=entry["gemm"] * shared["attention_of_gemm"],
                      weight_only_gemm=shared["weight_only_gemm"], moe_gemm=shared["moe_gemm"],
                      kv_bandwidth=shared["kv_bandwidth"], step_s=shared["step_s"], request_s=shared["request_s"],
                      allreduce_s=dict(shared["allreduce_s"]), link=shared["link"],
                      frontend_request_s=shared.get("frontend_request_s", 0.0), **fixed,
                      source=(note + "; " if note else "") + f"{doc['file']}: {entry.get('source', '')}")


def matmul_dtype(gpu, dtype: str) -> tuple[str, bool]:
    """(the dtype the matmuls run in, whether the weights are dequantised in the kernel).

    FP8 and NVFP4 ("fp4") weights run native matmuls where the GPU has them (vLLM quantizes the
    activations too). MXFP4 (gpt-oss's experts) does not, on any GPU: vLLM's MXFP4 MoE backends
    keep 16-bit activations unless told otherwise (quantization/mxfp4.py ``get_mxfp4_backend``,
    then fused_moe/oracle/mxfp4.py ``select_mxfp4_moe_backend``: Marlin or Triton on Hopper,
    FlashInfer's TRT-LLM BF16×MXFP4 on B200; FP8 activations only with
    ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8``). Later oracles may prefer FP8 activations on B200
    (AIConfigurator's collector notes it for 0.24.0's DeepSeek-V4 path); not modelled. INT4 is
    weight-only (AWQ/GPTQ's W4A16) everywhere."""
    if dtype in SIXTEEN_BIT:
        return dtype, False
    native = {"fp8": "fp8", "fp4": "fp4", "mxfp4": None, "int4": None}[dtype]
    if native and gpu.native(native):
        return native, False
    return "bf16", True


def achieved_rates(gpu, dtype: str, eff: Efficiency) -> tuple[float, float]:
    """(FLOP/s the weight matmuls reach, bytes/s weights stream at) on this GPU with ``dtype`` weights."""
    compute_dtype, weight_only = matmul_dtype(gpu, dtype)
    gemm_rate = gpu.peak_flops(compute_dtype) * eff.gemm * (eff.weight_only_gemm if weight_only else 1.0)
    return gemm_rate, gpu.bandwidth_gb_s * 1e9 * eff.bandwidth


def step_model(model, gpu, tp: int, dtype: str, plan, eff: Efficiency, link: str, link_gb_s: float,
               mean_prompt_tokens: float, source: str, prefix_cache_hit_rate: float = 0.0
               ) -> tuple[CapacityModel, list[dict]]:
    """The ``CapacityModel`` of one replica (``tp`` GPUs) and the assumptions it rests on. With a
    ``prefix_cache_hit_rate`` the prompt tokens computed are its tail, whose attention reads the
    cached head too."""
    if dtype == "fp4" and model.quantization == "mxfp4":
        dtype = "mxfp4"                      # fp4 on an MXFP4 checkpoint is the checkpoint's own
    compute_dtype, weight_only = matmul_dtype(gpu, dtype)
    peak = gpu.peak_flops(compute_dtype)
    gemm_rate, bandwidth = achieved_rates(gpu, dtype, eff)
    attention_rate = gpu.peak_flops("bf16") * eff.attention
    parts = model.part_bytes(dtype)
    lm_head_params = model.vocab * model.hidden
    # Read every step: all but the embedding lookup (t rows) and the routed experts; a tied
    # lm_head is the embedding matrix, read for the logits.
    read_dense = sum(v for k, v in parts.items() if k not in ("embedding", "experts"))
    if model.tied_embeddings:
        read_dense += parts["embedding"]
    # Matmul time a token: dense weights at the matmul rate, its routed experts' share slower
    # (grouped GEMMs of a few tokens an expert).
    counts = model.parts()
    routed_active = (counts["experts"] * model.experts_per_token / model.experts) if model.experts else 0.0
    matmul_s = (2 * (model.linear_params_per_token() - lm_head_params - routed_active) / gemm_rate
                + 2 * routed_active / (gemm_rate * eff.moe_gemm))
    allreduce_payload = 0.0
    allreduce_latency = 0.0
    if tp > 1:
        per_token = ACTIVATION_BYTES * model.hidden * 2 * (tp - 1) / tp / (link_gb_s * 1e9 * eff.link)
        allreduce_payload = 2 * model.layers * per_token
        allreduce_latency = 2 * model.layers * eff.allreduce_s[link]
    frontend_s = min(eff.frontend_request_s, eff.request_s)     # a share of the request's overhead
    # A computed prompt token attends over what precedes it: the cached head, then half the rest.
    context = max(1.0, mean_prompt_tokens * (1 + prefix_cache_hit_rate) / 2)
    prefill_attention = (model.attention_flops_per_token_per_context(int(context), prefill=True) * context
                         / tp / attention_rate)
    capacity = CapacityModel(
        step_base_s=(model.layers * eff.layer_s + model.moe_layers * eff.moe_layer_s + eff.step_s
                     + allreduce_latency),
        step_per_seq_s=eff.seq_s + 2 * lm_head_params / tp / gemm_rate + allreduce_payload,
        step_per_kv_token_s=plan.kv_bytes_per_token / (bandwidth * eff.kv_bandwidth),
        prefill_per_token_s=prefill_attention + allreduce_payload,
        request_overhead_s=eff.request_s, frontend_request_s=frontend_s,
        max_num_seqs=plan.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
        kv_cache_tokens=max(1, plan.kv_cache_tokens), max_model_len=plan.max_model_len,
        gemm_per_token_s=matmul_s / tp,
        weights_read_s=read_dense / tp / bandwidth,
        experts_read_s=parts.get("experts", 0) / tp / bandwidth,
        experts_touch_s=model.moe_layers * model.experts * eff.moe_expert_s,
        experts=model.experts, experts_per_token=model.experts_per_token,
        prefix_cache_hit_rate=prefix_cache_hit_rate, source=source)
    assumptions = [
        {"what": f"matmuls in {compute_dtype}" + (f" with {dtype} weights dequantised in the kernel "
                                                  f"(vLLM's weight-only path for {dtype} on this GPU)"
                                                  if weight_only else ""),
         "value": f"{peak / 1e12:,.0f} TFLOP/s dense peak × {eff.gemm:.2f}"
                  + (f" × {eff.weight_only_gemm:.2f} (weight-only)" if weight_only else ""),
         "source": f"{gpu.source}; efficiency: {eff.source}"},
        {"what": "memory bandwidth achieved streaming weights, and reading the KV cache",
         "value": f"{gpu.bandwidth_gb_s:,.0f} GB/s × {eff.bandwidth:.2f}, KV × {eff.kv_bandwidth:.2f} of that",
         "source": eff.source},
        {"what": "fixed costs: per layer a step, per step, per sequence a step, per request",
         "value": f"{eff.layer_s * 1e6:.1f} µs, {eff.step_s * 1e3:.2f} ms, {eff.seq_s * 1e6:.1f} µs, "
                  f"{eff.request_s * 1e3:.1f} ms", "source": eff.source},
        {"what": "the front end takes requests one at a time (vLLM's API server: one event loop)",
         "value": f"{frontend_s * 1e3:.1f} ms of the {eff.request_s * 1e3:.1f} ms "
                  "a request", "source": eff.source},
        {"what": "prefill attention charged at the mix's mean context (half the mean prompt"
                 + (", after its cached head)" if prefix_cache_hit_rate else ")"),
         "value": f"{context:,.0f} tokens at {eff.attention:.2f} of the 16-bit peak",
         "source": "FlashAttention's FLOP count, 4·heads·head_dim a layer per token pair"},
    ]
    if prefix_cache_hit_rate:
        assumptions.append({
            "what": "vLLM's prefix cache serves a share of every prompt (--prefix-cache-hit-rate): those "
                    "tokens take no prefill compute or step budget, but stay in the request's KV",
            "value": f"{prefix_cache_hit_rate:.1%} of prompt tokens",
            "source": "given by the user (vLLM reports it: prefix_cache_hits / prefix_cache_queries); automatic "
                      "prefix caching is on by default in vLLM's V1 engine"})
    if tp > 1:
        assumptions.append({"what": f"tensor parallelism over {link}: 2 all-reduces a layer",
                            "value": f"{eff.allreduce_s[link] * 1e6:.0f} µs each + payload at "
                                     f"{link_gb_s:,.0f} GB/s × {eff.link:.2f}",
                            "source": f"{gpu.source}; {eff.source}"})
    if dtype == "mxfp4" and gpu.family == "blackwell":
        assumptions.append({
            "what": "MXFP4 experts with 16-bit activations, vLLM's default on Blackwell; vLLM's gpt-oss recipe sets "
                    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (FP8 activations), not modelled",
            "value": "under that recipe InferenceX measured gpt-oss-120b's TPOT at 0.73 of this model's (median of "
                     "112 closed loops on B200, vLLM 0.11.2 and 0.13.0)",
            "source": "vllm-project/recipes OpenAI/GPT-OSS.md; benchmarks/capacity-inferencex/README.md"})
    if model.experts:
        assumptions.append({"what": "MoE: a step reads the routed experts its tokens touch; their matmuls run "
                                    "as grouped GEMMs",
                            "value": f"1 − (1 − {model.experts_per_token}/{model.experts})^tokens of "
                                     f"{parts.get('experts', 0) / 2**30:,.1f} GiB, uniform routing, read at the dense "
                                     f"layers' bandwidth; expert matmuls at {eff.moe_gemm:.2f} of the dense rate",
                            "source": "expected distinct experts under uniform top-k routing; the read rate "
                                      "checked on public small-batch MoE decode (benchmarks/capacity-calibration/"
                                      "points.json checks)"})
        assumptions.append({"what": "MoE: the fused-MoE kernels' time beyond bytes and FLOPs",
                            "value": f"{eff.moe_layer_s * 1e6:.1f} µs a MoE layer a step + "
                                     f"{eff.moe_expert_s * 1e6:.2f} µs an expert touched "
                                     f"({model.moe_layers} MoE layers of {model.experts} experts)",
                            "source": f"{efficiency_table()['file']}: fitted per GPU family on public fused-MoE "
                                      "kernel timings (vLLM and SGLang pull requests: benchmarks/capacity-calibration/"
                                      "moe-kernels.json); a family without them borrows the one its entry names"})
    return capacity, assumptions


def routed_experts_layer_s(gpu, dtype: str, eff: Efficiency, experts: int, experts_per_token: int, hidden: int,
                           intermediate: int, tokens: int, mlp_matrices: int = 3) -> float:
    """One MoE layer's routed experts on one GPU in a step of ``tokens`` tokens, with the terms
    ``step_model`` gives every MoE layer (which it sums with the dense layers' before the
    roofline's max): the longer of reading the experts the tokens touch and their grouped
    matmuls, plus the kernels' floor and per-expert cost. ``intermediate`` is the GPU's share of
    an expert's width (vLLM's fused-MoE ``N``). What the public fused-MoE kernel timings are
    compared with (benchmarks/capacity-calibration/moe-kernels.json)."""
    from cost.hardware.catalog import bytes_per_weight
    from cost.simulate.capacity import experts_touched

    gemm_rate, bandwidth = achieved_rates(gpu, dtype, eff)
    params = mlp_matrices * hidden * intermediate
    touched = experts * experts_touched(experts, experts_per_token, tokens)
    read = touched * params * bytes_per_weight(dtype) / bandwidth
    matmuls = 2 * tokens * experts_per_token * params / (gemm_rate * eff.moe_gemm)
    return max(read, matmuls) + eff.moe_layer_s + touched * eff.moe_expert_s
