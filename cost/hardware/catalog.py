"""The model catalog: the architecture facts of open-weight models, read from their Hugging Face
``config.json``, and the arithmetic a capacity-from-specs estimate needs from them: parameter
counts (total, active per token, per part), weight bytes in a given format, KV-cache bytes per
token and attention FLOPs per token of context.

The facts live in ``data/models-YYYY-MM-DD.json`` (data, not code), one entry per architecture with
the config.json it came from and the date it was checked; ``resolve`` also takes a Bedrock model id
(mapped to its open weights) or a path to any config.json, so a model outside the catalog needs
no code change. Pure standard library: the CLI imports this on start-up.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path

from cost.prices import strip_profile_prefix
from options.core import BadInput

DATA_DIR = Path(__file__).resolve().parent / "data"
CATALOG_PATTERN = re.compile(r"^models-\d{4}-\d{2}-\d{2}\.json$")

# Bytes one weight of a linear layer takes in each format, its scales included (the group or block
# size is the format's default; a checkpoint that states its own, e.g. int4 with group 32, overrides
# it through ``quant_group_size``):
# - 16-bit: 2 bytes.
# - fp8 / int8: 1 byte. Their per-tensor, per-channel or 128x128-block fp32 scales add < 0.03 %
#   (4 bytes per 16,384 weights for DeepSeek's blocks) and are left out.
# - int4 (AWQ, GPTQ, compressed-tensors int4): 4 bits plus one 16-bit scale per group of 128
#   weights, AWQ's and GPTQ's default group size (vLLM's AWQ/GPTQ docs; AutoAWQ q_group_size=128).
#   Asymmetric schemes also store a 4-bit zero point per group (+0.4 %), left out.
# - mxfp4: 4 bits plus one 8-bit (E8M0) scale per block of 32, the OCP Microscaling (MX) v1.0 spec.
# - nvfp4: 4 bits plus one FP8 (E4M3) scale per block of 16 (NVIDIA's NVFP4; its per-tensor fp32
#   scale is negligible).
_FORMATS = {               # format: (bits per weight, default group, scale bytes per group)
    "bf16": (16, 0, 0), "fp16": (16, 0, 0),
    "fp8": (8, 0, 0), "int8": (8, 0, 0),
    "int4": (4, 128, 2), "mxfp4": (4, 32, 1), "nvfp4": (4, 16, 1),
}
# weight_bytes(dtype) names → format; "fp4" is mxfp4 unless the checkpoint itself is nvfp4.
_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "int4": "int4",
           "fp4": "mxfp4", "mxfp4": "mxfp4", "nvfp4": "nvfp4"}
# Families whose MLP is two matrices (up, down) rather than gated (gate, up, down).
_PLAIN_MLP_TYPES = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2",
                    "gpt_bigcode", "mpt"}
_SLIDING_LAYER_TYPES = {"sliding_attention", "chunked_attention", "local_attention"}


def _bytes_per_weight(fmt: str, group: int = 0) -> float:
    bits, default_group, scale_bytes = _FORMATS[fmt]
    group = group or default_group
    return bits / 8 + (scale_bytes / group if group else 0.0)


def bytes_per_weight(dtype: str) -> float:
    """Bytes a weight of this dtype (a ``part_bytes`` name) takes at its format's default group."""
    key = str(dtype).lower()
    if key not in _DTYPES:
        raise BadInput(f"weight dtype {dtype!r} is not one of {', '.join(sorted(_DTYPES))}")
    return _bytes_per_weight(_DTYPES[key])


