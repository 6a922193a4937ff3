"""Secret references resolved inside the job (infra/secret_env.py), against moto."""

import json
import os

import pytest

from distrain_cloud.infra import secret_env
from distrain_cloud.infra.errors import UserError

REGION = "us-east-1"


def test_reference_forms():
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:hf-AbC"
    assert secret_env.parse_reference(arn) == ("secretsmanager", arn, "eu-west-1")
    assert secret_env.parse_reference("arn:aws:ssm:us-west-2:123456789012:parameter/team/wandb") == (
        "ssm",
        "/team/wandb",
        "us-west-2",
    )
    assert secret_env.parse_reference("ssm:/team/wandb") == ("ssm", "/team/wandb", None)
    assert secret_env.parse_reference("secretsmanager:hf") == ("secretsmanager", "hf", None)
    with pytest.raises(UserError, match="not a secret reference") as refused:
        secret_env.parse_reference("hf_plainvalue")
    assert "plainvalue" not in str(refused.value)  # a pasted value is never echoed
    # The same grammar as the spec's: an ssm name needs its leading slash.
    with pytest.raises(UserError, match="not a secret reference"):
        secret_env.parse_reference("ssm:team/wandb")


def test_resolves_plain_json_and_ssm_secrets(mocked_aws):
    import boto3

    sm = boto3.client("secretsmanager", region_name=REGION)
    plain = sm.create_secret(Name="hf", SecretString="fake-hf-value-1")["ARN"]
    both = sm.create_secret(Name="keys", SecretString=json.dumps({"WANDB_API_KEY": "fake-wandb-2", "X": "y"}))["ARN"]
    boto3.client("ssm", region_name=REGION).put_parameter(Name="/team/tok", Value="fake-ssm-3", Type="SecureString")
    got = secret_env.resolve_all({"HF_TOKEN": plain, "WANDB_API_KEY": both, "OTHER": "ssm:/team/tok"})
    assert got == {"HF_TOKEN": "fake-hf-value-1", "WANDB_API_KEY": "fake-wandb-2", "OTHER": "fake-ssm-3"}


def test_a_missing_secret_names_the_variable_not_a_value(mocked_aws):
    ref = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:nope-AbC"
    with pytest.raises(UserError, match=r"cannot resolve HF_TOKEN from .*nope-AbC: ResourceNotFoundException"):
        secret_env.resolve_all({"HF_TOKEN": ref})


def test_main_puts_values_in_the_environment_and_runs_the_command(mocked_aws, monkeypatch, capsys):
    import boto3

    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="hf", SecretString="fake-hf-value-1")[
        "ARN"
    ]
    # Through monkeypatch first, so that the value main() puts in os.environ is removed afterwards
    # (a delenv at the end would restore it instead, for every later test to see; a delenv of an
    # absent variable records nothing).
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("DISTRAIN_SECRETS", json.dumps({"HF_TOKEN": arn}))
    ran = {}
    monkeypatch.setattr(os, "execvp", lambda file, args: ran.update(args=args, token=os.environ.get("HF_TOKEN")))
    secret_env.main(["--", "python", "-m", "distrain_cloud.training.node_launch"])
    assert ran == {"args": ["python", "-m", "distrain_cloud.training.node_launch"], "token": "fake-hf-value-1"}
    assert "DISTRAIN_SECRETS" not in os.environ
    out = capsys.readouterr()
    assert "fake-hf-value-1" not in out.out + out.err
    assert "secrets resolved into: HF_TOKEN" in out.out


def test_main_fails_in_one_line(mocked_aws, monkeypatch, capsys):
    monkeypatch.setenv("DISTRAIN_SECRETS", json.dumps({"HF_TOKEN": "ssm:/missing"}))
    monkeypatch.setattr(os, "execvp", lambda *a: pytest.fail("must not run the command"))
    with pytest.raises(SystemExit) as e:
        secret_env.main(["--", "true"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: cannot resolve HF_TOKEN from ssm:/missing: ParameterNotFound"
    ]
