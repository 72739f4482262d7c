"""Environment → server settings → vLLM engine arguments, without starting an engine."""
from __future__ import annotations

import subprocess
import sys

import pytest

from byo_vllm.config import ConfigError, settings_from_env
from byo_vllm.engine_args import build_engine_args
from options.local_server import SERVE_SCRIPT


@pytest.fixture
def model(tmp_path):
    return str(tmp_path)


def engine_args(env):
    return build_engine_args(settings_from_env(env))


def test_sm_vllm_convention(model):
    args = engine_args({"SM_VLLM_MODEL": model, "SM_VLLM_MAX_NUM_SEQS": "32",
                        "SM_VLLM_MAX_MODEL_LEN": "2k", "SM_VLLM_ENFORCE_EAGER": "",
                        "SM_VLLM_ENABLE_PREFIX_CACHING": "false",
                        "SM_VLLM_GPU_MEMORY_UTILIZATION": "0.8"})
    assert args.model == model
    assert (args.max_num_seqs, args.max_model_len) == (32, 2000)
    assert args.enforce_eager is True and args.enable_prefix_caching is False
    assert args.gpu_memory_utilization == 0.8


def test_lmi_rung3_config_runs_unchanged(model):
    """The course's rung-3 example, plus the LMI names that differ from vLLM's."""
    env = {"HF_MODEL_ID": model, "SM_NUM_GPUS": "4", "OPTION_TENSOR_PARALLEL_DEGREE": "4",
           "OPTION_SERVING_LOADER": "vllm", "OPTION_MAX_ROLLING_BATCH_SIZE": "128",
           "OPTION_ROLLING_BATCH": "vllm", "OPTION_DTYPE": "fp16",
           "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS": "4096", "OPTION_MAX_MODEL_LEN": "4096",
           "OPTION_ENABLE_PREFIX_CACHING": "true", "OPTION_ASYNC_MODE": "true"}
    settings = settings_from_env(env)
    assert settings.engine_args["max_num_seqs"].source == "OPTION_MAX_ROLLING_BATCH_SIZE"
    assert any(i.startswith("OPTION_SERVING_LOADER=vllm") for i in settings.ignored)
    args = build_engine_args(settings)
    assert args.tensor_parallel_size == 4
    assert args.max_num_seqs == 128
    assert args.max_num_batched_tokens == 4096
    assert args.dtype == "float16"
    assert args.max_model_len == 4096
    assert args.enable_prefix_caching is True


def test_sm_num_gpus_sets_tensor_parallel_and_max(model):
    assert engine_args({"HF_MODEL_ID": model, "SM_NUM_GPUS": "2"}).tensor_parallel_size == 2
    assert engine_args({"HF_MODEL_ID": model, "SM_NUM_GPUS": "8",
                        "TENSOR_PARALLEL_DEGREE": "max"}).tensor_parallel_size == 8
    assert engine_args({"HF_MODEL_ID": model}).tensor_parallel_size == 1
    assert engine_args({"HF_MODEL_ID": model, "MAX_BATCH_SIZE": "64"}).max_num_seqs == 64


def test_model_order_and_sagemaker_model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    settings = settings_from_env({"SPECTRUM_SERVER_MODEL_DIR": str(tmp_path)})
    assert (settings.model, settings.model_source) == (str(tmp_path), str(tmp_path))
    settings = settings_from_env({"HF_MODEL_ID": "org/model",
                                  "SPECTRUM_SERVER_MODEL_DIR": str(tmp_path)})
    assert settings.model == "org/model"
    assert settings_from_env({"SM_VLLM_MODEL": "a/b", "HF_MODEL_ID": "a/b"}).model == "a/b"


def test_port(model):
    assert settings_from_env({"HF_MODEL_ID": model}).port == 8080
    assert settings_from_env({"HF_MODEL_ID": model, "SAGEMAKER_BIND_TO_PORT": "9001"}).port == 9001


@pytest.mark.parametrize("env,words", [
    ({"SM_VLLM_MAX_NUM_SEQS": "16", "OPTION_MAX_ROLLING_BATCH_SIZE": "128"},
     ["SM_VLLM_MAX_NUM_SEQS='16'", "OPTION_MAX_ROLLING_BATCH_SIZE='128'", "max_num_seqs"]),
    ({"SM_NUM_GPUS": "1", "OPTION_TENSOR_PARALLEL_DEGREE": "4"},
     ["OPTION_TENSOR_PARALLEL_DEGREE=4", "SM_NUM_GPUS=1"]),
    ({"SM_VLLM_MODEL": "org/a"}, ["SM_VLLM_MODEL='org/a'", "HF_MODEL_ID"]),
    ({"OPTION_ROLLING_BATCH": "trtllm"}, ["OPTION_ROLLING_BATCH='trtllm'"]),
    ({"SAGEMAKER_BIND_TO_PORT": "http"}, ["SAGEMAKER_BIND_TO_PORT='http'"]),
    ({"TENSOR_PARALLEL_DEGREE": "max"}, ["needs SM_NUM_GPUS"]),
    ({"OPTION_ENTRYPOINT": "missing.py"}, ["OPTION_ENTRYPOINT='missing.py'", "no such file"]),
])
def test_contradictions_and_bad_values_are_named(model, env, words):
    with pytest.raises(ConfigError) as info:
        settings_from_env({"HF_MODEL_ID": model, **env})
    for word in words:
        assert word in str(info.value)


def test_no_model_says_where_to_put_it(tmp_path):
    with pytest.raises(ConfigError, match="set HF_MODEL_ID"):
        settings_from_env({"SPECTRUM_SERVER_MODEL_DIR": str(tmp_path / "empty")})


def test_unknown_engine_flags_are_named_with_close_names(model):
    with pytest.raises(ConfigError) as info:
        engine_args({"HF_MODEL_ID": model, "SM_VLLM_MAX_NUM_SEQ": "8",
                     "OPTION_DTYPE": "fp99", "SM_VLLM_ENFORCE_EAGER": "sometimes"})
    message = str(info.value)
    assert "SM_VLLM_MAX_NUM_SEQ" in message and "max_num_seqs" in message
    assert "OPTION_DTYPE='fp99'" in message and "float16" in message
    assert "SM_VLLM_ENFORCE_EAGER='sometimes'" in message


def test_serve_stops_on_a_contradiction_with_its_message(model):
    env = {"PATH": "/usr/bin:/bin", "HF_MODEL_ID": model, "SM_VLLM_MAX_NUM_SEQS": "16",
           "OPTION_MAX_ROLLING_BATCH_SIZE": "128"}
    done = subprocess.run([sys.executable, str(SERVE_SCRIPT), "serve"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "OPTION_MAX_ROLLING_BATCH_SIZE='128'" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_rejects_unexpected_arguments():
    done = subprocess.run([sys.executable, str(SERVE_SCRIPT), "train"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "usage: serve" in done.stderr


def test_effective_configuration_masks_secrets(model):
    described = settings_from_env({"HF_MODEL_ID": model, "SM_VLLM_HF_TOKEN": "hf_secret"}
                                  ).describe()
    assert described["engine_args"]["hf_token"] == "****"
    assert "hf_secret" not in repr(described)
