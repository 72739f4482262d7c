"""Level 5's own pieces: the server env from --option, and the build/push steps."""
from __future__ import annotations

import pytest

from options.byo_image import BUILD_CONTEXT, REPOSITORY, build_and_push_steps, server_env
from options.core import BadInput


def test_options_become_the_servers_env():
    assert server_env(["max_model_len=4096", "enable-prefix-caching=", "SM_VLLM_DTYPE=half",
                       "OPTION_MAX_ROLLING_BATCH_SIZE=64", "HF_TOKEN=hf_x"]) == {
        "SM_VLLM_MAX_MODEL_LEN": "4096", "SM_VLLM_ENABLE_PREFIX_CACHING": "",
        "SM_VLLM_DTYPE": "half", "OPTION_MAX_ROLLING_BATCH_SIZE": "64", "HF_TOKEN": "hf_x"}
    with pytest.raises(BadInput, match="not KEY=VALUE"):
        server_env(["max_model_len"])


def test_build_and_push_commands_name_the_repository_and_the_context():
    steps, image = build_and_push_steps("eu-west-1", "dev")
    assert image == f"<account-id>.dkr.ecr.eu-west-1.amazonaws.com/{REPOSITORY}:dev"
    assert steps[0].operation == "CreateRepository" and steps[0].undo.operation == "DeleteRepository"
    commands = steps[1].params["all_commands"]
    assert commands[0] == f"docker build -t {REPOSITORY}:dev {BUILD_CONTEXT}"
    assert commands[-1] == f"docker push {image}"
    assert "get-login-password --region eu-west-1" in commands[1]
