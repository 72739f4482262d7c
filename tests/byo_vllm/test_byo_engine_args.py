"""Every engine flag vLLM declares with typed choices takes its value from the environment as
the flag's type: an integer choice such as max_lora_rank must accept "8", not refuse it as a
string. Walks vLLM's own parser, so a new typed-choices flag is covered when it appears."""
from __future__ import annotations

import pytest

from byo_vllm.config import settings_from_env
from byo_vllm.engine_args import engine_argv, engine_parser


def _typed_choice_flags():
    parser = engine_parser()
    for action in parser._actions:
        choices = action.choices
        if (choices and action.type not in (None, str) and action.option_strings
                and action.nargs in (None, "?")):
            first = next(iter(choices))
            if isinstance(first, (int, float)) and not isinstance(first, bool):
                yield action.option_strings[-1][2:].replace("-", "_"), first


TYPED = sorted(set(_typed_choice_flags()))


def test_vllm_has_integer_choice_flags_such_as_max_lora_rank():
    assert "max_lora_rank" in dict(TYPED), TYPED


@pytest.mark.parametrize("name,value", TYPED, ids=[n for n, _ in TYPED])
def test_typed_choice_flags_accept_their_values_from_the_environment(tiny_model, name, value):
    for env_name in (f"SM_VLLM_{name.upper()}", f"OPTION_{name.upper()}"):
        settings = settings_from_env({"HF_MODEL_ID": str(tiny_model), env_name: str(value)})
        argv = engine_argv(settings, engine_parser())
        assert argv[argv.index("--" + name.replace("_", "-")) + 1] == str(value)


def test_a_value_outside_the_choices_is_named_with_the_choices(tiny_model):
    from byo_vllm.config import ConfigError
    settings = settings_from_env({"HF_MODEL_ID": str(tiny_model), "SM_VLLM_MAX_LORA_RANK": "7"})
    with pytest.raises(ConfigError) as e:
        engine_argv(settings, engine_parser())
    assert "SM_VLLM_MAX_LORA_RANK='7'" in str(e.value) and "8, 16" in str(e.value)


@pytest.mark.parametrize("prefix", ["SM_VLLM_", "OPTION_"])
def test_lora_is_on_by_configuration_in_both_spellings(tiny_model, prefix):
    settings = settings_from_env({"HF_MODEL_ID": str(tiny_model), prefix + "ENABLE_LORA": "true",
                                  prefix + "MAX_LORAS": "2", prefix + "MAX_CPU_LORAS": "4",
                                  prefix + "MAX_LORA_RANK": "16"})
    argv = engine_argv(settings, engine_parser())
    assert "--enable-lora" in argv
    assert argv[argv.index("--max-lora-rank") + 1] == "16"
    assert argv[argv.index("--max-cpu-loras") + 1] == "4"
    # The engine's GPU slots hold every adapter the server keeps loaded (see adapters.py).
    assert int(argv[argv.index("--max-loras") + 1]) >= 2


@pytest.mark.parametrize("prefix", ["SM_VLLM_", "OPTION_"])
def test_tool_call_settings_reach_vllms_serving_layer_in_both_spellings(tiny_model, prefix):
    """As SageMaker's vLLM image passes SM_VLLM_* on to vllm serve (and LMI its option.*)."""
    from byo_vllm.engine_args import parse_serve_args
    settings = settings_from_env({"HF_MODEL_ID": str(tiny_model),
                                  prefix + "TOOL_CALL_PARSER": "pythonic",
                                  prefix + "ENABLE_AUTO_TOOL_CHOICE": "true"})
    args = parse_serve_args(settings)
    assert args.tool_call_parser == "pythonic" and args.enable_auto_tool_choice is True


def test_vllm_serves_own_http_flags_and_a_parserless_auto_choice_are_refused_by_name(tiny_model):
    from byo_vllm.config import ConfigError
    from byo_vllm.engine_args import parse_serve_args
    settings = settings_from_env({"HF_MODEL_ID": str(tiny_model), "SM_VLLM_PORT": "9000"})
    with pytest.raises(ConfigError, match="SM_VLLM_PORT: 'port' is a flag of vllm serve's own HTTP"):
        engine_argv(settings, engine_parser())
    settings = settings_from_env({"HF_MODEL_ID": str(tiny_model),
                                  "SM_VLLM_ENABLE_AUTO_TOOL_CHOICE": "true"})
    with pytest.raises(ConfigError, match="tool-call-parser|tool_call_parser"):
        parse_serve_args(settings)
