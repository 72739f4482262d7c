"""The model catalog (cost.hardware.catalog): parameter counts against the publishers' own figures,
KV-cache and weight bytes, config.json parsing for each family, and name resolution (catalog ids,
aliases, Bedrock ids, config.json paths). Pure: no network, no GPU."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cost.hardware.catalog import ModelSpec, catalog, catalog_file, from_config, resolve
from cost.prices import load_prices
from options.core import BadInput

REPO = Path(__file__).resolve().parents[2]


def within(value: float, published: float, tolerance: float = 0.02) -> bool:
    return abs(value - published) <= tolerance * published


# --- parameter counts against published figures -------------------------------------------------
# (model, published total, published active or None, where the figures are published)
PUBLISHED = [
    # Hugging Face model pages' safetensors counts for meta-llama/Llama-3.1-{8B,70B,405B}-Instruct.
    ("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, None),
    ("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, None),
    ("meta-llama/Llama-3.1-405B-Instruct", 405.9e9, None),
    # Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters but only uses 12.9B
    # parameters per token".
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7e9, 12.9e9),
    # Qwen3 model cards (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): "30.5B in total and 3.3B
    # activated", "235B in total and 22B activated"; Qwen/Qwen3-8B: "8.2B".
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("Qwen/Qwen3-235B-A22B", 235e9, 22e9),
    ("Qwen/Qwen3-8B", 8.2e9, None),
    # DeepSeek-V3 Technical Report (arXiv 2412.19437), abstract: "671B total parameters with 37B
    # activated for each token" (the 14B multi-token-prediction module excluded, as here).
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9),
    # Meta's Llama 4 model card: Scout "17B (Activated) 109B (Total)"; the total includes the
    # vision encoder this catalog leaves out, still within 2 %.
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 109e9, 17e9),
    # Gemma 3 Technical Report (arXiv 2503.19786): the 27B model; text weights only here.
    ("google/gemma-3-27b-it", 27e9, None),
    # OpenAI, gpt-oss model card, Table 1: 116.83B / 20.91B total (active below).
    ("openai/gpt-oss-120b", 116.8e9, None),
    ("openai/gpt-oss-20b", 20.9e9, None),
    # Qwen/Qwen2.5-0.5B-Instruct model card: "Number of Parameters: 0.49B" (0.36B non-embedding).
    ("Qwen/Qwen2.5-0.5B-Instruct", 0.49e9, None),
]


@pytest.mark.parametrize(("name", "total", "active"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_params_match_the_published_counts(name, total, active):
    spec = resolve(name)
    assert within(spec.params(), total), f"{name}: {spec.params() / 1e9:.2f}B vs {total / 1e9}B"
    if active is not None:
        assert within(spec.active_params(), active), f"{name}: {spec.active_params() / 1e9:.2f}B active"
    assert sum(spec.parts().values()) == spec.params()


@pytest.mark.parametrize(("name", "active"), [("openai/gpt-oss-120b", 5.1e9), ("openai/gpt-oss-20b", 3.6e9)])
def test_gpt_oss_active_counts_leave_the_embedding_out(name, active):
    # OpenAI's gpt-oss model card, Table 1: 5.13B / 3.61B active, counting the unembedding but not
    # the embedding lookup: exactly the matmul weights a token passes through.
    spec = resolve(name)
    assert within(spec.linear_params_per_token(), active)
    assert spec.active_params() - spec.linear_params_per_token() == pytest.approx(
        spec.parts()["embedding"] + spec.parts()["norms"], rel=1e-3)


def test_dense_models_use_every_parameter_and_moe_models_a_fraction():
    dense, moe = resolve("meta-llama/Llama-3.1-8B-Instruct"), resolve("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert dense.active_params() == dense.params() and dense.expert_params() == 0
    # Mixtral: 2 of 8 experts (3 x 4096 x 14336 each) in each of 32 layers.
    assert moe.expert_params() == 3 * 4096 * 14336
    assert moe.params() - moe.active_params() == 32 * 6 * moe.expert_params()
    # Untied lm_head counts once as a matmul; the embedding lookup does not.
    assert dense.linear_params_per_token() == dense.params() - dense.parts()["embedding"] - dense.parts()["norms"]


# --- KV cache ------------------------------------------------------------------------------------

def test_kv_bytes_per_token_of_ordinary_attention():
    assert resolve("meta-llama/Llama-3.1-8B-Instruct").kv_bytes_per_token() == 131072   # 2*8*128*2*32
    assert resolve("meta-llama/Llama-2-7b-hf").kv_bytes_per_token() == 524288           # 2*32*128*2*32
    assert resolve("mistralai/Mixtral-8x7B-Instruct-v0.1").kv_bytes_per_token() == 131072
    assert resolve("meta-llama/Llama-3.1-8B-Instruct").kv_bytes_per_token(kv_dtype_bytes=1) == 65536


def test_kv_bytes_of_mla_hold_the_latent_once():
    spec = resolve("deepseek-ai/DeepSeek-V3")
    assert spec.kv_bytes_per_token() == 61 * (512 + 64) * 2
    assert spec.kv_bytes_per_token(context=100_000) == spec.kv_bytes_per_token()   # no windows


def test_kv_bytes_of_sliding_window_layers_depend_on_the_context():
    spec = resolve("openai/gpt-oss-120b")       # 18 of 36 layers attend a 128-token window
    per_layer = 2 * 8 * 64 * 2
    assert spec.sliding_window == 128 and spec.sliding_layers == 18
    assert spec.kv_bytes_per_token() == 36 * per_layer                    # upper bound
    assert spec.kv_bytes_per_token(context=128) == 36 * per_layer
    assert spec.kv_bytes_per_token(context=4096) == pytest.approx(per_layer * (18 + 18 * 128 / 4096))
    with pytest.raises(BadInput, match="context"):
        spec.kv_bytes_per_token(context=0)


def test_attention_flops_per_context_token():
    assert resolve("meta-llama/Llama-3.1-8B-Instruct").attention_flops_per_token_per_context() == 4 * 32 * 128 * 32
    ds = resolve("deepseek-ai/DeepSeek-V3")
    assert ds.attention_flops_per_token_per_context() == 61 * 2 * 128 * (2 * 512 + 64)     # absorbed decode
    assert ds.attention_flops_per_token_per_context(prefill=True) == 61 * 2 * 128 * (192 + 128)
    gemma = resolve("google/gemma-3-27b-it")    # 52 of 62 layers see 1024 tokens
    assert gemma.attention_flops_per_token_per_context(context=2048) == pytest.approx(
        4 * 32 * 128 * (10 + 52 * 1024 / 2048))


# --- weight bytes --------------------------------------------------------------------------------

def test_weight_bytes_in_16_bit_are_two_per_parameter():
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b"):
        spec = resolve(name)
        assert spec.weight_bytes("bf16") == spec.weight_bytes("fp16") == 2 * spec.params()
    spec = resolve("meta-llama/Llama-3.1-8B-Instruct")
    assert spec.weight_bytes() == 2 * spec.params()            # a bf16 checkpoint


def test_fp8_and_int4_quantize_the_linear_layers_only():
    spec = resolve("meta-llama/Llama-3.1-8B-Instruct")
    p = spec.parts()
    linear = p["attention"] + p["dense_mlp"]
    kept = p["embedding"] + p["lm_head"] + p["norms"]           # 16-bit, as vLLM keeps them
    assert spec.weight_bytes("fp8") == linear + 2 * kept
    assert spec.weight_bytes("int4") == round(linear * (0.5 + 2 / 128) + 2 * kept)
    assert spec.weight_bytes("fp4") == round(linear * (0.5 + 1 / 32) + 2 * kept)
    with pytest.raises(BadInput, match="fp3"):
        spec.weight_bytes("fp3")


def test_checkpoint_formats_are_the_auto_weight_bytes():
    ds = resolve("deepseek-ai/DeepSeek-V3")           # fp8 on every linear layer
    assert ds.quantization == "fp8" and ds.weight_bytes() == ds.weight_bytes("fp8")
    oss = resolve("openai/gpt-oss-120b")              # mxfp4 on the experts only
    p = oss.parts()
    assert (oss.quantization, oss.quantized_parts) == ("mxfp4", "experts")
    assert oss.weight_bytes() == round(p["experts"] * (0.5 + 1 / 32) + 2 * (oss.params() - p["experts"]))
    assert oss.weight_bytes("fp4") == oss.weight_bytes()
    assert 60e9 < oss.weight_bytes() < 67e9           # the published checkpoint: ~65 GB
    kimi = resolve("moonshotai/Kimi-K2.5")            # int4 experts, one scale per 32 weights
    k = kimi.parts()
    assert (kimi.quantization, kimi.quantized_parts, kimi.quant_group_size) == ("int4", "experts", 32)
    assert kimi.weight_bytes() == round(k["experts"] * (0.5 + 2 / 32) + 2 * (kimi.params() - k["experts"]))


# --- reading config.json -------------------------------------------------------------------------

QWEN25_AWQ = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
    "tie_word_embeddings": False, "sliding_window": 131072, "use_sliding_window": False,
    "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                            "zero_point": True},
}


def test_from_config_folder_with_quantization(tmp_path):
    folder = tmp_path / "Qwen2.5-7B-Instruct-AWQ"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_AWQ))
    spec = resolve(str(folder))
    assert spec.name == "Qwen2.5-7B-Instruct-AWQ" and spec.source.endswith("config.json")
    assert (spec.quantization, spec.quantized_parts, spec.quant_group_size) == ("int4", "linear", 0)
    assert spec.head_dim == 3584 // 28 and spec.sliding_layers == 0      # use_sliding_window false
    assert spec.params() == resolve("Qwen/Qwen2.5-7B-Instruct").params()
    p = spec.parts()
    linear = p["attention"] + p["dense_mlp"]
    assert spec.weight_bytes() == round(linear * (0.5 + 2 / 128) + 2 * (spec.params() - linear))
    assert resolve(str(folder / "config.json")) == spec                  # the file itself


def test_from_config_compressed_tensors_fp8():
    config = {**QWEN25_AWQ, "quantization_config": {
        "quant_method": "compressed-tensors", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}}
    assert from_config(config, "x", "test").quantization == "fp8"


def test_missing_field_names_the_field_and_the_file(tmp_path):
    config = {k: v for k, v in QWEN25_AWQ.items() if k != "num_hidden_layers"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadInput, match="num_hidden_layers") as err:
        resolve(str(tmp_path))
    assert str(tmp_path / "config.json") in str(err.value)
    with pytest.raises(BadInput, match="wrong type"):
        from_config({**QWEN25_AWQ, "num_hidden_layers": "many"}, "x", "test")
    with pytest.raises(BadInput, match="quant_method 'exl2'"):
        from_config({**QWEN25_AWQ, "quantization_config": {"quant_method": "exl2"}}, "x", "test")


def test_from_config_qwen3_moe_layer_pattern():
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
              "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
              "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
              "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    spec = from_config(config, "moe", "test")
    assert spec.moe_layers == 23                 # layers 3, 5, ..., 47 (odd index, not layer 1)
    assert spec.parts()["dense_mlp"] == 25 * 3 * 2048 * 6144
    assert spec.expert_intermediate == 768 and spec.experts_per_token == 8


def test_from_config_reads_each_family_in_the_catalog():
    # Llama 4: every layer MoE with one shared expert; 3 of 4 layers attend 8192-token chunks.
    scout = resolve("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert (scout.experts, scout.experts_per_token, scout.moe_layers) == (16, 1, 48)
    assert (scout.shared_experts, scout.shared_expert_intermediate) == (1, 8192)
    assert (scout.sliding_window, scout.sliding_layers) == (8192, 36)
    # DeepSeek-V3: 3 dense layers, 58 MoE with 256 routed + 1 shared expert, MLA.
    ds = resolve("deepseek-ai/DeepSeek-V3")
    assert (ds.moe_layers, ds.experts, ds.shared_experts, ds.intermediate) == (58, 256, 1, 18432)
    assert (ds.kv_lora_rank, ds.qk_rope_head_dim, ds.q_lora_rank, ds.head_dim) == (512, 64, 1536, 192)
    kimi = resolve("moonshotai/Kimi-K2.5")       # nested text_config, one dense layer, 384 experts
    assert (kimi.moe_layers, kimi.experts, kimi.heads, kimi.architecture) == (60, 384, 64, "KimiK25ForConditionalGeneration")
    # Gemma 3: transformers' defaults fill what the multimodal config leaves out; 5 local : 1 global.
    g4 = resolve("google/gemma-3-4b-it")
    assert (g4.heads, g4.kv_heads, g4.head_dim, g4.vocab, g4.tied_embeddings) == (8, 4, 256, 262208, True)
    assert (g4.sliding_window, g4.sliding_layers) == (1024, 34 - 5)
    assert resolve("google/gemma-3-27b-it").head_dim == 128
    # gpt-oss and MiniMax-M2: every layer MoE, expert width = intermediate_size.
    assert resolve("openai/gpt-oss-20b").moe_layers == 24
    mm = resolve("MiniMaxAI/MiniMax-M2.5")
    assert (mm.experts, mm.experts_per_token, mm.expert_intermediate, mm.shared_experts, mm.head_dim) == (256, 8, 1536, 0, 128)


# --- names ---------------------------------------------------------------------------------------

def test_names_resolve_case_insensitively_with_or_without_the_organisation():
    spec = resolve("meta-llama/Llama-3.1-70B-Instruct")
    assert resolve("META-LLAMA/llama-3.1-70b-instruct") is spec
    assert resolve("Llama-3.3-70B-Instruct") is spec                   # alias: same architecture
    assert resolve("deepseek-ai/DeepSeek-R1-Distill-Llama-70B") is spec
    assert resolve("mistralai/Mistral-7B-Instruct-v0.3").name == "mistralai/Mistral-7B-Instruct-v0.2"


def test_unknown_name_lists_close_names():
    with pytest.raises(BadInput) as err:
        resolve("llama-3.1-8b-instrcut")
    message = str(err.value)
    assert "Llama-3.1-8B-Instruct" in message and "Closest:" in message
    assert message.split("Closest: ")[1].split(". For")[0].count(", ") == 4     # five names


def test_every_open_bedrock_model_resolves_to_its_weights():
    expected = {
        "meta.llama3-1-8b-instruct-v1:0": "meta-llama/Llama-3.1-8B-Instruct",
        "meta.llama3-1-70b-instruct-v1:0": "meta-llama/Llama-3.1-70B-Instruct",
        "meta.llama3-3-70b-instruct-v1:0": "meta-llama/Llama-3.1-70B-Instruct",
        "mistral.mistral-7b-instruct-v0:2": "mistralai/Mistral-7B-Instruct-v0.2",
        "mistral.mixtral-8x7b-instruct-v0:1": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "qwen.qwen3-32b-v1:0": "Qwen/Qwen3-32B",
        "qwen.qwen3-235b-a22b-2507-v1:0": "Qwen/Qwen3-235B-A22B",
        "deepseek.v3-v1:0": "deepseek-ai/DeepSeek-V3",
        "deepseek.r1-v1:0": "deepseek-ai/DeepSeek-V3",
        "openai.gpt-oss-20b-1:0": "openai/gpt-oss-20b",
        "openai.gpt-oss-120b-1:0": "openai/gpt-oss-120b",
    }
    for model_id, name in expected.items():
        assert resolve(model_id).name == name, model_id
    assert resolve("us.meta.llama3-1-8b-instruct-v1:0").name == "meta-llama/Llama-3.1-8B-Instruct"
    # Every Bedrock model in the price table is either mapped here or closed.
    for row in load_prices().bedrock_models():
        if row.model_id in expected:
            continue
        with pytest.raises(BadInput, match="no open weights"):
            resolve(row.model_id)


def test_closed_bedrock_models_are_refused():
    for model_id in ("anthropic.claude-3-haiku-20240307-v1:0", "amazon.nova-pro-v1:0",
                     "us.anthropic.claude-sonnet-4-5-20250929-v1:0"):
        with pytest.raises(BadInput, match="no open weights"):
            resolve(model_id)


# --- the catalog file ----------------------------------------------------------------------------

REQUIRED = [
    "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "codellama/CodeLlama-34b-hf",
    "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-405B",
    "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B",
    "meta-llama/Llama-4-Scout-17B-16E", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-72B", "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "mistralai/Mistral-7B-v0.1",
    "mistralai/Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x22B-v0.1",
    "01-ai/Yi-34B", "openai/gpt-oss-20b", "openai/gpt-oss-120b", "google/gemma-3-1b-it",
    "google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
    "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "MiniMaxAI/MiniMax-M2.5",
    "MiniMaxAI/MiniMax-M2", "moonshotai/Kimi-K2.5",
]


def test_the_catalog_holds_the_required_models():
    for name in REQUIRED:
        assert isinstance(resolve(name), ModelSpec), name


def test_every_entry_loads_has_a_source_and_round_trips():
    specs = catalog()
    assert len(specs) >= 35
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    for spec in specs:
        assert "huggingface.co/" in spec.source and "2026-" in spec.source, spec.name
        assert ModelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
        assert spec.params() > 0 and spec.kv_bytes_per_token() > 0 and spec.weight_bytes() > 0
    raw = json.loads(catalog_file().read_text())
    assert raw["as_of"] and len(raw["models"]) == len(specs)


def test_module_imports_no_numpy():
    code = "import sys, cost.hardware.catalog; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": ""}, check=True)
    assert out.stdout.strip() == "False"
