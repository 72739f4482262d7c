"""The CLI's contract: bad input exits 2 with a message naming the value and the fix; no tracebacks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from options.deploy import main

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tensor_parallel_that_does_not_divide_the_gpus(capsys):
    code, _, err = run(capsys, "--level", "3", "--plan", "--instance-type", "ml.g5.12xlarge",
                       "--option", "OPTION_TENSOR_PARALLEL_DEGREE=3")
    assert code == 2
    assert "tensor parallel degree 3 does not divide the 4 GPUs of ml.g5.12xlarge" in err
    assert "use one of 1, 2, 4" in err


def test_tensor_parallel_that_does_not_divide_the_heads(capsys):
    # Qwen2.5 7B has 28 attention heads: 8 divides the 8 GPUs of ml.g5.48xlarge but not the heads.
    code, _, err = run(capsys, "--level", "3", "--plan", "--instance-type", "ml.g5.48xlarge",
                       "--model", "Qwen/Qwen2.5-7B-Instruct", "--option", "tensor_parallel_degree=8")
    assert code == 2 and "does not divide the model's 28 attention heads" in err
    assert "OPTION_TENSOR_PARALLEL_DEGREE to one of 1, 2, 4" in err


def test_default_tensor_parallel_is_explained_when_it_does_not_fit_the_heads(capsys, tiny_model):
    code, _, err = run(capsys, "--level", "3", "--plan", "--instance-type", "ml.g5.12xlarge",
                       "--model", str(tiny_model))
    assert code == 2 and "default tensor_parallel_degree=max uses all 4 GPUs" in err
    assert "model's 2 attention heads" in err and "one of 1, 2" in err


def test_70b_on_one_a10g_names_the_numbers_and_what_fits(capsys):
    code, _, err = run(capsys, "--level", "3", "--plan", "--instance-type", "ml.g5.xlarge",
                       "--model", "meta-llama/Llama-3.1-70B-Instruct")
    assert code == 2
    assert "does not fit: weights 131.5 GiB" in err and "ml.g5.xlarge gives 20.1 GiB usable" in err
    assert "The cheapest instance that fits is ml." in err


def test_70b_with_shorter_context_fits_on_the_suggested_instance(capsys):
    code, _, err = run(capsys, "--level", "3", "--plan", "--instance-type", "ml.g5.xlarge",
                       "--model", "meta-llama/Llama-3.1-70B-Instruct")
    suggested = err.split("The cheapest instance that fits is ")[1].split(" ")[0]
    code, out, err = run(capsys, "--level", "3", "--plan", "--json", "--instance-type", suggested,
                         "--model", "meta-llama/Llama-3.1-70B-Instruct")
    assert code == 0, err
    assert json.loads(out)["steps"][1]["params"]["ProductionVariants"][0]["InstanceType"] == suggested


@pytest.mark.parametrize("argv, expected", [
    (["--level", "3", "--plan", "--instance-type", "ml.g5.3xlarge"],
     ["unknown instance type 'ml.g5.3xlarge'", "g5.2xlarge"]),
    (["--level", "9", "--plan"], ["level 9 is not a rung", "3 = Bring your own model on LMI"]),
    (["--level", "3", "--plan", "--model", "/no/such/model"], ["'/no/such/model': no such folder here"]),
    (["--level", "4", "--plan", "--model", "mistralai/Mistral-7B-Instruct-v0.3"], ["needs a local folder"]),
    (["--level", "2", "--plan", "--model", "meta-textgeneration-llama-3-8b-instruct"],
     ["gated model", "--accept-eula"]),
    (["--level", "2", "--plan", "--model", "huggingface-llm-nope"], ["huggingface-llm-mistral-7b-instruct"]),
    (["--level", "3", "--plan", "--option", "OPTION_TENSOR_PARALLEL_DEGREE"], ["is not KEY=VALUE"]),
    (["--level", "3", "--plan", "--autoscale-min", "2"], ["--autoscale-min needs --autoscale-max"]),
    (["--level", "3", "--status"], ["--target aws"]),
], ids=["unknown-instance", "unknown-level", "missing-model", "level4-hub-id", "gated-no-eula",
        "unknown-jumpstart-model", "option-syntax", "autoscale-bounds", "status-local"])
def test_bad_input_names_the_value_and_the_fix(capsys, argv, expected):
    code, _, err = run(capsys, *argv)
    assert code == 2
    for text in expected:
        assert text in err


def test_flag_of_another_rung_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--level", "3", "--plan", "--image-uri", "x"])
    assert exit_.value.code == 2


def test_bad_input_exits_2_without_traceback_in_a_real_process():
    done = subprocess.run([sys.executable, "-m", "options.deploy", "--level", "3", "--plan",
                           "--instance-type", "ml.g5.12xlarge", "--option", "OPTION_TENSOR_PARALLEL_DEGREE=3"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.startswith("error: ")


def test_help_explains_every_flag_with_an_example():
    done = subprocess.run([sys.executable, "-m", "options.deploy", "--level", "3", "--help"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--option", "--lmi-version", "--autoscale-max", "--instance-type", "--target", "--plan"):
        assert flag in done.stdout
    assert "OPTION_TENSOR_PARALLEL_DEGREE=4" in done.stdout and "e.g." in done.stdout


def test_emulator_lifecycle_in_one_command_prints_each_stage():
    done = subprocess.run([sys.executable, "-m", "options.deploy", "--level", "3", "--target", "emulator",
                           "--json", "--option", "HF_TOKEN=hf_secret_value"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"]["status"] == "InService"
    assert summary["answer"]["text"].startswith("(emulator) canned answer")
    assert any(r.startswith("endpoint ") for r in summary["removed"])
    for stage in ("+ CreateModel", "InService", "teardown:", "- endpoint"):
        assert stage in done.stderr
    assert "hf_secret_value" not in done.stdout + done.stderr


def test_separate_status_and_down_against_a_running_emulator(emulator_url, target):
    base = [sys.executable, "-m", "options.deploy", "--level", "5", "--target", "emulator",
            "--endpoint-url", emulator_url]
    up = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    status = subprocess.run(base + ["--status", "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["status"] == "InService"
    down = subprocess.run(base + ["--down", "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and any(r.startswith("model ") for r in json.loads(down.stdout)["removed"])
    after = subprocess.run(base + ["--status", "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert json.loads(after.stdout)["status"] == "absent"


def test_aws_target_prints_endpoint_invoke_cost_and_teardown(emulator_url, target, queue_answer):
    """The aws code path end to end, its requests sent to moto through --endpoint-url."""
    queue_answer({"generated_text": "a GPU does many sums at once"})
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    done = subprocess.run([sys.executable, "-m", "options.deploy", "--level", "3", "--target", "aws",
                           "--endpoint-url", emulator_url, "--invoke", "What does a GPU do?"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "InService: spectrum-l3-mistral-7b-instruct-v0-3" in out
    assert "answer (spectrum-l3-mistral-7b-instruct-v0-3): 'a GPU does many sums at once'" in out
    assert "cost while it runs: $1.408/hour" in out
    assert "--down" in out and "--status" in out and "--invoke" in out
