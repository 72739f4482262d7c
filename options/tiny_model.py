"""A tiny random-weight Llama built on this machine, so serving runs without any download.

``tiny_model_dir()`` returns a Hugging Face model folder (config.json, safetensors weights,
a byte-level BPE tokenizer trained here with ``tokenizers``, a chat template) that vLLM and
transformers both load. It is built once and cached in ``$SPECTRUM_CACHE`` (default
``~/.cache/spectrum``); concurrent callers wait on a file lock and share one build.

Its shape is the smallest vLLM's CPU attention accepts: head_dim 64 (16 fails), one KV head.
Weights are random (seeded), so the text it writes is noise; token counts and timings are real.

    python -m options.tiny_model        # builds (if needed) and prints the folder
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

# Bump when the recipe changes: a new folder is built beside the old one.
RECIPE_VERSION = 1
FOLDER_NAME = f"tiny-llama-v{RECIPE_VERSION}"

HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 2
HEAD_DIM = 64
NUM_KV_HEADS = 1
INTERMEDIATE_SIZE = 256
VOCAB_SIZE = 512
MAX_POSITIONS = 2048
SEED = 0

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
SPECIAL_TOKENS = [BOS, EOS, UNK, PAD]

# A plain role-tagged template: the shape a real instruct model's template has.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}" + EOS + "\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A few KB of ordinary English for the tokenizer to learn merges from.
_TRAINING_TEXT = """
The deployment spectrum runs from fully managed services to infrastructure you build yourself.
At one end a managed model answers prompts and bills per token; at the other end you run the
servers, the engine, the autoscaler and the monitoring, and you pay for every instance hour
whether or not anyone sends a request. Between them sit managed endpoints that run a container
you choose, with a model you bring, configured through environment variables.
A serving engine keeps a batch of requests running at once. Each step it decodes one more token
for every running request, admits waiting requests when memory allows, and evicts finished ones.
The key and value cache holds the attention state of every running sequence in fixed-size pages,
so memory is not wasted on padding and many more requests fit on one accelerator.
Time to first token measures how long a user waits before the answer starts. Time per output
token measures how quickly the rest of the answer arrives. Throughput counts the output tokens
the server produces each second across all requests. Latency and throughput pull against each
other: a larger batch produces more tokens per second but each request waits a little longer.
What is the cheapest way to serve this model? It depends on the traffic. A steady stream of
requests keeps an instance busy and makes a dedicated endpoint cheaper than paying per token.
Sparse traffic leaves the instance idle most of the hour, and per-token pricing wins easily.
Hello! How can I help you today? Please summarise the following document in three sentences.
Translate the sentence into French. Write a short poem about the sea. Answer yes or no.
The quick brown fox jumps over the lazy dog. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2026.
user assistant system content role message prompt completion stream token tokens model server
"""


def cache_root() -> Path:
    return Path(os.environ.get("SPECTRUM_CACHE") or Path.home() / ".cache" / "spectrum")


def tiny_model_dir() -> Path:
    """The tiny model's folder, built on first use (safe across processes)."""
    root = cache_root()
    target = root / FOLDER_NAME
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{FOLDER_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():      # another process built it while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}-", dir=root))
        try:
            _build(staging)
            staging.rename(target)                  # atomic: readers never see half a folder
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def _build(folder: Path) -> None:
    _build_tokenizer(folder)
    _build_weights(folder)


def _build_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_TRAINING_TEXT.split("\n"), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    tokenizer.save(str(folder / "tokenizer.json"))
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD,
        "add_bos_token": True, "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False,
                                          "rstrip": False, "normalized": False,
                                          "single_word": False}
                                 for t, i in ids.items()},
    }, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD}, indent=2))


def _config(vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN_SIZE, "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS, "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": vocab_size, "max_position_embeddings": MAX_POSITIONS,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
    }


def _build_weights(folder: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = _config(tok.get_vocab_size(), tok.token_to_id(BOS), tok.token_to_id(EOS),
                     tok.token_to_id(PAD))
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    # save_pretrained rewrites config.json in its own words; keep ours, which both loaders read.
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
        indent=2))


if __name__ == "__main__":
    print(tiny_model_dir())
