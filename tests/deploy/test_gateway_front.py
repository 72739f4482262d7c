"""``--gateway`` for levels 1-5: the config it prints is one the gateway's own loader accepts,
pointing at exactly what the rung's plan deploys, with the least IAM policy for that."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from options.deploy import parse_args
from options.gateway_front import BEDROCK_INVOKE, SAGEMAKER_INVOKE, front_for
from options.sagemaker.plan import endpoint_name_of
from options.spectrum import rung, rung_module

GATEWAY_DIR = Path(__file__).resolve().parents[2] / "containers" / "gateway"
sys.path.insert(0, str(GATEWAY_DIR))
from spectrum_gateway.config import load_config  # noqa: E402


def _front(argv: list[str]):
    args = parse_args(argv + ["--plan"])
    module = rung_module(args.level)
    spec = module.spec_from_args(args)
    return module, spec, front_for(args.level, module, spec, args)


@pytest.mark.parametrize("level", [2, 3, 4, 5])
def test_sagemaker_rungs_front_the_planned_endpoint(level, tmp_path):
    module, spec, front = _front(["--level", str(level), "--region", "eu-west-1"])
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(front["config"]))
    config = load_config(path)            # the gateway's own checks, as `serve` runs them

    (upstream,) = config.models["chat"].upstreams
    endpoint = endpoint_name_of(module.plan(spec))
    assert upstream.sagemaker["endpoint"] == endpoint
    assert upstream.sagemaker["dialect"] == rung(level).can.dialect
    assert upstream.sagemaker["region"] == "eu-west-1"
    (statement,) = front["iam_policy"]["Statement"]
    assert statement["Action"] == list(SAGEMAKER_INVOKE)
    assert statement["Resource"] == [f"arn:aws:sagemaker:eu-west-1:*:endpoint/{endpoint.lower()}"]


def test_bedrock_front_is_priced_and_scoped_to_the_model(tmp_path):
    _, spec, front = _front(["--level", "1", "--model", "amazon.nova-lite-v1:0"])
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(front["config"]))
    (upstream,) = load_config(path).models["chat"].upstreams
    assert upstream.bedrock == {"model_id": "amazon.nova-lite-v1:0", "region": spec.region}
    from cost.prices import load_prices
    price = load_prices().bedrock("amazon.nova-lite-v1:0")
    assert (upstream.usd_per_mtok_input, upstream.usd_per_mtok_output) == \
        (price.input_per_million, price.output_per_million)
    (statement,) = front["iam_policy"]["Statement"]
    assert statement["Action"] == list(BEDROCK_INVOKE)
    assert statement["Resource"] == [f"arn:aws:bedrock:{spec.region}::foundation-model/amazon.nova-lite-v1:0"]


def test_inference_profile_allows_the_profile_and_its_model_in_every_region():
    from options.gateway_front import bedrock_upstream
    _, (statement,) = bedrock_upstream("us.amazon.nova-lite-v1:0", "us-east-1")
    assert statement["Resource"] == ["arn:aws:bedrock:us-east-1:*:inference-profile/us.amazon.nova-lite-v1:0",
                                     "arn:aws:bedrock:*::foundation-model/amazon.nova-lite-v1:0"]


def test_gateway_serves_the_level5_endpoint_it_was_printed_for(tmp_path):
    """The printed config, unchanged but for the emulator's URL, answers through the gateway:
    level 5 applied on the local AWS, the gateway started with its own `serve`, called with the
    OpenAI SDK; the answer is the emulator's queued body, in the rung's dialect."""
    import json

    sys.path.insert(0, str(GATEWAY_DIR.parents[1] / "tests" / "gateway"))
    from gateway_harness import Gateway

    from options import contract
    from options.aws import Target, emulator, queue_emulator_result

    module, spec, front = _front(["--level", "5"])
    with emulator() as url:
        deployment = module.apply(module.plan(spec), Target("emulator", "us-east-1", url))
        upstream = front["config"]["models"]["chat"]["upstreams"][0]
        assert upstream["sagemaker"]["endpoint"] == deployment.endpoint_name
        upstream["sagemaker"]["endpoint_url"] = url
        canned = contract.Result(text="through the gateway", finish_reason="stop",
                                 usage=contract.Usage(input_tokens=5, output_tokens=3))
        wire = contract.dialect(rung(5).can.dialect).result_to_wire(canned)
        queue_emulator_result(url, "us-east-1", json.dumps(wire))

        gateway = Gateway(tmp_path, front["config"]).start()
        try:
            key = gateway.create_key("team-a")["key"]
            answer = gateway.client(key).chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
        finally:
            gateway.stop()
        module.down(spec, Target("emulator", "us-east-1", url))
    assert answer.choices[0].message.content == "through the gateway"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (5, 3)


def test_cli_prints_the_front_as_json_and_refuses_it_for_inference_components(capsys):
    from options.deploy import main

    assert main(["--level", "3", "--gateway", "--json", "--region", "us-west-2"]) == 0
    front = json.loads(capsys.readouterr().out)
    assert front["level"] == 3
    assert front["config"]["models"]["chat"]["upstreams"][0]["sagemaker"]["region"] == "us-west-2"

    assert main(["--level", "3", "--gateway", "--adapter", "a1=s3://bucket/a1"]) == 2
    assert "InferenceComponentName" in capsys.readouterr().err
