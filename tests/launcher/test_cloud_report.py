"""`distrain-cloud report JOB` for cloud jobs: the job's metrics fetched from S3 (moto), then the page.

SageMaker uploads the output folder as <S3OutputPath>/<job>/output/output.tar.gz when the job ends;
EC2's node agent uploads it as plain files under the job's output_uri (the model under model_uri).
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest
from clirun import run_cli

REGION = "us-east-1"
BUCKET = "out-bucket"
ROWS = [
    {"step": 10, "train_loss": 2.345, "lr": 1e-3, "tokens_per_sec": 15620.0, "time": 1.0},
    {"step": 20, "train_loss": 1.234, "lr": 5e-4, "tokens_per_sec": 16000.0, "time": 2.0},
    {"step": 20, "eval_loss": 1.456, "eval_accuracy": 0.625, "time": 2.1},
]
METRICS = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


def record(job_records: Path, name: str, backend: str, **where) -> None:
    """The record `submit` leaves on this machine (a cloud job has no work folder)."""
    job_records.mkdir(parents=True, exist_ok=True)
    body = {"name": name, "backend": backend, "region": REGION, "workdir": None, **where}
    (job_records / f"{name}.json").write_text(json.dumps(body))


def put(key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3", region_name=REGION).put_object(Bucket=BUCKET, Key=key, Body=body)


def tarball(members: list[tuple[str, bytes | str]]) -> bytes:
    """A .tar.gz of (name, bytes) files; a str is a symlink to that target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    return buf.getvalue()


@pytest.fixture
def bucket(mocked_aws):
    import boto3

    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture
def ec2_bucket(bucket):
    """`bucket`, with moto's EC2 in place: its first use in a process imports ~2.5 s of region
    data, paid here as test_ec2_lifecycle's stack fixture pays it, not by the test it serves."""
    import boto3

    boto3.client("ec2", region_name=REGION).describe_instances()
    return bucket


def sagemaker_job(name: str) -> None:
    """A training job as moto keeps it: Completed at once, with the output path submit sends."""
    import boto3

    boto3.client("sagemaker", region_name=REGION).create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": "image", "TrainingInputMode": "File"},
        RoleArn="arn:aws:iam::123456789012:role/sm",
        OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/distrain-cloud/jobs/"},
        ResourceConfig={"InstanceType": "ml.g5.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )


def ec2_job(name: str, node: dict | None) -> None:
    """An EC2 job's description in S3 and its one node's final record (None: not reported yet)."""
    root = f"distrain-cloud/jobs/{name}"
    now = time.time()
    description = {
        "job": name,
        "nodes": 1,
        "lineage": name,
        "attempt": 1,
        "checkpoint_uri": f"s3://{BUCKET}/distrain-cloud/checkpoints/{name}/",
        "deadline": now + 3600,
        "submitted": now - 5,
        "instance_type": "g5.2xlarge",
        "output_uri": f"s3://{BUCKET}/{root}/output/",
        "model_uri": f"s3://{BUCKET}/{root}/model/",
    }
    put(f"{root}/job.json", json.dumps(description).encode())
    if node is not None:
        put(f"{root}/nodes/0.json", json.dumps({"time": now, **node}).encode())


def assert_page_has_the_losses(page: Path) -> str:
    text = page.read_text()
    assert 'id="plot-loss"' in text and (page.parent / "plots" / "loss.svg").is_file()
    assert "<th>train_loss</th><td>1.234</td>" in text and "<th>eval_loss</th><td>1.456</td>" in text
    assert "<b>Completed</b>" in text
    return text


def test_a_sagemaker_jobs_report_reads_only_the_named_members_of_its_output_archive(
    bucket, job_records, tmp_path, capsys
):
    job = "sm-job-1"
    sagemaker_job(job)
    record(job_records, job, "sagemaker")
    put(
        f"distrain-cloud/jobs/{job}/output/output.tar.gz",
        tarball(
            [
                ("../metrics.jsonl", b"not these"),  # a path out of the folder: never read
                ("sample.txt", "/etc/hostname"),  # a link, not a file: skipped
                ("wandb/run-1/files/config.yaml", b"x: 1"),
                ("./metrics.jsonl", METRICS),
            ]
        ),
    )
    workdir = tmp_path / "runs"
    code, out, err = run_cli(capsys, "report", job, "--workdir", str(workdir))
    assert code == 0, err
    page = Path(out.strip())
    assert page == workdir / job / "report" / "report.html"
    text = assert_page_has_the_losses(page)
    assert "<th>instance</th><td>1 x ml.g5.2xlarge</td>" in text
    assert (workdir / job / "output" / "metrics.jsonl").read_bytes() == METRICS
    assert sorted(p.name for p in (workdir / job / "output").iterdir()) == ["metrics.jsonl"]
    assert not (tmp_path / "metrics.jsonl").exists() and not (workdir / "metrics.jsonl").exists()


def test_an_ec2_jobs_report_reads_its_output_and_model_folders(ec2_bucket, job_records, tmp_path, capsys):
    job = "ec2-job-1"
    ec2_job(job, {"status": "Completed", "exit_code": 0, "reason": "", "step": 20})
    record(job_records, job, "ec2", stack="distrain-cloud", bucket=BUCKET, prefix="distrain-cloud")
    put(f"distrain-cloud/jobs/{job}/output/metrics.jsonl", METRICS)
    put(f"distrain-cloud/jobs/{job}/output/sample.txt", b"Once upon a time\n")
    put(f"distrain-cloud/jobs/{job}/model/training_args.json", json.dumps({"task": "causal-lm"}).encode())
    workdir = tmp_path / "runs"
    code, out, err = run_cli(capsys, "report", job, "--workdir", str(workdir))
    assert code == 0, err
    text = assert_page_has_the_losses(Path(out.strip()))
    assert "Once upon a time" in text and "<th>task</th><td>causal-lm</td>" in text
    # A fetched job is not a local one: `ls` does not list its folder.
    code, out, _ = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(workdir), "--json")
    assert (code, json.loads(out)) == (0, [])