@dataclass(frozen=True)
class ModelSpec:
    """One architecture's facts, as its config.json states them. Parameter counts leave out
    biases (Qwen2's QKV and gpt-oss's biases are < 0.01 % of the weights) and count norms as
    2 × hidden a layer plus the final one (q/k norms, Gemma's extra norms: < 0.01 %)."""
    name: str                 # canonical Hugging Face id, e.g. "meta-llama/Llama-3.1-8B-Instruct"
    architecture: str         # config's architectures[0]
    source: str               # where the facts come from: the config.json URL + date checked
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int         # dense MLP width (for layers without MoE)
    vocab: int
    tied_embeddings: bool
    max_position_embeddings: int
    mlp_matrices: int = 3     # 3 for gated (SwiGLU/GeGLU), 2 for a plain MLP
    sliding_window: int | None = None
    sliding_layers: int = 0   # how many layers use windowed (or chunked) attention
    experts: int = 0          # routed experts per MoE layer (0: dense model)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    shared_expert_intermediate: int = 0
    moe_layers: int = 0       # layers whose MLP is MoE (others dense with `intermediate`)
    kv_lora_rank: int = 0     # MLA (DeepSeek-V3 style): latent KV width; 0 = ordinary attention
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    quantization: str | None = None   # the checkpoint's own weight format when not 16-bit: "fp8", "mxfp4", "int4", ...
    aliases: tuple[str, ...] = ()     # other accepted names (base/instruct of one architecture, short names)
    # Where the checkpoint's own format differs from the defaults above (additions to the agreed
    # interface, both optional): the group size of its scales (0: the format's default), and which
    # weights it quantizes: "linear" (attention, dense MLPs, experts; vLLM's fp8/AWQ/GPTQ) or
    # "experts" (routed experts only: gpt-oss's mxfp4, Kimi-K2.5's int4).
    quant_group_size: int = 0
    quantized_parts: str = "linear"

    def __post_init__(self) -> None:
        problems = []
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim, self.vocab) <= 0:
            problems.append("layers, hidden, heads, kv_heads, head_dim and vocab must be positive")
        if not 0 <= self.moe_layers <= self.layers or not 0 <= self.sliding_layers <= self.layers:
            problems.append("moe_layers and sliding_layers must lie in 0..layers")
        if self.experts and not (0 < self.experts_per_token <= self.experts and self.moe_layers
                                 and self.expert_intermediate):
            problems.append("an MoE needs experts_per_token in 1..experts, moe_layers and expert_intermediate")
        if not self.experts and (self.moe_layers or self.experts_per_token):
            problems.append("moe_layers/experts_per_token without experts")
        if self.moe_layers < self.layers and self.intermediate <= 0:
            problems.append("dense layers need intermediate > 0")
        if self.sliding_layers and not self.sliding_window:
            problems.append("sliding_layers without a sliding_window")
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            problems.append("MLA needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        if self.quantization is not None and self.quantization not in _FORMATS:
            problems.append(f"quantization {self.quantization!r} is not one of {sorted(_FORMATS)}")
        if self.quantized_parts not in ("linear", "experts"):
            problems.append("quantized_parts must be 'linear' or 'experts'")
        if self.mlp_matrices not in (2, 3):
            problems.append("mlp_matrices must be 2 or 3")
        if problems:
            raise BadInput(f"model {self.name!r} ({self.source}): " + "; ".join(problems))

    # --- parameters ----------------------------------------------------------------------------

    def _attention_per_layer(self) -> int:
        h = self.hidden
        if self.kv_lora_rank:     # MLA: low-rank Q (when q_lora_rank), a shared latent KV, up-projections
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.heads * qk if self.q_lora_rank
                 else h * self.heads * qk)
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + self.heads * self.v_head_dim * h
        q_out = self.heads * self.head_dim
        return 2 * h * q_out + 2 * h * self.kv_heads * self.head_dim      # q, o; k, v

    def expert_params(self) -> int:
        """One routed expert's parameters in one layer (0 for a dense model)."""
        return self.mlp_matrices * self.hidden * self.expert_intermediate if self.experts else 0

    def parts(self) -> dict[str, int]:
        """Parameter counts by part: embedding, lm_head (0 when tied to the embedding), attention
        (all layers), dense_mlp (all dense layers), experts (every routed expert of every MoE
        layer), shared_experts, router, norms."""
        h, dense_layers = self.hidden, self.layers - self.moe_layers
        mla_norms = self.layers * (self.q_lora_rank + self.kv_lora_rank) if self.kv_lora_rank else 0
        return {
            "embedding": self.vocab * h,
            "lm_head": 0 if self.tied_embeddings else self.vocab * h,
            "attention": self.layers * self._attention_per_layer(),
            "dense_mlp": dense_layers * self.mlp_matrices * h * self.intermediate,
            "experts": self.moe_layers * self.experts * self.expert_params(),
            "shared_experts": (self.moe_layers * self.shared_experts * self.mlp_matrices * h
                               * self.shared_expert_intermediate),
            "router": self.moe_layers * h * self.experts,
            "norms": self.layers * 2 * h + h + mla_norms,
        }

    def params(self) -> int:
        """All parameters (what the checkpoint holds, less MTP/vision modules vLLM does not load
        for text serving by default)."""
        return sum(self.parts().values())

    def _unchosen_expert_params(self) -> int:
        if not self.experts:
            return 0
        return self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params()

    def active_params(self) -> int:
        """Parameters one token uses: everything but the routed experts it is not sent to. Counts
        the embedding table, as Mistral, Qwen, Meta and DeepSeek count their "active" figures;
        OpenAI's gpt-oss figures leave the embedding out (see linear_params_per_token)."""
        return self.params() - self._unchosen_expert_params()

    def linear_params_per_token(self) -> int:
        """Matmul weights one token passes through, 2 FLOPs each: attention projections, dense or
        chosen-expert and shared MLPs, the router and the lm_head (the embedding matrix again when
        tied); not the embedding lookup (a gather) nor the norms."""
        p = self.parts()
        routed = p["experts"] - self._unchosen_expert_params()
        return (p["attention"] + p["dense_mlp"] + routed + p["shared_experts"] + p["router"]
                + self.vocab * self.hidden)

    # --- bytes -------------------------------------------------------------------------------

    def weight_bytes(self, dtype: str = "auto") -> int:
        """Bytes of the weights in ``dtype`` (auto|bf16|fp16|fp8|int8|fp4|int4; also mxfp4, nvfp4).

        "auto" is the checkpoint's own format: ``quantization`` on the parts it quantizes, 16-bit
        otherwise. A quantized dtype applies to the linear layers (attention projections, dense
        MLPs, shared and routed experts); the embedding, lm_head, norms and routers stay 16-bit,
        as vLLM's fp8 and AWQ/GPTQ paths keep them. When ``dtype`` is the checkpoint's own family
        (fp4 on an mxfp4 checkpoint, int4 on an int4 one) the checkpoint's own parts and group
        size apply (gpt-oss's mxfp4 covers the experts only); bytes per weight: see _FORMATS."""
        return round(sum(self.part_bytes(dtype).values()))

    def part_bytes(self, dtype: str = "auto") -> dict[str, float]:
        """``weight_bytes`` by part (the keys of ``parts``): what a step reads of each, for the
        roofline (routed experts apart from the weights every token reads)."""
        key = str(dtype).lower()
        if key == "auto":
            fmt = self.quantization or "bf16"
        elif key in _DTYPES:
            fmt = _DTYPES[key]
        else:
            raise BadInput(f"weight dtype {dtype!r} is not one of auto, {', '.join(sorted(_DTYPES))}")
        p = self.parts()
        if _FORMATS[fmt][0] == 16:
            return {k: 2.0 * v for k, v in p.items()}
        own = self.quantization is not None and (
            fmt == self.quantization or (key == "fp4" and self.quantization in ("mxfp4", "nvfp4")))
        if own:
            fmt, group, scope = self.quantization, self.quant_group_size, self.quantized_parts
        else:
            group, scope = 0, "linear"
        quantized = (("experts",) if scope == "experts"
                     else ("attention", "dense_mlp", "experts", "shared_experts"))
        rate = _bytes_per_weight(fmt, group)
        return {k: v * (rate if k in quantized else 2.0) for k, v in p.items()}

    def _layer_shares(self, context: int | None) -> float:
        """Layers that see the whole context, counting a windowed layer as min(context, window) /
        context of one (as a full layer when context is None: an upper bound)."""
        if context is not None and context <= 0:
            raise BadInput(f"context must be a positive number of tokens, got {context}")
        full = self.layers - self.sliding_layers
        if not self.sliding_layers or context is None:
            return float(self.layers)
        return full + self.sliding_layers * min(context, self.sliding_window) / context

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2, context: int | None = None) -> float:
        """KV-cache bytes one token of context holds, all layers, whole model (vLLM splits it
        across tensor-parallel ranks by KV head; MLA's latent is replicated on every rank).

        Per layer: K and V, 2 × kv_heads × head_dim × kv_dtype_bytes; MLA holds its latent and
        rope key once, (kv_lora_rank + qk_rope_head_dim) × kv_dtype_bytes. A sliding-window (or
        chunked-attention) layer keeps at most its window, so with ``context`` (the sequence
        length) it counts min(context, window) / context of a token; with context=None it counts
        as a full layer, an upper bound for sizing."""
        if kv_dtype_bytes <= 0:
            raise BadInput(f"kv_dtype_bytes must be positive, got {kv_dtype_bytes}")
        if self.kv_lora_rank:
            per_layer = (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        else:
            per_layer = 2 * self.kv_heads * self.head_dim * kv_dtype_bytes
        return per_layer * self._layer_shares(context)

    def attention_flops_per_token_per_context(self, context: int | None = None,
                                              prefill: bool = False) -> float:
        """FLOPs one new token spends per KV token it attends, summed over layers: QK^T and PV,
        2 FLOPs a multiply-add each, 4 × heads × head_dim a layer.

        MLA computes decode in vLLM's absorbed form, scoring against the latent: 2 × heads ×
        (kv_lora_rank + qk_rope_head_dim) for QK^T plus 2 × heads × kv_lora_rank for PV; its
        prefill (``prefill=True``) expands K and V per head: 2 × heads × (qk_nope + qk_rope) +
        2 × heads × v_head_dim. Windowed layers scale as in kv_bytes_per_token (both arguments
        beyond the agreed interface are optional)."""
        if self.kv_lora_rank and not prefill:
            per_layer = 2 * self.heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        elif self.kv_lora_rank:
            per_layer = 2 * self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        else:
            per_layer = 4 * self.heads * self.head_dim
        return per_layer * self._layer_shares(context)

    def to_json(self) -> dict:
        """The catalog entry: every field, aliases as a list (ModelSpec(**entry) reads it back)."""
        out = asdict(self)
        out["aliases"] = list(self.aliases)
        return out

    @classmethod
    def from_json(cls, entry: dict) -> "ModelSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise BadInput(f"catalog entry {entry.get('name')!r} has unknown fields {unknown}")
        return cls(**{**entry, "aliases": tuple(entry.get("aliases", ()))})


# --- reading a config.json -----------------------------------------------------------------------

# Gemma 3's multimodal config.json states only what differs from transformers' Gemma3TextConfig
# defaults (google/gemma-3-4b-it's text_config has no heads, vocab_size or head_dim); these are
# those defaults (transformers models/gemma3/configuration_gemma3.py).
_GEMMA3_DEFAULTS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "vocab_size": 262_208, "max_position_embeddings": 131_072,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True}


