"""What the plan can know offline fails the dry run (and the submit) before anything is paid for."""

from __future__ import annotations

import json
import os

import pytest

# (training flags, launcher flags, the failed check's line in the plan)
CASES = {
    # a relative path is read from where the user typed it ({here}), not from the job's own folder
    "missing data file": (["--train-file", "nowhere.csv"], [], "[FAIL] --train-file {here}/nowhere.csv exists: "),
    "missing local dataset": (["--dataset", "./data"], [], "[FAIL] --dataset {here}/data exists: "),
    "negative learning rate": (["--lr", "-1"], [], "[FAIL] learning rate is positive: --lr -1.0: give a positive"),
    "negative learning rate as -1e-4": (["--lr", "-1e-4"], [], "[FAIL] learning rate is positive: --lr -0.0001"),
    "zero learning rate": (["--lr", "0"], [], "[FAIL] learning rate is positive"),
    "masked-lm on GPT-2": (
        ["--task", "masked-lm"],
        [],
        "[FAIL] task masked-lm fits the model: preset tiny-gpt2 is GPT-2, which has no masked-LM head: add --preset",
    ),
    "masked-lm on the 8B Llama": (
        ["--task", "masked-lm", "--preset", "llama-8b"],
        [],
        "[FAIL] task masked-lm fits the model: preset llama-8b is Llama, which has no masked-LM head: add --preset",
    ),
    "more processes than cores": ([], ["--processes", "64"], f"64 processes on {os.cpu_count()} CPU cores: give"),
}


@pytest.mark.parametrize("train, launcher, line", CASES.values(), ids=CASES.keys())
def test_a_failed_offline_check_fails_the_dry_run_and_the_submit(cli, tmp_path, train, launcher, line):
    if "processes" in line and os.cpu_count() >= 64:
        pytest.skip("this machine has 64 cores")
    args = ["submit", "--instance", "local", *launcher]
    line = line.format(here=tmp_path)
    dry = cli(*args, "--dry-run", "--", *train, cwd=tmp_path)
    assert dry.returncode == 1 and line in dry.stdout, dry.stdout + dry.stderr
    real = cli(*args, "--", *train, cwd=tmp_path)
    assert real.returncode == 2 and real.stderr.startswith("error: plan check failed, nothing was created: ")
    assert not (tmp_path / "runs").exists()


def test_what_passes_is_shown_as_passing(cli, tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("text,label\nhi,0\n")
    flags = ["--task", "masked-lm", "--preset", "tiny-bert", "--lr", "3e-4", "--train-file", str(data)]
    dry = cli("submit", "--instance", "local", "--dry-run", "--", *flags, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout
    for check in ("learning rate is positive", "task masked-lm fits the model", f"--train-file {data} exists"):
        assert f"[ok  ] {check}" in dry.stdout


def test_a_relative_data_file_is_read_from_where_the_user_typed_it(capsys, monkeypatch, tmp_path):
    """The job runs in a folder of its own: the plan hands it the file's absolute path, and a
    resume from another folder reads the same file (the record keeps that path)."""
    from clirun import run_cli

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("text,label\nhi,0\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(
        capsys, "submit", "--instance", "local", "--dry-run", "--json", "--", "--train-file", "data/train.csv"
    )
    plan = json.loads(out)
    assert (code, err) == (0, ""), out
    absolute = str(tmp_path / "data" / "train.csv")
    assert plan["request"]["command"][-2:] == ["--train-file", absolute]
    assert {"name": f"--train-file {absolute} exists", "ok": True, "detail": ""} in plan["checks"]


def test_a_cloud_job_is_told_its_data_must_come_through_a_channel(capsys, monkeypatch, tmp_path, no_aws_config):
    from clirun import run_cli

    (tmp_path / "train.csv").write_text("text,label\nhi,0\n")
    monkeypatch.chdir(tmp_path)
    argv = ["submit", "--instance", "ml.g5.xlarge", "--region", "us-east-1", "--max-run", "1h", "--dry-run"]
    code, out, _ = run_cli(capsys, *argv, "--", "--train-file", "train.csv")
    assert code == 1
    (line,) = [x for x in out.splitlines() if "--train-file" in x and "[FAIL]" in x]
    assert "[FAIL] --train-file train.csv reaches the job: a cloud job cannot read files of this machine" in line
    assert "--input train=s3://" in line
    code, out, _ = run_cli(capsys, *argv, "--", "--train-file", "/opt/ml/input/data/train/train.csv")
    assert code == 0 and "reaches the job" not in out  # a path inside the job: not this machine's


def test_push_to_hub_needs_a_token_before_training(cli, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    r = cli("submit", "--instance", "local", "--dry-run", "--push-to-hub", "me/model", cwd=tmp_path, env=env)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: --push-to-hub me/model needs a Hub token: add --secret HF_TOKEN=<Secrets Manager ARN or ssm:/name> "
        "or set HF_TOKEN in this environment"
    ]
    local = cli(
        "submit",
        "--instance",
        "local",
        "--dry-run",
        "--push-to-hub",
        "me/model",
        cwd=tmp_path,
        env={**env, "HF_TOKEN": "hf_placeholder"},
    )
    assert local.returncode == 0, local.stderr
    cloud = ["submit", "--instance", "ml.g5.xlarge", "--region", "us-east-1", "--dry-run", "--push-to-hub", "me/m"]
    r = cli(*cloud, cwd=tmp_path, env={**env, "HF_TOKEN": "hf_placeholder"})
    assert r.returncode == 2 and "needs a Hub token: add --secret HF_TOKEN=" in r.stderr
