"""SageMaker submit, status, wait, cancel, ls and logs against moto (and botocore's Stubber
where moto cannot play the part: its training jobs are Completed at once and it has no
StopTrainingJob)."""

from __future__ import annotations

import datetime as dt
import functools
import gzip
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from clirun import run_cli

from distrain_cloud.infra import aws
from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.api import plan_job, submit_job
from distrain_cloud.launcher.backends import wait_for
from distrain_cloud.launcher.backends.sagemaker import backend as sm
from distrain_cloud.launcher.lease import LineageBusy
from distrain_cloud.launcher.plan import JobRef
from distrain_cloud.launcher.spec import load_spec

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def trust(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
        }
    )


@pytest.fixture
def role(mocked_aws):
    import boto3

    return boto3.client("iam").create_role(
        RoleName="distrain-sm", AssumeRolePolicyDocument=trust("sagemaker.amazonaws.com")
    )["Role"]["Arn"]


def ref(name: str) -> JobRef:
    return JobRef(name, "sagemaker", REGION)


def spec(role_arn, **overrides):
    base = {"instance": "ml.p3.8xlarge", "region": REGION, "sagemaker.role": role_arn, "max_run": "2h"}
    base.update(overrides)
    return load_spec(None, base)


class Recorder:
    """Every request any botocore client sends, as (operation, url, headers, body bytes)."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict, bytes]] = []

    def __call__(self, request, event_name, **_):
        body = request.body
        body = getattr(body, "_raw", body)  # aws-chunked upload (a checksum trailer): the payload inside
        if body is None:
            data = b""
        elif isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode()
        elif hasattr(body, "getvalue"):
            data = body.getvalue()
        else:  # a stream: read it and rewind for the real send
            pos = body.tell()
            data = body.read()
            body.seek(pos)
        data = data.encode() if isinstance(data, str) else data
        headers = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in request.headers.items()}
        op = ".".join(event_name.split(".")[1:])  # "s3.PutObject"
        self.requests.append((op, request.url, headers, data))

    def ops(self, op: str | None = None) -> list:
        return [r for r in self.requests if op is None or r[0] == op]


@pytest.fixture
def recorder(monkeypatch):
    """Hooks every client botocore creates (through infra.aws or not) with a before-send recorder."""
    from awscalls import on_every_client

    rec = Recorder()
    on_every_client(monkeypatch, "before-send", rec, first=True)
    return rec


class _Raw:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def inject_error(monkeypatch, operation: str, code: str, message: str, status: int = 400) -> list[int]:
    """Make every SageMaker `operation` sent through infra.aws.client answer with `code`."""
    from botocore.awsrequest import AWSResponse

    sent: list[int] = []
    real = aws.client

    def answer(request, **_):
        sent.append(1)
        body = json.dumps({"__type": code, "message": message}).encode()
        return AWSResponse(
            request.url, status, {"x-amzn-RequestId": "req-1", "Content-Type": "application/x-amz-json-1.1"}, _Raw(body)
        )

    def client(service, region=None):
        c = real(service, region)
        if service == "sagemaker":
            c.meta.events.register_first(f"before-send.sagemaker.{operation}", answer)
        return c

    monkeypatch.setattr(aws, "client", client)
    monkeypatch.setattr("time.sleep", lambda s: None)  # botocore's retry back-off
    return sent


def nothing_created():
    import boto3

    assert boto3.client("s3").list_buckets()["Buckets"] == []
    assert boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"] == []


@functools.cache
def _shared_loader(*args, **kwargs):
    import botocore.loaders

    return botocore.loaders.create_loader(*args, **kwargs)


@pytest.fixture(autouse=True)
def shared_botocore_data(monkeypatch):
    """One botocore data loader for every session: infra.aws makes a new session per client, and
    each would parse the service models again (~0.3 s a client). Requests are unchanged."""
    import botocore.session

    monkeypatch.setattr(botocore.session, "create_loader", _shared_loader)


# ====================================================================== submit


@pytest.mark.slow  # about 1 s alone, but 3.0-3.4 s under CI's load (the gate listed it twice)
def test_submit_sends_exactly_the_plan_creates_the_bucket_and_uploads_the_bundle_once(role, recorder, capsys):
    import boto3

    first = plan_job(spec(role, spot=True, strategy="zero2", train_args=["--batch-size", "8"]))
    assert not first.failed_checks, first.checks
    assert [c.ok for c in first.checks if c.name == "role exists and trusts SageMaker"] == [True]
    assert submit_job(first) == 0
    assert "code bundle uploaded" in capsys.readouterr().err

    # the request on the wire is the plan's request, verbatim
    (create,) = recorder.ops("sagemaker.CreateTrainingJob")
    assert json.loads(create[3]) == json.loads(json.dumps(first.request))

    bucket, sha = f"distrain-cloud-{ACCOUNT}-{REGION}", first.bundle["sha256"]
    s3 = boto3.client("s3", region_name=REGION)
    assert s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]["BlockPublicAcls"] is True
    rule = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    key = f"distrain-cloud/code/{sha}.tar.gz"
    lease = f"distrain-cloud/leases/{first.job_name}.json"  # beside checkpoints/<lineage>/, taken first
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == [key, lease]
    (taken, *_) = recorder.ops("s3.PutObject")
    assert taken[1].endswith(lease) and taken[2]["If-None-Match"] == "*"  # on the wire: only if absent
    assert json.loads(taken[3]) | {"time": 0} == {
        "job": first.job_name, "lineage": first.job_name, "attempt": None, "backend": "sagemaker",
        "region": REGION, "time": 0,
    }  # fmt: skip
    uploaded = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert hashlib.sha256(uploaded).hexdigest() == sha

    client = boto3.client("sagemaker", region_name=REGION)
    job = client.describe_training_job(TrainingJobName=first.job_name)
    algo = job["AlgorithmSpecification"]
    assert algo["TrainingImage"] == first.summary["image"] and "cu12" in algo["TrainingImage"]
    assert algo["ContainerEntrypoint"] == first.request["AlgorithmSpecification"]["ContainerEntrypoint"]
    assert "distrain_cloud/training/job_entry.sh" in algo["ContainerEntrypoint"][2]
    assert job["ResourceConfig"]["InstanceType"] == "ml.p3.8xlarge" and job["ResourceConfig"]["InstanceCount"] == 1
    assert job["HyperParameters"] == first.request["HyperParameters"]
    assert job["HyperParameters"]["strategy"] == "zero2" and job["HyperParameters"]["batch_size"] == "8"
    assert job["EnableManagedSpotTraining"] is True
    assert job["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 14400}
    assert job["CheckpointConfig"] == {
        "S3Uri": f"s3://{bucket}/distrain-cloud/checkpoints/{first.job_name}/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert job["RoleArn"] == role
    assert job["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{bucket}/{key}"
    tags = {t["Key"]: t["Value"] for t in client.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
    assert tags["distrain-cloud:code-sha256"] == sha and tags["distrain-cloud:lineage"] == first.job_name

    # unchanged code: a second job reuses the bundle, uploading nothing
    second = plan_job(spec(role))
    assert second.bundle["sha256"] == sha and second.job_name != first.job_name
    assert submit_job(second) == 0
    assert "code bundle already in S3" in capsys.readouterr().err
    assert len([r for r in recorder.ops("s3.PutObject") if "/code/" in r[1]]) == 1
    assert len(recorder.ops("s3.CreateBucket")) == 1
    assert {j["TrainingJobName"] for j in client.list_training_jobs()["TrainingJobSummaries"]} == {
        first.job_name,
        second.job_name,
    }


def test_a_role_that_only_trusts_ec2_is_refused_and_nothing_is_created(mocked_aws, recorder, capsys):
    import boto3

    arn = boto3.client("iam").create_role(RoleName="ec2-only", AssumeRolePolicyDocument=trust("ec2.amazonaws.com"))[
        "Role"
    ]["Arn"]
    with pytest.raises(UserError, match=r"IAM role 'ec2-only' does not trust sagemaker.amazonaws.com: add it"):
        plan_job(spec(arn))
    code, out, err = run_cli(
        capsys, "submit", "--yes", "--instance", "ml.p3.8xlarge", "--role", arn, "--region", REGION
    )
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: IAM role 'ec2-only' does not trust sagemaker.amazonaws.com: add it "
        "as a Service principal allowed to sts:AssumeRole in the role's trust policy"
    ]
    nothing_created()
    writes = {op for op, *_ in recorder.requests} - {
        "sts.GetCallerIdentity",
        "iam.GetRole",
        "iam.CreateRole",
        "s3.ListBuckets",
        "sagemaker.ListTrainingJobs",
    }
    assert writes == set()


def test_a_paid_submit_without_a_terminal_needs_yes_and_says_what_it_would_cost(role, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    code, out, err = run_cli(capsys, "submit", "--instance", "ml.p3.8xlarge", "--role", role, "--region", REGION)
    assert code == 2 and out == ""
    note, error = err.strip().splitlines()
    basis = "AWS list price as of 2025-07, recalled, not read from the Price List"  # every cost line says the date
    assert note == (
        f"note: no --max-run given: the job may run 24 h (worst case $352.51, {basis}); set --max-run, e.g. 2h"
    )
    assert error.startswith("error: submitting distrain-") and error.endswith(
        f"worst case $352.51 ({basis}) costs money: add --yes to submit without a terminal to confirm"
    )
    nothing_created()


def test_a_missing_role_or_one_of_another_account_is_refused(role):
    with pytest.raises(UserError, match="IAM role 'nope' not found in this account"):
        plan_job(spec("nope"))
    with pytest.raises(UserError, match="is not in this account"):
        plan_job(spec("arn:aws:iam::999999999999:role/distrain-sm"))
    nothing_created()


def test_over_budget_submit_refuses_and_creates_nothing(role, capsys):
    code, out, err = run_cli(
        capsys,
        "submit",
        "--yes",
        "--instance",
        "ml.p3.8xlarge",
        "--role",
        role,
        "--region",
        REGION,
        "--max-run",
        "6h",
        "--max-cost",
        "50",
    )
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: plan check failed, nothing was created: cost <= --max-cost 50.0 (worst case $88.13")
    nothing_created()


@pytest.mark.parametrize(
    "code, message, expected",
    [
        (
            "ResourceLimitExceeded",
            "The account-level service limit 'ml.p3.8xlarge for training job usage' is 0 Instances",
            "error: AWS quota exceeded for CreateTrainingJob: The account-level service limit "
            "'ml.p3.8xlarge for training job usage' is 0 Instances -- "
            "request an increase in the Service Quotas console",
        ),
        (
            "ThrottlingException",
            "Rate exceeded",
            "error: AWS is throttling CreateTrainingJob (gave up after 9 attempts); retry later",
        ),
    ],
)
def test_create_training_job_errors_are_one_line_with_advice(role, monkeypatch, capsys, code, message, expected):
    sent = inject_error(monkeypatch, "CreateTrainingJob", code, message)
    submit = ["submit", "--yes", "--instance", "ml.p3.8xlarge", "--max-run", "2h"]
    rc, out, err = run_cli(capsys, *submit, "--role", role, "--region", REGION)
    assert rc == 5 and out == ""  # quota, capacity, throttling: their own exit code
    (line,) = err.strip().splitlines()
    assert line.startswith(expected), line
    assert len(sent) == (9 if code == "ThrottlingException" else 1)  # throttling is retried, quota is not
    if code == "ResourceLimitExceeded":
        assert "smaller instance type/count" in line


@pytest.mark.slow  # three plans and a CLI run (3.5 s before the lease's part, under load)
def test_resume_from_reuses_the_earlier_jobs_checkpoints(role, capsys):
    from moto.sagemaker.models import sagemaker_backends

    first = plan_job(spec(role, spot=True))
    submit_job(first)
    again = plan_job(spec(role, spot=True, resume_from=first.job_name))
    assert again.request["CheckpointConfig"] == first.request["CheckpointConfig"]
    assert {"Key": "distrain-cloud:lineage", "Value": first.job_name} in again.request["Tags"]
    assert [c.ok for c in again.checks if c.name.startswith("resume from")] == [True]

    # One live attempt per lineage: while the first job runs (moto's jobs complete at once, so its
    # status is set as SageMaker would show it), `resume` and `submit --resume-from` launch nothing.
    jobs = sagemaker_backends[ACCOUNT][REGION].training_jobs
    jobs[first.job_name].training_job_status = "InProgress"
    code, _, err = run_cli(capsys, "resume", first.job_name, "--yes")
    busy = (
        f"lineage {first.job_name} has a live attempt: {first.job_name} (InProgress); one attempt runs at a time: "
        f"`distrain-cloud status {first.job_name}`, or stop it (`distrain-cloud cancel {first.job_name}`) and "
        "resume again"
    )
    assert code == 2 and err.strip().splitlines() == [f"error: {busy}"]
    with pytest.raises(LineageBusy, match=re.escape(busy)):
        submit_job(again)  # as `submit --resume-from` does
    assert list(jobs) == [first.job_name]
    jobs[first.job_name].training_job_status = "Stopped"  # ended: the next attempt takes the lease over
    assert submit_job(again) == 0 and list(jobs) == [first.job_name, again.job_name]
    bucket, key = again.request["CheckpointConfig"]["S3Uri"].removeprefix("s3://").split("/", 1)
    import boto3

    lease = key.replace(f"checkpoints/{first.job_name}/", f"leases/{first.job_name}.json")
    body = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=lease)["Body"].read())
    assert (body["job"], body["lineage"]) == (again.job_name, first.job_name)
    with pytest.raises(UserError, match=r"AWS rejected DescribeTrainingJob: Could not find training job"):
        plan_job(spec(role, resume_from="never-ran-20250101-000000-abcd"))


def test_a_spot_job_is_checked_against_the_spot_quota(role, stub_client):
    stub = stub_client("service-quotas", REGION)
    page = {
        "Quotas": [
            {"QuotaName": "ml.g5.12xlarge for training job usage", "Value": 8.0},
            {"QuotaName": "ml.g5.12xlarge for spot training job usage", "Value": 1.0},
        ]
    }
    for _ in range(2):
        stub.add_response("list_service_quotas", page, {"ServiceCode": "sagemaker"})

    spot = plan_job(spec(role, instance="ml.g5.12xlarge", nodes=2, spot=True))
    ((name, detail),) = [(c.name, c.detail) for c in spot.failed_checks]
    assert name == "quota: ml.g5.12xlarge for spot training job usage"
    assert detail.startswith("1 allowed, 0 in use by 0 in-progress job(s), 2 needed: 2 > 1;")
    on_demand = plan_job(spec(role, instance="ml.g5.12xlarge", nodes=2))
    assert [c.ok for c in on_demand.checks if c.name.startswith("quota:")] == [True]


def test_a_bucket_we_may_not_use_fails_the_plan_instead_of_promising_to_create_it(role, stub_client):
    stub_client("s3", REGION).add_client_error("head_bucket", service_error_code="403", http_status_code=403)
    plan = plan_job(spec(role))
    failed = [(c.name, c.detail) for c in plan.failed_checks]
    assert len(failed) == 1 and failed[0][0] == "bucket usable" and "access denied" in failed[0][1], failed


def test_a_bucket_check_s3_does_not_answer_is_not_checked_rather_than_promised(role, stub_client):
    stub_client("s3", REGION).add_client_error("head_bucket", service_error_code="SlowDown", http_status_code=503)
    plan = plan_job(spec(role))
    (check,) = [c for c in plan.checks if c.name.startswith("bucket")]
    assert (check.ok, check.detail.split(": ", 1)[1]) == (None, "not checked (SlowDown)")


# ====================================================================== secrets never leave as values


def test_a_secret_value_is_in_no_request_and_not_in_the_bundle(role, recorder, capsys):
    import boto3

    value = "fake-token-value-0123456789"
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="hf-token", SecretString=value)["ARN"]
    plan = plan_job(spec(role, secrets={"HF_TOKEN": arn}, spot=True, **{"hub.repo_id": "me/gpt2-emotion"}))
    assert submit_job(plan) == 0
    out, err = capsys.readouterr()
    ops = [op for op, *_ in recorder.requests]
    assert "sagemaker.CreateTrainingJob" in ops and "s3.PutObject" in ops  # the recorder saw the whole submit
    assert not any("GetSecretValue" in op or "GetParameter" in op for op in ops)
    needle = value.encode()
    for op, url, headers, body in recorder.requests:
        if op.endswith(".CreateSecret"):  # the test's own setup
            continue
        assert value not in url and value not in json.dumps(headers), op
        assert needle not in body, op
        if body[:2] == b"\x1f\x8b":
            assert needle not in gzip.decompress(body), op
    (create,) = recorder.ops("sagemaker.CreateTrainingJob")
    assert arn.encode() in create[3]  # the reference travels; the value does not
    assert value not in plan.to_json() and value not in out + err

    raw = gzip.decompress(plan.payload.bundle)
    assert needle not in raw
    with tarfile.open(fileobj=io.BytesIO(plan.payload.bundle), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                assert needle not in tar.extractfile(member).read(), member.name

    # the job can still get it: the shipped resolver turns the reference into the value
    from distrain_cloud.infra.secret_env import resolve_all

    refs = json.loads(plan.request["Environment"]["DISTRAIN_SECRETS"])
    assert resolve_all(refs) == {"HF_TOKEN": value}


# ====================================================================== status, wait, cancel


def described(status, secondary, reason=None, name="job-1"):
    now = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    job = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://b/distrain-cloud/jobs/{name}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img"},
        "ResourceConfig": {"InstanceType": "ml.p3.8xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CheckpointConfig": {"S3Uri": f"s3://b/distrain-cloud/checkpoints/{name}/"},
        "CreationTime": now,
    }
    if reason:
        job["FailureReason"] = reason
    return job


@pytest.fixture
def stub(stub_client):
    """infra.aws.client hands out one Stubber-backed SageMaker client; other services are real."""
    return stub_client("sagemaker", REGION)


def expect_describe(stub, *jobs):
    for job in jobs:
        stub.add_response("describe_training_job", job, {"TrainingJobName": job["TrainingJobName"]})


@pytest.mark.parametrize(
    "status, secondary, terminal",
    [
        ("InProgress", "Training", False),
        ("Stopping", "Stopping", False),
        ("Completed", "Completed", True),
        ("Failed", "Failed", True),
        ("Stopped", "Stopped", True),
        ("Deleting", "Stopped", True),
    ],
)
def test_status_for_every_training_job_status(stub, status, secondary, terminal):
    expect_describe(stub, described(status, secondary, reason="AlgorithmError: boom" if status == "Failed" else None))
    info = sm.BACKEND.status(ref("job-1"))
    assert (info["status"], info["secondary_status"], info["terminal"]) == (status, secondary, terminal)
    assert info["instance"] == "2 x ml.p3.8xlarge"
    assert info["checkpoints"] == "s3://b/distrain-cloud/checkpoints/job-1/"
    if status == "Failed":
        assert info["detail"] == "AlgorithmError: boom"


def test_every_status_botocore_knows_is_handled():
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    assert set(model.shape_for("TrainingJobStatus").enum) <= {s.value for s in sm.TrainingJobStatus}


@pytest.mark.parametrize(
    "status, secondary, terminal, says",
    [
        ("InProgress", "Interrupted", False, "spot"),
        ("Stopped", "MaxWaitTimeExceeded", True, "--max-wait"),
        ("Failed", "MaxWaitTimeExceeded", True, "--max-wait"),
        ("Stopped", "MaxRuntimeExceeded", True, "--max-run"),
        ("Stopped", "Stopped", True, ""),
    ],
)
def test_status_explains_spot_and_limit_secondary_statuses(stub, status, secondary, terminal, says):
    expect_describe(stub, described(status, secondary))
    info = sm.BACKEND.status(ref("job-1"))
    assert (info["status"], info["secondary_status"], info["terminal"]) == (status, secondary, terminal)
    assert says in info["detail"]


def test_a_failure_reason_wins_over_the_generic_explanation(stub):
    expect_describe(stub, described("Failed", "MaxWaitTimeExceeded", reason="Spot capacity unavailable"))
    assert sm.BACKEND.status(ref("job-1"))["detail"] == "Spot capacity unavailable"


def test_status_of_an_unknown_job_is_one_line(mocked_aws):
    with pytest.raises(UserError, match=r"^AWS rejected DescribeTrainingJob: Could not find training job"):
        sm.BACKEND.status(ref("nope"))


@pytest.fixture
def no_sleep(monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr("time.sleep", sleeps.append)
    return sleeps


def untimed(err: str) -> list[str]:
    """wait's lines without their leading HH:MM:SS (checked here)."""
    lines = err.splitlines()
    assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in lines), lines
    return [line[9:] for line in lines]