def from_config(config: dict, name: str, source: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json dict (nested ``text_config`` for multimodal
    checkpoints: Gemma 3, Llama 4, Kimi-K2.5). Reads dense Llama/Mistral/Qwen2/Qwen3/Gemma 3,
    Mixtral, Qwen-MoE, gpt-oss, Llama 4, DeepSeek-V3/Kimi-K2 (MLA) and MiniMax-M2 style MoE. A field
    the arithmetic needs that the config lacks is a BadInput naming it and ``source``."""
    try:
        return _from_config(config, name, source)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, BadInput):
            raise
        raise BadInput(f"{source}: a config field has the wrong type ({exc})") from None


def _from_config(config: dict, name: str, source: str) -> ModelSpec:
    if not isinstance(config, dict):
        raise BadInput(f"{source}: a config.json must hold a JSON object")
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    defaults = _GEMMA3_DEFAULTS if model_type.startswith("gemma3") else {}

    def get(key: str, default=None):
        value = text.get(key)
        return defaults.get(key, default) if value is None else value

    def need(key: str, why: str) -> int:
        value = get(key)
        if value is None:
            raise BadInput(f"{source}: {key!r} is missing from the config ({why}); "
                           "pass the model's own config.json")
        return value

    architectures = config.get("architectures") or text.get("architectures")
    if not architectures:
        raise BadInput(f"{source}: 'architectures' is missing from the config (it names the model class)")
    layers = int(need("num_hidden_layers", "the number of decoder layers"))
    hidden = int(need("hidden_size", "the model width"))
    heads = int(need("num_attention_heads", "the attention heads"))
    kv_heads = int(get("num_key_value_heads") or heads)
    vocab = int(need("vocab_size", "the embedding and lm_head size"))
    max_pos = int(need("max_position_embeddings", "the longest context"))
    tied = bool(get("tie_word_embeddings", config.get("tie_word_embeddings", False)))

    kv_lora_rank = int(get("kv_lora_rank") or 0)
    mla = {}
    if kv_lora_rank:
        mla = {"kv_lora_rank": kv_lora_rank,
               "qk_rope_head_dim": int(need("qk_rope_head_dim", "MLA's rope key width")),
               "qk_nope_head_dim": int(need("qk_nope_head_dim", "MLA's per-head key width")),
               "v_head_dim": int(need("v_head_dim", "MLA's per-head value width")),
               "q_lora_rank": int(get("q_lora_rank") or 0)}
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    else:
        head_dim = int(get("head_dim") or hidden // heads)

    moe = _moe_fields(get, need, layers, model_type)
    # Llama 4's intermediate_size is the experts' width; its dense layers use intermediate_size_mlp.
    dense_key = "intermediate_size_mlp" if model_type.startswith("llama4") else "intermediate_size"
    if moe.get("moe_layers", 0) < layers:
        intermediate = int(need(dense_key, "the dense MLP width"))
    else:                                  # no dense layer: the width is only recorded
        intermediate = int(get(dense_key) or get("intermediate_size") or 0)
    quant = _quantization(config.get("quantization_config") or text.get("quantization_config")
                          or config.get("compression_config"), source, bool(moe.get("experts")))
    return ModelSpec(name=name, architecture=str(architectures[0]), source=source, layers=layers,
                     hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     intermediate=intermediate, vocab=vocab, tied_embeddings=tied,
                     max_position_embeddings=max_pos,
                     mlp_matrices=2 if model_type in _PLAIN_MLP_TYPES else 3,
                     **_sliding_fields(get, layers, model_type), **moe, **mla, **quant)


def _sliding_fields(get, layers: int, model_type: str) -> dict:
    """Which layers attend a window: ``layer_types`` when given (gpt-oss, newer Gemma 3),
    Gemma 3's every-Nth-layer-global pattern, Llama 4's chunked layers (all but every 4th, the
    NoPE global ones), Qwen's use_sliding_window switch, else a bare sliding_window (Mistral
    v0.1) applies to every layer."""
    if model_type.startswith("llama4"):
        chunk = get("attention_chunk_size")
        if not chunk:
            return {}
        rope_layers = get("no_rope_layers")      # 1 = a RoPE layer, which attends in chunks
        count = (sum(1 for v in rope_layers if v) if isinstance(rope_layers, list) and rope_layers
                 else layers - layers // int(get("no_rope_layer_interval", 4)))
        return {"sliding_window": int(chunk), "sliding_layers": count}
    window = get("sliding_window")
    types = get("layer_types")
    if isinstance(types, list) and types:
        count = sum(1 for t in types if t in _SLIDING_LAYER_TYPES)
    elif get("sliding_window_pattern") or get("_sliding_window_pattern"):
        pattern = int(get("sliding_window_pattern") or get("_sliding_window_pattern"))
        count = layers - layers // pattern
    elif get("use_sliding_window") is False:
        count = 0
    elif get("use_sliding_window") and get("max_window_layers") is not None:
        count = layers - int(get("max_window_layers"))     # Qwen2: layers from max_window_layers on
    else:
        count = layers if window else 0
    return {"sliding_window": int(window), "sliding_layers": count} if window and count else {}


def _moe_fields(get, need, layers: int, model_type: str) -> dict:
    """Routed and shared experts, and which layers are MoE: an explicit ``moe_layers`` list,
    Llama 4's interleave_moe_layer_step, DeepSeek's first_k_dense_replace/moe_layer_freq,
    Qwen's decoder_sparse_step/mlp_only_layers, else every layer."""
    experts = int(get("n_routed_experts") or get("num_local_experts") or get("num_experts") or 0)
    if not experts:
        return {}
    k = int(get("experts_per_token") or need("num_experts_per_tok", "experts a token is routed to"))
    width = int(get("moe_intermediate_size") or need("intermediate_size", "the expert MLP width"))
    explicit = get("moe_layers")
    if isinstance(explicit, list):
        moe = set(explicit)
    elif get("interleave_moe_layer_step"):
        step = int(get("interleave_moe_layer_step"))
        moe = {i for i in range(layers) if (i + 1) % step == 0}
    elif get("first_k_dense_replace") is not None or get("moe_layer_freq") is not None:
        first, freq = int(get("first_k_dense_replace") or 0), int(get("moe_layer_freq") or 1)
        moe = {i for i in range(layers) if i >= first and i % freq == 0}
    else:
        step, dense = int(get("decoder_sparse_step") or 1), set(get("mlp_only_layers") or [])
        moe = {i for i in range(layers) if i not in dense and (i + 1) % step == 0}
    shared, shared_width = 0, 0
    if get("n_shared_experts"):                                 # DeepSeek-V3, Kimi-K2
        shared, shared_width = int(get("n_shared_experts")), width
    elif get("shared_expert_intermediate_size"):               # Qwen2-MoE
        shared, shared_width = 1, int(get("shared_expert_intermediate_size"))
    elif get("shared_intermediate_size"):                      # MiniMax (0 in M2: none)
        shared, shared_width = 1, int(get("shared_intermediate_size"))
    elif model_type.startswith("llama4"):                      # one shared expert, expert-wide
        shared, shared_width = 1, width
    return {"experts": experts, "experts_per_token": k, "expert_intermediate": width,
            "shared_experts": shared, "shared_expert_intermediate": shared_width,
            "moe_layers": len([i for i in moe if 0 <= i < layers])}


