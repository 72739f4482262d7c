"""LmiConfig rendering, model sizing and the LMI image table (no cloud, no engine)."""
from __future__ import annotations

import json

import pytest

from cost.prices import load_prices
from options.lmi.config import (DEFAULT_LMI_VERSION, LmiConfig, ModelShape, check_fit, estimate_parameters,
                                fit, image_uri, model_shape, parse_options, startup_timeout_s)
from options.core import BadInput

PRICES = load_prices()


def test_env_and_serving_properties_say_the_same_thing():
    options, plain = parse_options(["OPTION_TENSOR_PARALLEL_DEGREE=4", "option.rolling_batch=vllm",
                                    "max_rolling_batch_size=128", "HF_TOKEN=hf_x"])
    config = LmiConfig("meta-llama/Llama-3.1-8B-Instruct", options, plain)
    assert config.env() == {"HF_MODEL_ID": "meta-llama/Llama-3.1-8B-Instruct",
                            "OPTION_ENABLE_PREFIX_CACHING": "true",
                            "OPTION_MAX_ROLLING_BATCH_SIZE": "128", "OPTION_ROLLING_BATCH": "vllm",
                            "OPTION_TENSOR_PARALLEL_DEGREE": "4", "HF_TOKEN": "hf_x"}
    props = dict(line.split("=", 1) for line in config.serving_properties().splitlines())
    assert props == {"engine": "Python", "option.model_id": "meta-llama/Llama-3.1-8B-Instruct",
                     "option.enable_prefix_caching": "true",
                     "option.max_rolling_batch_size": "128", "option.rolling_batch": "vllm",
                     "option.tensor_parallel_degree": "4"}
    assert "hf_x" not in config.serving_properties()  # secrets stay in the env


@pytest.mark.parametrize("given", ["OPTION_ENABLE_PREFIX_CACHING=false",
                                   "option.enable_prefix_caching=false"])
def test_prefix_caching_is_on_unless_the_user_turns_it_off(given):
    assert LmiConfig("m").env()["OPTION_ENABLE_PREFIX_CACHING"] == "true"
    options, plain = parse_options([given])
    config = LmiConfig("m", options, plain)
    assert config.env()["OPTION_ENABLE_PREFIX_CACHING"] == "false"
    assert "option.enable_prefix_caching=false" in config.serving_properties().splitlines()
    # The bring-your-own server maps the same variable onto vLLM's flag.
    from byo_vllm.config import settings_from_env
    settings = settings_from_env(config.env())
    assert settings.engine_args["enable_prefix_caching"].value == "false"
    assert settings.prefix_caching_said() == "false, as set by OPTION_ENABLE_PREFIX_CACHING"


def test_parameters_estimated_from_a_llama_8b_config():
    config = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
              "tie_word_embeddings": False}
    assert estimate_parameters(config) == pytest.approx(8.03e9, rel=0.01)


def test_shape_from_a_local_folder_uses_the_real_weight_size(tiny_model):
    shape = model_shape("", tiny_model, {})
    config = json.loads((tiny_model / "config.json").read_text())
    assert shape.num_attention_heads == config["num_attention_heads"] == 2
    assert shape.num_kv_heads == 1 and shape.head_dim == 64
    assert shape.weight_bytes == sum(p.stat().st_size for p in tiny_model.glob("*.safetensors"))


def test_shape_falls_back_to_catalogue_then_flags_then_unknown():
    assert model_shape("mistralai/Mistral-7B-Instruct-v0.3", None, {}).source.startswith("built-in catalogue")
    by_flags = model_shape("someone/private-model", None, {"parameters": 3e9, "num_attention_heads": 24})
    assert by_flags.source == "flags" and by_flags.parameters == 3e9
    assert model_shape("someone/private-model", None, {}).source == "unknown"


def test_unknown_shape_validates_what_it_can_and_says_what_it_skipped():
    config = LmiConfig("someone/private-model", {"tensor_parallel_degree": "4"})
    report = fit(config, ModelShape(source="unknown"), PRICES.instance("ml.g5.12xlarge"))
    assert report.fits and any("memory not checked" in s for s in report.skipped)
    assert any("attention heads unknown" in s for s in report.skipped)
    with pytest.raises(BadInput, match="does not divide the 4 GPUs"):
        fit(LmiConfig("x", {"tensor_parallel_degree": "3"}), ModelShape(source="unknown"),
            PRICES.instance("ml.g5.12xlarge"))