def test_wait_prints_each_transition_once_and_returns_0_when_completed(stub, no_sleep, capsys):
    expect_describe(
        stub,
        described("InProgress", "Starting"),
        described("InProgress", "Downloading"),
        described("InProgress", "Training"),
        described("InProgress", "Training"),
        described("InProgress", "Uploading"),
        described("Completed", "Completed"),
    )
    assert wait_for(sm.BACKEND, ref("job-1"), poll=7) == 0
    assert untimed(capsys.readouterr().err) == [
        "job-1: InProgress / Starting",
        "job-1: InProgress / Downloading",
        "job-1: InProgress / Training",
        "job-1: InProgress / Uploading",
        "job-1: Completed / Completed",
    ]
    assert no_sleep == [7] * 5


@pytest.mark.parametrize(
    "final",
    [
        described("Failed", "Failed", reason="AlgorithmError: CUDA out of memory"),
        described("Stopped", "Stopped"),
        described("Stopped", "MaxWaitTimeExceeded"),
    ],
)
def test_wait_returns_1_for_failed_or_stopped(stub, no_sleep, capsys, final):
    expect_describe(stub, described("InProgress", "Training"), described("Stopping", "Stopping"), final)
    assert wait_for(sm.BACKEND, ref("job-1")) == 1
    lines = untimed(capsys.readouterr().err)
    assert lines[:2] == ["job-1: InProgress / Training", "job-1: Stopping / Stopping"]
    assert lines[2].startswith(f"job-1: {final['TrainingJobStatus']} / {final['SecondaryStatus']}")
    if final.get("FailureReason"):
        assert lines[2].endswith(" - AlgorithmError: CUDA out of memory")