def _quantization(qc, source: str, is_moe: bool) -> dict:
    """The checkpoint's own weight format from ``quantization_config``: fp8 → "fp8", mxfp4 →
    "mxfp4", AWQ/GPTQ 4-bit → "int4" (8-bit → "int8"), compressed-tensors from its weights'
    num_bits and type, modelopt from quant_algo. An MoE whose list of unquantized modules names
    the attention quantizes only its experts (gpt-oss, Kimi-K2.5)."""
    if not qc:
        return {}
    if not isinstance(qc, dict):
        raise BadInput(f"{source}: quantization_config must be an object")
    method = str(qc.get("quant_method") or "").lower()
    group = 0
    if method == "fp8":
        fmt, skip = "fp8", qc.get("modules_to_not_convert") or qc.get("ignored_layers")
    elif method == "mxfp4":
        fmt, skip = "mxfp4", qc.get("modules_to_not_convert")
    elif method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "intel/auto-round"):
        bits = qc.get("bits") or qc.get("w_bit")
        fmt = {4: "int4", 8: "int8"}.get(int(bits or 0))
        if fmt is None:
            raise BadInput(f"{source}: quantization_config bits={bits!r} ({method}): only 4 and 8 are read")
        group = int(qc.get("group_size") or qc.get("q_group_size") or 0)
        group = group if group > 0 else 0          # GPTQ's -1 means per channel: scales negligible
        skip = qc.get("modules_to_not_convert")
    elif method == "compressed-tensors":
        weights = next((g.get("weights") for g in (qc.get("config_groups") or {}).values()
                        if isinstance(g, dict) and isinstance(g.get("weights"), dict)), None)
        if not weights:
            raise BadInput(f"{source}: compressed-tensors quantization_config has no config_groups weights")
        bits, kind = int(weights.get("num_bits") or 0), str(weights.get("type") or "int")
        fmt = {(8, "float"): "fp8", (8, "int"): "int8", (4, "int"): "int4",
               (4, "float"): "nvfp4"}.get((bits, kind))
        if fmt is None:
            raise BadInput(f"{source}: compressed-tensors weights num_bits={bits} type={kind!r} are not read")
        group = int(weights.get("group_size") or 0) if fmt in ("int4", "nvfp4") else 0
        skip = qc.get("ignore")
    elif method == "modelopt":
        algo = str(qc.get("quant_algo") or "").upper()
        fmt = {"FP8": "fp8", "NVFP4": "nvfp4"}.get(algo)
        if fmt is None:
            raise BadInput(f"{source}: modelopt quant_algo {algo!r} is not read (FP8, NVFP4)")
        skip = qc.get("exclude_modules")
    elif method == "bitsandbytes":
        fmt = "int4" if qc.get("load_in_4bit") else "int8"
        group, skip = (64 if fmt == "int4" else 0), qc.get("llm_int8_skip_modules")
    else:
        raise BadInput(f"{source}: quantization_config.quant_method {method!r} is not one this reads "
                       "(fp8, mxfp4, awq, gptq, compressed-tensors, modelopt, bitsandbytes)")
    skip = [str(s) for s in (skip or [])]
    experts_only = is_moe and any("self_attn" in s or s.endswith(".attn") for s in skip)
    out = {"quantization": fmt, "quantized_parts": "experts" if experts_only else "linear"}
    if group and group != _FORMATS[fmt][1]:
        out["quant_group_size"] = group
    return out


