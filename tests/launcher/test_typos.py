"""Typos a newcomer makes, answered through the real CLI (in this process) before anything is sent
or paid for: a job name nobody knows, a config key or builtin data set that does not exist."""

from __future__ import annotations

import json

import pytest
from clirun import run_cli

REGION = "us-east-1"


def not_known_here(name: str, missing: str, hint: str = "") -> str:
    return (
        f"error: no job named {name} is known here (no record on this machine and no folder runs/{name}){hint}; "
        f"a job submitted from another machine: add --region REGION ({missing}), and --backend ec2 for an EC2 job"
    )


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The CLI runs in an empty folder: no runs/ of anyone's."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", ["status", "logs", "report", "cancel", "wait", "resume"])
def test_an_unknown_job_without_aws_set_up_is_a_typo_not_an_aws_set_up_problem(no_aws_config, here, capsys, command):
    code, out, err = run_cli(capsys, command, "no-such-job")
    assert (code, out) == (2, "")
    assert err.splitlines() == [not_known_here("no-such-job", "no AWS region is configured")]


def test_with_a_region_but_no_credentials_the_answer_is_the_same(no_aws_config, here, capsys, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    code, _, err = run_cli(capsys, "status", "no-such-job")
    assert code == 2 and err.splitlines() == [not_known_here("no-such-job", "no AWS credentials are configured")]


def test_a_near_miss_of_a_job_this_machine_knows_is_named(no_aws_config, here, capsys, job_records):
    known = "tiny-gpt2-20261128-012345-abc123"
    job_records.mkdir(parents=True, exist_ok=True)
    (job_records / f"{known}.json").write_text(json.dumps({"name": known, "backend": "local"}))
    (here / "runs" / "local-20261128-012345-def456").mkdir(parents=True)
    (here / "runs" / "local-20261128-012345-def456" / "job.json").write_text("{}")
    code, _, err = run_cli(capsys, "status", "tiny-gpt2-20261128-012345-abc124")
    assert code == 2 and f"; did you mean {known}?; a job submitted from another machine" in err
    code, _, err = run_cli(capsys, "logs", "local-20261128-012345-def465")
    assert code == 2 and "; did you mean local-20261128-012345-def456?;" in err


def test_where_aws_is_set_up_sagemaker_is_asked_and_its_no_is_the_same_kind_of_answer(mocked_aws, here, capsys):
    code, out, err = run_cli(capsys, "status", "no-such-job")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: no job named no-such-job is known (no record on this machine and no folder runs/no-such-job, "
        f"none on SageMaker in {REGION}); an EC2 job submitted from another machine: add --backend ec2"
    ]


def test_a_sagemaker_job_submitted_elsewhere_is_still_found(mocked_aws, here, capsys):
    import boto3

    boto3.client("sagemaker", region_name=REGION).create_training_job(
        TrainingJobName="from-elsewhere",
        AlgorithmSpecification={"TrainingImage": "image", "TrainingInputMode": "File"},
        RoleArn="arn:aws:iam::123456789012:role/sm",
        OutputDataConfig={"S3OutputPath": "s3://bucket/jobs/"},
        ResourceConfig={"InstanceType": "ml.g5.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )
    code, out, err = run_cli(capsys, "status", "from-elsewhere", "--json")
    assert code == 0, err
    assert json.loads(out)["backend"] == "sagemaker"


def test_pointing_at_a_cloud_without_credentials_is_still_a_credentials_error(no_aws_config, here, capsys):
    code, _, err = run_cli(capsys, "status", "no-such-job", "--region", REGION)
    assert code == 3 and err.startswith("error: no AWS credentials found")


CONFIG_TYPO = (
    "[FAIL] --config-overrides fit the model's config: --config-overrides n_layr=2: GPT2Config has no 'n_layr' "
    "(did you mean 'n_layer'? its config.json names the keys it has)"
)
BUILTIN_TYPO = (
    "[FAIL] --dataset builtin:sentimnt is a builtin: no such builtin: choose builtin:sentiment or builtin:corpus"
)


def test_typos_in_training_flags_fail_a_cloud_dry_run_before_anything_is_paid_for(aws_calls, here, capsys):
    typos = ["--config-overrides", "n_layr=2", "--dataset", "builtin:sentimnt"]
    code, out, err = run_cli(
        capsys, "submit", "--instance", "ml.g5.xlarge", "--region", REGION, "--dry-run", "--", "--task", "causal-lm",
        *typos,
    )  # fmt: skip
    assert code == 1 and CONFIG_TYPO in out and BUILTIN_TYPO in out, out + err
    assert err.startswith("error: plan check failed, nothing was created: ")
    assert aws_calls == []
    # A flag argparse refuses is refused in the plan too (the launcher parses the training flags).
    code, _, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", "--n-layer", "2")
    assert (code, err) == (2, "error: training arguments: unrecognized arguments: --n-layer 2\n")


@pytest.mark.slow  # three plans, each with its transformers child (~0.9 s)
def test_config_overrides_are_checked_against_a_model_config_file_and_a_cached_hub_model(here, capsys, monkeypatch):
    # A config file, and a Hub model in this machine's cache (its layout as huggingface_hub writes it).
    bert = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    (here / "bert.json").write_text(json.dumps(bert))
    snapshot = here / "hub" / "models--someone--tiny" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    (here / "hub" / "models--someone--tiny" / "refs").mkdir()
    (here / "hub" / "models--someone--tiny" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(here / "hub"))

    def checks(*train: str) -> dict[str, dict]:
        code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--json", "--", *train)
        return {c["name"]: c for c in json.loads(out)["checks"]}

    name = "--config-overrides fit the model's config"
    fits = checks("--model-config", str(here / "bert.json"), "--config-overrides", "hidden_dropout_prob=0")
    assert fits[name]["ok"] is True
    typo = checks("--model", "someone/tiny", "--config-overrides", "n_embed=32")
    assert typo[name]["ok"] is False and "GPT2Config has no 'n_embed' (did you mean 'n_embd'?" in typo[name]["detail"]
    absent = checks("--model", "someone/absent", "--config-overrides", "n_embed=32")
    assert absent[name] == {
        "name": name,
        "ok": None,
        "detail": "checked when the job starts: someone/absent's config is not in this machine's Hugging Face cache",
    }
