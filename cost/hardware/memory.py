"""vLLM's memory arithmetic: what is left for the KV cache on each GPU, and so how many tokens
and sequences one replica holds.

vLLM (V1 engine) profiles one forward pass of ``max_num_batched_tokens`` dummy tokens at start-up
and gives the KV cache what remains of ``gpu_memory_utilization`` × the GPU's memory:

    KV budget = total × utilization − weights/TP − peak activation − non-torch memory
    tokens    = ⌊budget / (block_size × KV bytes a token holds on one GPU)⌋ × block_size

- total: what CUDA reports for the device (``GpuSpec.memory_gib``), not the nominal GB;
- peak activation: the profile's own peak above the weights: the sampler's logits
  (``max_num_seqs`` × vocabulary × 4 bytes, fp32, as vLLM's dummy sampler run allocates them)
  and a cost per batched token (``ACTIVATION_GIB_PER_BATCHED_TOKEN``) fitted on the four KV sizes
  vLLM logged on an H100 at 2,048 batched tokens (``LOGGED_KV_SIZES``, FACTS §13). What those
  leave above the weights, the KV cache, the logits and non-torch memory is 0.16-0.21 GiB for
  7B to 70B models alike (it does not follow hidden or MLP widths), so one figure a token;
- non-torch memory: the CUDA context, NCCL buffers and cuBLAS workspaces outside torch's
  allocator: ~0.15 GiB on one GPU, ~0.6 GiB with tensor parallelism (FACTS §13);
- CUDA-graph memory is captured after the profile, outside the budget (vLLM PR #21489): it
  comes out of the 1 − utilization headroom, not the KV cache.

With that the four logged sizes come back within 0.2 % (tests/cost/test_hardware_capacity.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from options.core import BadInput

GIB = 1024 ** 3
BLOCK_SIZE = 16                          # vLLM's default KV block on CUDA
# Fitted on LOGGED_KV_SIZES (see the module docstring): their mean, 0.178 GiB at 2,048 batched
# tokens once the logits and non-torch memory are taken off (0.162, 0.171, 0.206, 0.172).
ACTIVATION_GIB_PER_BATCHED_TOKEN = 0.178 / 2048
NON_TORCH_GIB = {"single": 0.15, "tensor_parallel": 0.6}
SAMPLER_LOGIT_BYTES = 4                  # fp32 logits of the dummy sampler run

# vLLM's logged "GPU KV cache size" on an H100 80 GB (v0.15.1, gpu_memory_utilization 0.9,
# max_num_batched_tokens 2,048, bf16 weights and KV): the calibration of this module.
LOGGED_KV_SIZES = (
    {"model": "meta-llama/Llama-2-7b-hf", "gpu": "h100", "tp": 1, "kv_cache_tokens": 119_408},
    {"model": "meta-llama/Llama-2-70b-hf", "gpu": "h100", "tp": 4, "kv_cache_tokens": 501_712},
    {"model": "mistralai/Mixtral-8x7B-v0.1", "gpu": "h100", "tp": 2, "kv_cache_tokens": 440_176},
    {"model": "codellama/CodeLlama-34b-hf", "gpu": "h100", "tp": 2, "kv_cache_tokens": 425_648},
)
LOGGED_SOURCE = ("vLLM's start-up log line 'GPU KV cache size: N tokens' on H100 80 GB, v0.15.1, "
                 "utilization 0.9, max_num_batched_tokens 2048 (FACTS §13)")

# vLLM's OpenAI-server defaults by GPU (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults,
# read from vLLM 0.32.0; the same table since 0.10): the largest GPUs batch the most, and an A100
# stays small (vLLM PR #17885: larger batches cost it throughput).
VLLM_DEFAULTS_SOURCE = ("vLLM 0.32.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, OpenAI server "
                        "(unchanged since 0.10)")
BATCH_DEFAULTS = (   # (least CUDA memory in GiB, A100 excluded?, defaults)
    (160, False, {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}),
    (70, True, {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}),
    (0, False, {"max_num_seqs": 256, "max_num_batched_tokens": 2048}),
)


@dataclass(frozen=True)
class EngineFlags:
    """The vLLM flags the arithmetic depends on; None = vLLM's default for that GPU."""
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.gpu_memory_utilization, (int, float)) and 0 < self.gpu_memory_utilization <= 1):
            raise BadInput(f"--gpu-memory-utilization {self.gpu_memory_utilization!r} must be in (0, 1] "
                           "(vLLM's default is 0.9)")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise BadInput(f"--{name.replace('_', '-')} {value!r} must be a whole number >= 1")


