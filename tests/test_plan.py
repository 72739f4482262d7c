"""Plans are data; secrets never leave them unmasked, references to secrets stay readable."""
from options.core import MASK, mask_secrets
from options.plan import Plan, Step


def test_secret_values_are_masked_wherever_they_sit():
    params = {"PrimaryContainer": {"Environment": {"HF_TOKEN": "hf_live", "OPTION_DTYPE": "fp16"}},
              "Tags": [{"Key": "team", "Value": "ml"}],
              "headers": ({"X-Api-Key": "k-123"},),
              "AWS_SECRET_ACCESS_KEY": "wJalr", "db_password": "hunter2"}
    masked = mask_secrets(params)
    env = masked["PrimaryContainer"]["Environment"]
    assert env == {"HF_TOKEN": MASK, "OPTION_DTYPE": "fp16"}
    assert masked["headers"][0]["X-Api-Key"] == MASK
    assert masked["AWS_SECRET_ACCESS_KEY"] == MASK and masked["db_password"] == MASK
    assert masked["Tags"] == params["Tags"]
    assert params["PrimaryContainer"]["Environment"]["HF_TOKEN"] == "hf_live", "the original is untouched"


def test_references_to_secrets_are_not_secrets():
    env = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert mask_secrets(env) == env
    assert mask_secrets({"secretName": "tls", "TokenArn": "arn:aws:secretsmanager:x"})["secretName"] == "tls"


def test_empty_secret_stays_visibly_empty():
    assert mask_secrets({"HF_TOKEN": ""}) == {"HF_TOKEN": ""}


def test_plan_json_masks_step_parameters():
    step = Step("sagemaker", "CreateModel", {"Environment": {"HF_TOKEN": "hf_live"}})
    plan = Plan(level=3, steps=[step], cost={"hourly_usd": 1.0}, notes=["n"])
    assert plan.to_json() == {"level": 3, "cost": {"hourly_usd": 1.0}, "notes": ["n"],
                              "steps": [{"service": "sagemaker", "operation": "CreateModel",
                                         "params": {"Environment": {"HF_TOKEN": MASK}}}]}


def test_token_counts_and_tokenizer_settings_are_not_secrets():
    settings = {"max_new_tokens": 64, "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS": "4096",
                "tokenizer_mode": "auto", "eos_token_id": 2, "HF_TOKEN": "hf_live",
                "github_token": "ghp"}
    assert mask_secrets(settings) == {**settings, "HF_TOKEN": MASK, "github_token": MASK}