def test_kv_cache_arithmetic():
    shape = model_shape("meta-llama/Llama-3.1-8B-Instruct", None, {})
    # 32 layers × 8 KV heads × 128 × 2 (K and V) × 2 bytes = 128 KiB per token
    assert shape.kv_bytes_per_token(2) == 131072
    report = fit(LmiConfig("m", {"max_model_len": "8192"}), shape, PRICES.instance("ml.g5.2xlarge"))
    assert report.kv_gib_per_sequence == pytest.approx(1.0)
    assert report.weights_gib == pytest.approx(8.03e9 * 2 / 2 ** 30)
    assert report.sequences_that_fit == int((22.3 * 0.9 - report.weights_gib) / 1.0)


def test_a_long_context_that_does_not_fit_names_a_fix():
    shape = model_shape("meta-llama/Llama-3.1-8B-Instruct", None, {})
    with pytest.raises(BadInput) as err:
        check_fit(LmiConfig("m", {"max_model_len": "131072", "dtype": "fp32"}), shape,
                  PRICES.instance("ml.g5.xlarge"), PRICES)
    assert "weights 29.9 GiB" in str(err.value) and "cheapest instance that fits" in str(err.value)


def test_when_only_the_kv_cache_overflows_a_shorter_context_is_offered():
    shape = model_shape("meta-llama/Llama-3.1-8B-Instruct", None, {})
    instance = PRICES.instance("ml.g5.xlarge")
    with pytest.raises(BadInput) as err:
        check_fit(LmiConfig("m", {"max_model_len": "131072"}), shape, instance, PRICES)
    offered = int(str(err.value).split("OPTION_MAX_MODEL_LEN=")[1].split()[0])
    assert offered % 1024 == 0 and 1024 <= offered < 131072
    # The offered context really fits, and it is the longest (to the 1024 below) that does.
    assert fit(LmiConfig("m", {"max_model_len": str(offered)}), shape, instance).fits
    assert not fit(LmiConfig("m", {"max_model_len": str(offered + 2048)}), shape, instance).fits


def test_quantization_shrinks_the_weights():
    shape = model_shape("meta-llama/Llama-3.1-70B-Instruct", None, {})
    report = fit(LmiConfig("m", {"quantize": "awq", "max_model_len": "8192"}), shape,
                 PRICES.instance("ml.g5.12xlarge"))
    assert report.weights_gib == pytest.approx(70.6e9 * 0.56 / 2 ** 30) and report.fits


def test_startup_timeout_grows_with_the_weights_within_sagemaker_bounds():
    assert startup_timeout_s(1) == 608 and startup_timeout_s(None) == 1800
    assert startup_timeout_s(500) == 3600 and startup_timeout_s(0.001) == 600


def test_image_uri_from_the_sdk_table():
    assert image_uri("us-east-1") == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.38.0-lmi29.0.0-cu130"
    assert DEFAULT_LMI_VERSION in image_uri("eu-west-1")
    assert image_uri("us-east-1", "0.36.0").endswith(":0.36.0-lmi27.0.0-cu130")
    with pytest.raises(BadInput, match="0.99.0.*choose one of 0.38.0"):
        image_uri("us-east-1", "0.99.0")
    with pytest.raises(BadInput, match="not published in region 'mars-1'"):
        image_uri("mars-1")


@pytest.mark.parametrize("bad", ["dtype=fp13", "gpu_memory_utilization=1.5", "max_rolling_batch_size=0"])
def test_bad_option_values(bad):
    options, plain = parse_options([bad])
    with pytest.raises(BadInput, match=bad.split("=")[0]):
        check_fit(LmiConfig("m", options, plain), model_shape("mistralai/Mistral-7B-Instruct-v0.3", None, {}),
                  PRICES.instance("ml.g5.xlarge"), PRICES)