def test_submit_wait_follows_the_job(role, no_sleep, capsys):
    assert submit_job(plan_job(spec(role)), wait=True) == 0  # moto's jobs complete at once
    assert capsys.readouterr().err.splitlines()[-1].endswith(": Completed / Completed")


def test_cancel_stops_a_running_job(stub, capsys):
    expect_describe(stub, described("InProgress", "Training"))
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "job-1"})
    assert sm.BACKEND.cancel(ref("job-1")).startswith("stopping job-1: it saves a checkpoint first")
    # and through the CLI, which finds the job (no record here) before it asks for its status
    expect_describe(stub, described("InProgress", "Interrupted"), described("InProgress", "Interrupted"))
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "job-1"})
    code, out, _ = run_cli(capsys, "cancel", "job-1", "--region", REGION)
    assert code == 0 and out.startswith("stopping job-1")


@pytest.mark.parametrize("status", ["Completed", "Failed", "Stopped"])
def test_cancel_refuses_politely_for_an_ended_job(stub, capsys, status):
    expect_describe(stub, described(status, status))  # and no StopTrainingJob: the Stubber would fail on one
    assert sm.BACKEND.cancel(ref("job-1")) == f"job-1 already ended: {status}"
    expect_describe(stub, described(status, status), described(status, status))  # found, then asked
    code, out, err = run_cli(capsys, "cancel", "job-1", "--region", REGION)
    assert (code, out.strip(), err) == (0, f"job-1 already ended: {status}", "")