def engine_defaults(gpu) -> dict[str, int]:
    """vLLM's defaults for ``max_num_seqs`` and ``max_num_batched_tokens`` on this GPU."""
    for least_gib, not_a100, defaults in BATCH_DEFAULTS:
        if gpu.memory_gib >= least_gib and not (not_a100 and gpu.name.startswith("a100")):
            return dict(defaults)
    raise AssertionError("the last row takes every GPU")


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's memory under vLLM, and what the KV cache holds across the replica."""
    gpu_total_gib: float
    utilization: float
    weights_gib: float              # per GPU (weights / TP)
    activation_gib: float
    non_torch_gib: float
    kv_budget_gib: float            # per GPU; negative when the weights do not fit
    kv_bytes_per_token: float       # per GPU
    kv_cache_tokens: int            # per replica (each GPU holds its share of every token)
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    max_model_len_lowered_from: int | None   # the model's own context, when it was cut to fit the cache

    @property
    def weights_fit(self) -> bool:
        return self.kv_budget_gib > 0 and self.kv_cache_tokens >= BLOCK_SIZE

    @property
    def fits(self) -> bool:
        """vLLM starts: the weights fit and the cache holds one sequence of ``max_model_len``."""
        return self.weights_fit and self.kv_cache_tokens >= self.max_model_len

    def max_concurrent_seqs(self, input_tokens: float, output_tokens: float) -> int:
        """Sequences running at once at this mix: the KV cache's share per sequence, or max_num_seqs."""
        per_seq = max(1.0, float(input_tokens) + float(output_tokens))
        return int(min(self.max_num_seqs, self.kv_cache_tokens // per_seq))

    def to_json(self) -> dict:
        return {**asdict(self), "fits": self.fits}


def plan_memory(model, gpu, tp: int, dtype: str, kv_dtype_bytes: float, flags: EngineFlags,
                context_tokens: int | None = None) -> MemoryPlan:
    """The memory plan of ``model`` on ``tp`` GPUs of ``gpu`` (see the module docstring).

    ``context_tokens`` is the sequence length sliding-window layers are charged at (they keep at
    most their window); None charges them as full layers. A ``max_model_len`` not given is the
    model's own context, cut to what the cache holds when it holds less (vLLM refuses to start
    otherwise; the plan says so in ``max_model_len_lowered_from``)."""
    defaults = engine_defaults(gpu)
    seqs = flags.max_num_seqs or defaults["max_num_seqs"]
    batched = flags.max_num_batched_tokens or defaults["max_num_batched_tokens"]
    total = gpu.memory_gib
    weights = model.weight_bytes(dtype) / tp / GIB
    activation = batched * ACTIVATION_GIB_PER_BATCHED_TOKEN + seqs * model.vocab * SAMPLER_LOGIT_BYTES / GIB
    non_torch = NON_TORCH_GIB["tensor_parallel" if tp > 1 else "single"]
    budget = total * flags.gpu_memory_utilization - weights - activation - non_torch
    per_token = kv_bytes_per_gpu(model, tp, kv_dtype_bytes, context_tokens)
    blocks = max(0, math.floor(budget * GIB / (BLOCK_SIZE * per_token))) if budget > 0 else 0
    tokens = blocks * BLOCK_SIZE
    own = model.max_position_embeddings
    if flags.max_model_len is not None:
        max_len, lowered = flags.max_model_len, None
    elif tokens < own:
        # vLLM refuses a context the cache cannot hold; a user lowers --max-model-len to it.
        max_len = max(BLOCK_SIZE, tokens // 1024 * 1024 or tokens)
        lowered = own
    else:
        max_len, lowered = own, None
    return MemoryPlan(gpu_total_gib=total, utilization=flags.gpu_memory_utilization, weights_gib=weights,
                      activation_gib=activation, non_torch_gib=non_torch, kv_budget_gib=budget,
                      kv_bytes_per_token=per_token, kv_cache_tokens=tokens, max_num_seqs=seqs,
                      max_num_batched_tokens=batched, max_model_len=max_len, max_model_len_lowered_from=lowered)


def kv_bytes_per_gpu(model, tp: int, kv_dtype_bytes: float, context_tokens: int | None = None) -> float:
    """KV bytes one token holds on one GPU: attention heads split over TP (a KV head is never
    split: with fewer KV heads than GPUs each GPU keeps a copy of one), MLA's latent KV kept
    whole on every GPU (vLLM replicates it)."""
    whole = model.kv_bytes_per_token(kv_dtype_bytes, context_tokens)
    if model.kv_lora_rank:
        return whole
    share = max(1, model.kv_heads // tp) / model.kv_heads if model.kv_heads < tp else 1 / tp
    return whole * share