def test_a_running_job_without_metrics_yet_is_one_line_naming_where_they_will_be(
    ec2_bucket, job_records, tmp_path, capsys
):
    job = "ec2-job-2"
    ec2_job(job, None)
    record(job_records, job, "ec2", stack="distrain-cloud", bucket=BUCKET, prefix="distrain-cloud")
    code, out, err = run_cli(capsys, "report", job, "--workdir", str(tmp_path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"error: {job} is InProgress: its metrics reach S3 when it ends "
        f"(s3://{BUCKET}/distrain-cloud/jobs/{job}/output/metrics.jsonl is not there yet); "
        f"`distrain-cloud logs {job} --follow` shows its steps meanwhile"
    ]


def test_an_ended_job_with_no_output_names_the_missing_object(bucket, job_records, tmp_path, capsys):
    job = "sm-job-2"
    sagemaker_job(job)
    record(job_records, job, "sagemaker")
    code, _, err = run_cli(capsys, "report", job, "--workdir", str(tmp_path))
    assert code == 2
    assert err.splitlines() == [
        f"error: {job} ended Completed and left no metrics at "
        f"s3://{BUCKET}/distrain-cloud/jobs/{job}/output/output.tar.gz (it logged no step); "
        f"`distrain-cloud logs {job}` says why"
    ]


def test_an_archive_that_is_not_one_is_one_line(bucket, job_records, tmp_path, capsys):
    job = "sm-job-3"
    sagemaker_job(job)
    record(job_records, job, "sagemaker")
    put(f"distrain-cloud/jobs/{job}/output/output.tar.gz", b"not a tarball")
    code, _, err = run_cli(capsys, "report", job, "--workdir", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: s3://{BUCKET}/distrain-cloud/jobs/{job}/output/output.tar.gz is not a readable")


def test_no_credentials_is_one_line_and_exit_3(no_aws_config, job_records, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    record(job_records, "sm-job-4", "sagemaker")
    code, out, err = run_cli(capsys, "report", "sm-job-4", "--workdir", str(tmp_path))
    assert (code, out) == (3, "")
    assert err.splitlines() == [
        "error: no AWS credentials found: run `aws configure` or set AWS_PROFILE / "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    ]


def test_a_resumed_sagemaker_jobs_report_fetches_and_plots_its_whole_lineage(bucket, job_records, tmp_path, capsys):
    first_rows = [{"step": 5, "train_loss": 3.0}, {"step": 10, "train_loss": 2.5}]
    for name, rows in (("sm-first", first_rows), ("sm-second", ROWS)):
        sagemaker_job(name)
        put(
            f"distrain-cloud/jobs/{name}/output/output.tar.gz",
            tarball([("metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())]),
        )
    record(job_records, "sm-first", "sagemaker")
    record(job_records, "sm-second", "sagemaker", spec={"resume_from": "sm-first"})  # as `resume` records it
    workdir = tmp_path / "runs"
    code, out, err = run_cli(capsys, "report", "sm-second", "--workdir", str(workdir))
    assert code == 0, err
    text = assert_page_has_the_losses(Path(out.strip()))
    assert "lineage, oldest first: sm-first (steps 5-10) &rarr; sm-second (steps 10-20)" in text
    assert (workdir / "sm-first" / "output" / "metrics.jsonl").is_file()  # fetched from S3 like the job's own
    loss = (Path(out.strip()).parent / "plots" / "loss.svg").read_text()
    assert loss.count("<circle") == 3 + 1  # train steps 5, 10 (sm-second's), 20; one eval


def test_an_attempt_missing_from_s3_is_named_on_the_page(bucket, job_records, tmp_path, capsys):
    sagemaker_job("sm-second")
    put("distrain-cloud/jobs/sm-second/output/output.tar.gz", tarball([("metrics.jsonl", METRICS)]))
    record(job_records, "sm-second", "sagemaker", spec={"resume_from": "sm-gone"})
    code, out, err = run_cli(capsys, "report", "sm-second", "--workdir", str(tmp_path / "runs"))
    assert code == 0, err
    assert "; not plotted: sm-gone: " in Path(out.strip()).read_text()