def test_cancel_of_a_stopping_job_sends_nothing_more(stub):
    expect_describe(stub, described("Stopping", "Stopping"))
    assert sm.BACKEND.cancel(ref("job-1")) == "job-1 is already stopping"


def test_throttled_status_is_one_line(mocked_aws, monkeypatch, capsys):
    inject_error(monkeypatch, "DescribeTrainingJob", "ThrottlingException", "Rate exceeded")
    code, out, err = run_cli(capsys, "status", "job-1", "--region", REGION)
    assert code == 5  # retry later: the capacity class
    assert err.strip() == "error: AWS is throttling DescribeTrainingJob (gave up after 9 attempts); retry later"


# ====================================================================== ls


@pytest.mark.slow  # creates jobs in moto: over 3 s under CI's load
def test_ls_lists_created_jobs(role, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `ls` also lists the local jobs under ./runs: none here
    names = set()
    for _ in range(2):
        p = plan_job(spec(role))
        submit_job(p)
        names.add(p.job_name)
    jobs = sm.BACKEND.list_jobs(region=REGION, workdir=Path("runs"), limit=20)
    assert {j["job_name"] for j in jobs} == names and {j["status"] for j in jobs} == {"Completed"}
    code, out, _ = run_cli(capsys, "ls", "--json", "--region", REGION)
    assert code == 0
    listed = json.loads(out)
    assert {j["job_name"] for j in listed} == names
    assert all(j["created"] for j in listed)
    code, out, _ = run_cli(capsys, "status", next(iter(names)), "--json", "--region", REGION)
    assert code == 0 and json.loads(out)["status"] == "Completed"


def test_ls_with_no_jobs_is_empty(mocked_aws, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout's ./runs, where README's local job leaves its record
    assert sm.BACKEND.list_jobs(region=REGION, workdir=Path("runs"), limit=20) == []
    code, out, _ = run_cli(capsys, "ls", "--json", "--region", REGION)
    assert (code, json.loads(out)) == (0, [])


# ====================================================================== logs


def put_logs(job, host, lines, start=0):
    """Events `start` ms after now (CloudWatch drops events older than 14 days)."""
    import time

    import boto3

    start += int(time.time() * 1000)

    logs = boto3.client("logs", region_name=REGION)
    try:
        logs.create_log_group(logGroupName=LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    stream = f"{job}/{host}-1732600000"
    try:
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    logs.put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": start + i, "message": m} for i, m in enumerate(lines)],
    )


def test_logs_print_every_host_prefixed(role, capsys):
    p = plan_job(spec(role, nodes=2))
    submit_job(p)
    job = p.job_name
    put_logs(job, "algo-1", ["node_launch node_rank=0 nodes=2 processes=8", "step=10 train_loss=1.2345 lr=5e-05"])
    put_logs(job, "algo-2", ["node_launch node_rank=1 nodes=2 processes=8"])
    put_logs(job + "-other", "algo-1", ["not this job"])  # a name sharing the prefix
    assert [line.text() for line in sm.BACKEND.log_lines(ref(job))] == [
        "[algo-1] node_launch node_rank=0 nodes=2 processes=8",
        "[algo-1] step=10 train_loss=1.2345 lr=5e-05",
        "[algo-2] node_launch node_rank=1 nodes=2 processes=8",
    ]
    code, out, _ = run_cli(capsys, "logs", job, "--region", REGION)
    assert code == 0 and out.splitlines()[0] == "[algo-1] node_launch node_rank=0 nodes=2 processes=8"
    # --follow on an ended job prints it all once and returns without sleeping
    code, out, _ = run_cli(capsys, "logs", job, "--follow", "--region", REGION)
    assert code == 0 and len(out.splitlines()) == 3
    code, out, err = run_cli(capsys, "logs", job, "--json", "--region", REGION)
    records = [json.loads(line) for line in out.splitlines()]  # every stdout line is JSON
    assert (code, err) == (0, "")
    assert [(r["host"], r["message"]) for r in records] == [
        ("algo-1", "node_launch node_rank=0 nodes=2 processes=8"),
        ("algo-1", "step=10 train_loss=1.2345 lr=5e-05"),
        ("algo-2", "node_launch node_rank=1 nodes=2 processes=8"),
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"]) for r in records)


def test_logs_of_a_job_with_no_log_group_yet_print_nothing(mocked_aws, capsys):
    assert list(sm.BACKEND.log_lines(ref("starting-job"))) == []
    put_logs("another-job", "algo-1", ["x"])  # a group, but no stream of this job
    assert list(sm.BACKEND.log_lines(ref("starting-job"))) == []
    code, out, err = run_cli(capsys, "logs", "starting-job", "--json", "--backend", "sagemaker", "--region", REGION)
    assert (code, out, err) == (0, "", "")


@pytest.mark.parametrize("as_json", [False, True])
def test_logs_follow_prints_new_lines_once_until_the_job_ends(mocked_aws, stub_client, monkeypatch, capsys, as_json):
    stub = stub_client("sagemaker", REGION)
    expect_describe(
        stub,
        described("InProgress", "Training", name="run-1"),
        described("InProgress", "Training", name="run-1"),
        described("Completed", "Completed", name="run-1"),
    )
    put_logs("run-1", "algo-1", ["step=10 train_loss=2.0"])
    more = iter(
        [
            lambda: (
                put_logs("run-1", "algo-1", ["step=20 train_loss=1.5"], start=1000),
                put_logs("run-1", "algo-2", ["late host line"]),
            ),
            lambda: put_logs("run-1", "algo-1", ["step=30 train_loss=1.0", "model_saved=/opt/ml/model"], start=2000),
        ]
    )
    monkeypatch.setattr("time.sleep", lambda s: next(more)())
    calls: list[str] = []  # every CloudWatch Logs call the command makes
    real_client = aws.client

    def counting_client(service, region=None, **kwargs):
        client = real_client(service, region, **kwargs)
        if service == "logs":
            client.meta.events.register("before-call.logs.*", lambda model, **_: calls.append(model.name))
        return client

    monkeypatch.setattr(aws, "client", counting_client)
    argv = ["logs", "run-1", "--follow", "--backend", "sagemaker", "--region", REGION]
    code, out, err = run_cli(capsys, *argv, *(["--json"] if as_json else []))
    assert (code, err) == (0, "")
    assert calls == ["FilterLogEvents"] * 3  # one search a round for both hosts, not one read per host
    expected = [
        ("algo-1", "step=10 train_loss=2.0"),
        ("algo-1", "step=20 train_loss=1.5"),
        ("algo-2", "late host line"),
        ("algo-1", "step=30 train_loss=1.0"),
        ("algo-1", "model_saved=/opt/ml/model"),
    ]
    if as_json:
        assert [(r["host"], r["message"]) for r in map(json.loads, out.splitlines())] == expected
    else:
        assert out.splitlines() == [f"[{host}] {message}" for host, message in expected]
    stub.assert_no_pending_responses()


def test_logs_json_gives_each_line_of_an_event_its_host_and_the_events_time(stub_client, capsys):
    logs = stub_client("logs", REGION)
    stream = "run-1/algo-2-1732600000"
    events = [
        {"timestamp": 1732600000123, "message": "Traceback (most recent call last):\n  File x\nValueError: boom\n"},
        {"timestamp": 1732600001000, "message": 'a line with "quotes" and \\ and \t'},
    ]
    logs.add_response(
        "filter_log_events",
        {"events": [{**e, "logStreamName": stream, "eventId": str(i)} for i, e in enumerate(events)]},
        {"logGroupName": LOG_GROUP, "logStreamNamePrefix": "run-1/"},
    )
    code, out, err = run_cli(capsys, "logs", "run-1", "--json", "--backend", "sagemaker", "--region", REGION)
    assert (code, err) == (0, "")
    first = {"time": "2024-11-26T05:46:40.123Z", "host": "algo-2"}
    assert [json.loads(line) for line in out.splitlines()] == [
        {**first, "message": "Traceback (most recent call last):"},
        {**first, "message": "  File x"},
        {**first, "message": "ValueError: boom"},
        {"time": "2024-11-26T05:46:41.000Z", "host": "algo-2", "message": 'a line with "quotes" and \\ and \t'},
    ]


def test_logs_read_every_page_of_one_search_over_all_streams_and_trust_no_field(stub_client, capsys, monkeypatch):
    """One FilterLogEvents search a round, whatever the number of hosts, page by page: a page may
    come back empty with a token after it (CloudWatch searches in chunks of time), and only a page
    without a token ends the round. A followed log reads on from a little before the newest event,
    printing no event twice. Every request passes the API model; events that are not what the
    model says are skipped."""
    from distrain_cloud.launcher.apimodel import problems

    logs = stub_client("logs", REGION)
    sagemaker = stub_client("sagemaker", REGION)
    expect_describe(
        sagemaker, described("InProgress", "Training", name="run-1"), described("Completed", "Completed", name="run-1")
    )
    t = 1732600000000

    def event(i: int, host: str, message: str, at: int) -> dict:
        return {"logStreamName": f"run-1/{host}-1732600000", "eventId": f"e{i}", "timestamp": at, "message": message}

    base = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": "run-1/"}
    rounds = [
        (base, {"events": [event(1, "algo-1", "step=10", t)], "nextToken": "p2"}),
        ({**base, "nextToken": "p2"}, {"events": [], "nextToken": "p3"}),  # empty, and not the end
        (
            {**base, "nextToken": "p3"},
            {"events": [event(2, "algo-2", "host two", t + 5), event(3, "algo-1", "step=20", t + 10)]},
        ),
        # the next round reads again from 30 s before the newest event: what it printed comes back
        (
            {**base, "startTime": t + 10 - 30_000},
            {
                "events": [
                    event(1, "algo-1", "step=10", t),
                    event(4, "algo-2", "late, stamped early", t + 7),  # delivered after step=20
                    event(3, "algo-1", "step=20", t + 10),
                    {**event(5, "algo-1", "x", t + 11), "logStreamName": "run-10/algo-1-1"},  # another job's
                    event(6, "algo-1", "model_saved=/opt/ml/model", t + 20),
                ]
            },
        ),
    ]
    for params, response in rounds:
        assert problems("logs", "FilterLogEvents", params) == []
        logs.add_response("filter_log_events", response, params)
    monkeypatch.setattr("time.sleep", lambda s: None)
    code, out, err = run_cli(capsys, "logs", "run-1", "--follow", "--backend", "sagemaker", "--region", REGION)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "[algo-1] step=10",
        "[algo-2] host two",
        "[algo-1] step=20",
        "[algo-2] late, stamped early",
        "[algo-1] model_saved=/opt/ml/model",
    ]


def sagemaker_refuses_taken_names(monkeypatch, *, lose_first_answer: bool = False) -> list[str]:
    """CreateTrainingJob as SageMaker answers it and moto does not: `ResourceInUse` when a job of that
    name exists. With `lose_first_answer`, the first job is created and its answer lost on the way back
    (a dropped connection), so botocore retries the call, as in real life."""
    from botocore.exceptions import ConnectionClosedError
    from moto.sagemaker.exceptions import ResourceInUseException
    from moto.sagemaker.models import SageMakerModelBackend

    answers: list[str] = []
    create = SageMakerModelBackend.create_training_job

    def create_like_sagemaker(self, training_job_name, *args, **kwargs):
        if training_job_name in self.training_jobs:
            answers.append("ResourceInUse")
            raise ResourceInUseException(message=f"Training job {training_job_name} already exists")
        job = create(self, training_job_name, *args, **kwargs)
        answers.append("created")
        if lose_first_answer and len(answers) == 1:
            raise ConnectionClosedError(endpoint_url="https://api.sagemaker.us-east-1.amazonaws.com")
        return job

    monkeypatch.setattr(SageMakerModelBackend, "create_training_job", create_like_sagemaker)
    monkeypatch.setattr("time.sleep", lambda s: None)  # botocore's retry back-off
    return answers


def test_a_create_whose_answer_was_lost_is_still_a_success(role, monkeypatch, capsys):
    sent = sagemaker_refuses_taken_names(monkeypatch, lose_first_answer=True)
    submit = ["submit", "--yes", "--instance", "ml.p3.8xlarge", "--max-run", "2h"]
    rc, out, err = run_cli(capsys, *submit, "--role", role, "--region", REGION)
    assert sent == ["created", "ResourceInUse"]  # delivered, answer dropped; the retry met its own job
    assert rc == 0, err
    assert err.startswith("submitted ")
    import boto3

    jobs = boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"]
    assert len(jobs) == 1


def test_a_name_taken_by_another_job_is_a_conflict(role, monkeypatch):
    from distrain_cloud.launcher.backends.sagemaker.backend import create_training_job_once

    sent = sagemaker_refuses_taken_names(monkeypatch)
    plan = plan_job(spec(role), dry_run=False)
    create_training_job_once(plan.request, REGION)
    create_training_job_once(plan.request, REGION)  # the same request again: the same job
    other = {**plan.request, "HyperParameters": {**plan.request["HyperParameters"], "seed": "7"}}
    with pytest.raises(UserError, match="a different training job named .* already exists"):
        create_training_job_once(other, REGION)
    assert sent == ["created", "ResourceInUse", "ResourceInUse"]
