"""Bad input is refused before any AWS call: one `error:` line naming the flag or key, exit 2.

Each case runs the real CLI in-process with credentials present, as a real (not dry-run)
submit, and counts the AWS calls botocore was asked to make: zero, every time. Also: what the
plan sends fits SageMaker's API model (lengths, ranges, patterns), which moto never checks.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import apimodel
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.cli import main
from distrain_cloud.launcher.spec import load_spec

ROLE = "arn:aws:iam::123456789012:role/distrain-sm"
SAGEMAKER = ["submit", "--yes", "--instance", "ml.g5.xlarge", "--region", "us-east-1", "--role", ROLE]
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as end:
        main(argv)
    err = capsys.readouterr().err
    return end.value.code, [line for line in err.splitlines() if line.strip()]


def spec_file(tmp_path, content: bytes | str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


# (CLI arguments after the common ones, text the one line must contain)
FLAG_CASES = {
    "max-run zero": (["--max-run", "0"], "max_run"),
    "max-run over 28 days": (["--max-run", "29d"], "--max-run"),
    "input s3:// without bucket": (["--input", "train=s3://"], "names no bucket"),
    "input invalid bucket": (["--input", "train=s3://Bad_Bucket/data"], "not a valid S3 bucket name"),
    "input channel name": (["--input", "tr ain=s3://my-bucket/data"], "channel name"),
    "input local path on SageMaker": (["--input", "train=/data/train"], "--input train=/data/train"),
    "resume-from a path": (["--resume-from", "../../victim"], "resume_from"),
    "name with a dot": (["--name", "my.job"], "name"),
    # One source for each setting: given after `--` too, the plan and the training would disagree.
    "strategy after --": (["--strategy", "ddp", "--", "--strategy", "zero3"], "give --strategy before `--`"),
    "precision after --": (["--", "--precision=bf16"], "give --precision before `--`, not after it"),
    "push-to-hub after --": (["--", "--push-to-hub", "me/model"], "give --push-to-hub before `--`"),
    "run-name after --": (["--", "--run-name", "x"], "before `--`, not after it (in a spec file: wandb.run_name)"),
    "wandb entity after --": (["--", "--wandb-entity", "team"], "give --wandb-entity before `--`"),
    "hub-revision after --": (["--", "--hub-revision", "x"], "give --hub-revision before `--`"),
    "hub-private after --": (["--", "--hub-private"], "before `--`, not after it (in a spec file: hub.private)"),
    "hyperparameter value over 2500": (["--", "--generate-prompt", "x" * 2600], "HyperParameters"),
    # The backend is chosen, not guessed from the name, so a choice the instance contradicts is refused.
    "backend against the instance": (
        ["--backend", "ec2"],
        "--backend ec2 cannot run --instance ml.g5.xlarge (a SageMaker type): give --instance g5.xlarge, "
        "or drop --backend to run it on SageMaker",
    ),
    "unknown backend": (["--backend", "batch"], "backend (--backend): Input should be 'local', 'sagemaker' or 'ec2'"),
}
SPEC_CASES = {
    "bucket name": ("sagemaker:\n  bucket: My_Bucket\n", "sagemaker.bucket"),
    "subnets without security groups": (
        "sagemaker:\n  subnets: [subnet-0123abcd]\n",
        "subnets without security_group_ids",
    ),
    "security groups without subnets": (
        "sagemaker:\n  security_group_ids: [sg-0123abcd]\n",
        "security_group_ids without subnets",
    ),
    "subnet id": ("sagemaker:\n  subnets: [net1]\n  security_group_ids: [sg-0123abcd]\n", "not a subnet id"),
    "reserved tag": ("sagemaker:\n  tags: {'aws:x': y}\n", "reserved"),
    "prefix climbing out": ("sagemaker:\n  prefix: a/../b\n", "sagemaker.prefix"),
    "empty file": ("", "is empty"),
    "comment-only file": ("# nothing here\n", "is empty"),
    "not UTF-8": (b"name: caf\xe9\n", "not UTF-8"),
    "billion laughs": (BILLION_LAUGHS, "aliases expand it"),
    "recursive alias": ("a: &a [*a]\n", "refers to itself"),
    "a list, not a mapping": ("- a\n- b\n", "must be a mapping"),
    "backend against the instance": ("backend: local\n", "--backend local cannot run --instance ml.g5.xlarge"),
}


@pytest.mark.parametrize("args, expected", FLAG_CASES.values(), ids=FLAG_CASES.keys())
def test_bad_flags_are_refused_in_one_line_before_any_aws_call(aws_calls, capsys, args, expected):
    cut = args.index("--") if "--" in args else len(args)
    code, lines = run_cli(SAGEMAKER + args[:cut] + args[cut:], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert aws_calls == []


@pytest.mark.parametrize("content, expected", SPEC_CASES.values(), ids=SPEC_CASES.keys())
def test_bad_job_files_are_refused_in_one_line_before_any_aws_call(aws_calls, capsys, tmp_path, content, expected):
    code, lines = run_cli(SAGEMAKER + [spec_file(tmp_path, content)], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert aws_calls == []


def test_a_folder_or_a_huge_file_is_not_a_job_spec(aws_calls, capsys, tmp_path):
    code, lines = run_cli(SAGEMAKER + [str(tmp_path)], capsys)
    assert code == 2 and lines == [
        f"error: job spec {tmp_path} is not a file (give the YAML file, e.g. examples/local-quickstart.yaml)"
    ]
    big = spec_file(tmp_path, "name: x\n" + "#" * (1 << 20))
    code, lines = run_cli(SAGEMAKER + [big], capsys)
    assert code == 2 and "bytes; a spec is at most" in lines[0]
    assert aws_calls == []


def test_resume_from_cannot_leave_the_local_work_folder(capsys, tmp_path):
    (tmp_path / "victim" / "checkpoints").mkdir(parents=True)
    code, lines = run_cli(["submit", "--instance", "local", "--dry-run", "--resume-from", "../victim"], capsys)
    assert code == 2 and "'../victim' is not a job name" in lines[0]


# ---------------------------------------------------------------- the API model itself


def test_the_api_model_check_finds_what_moto_accepts():
    """The failures a hostile review sent to moto, each caught by the model walk."""
    request = {
        "TrainingJobName": "ok-name",
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "img",
            "ContainerEntrypoint": ["/bin/bash", "-c", "x" * 547],
        },
        "HyperParameters": {"lr": "1" * 2501},
        "InputDataConfig": [
            {"ChannelName": "bad name", "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "ftp://x"}}}
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://b/p"},
        "ResourceConfig": {"InstanceType": "ml.nope.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 29 * 86400},
        "Bogus": 1,
    }
    found = dict(apimodel.problems("sagemaker", "CreateTrainingJob", request))
    assert found["AlgorithmSpecification.ContainerEntrypoint[2]"] == "has 547 characters; the API allows at most 256"
    assert "at most 2500" in found["HyperParameters['lr']"]
    assert "pattern" in found["InputDataConfig[0].ChannelName"]
    assert "pattern" in found["InputDataConfig[0].DataSource.S3DataSource.S3Uri"]
    assert "not one of the values" in found["ResourceConfig.InstanceType"]
    assert "28 days" in found["StoppingCondition.MaxRuntimeInSeconds"]
    assert found["Bogus"] == "is not a field of this request"
    # Java's `.` stops at a newline, as SageMaker's does: a multi-line entrypoint item is refused.
    assert (
        apimodel.problems(
            "sagemaker",
            "CreateTrainingJob",
            {**request, "AlgorithmSpecification": {"TrainingInputMode": "File", "ContainerEntrypoint": ["a\nb"]}},
        )
        != []
    )
    del request["Bogus"]
    assert ("RoleArn", "is required") in apimodel.problems(
        "sagemaker", "CreateTrainingJob", {k: v for k, v in request.items() if k != "RoleArn"}
    )


# ---------------------------------------------------------------- every plannable spec is a valid request

_name = st.from_regex(r"[a-z0-9](-?[a-z0-9]){0,20}", fullmatch=True)
_tag_text = st.text(st.sampled_from("abcXYZ019 _.:/=+-@é"), min_size=1, max_size=40)
_specs = st.fixed_dictionaries(
    {
        "name": _name,
        "instance": st.sampled_from(
            [
                "ml.g5.xlarge",
                "ml.g5.12xlarge",
                "ml.p3.8xlarge",
                "ml.p4d.24xlarge",
                "ml.g4dn.12xlarge",
                "ml.m5.xlarge",
                "ml.trn1.32xlarge",
            ]
        ),
        "nodes": st.integers(1, 8),
        "strategy": st.sampled_from(["ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload"]),
        "spot": st.booleans(),
        "max_run": st.integers(1, 40 * 86400),
        "inputs": st.dictionaries(
            st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True).filter(lambda c: c != "code"),
            _name.map(lambda b: f"s3://{b}x1/data/"),
            max_size=3,
        ),
        "hyperparameters": st.fixed_dictionaries(
            {},
            optional={
                "lr": st.floats(1e-6, 1.0),
                "max_steps": st.integers(1, 10**6),
                "model": st.text(min_size=1, max_size=3000),
                "seed": st.integers(0, 2**31),
            },
        ),
        "train_args": st.lists(st.sampled_from(["--max-steps", "7", "--seed", "3"]), max_size=0),
        "sagemaker": st.fixed_dictionaries(
            {"role": st.just(ROLE)},
            optional={
                "prefix": st.from_regex(r"[a-z0-9]{1,20}(/[a-z0-9]{1,20}){0,3}", fullmatch=True),
                "bucket": _name.map(lambda b: b + "-bkt"),
                "tags": st.dictionaries(
                    _tag_text.filter(lambda k: not k.lower().startswith(("aws:", "distrain-cloud:"))),
                    _tag_text,
                    max_size=5,
                ),
                "volume_size_gb": st.integers(1, 16384),
            },
        ),
    }
)


@pytest.mark.slow  # 60 generated specs, each planned: 3-6 s under CI's load
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_specs)
def test_every_spec_that_plans_yields_a_request_the_api_accepts(aws_calls, data):
    try:
        plan = plan_job(load_spec(None, data), dry_run=True)
    except UserError:
        return  # refused before anything was sent: the other half of the contract
    assert apimodel.problems("sagemaker", "CreateTrainingJob", plan.request) == []
    assert aws_calls == []


def test_dry_run_lists_the_bundle_files_and_a_big_file_needs_allow_large(capsys, tmp_path, monkeypatch):
    from distrain_cloud.launcher import bundle
    from distrain_cloud.launcher.backends import cloud

    repo = tmp_path / "repo"
    (repo / "training" / "assets").mkdir(parents=True)
    (repo / "training" / "__init__.py").write_text("")
    (repo / "training" / "assets" / "big.bin").write_bytes(b"x" * 4096)
    monkeypatch.setattr(cloud, "repo_root", lambda: repo)
    monkeypatch.setattr(bundle, "MAX_FILE_SIZE", 1024)
    code, lines = run_cli(SAGEMAKER + ["--dry-run", "--bundle-files"], capsys)
    assert code == 2 and len(lines) == 1 and "training/assets/big.bin" in lines[0] and "bundle.allow_large" in lines[0]

    job = spec_file(tmp_path, "bundle:\n  allow_large: [training/assets/big.bin]\n")
    with pytest.raises(SystemExit) as end:
        main(SAGEMAKER + [job, "--dry-run", "--bundle-files"])
    out = capsys.readouterr().out
    assert end.value.code == 0
    listing = out[out.index("code bundle files:") :]
    assert "distrain_cloud/training/assets/big.bin" in listing and "4.0 KiB" in listing


def test_the_backend_routes_the_job_and_one_the_instance_implies_is_not_recorded(aws_calls, capsys, tmp_path):
    """`backend:` (or --backend) picks the backend; left out, the instance picks it as before, and a
    backend the instance implies stays out of the recorded spec (job records and job.json read as before)."""
    ec2 = ["submit", "--dry-run", "--json", "--instance", "g5.xlarge", "--region", "us-east-1"]
    plans = []
    for extra in (["--backend", "ec2"], [spec_file(tmp_path, "backend: ec2\n")]):
        with pytest.raises(SystemExit) as end:
            main(ec2 + extra + ["--", "--task", "causal-lm"])
        assert end.value.code in (0, None)
        plans.append(json.loads(capsys.readouterr().out))
    for plan in plans:
        assert plan["backend"] == "ec2" and "backend" not in plan["configs"]["job.json"]["spec"]
    assert load_spec(None, {"instance": "ml.g5.xlarge"}).backend == "sagemaker"
    assert load_spec(None, {}).backend == "local"
    assert aws_calls == []