# --- the catalog ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Catalog:
    path: Path
    models: tuple[ModelSpec, ...]
    index: dict                  # lower-case name or alias → ModelSpec
    display: tuple[str, ...]     # the names offered as close matches
    bedrock: dict                # Bedrock model id → catalog name
    closed_prefixes: tuple[str, ...]


def catalog_file(data_dir: Path = DATA_DIR) -> Path:
    """The newest dated catalog in ``data_dir``."""
    files = sorted(p for p in data_dir.glob("models-*.json") if CATALOG_PATTERN.match(p.name))
    if not files:
        raise FileNotFoundError(f"no models-YYYY-MM-DD.json in {data_dir}")
    return files[-1]


@lru_cache(maxsize=4)
def _load(path: Path | None = None) -> _Catalog:
    path = path or catalog_file()
    data = json.loads(path.read_text())
    models = tuple(ModelSpec.from_json(e) for e in data["models"])
    index: dict[str, ModelSpec] = {}
    display: list[str] = []
    for spec in models:
        for label in (spec.name, *spec.aliases):
            for key in {label.lower(), label.lower().rsplit("/", 1)[-1]}:
                other = index.setdefault(key, spec)
                if other is not spec and key == label.lower():
                    raise ValueError(f"{path.name}: {label!r} names both {other.name} and {spec.name}")
            display.append(label)
    bedrock = data.get("bedrock", {})
    for model_id, target in bedrock.items():
        if target.lower() not in index:
            raise ValueError(f"{path.name}: Bedrock {model_id} maps to {target!r}, not in the catalog")
    return _Catalog(path, models, index, tuple(display), bedrock,
                    tuple(data.get("closed_bedrock_prefixes", ())))


def catalog() -> list[ModelSpec]:
    """Every architecture in the catalog, in file order."""
    return list(_load().models)


def resolve(name: str) -> ModelSpec:
    """The ModelSpec for ``name``: a catalog id or alias (case-insensitive, with or without the
    organisation), a Bedrock model id with open weights (cross-region "us." prefixes too), or a
    path to a config.json or a folder holding one."""
    if not isinstance(name, str) or not name.strip():
        raise BadInput("a model name is needed: a Hugging Face id, a Bedrock model id or a config.json path")
    name = name.strip()
    cat = _load()
    spec = cat.index.get(name.lower())
    if spec is not None:
        return spec
    bedrock = {k.lower(): v for k, v in cat.bedrock.items()}
    model_id = strip_profile_prefix(name.lower())        # "us.meta.llama3-..." bills as the base model
    if model_id in bedrock:
        return cat.index[bedrock[model_id].lower()]
    if any(model_id.startswith(prefix) for prefix in cat.closed_prefixes):
        open_ids = ", ".join(sorted(cat.bedrock))
        raise BadInput(f"{name} is a closed Bedrock model: it has no open weights, so no replica can be "
                       f"sized for it; compare it on price instead, or name an open model ({open_ids})")
    path = Path(name).expanduser()
    if path.exists() or name.endswith(".json"):
        return _from_path(path)
    close = difflib.get_close_matches(name.lower(), [d.lower() for d in cat.display], n=5, cutoff=0)
    by_lower = {d.lower(): d for d in cat.display}
    raise BadInput(f"unknown model {name!r}: not in the catalog ({cat.path.name}), not a Bedrock id "
                   f"with open weights, not a config.json path. Closest: "
                   f"{', '.join(by_lower[c] for c in close)}. For another model pass its config.json "
                   "(or the folder holding it).")


def _from_path(path: Path) -> ModelSpec:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise BadInput(f"{file}: no such file (give a config.json or a folder holding one)")
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{file}: not a readable JSON config ({exc})") from None
    # The folder's name: a fine-tune's _name_or_path often names its base model instead.
    return from_config(config, name=file.resolve().parent.name, source=f"file://{file.resolve()}")
