"""One live attempt per lineage (launcher/lease.py): the lease's protocol on both stores, what moto
does with S3's conditional writes, and a local lineage through the real CLI. The cloud races run
in test_ec2_lifecycle.py (two resumes at once, a --spot --wait relaunch) and
test_sagemaker_lifecycle.py (resume and --resume-from of a running job)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from clirun import run_cli

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import lease as leases
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.lease import FileStore, LineageBusy, S3Store, lease_key, lineage_lease, take
from distrain_cloud.launcher.spec import load_spec


def me(job: str, runs: Path, lineage: str = "first-job") -> dict:
    return {"job": job, "lineage": lineage, "backend": "local", "attempt": None, "workdir": str(runs), "time": 0}


def local_job(runs: Path, name: str, status: str | None) -> None:
    """A local job's folder as its submit leaves it: job.json, then status.json (InProgress: ours)."""
    root = runs / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.json").write_text("{}")
    if status is not None:
        record = {"status": status, "exit_code": None, "updated": time.time()}
        record |= {"pid": os.getpid(), "host": socket.gethostname()} if status == "InProgress" else {}
        (root / "status.json").write_text(json.dumps(record))


# ====================================================================== the protocol, on a local lineage


def test_a_live_holder_refuses_and_an_ended_one_is_taken_over(tmp_path):
    runs = tmp_path / "runs"
    store = FileStore(tmp_path / "leases" / "first-job.json")
    local_job(runs, "first-job", "InProgress")
    take(store, me("first-job", runs))
    with pytest.raises(LineageBusy, match=r"lineage first-job has a live attempt: first-job \(InProgress\)") as busy:
        take(store, me("second-job", runs))
    assert busy.value.holder == "first-job" and busy.value.exit_code == 2
    assert json.loads(store.path.read_text())["job"] == "first-job"

    local_job(runs, "first-job", "Stopped")
    held = take(store, me("second-job", runs))
    assert json.loads(store.path.read_text())["job"] == "second-job" and held.etag == store.read()[1]
    assert take(store, me("second-job", runs)).etag == held.etag  # the holder itself (a retried submit) keeps it


def test_of_two_that_judged_the_holder_ended_only_one_takes_the_lease(tmp_path):
    """The race inside take(): both read the ended holder's version; the overwrite is conditional on
    it, so the second finds the first's lease, and the first is live."""
    runs = tmp_path / "runs"
    store = FileStore(tmp_path / "leases" / "first-job.json")
    local_job(runs, "first-job", "Stopped")
    take(store, me("first-job", runs))
    _, seen, _ = store.read()
    assert store.replace(json.dumps(me("second-job", runs)).encode(), seen) is not None  # the winner
    assert store.replace(json.dumps(me("third-job", runs)).encode(), seen) is None  # the loser's stale version
    local_job(runs, "second-job", None)  # folder made, process not started yet
    with pytest.raises(LineageBusy, match=r"live attempt: second-job \(starting\)"):
        take(store, me("third-job", runs))


def test_a_holder_not_found_is_launching_until_the_grace_passes(tmp_path, monkeypatch):
    """Its submit took the lease, then died before the job existed (or the job is not visible yet)."""
    runs = tmp_path / "runs"
    store = FileStore(tmp_path / "leases" / "first-job.json")
    take(store, me("first-job", runs))
    with pytest.raises(LineageBusy, match=r"live attempt: first-job \(launching\)"):
        take(store, me("second-job", runs))
    monkeypatch.setattr(leases, "LAUNCH_GRACE_S", 0)
    take(store, me("second-job", runs))
    assert json.loads(store.path.read_text())["job"] == "second-job"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[" * 60000,
        b"[]",
        json.dumps({"job": "../../etc", "backend": "local"}).encode(),
        json.dumps({"job": "a-job", "backend": "elsewhere"}).encode(),
        json.dumps({"job": "a-job", "backend": "ec2", "region": "us-east-1", "bucket": "b", "prefix": "p"}).encode(),
        json.dumps({"job": "a-job", "backend": "sagemaker", "region": "https://evil"}).encode(),
    ],
)
def test_a_lease_we_did_not_write_is_one_line_and_launches_nothing(tmp_path, body):
    runs = tmp_path / "runs"
    store = FileStore(tmp_path / "leases" / "first-job.json")
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(body)
    with pytest.raises(UserError, match=r"^the lease of lineage first-job at .*first-job.json is not one "):
        take(store, me("second-job", runs))
    assert store.path.read_bytes() == body


def test_a_start_refused_before_launching_frees_the_lease_and_one_that_launched_keeps_it(tmp_path, job_records):
    plan = plan_job(load_spec(None, {"local": {"workdir": str(tmp_path / "runs")}}), dry_run=True)
    path = job_records.parent / "leases" / f"{plan.job_name}.json"  # beside the job records
    with pytest.raises(UserError, match="the upload was refused"), lineage_lease(plan):
        assert json.loads(path.read_text())["job"] == plan.job_name
        raise UserError("the upload was refused")
    assert json.loads(path.read_text())["released"] is True
    with pytest.raises(UserError, match="the log could not be read"), lineage_lease(plan):
        leases.launched(plan)
        raise UserError("the log could not be read")  # after the launch: the job's status decides
    assert "released" not in json.loads(path.read_text())


# ====================================================================== a local lineage through the real CLI


def test_resume_from_a_running_local_job_is_refused_in_one_line_and_starts_nothing(
    tmp_path, monkeypatch, capsys, job_records
):
    runs, lease = tmp_path / "runs", job_records.parent / "leases" / "first-job.json"
    (runs / "first-job" / "checkpoints").mkdir(parents=True)
    local_job(runs, "first-job", "InProgress")  # running: its pid is this test's
    take(FileStore(lease), me("first-job", runs.resolve()))  # as its submit took it
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "submit", "--instance", "local", "--resume-from", "first-job", "--yes")
    assert code == 2 and err.strip().splitlines() == [
        "error: lineage first-job has a live attempt: first-job (InProgress); one attempt runs at a time: "
        "`distrain-cloud status first-job`, or stop it (`distrain-cloud cancel first-job`) and resume again"
    ]
    assert [p.name for p in runs.iterdir()] == ["first-job"]  # no folder, no process

    local_job(runs, "first-job", "Stopped")  # ended: the next attempt takes the lease over
    plan = plan_job(load_spec(None, {"local": {"workdir": str(runs)}, "resume_from": "first-job"}))
    with lineage_lease(plan):
        assert json.loads(lease.read_text())["job"] == plan.job_name


# ====================================================================== S3: the key, the request, moto


def test_the_lease_lives_beside_the_lineages_checkpoints_not_inside():
    assert lease_key("s3://b/distrain-cloud/checkpoints/job-1/", "job-1") == ("b", "distrain-cloud/leases/job-1.json")
    assert lease_key("s3://b/checkpoints/job-1/", "job-1") == ("b", "leases/job-1.json")
    assert lease_key("s3://b/team/ckpt/", "job-1") == ("b", "team/ckpt.lease.json")  # a folder of another shape


def test_the_conditional_writes_fit_the_s3_api_model():
    from distrain_cloud.launcher.apimodel import problems

    base = {"Bucket": "stack-bucket", "Key": "distrain-cloud/leases/job-1.json", "Body": b"{}"}
    assert problems("s3", "PutObject", {**base, "ContentType": "application/json", "IfNoneMatch": "*"}) == []
    assert problems("s3", "PutObject", {**base, "IfMatch": '"0123abcd"'}) == []


def test_moto_refuses_a_conditional_write_over_another_version_with_412(mocked_aws):
    """What the S3 store relies on, as moto 5.2.5 plays it: If-None-Match "*" over an existing key
    and If-Match on a stale ETag are both 412 PreconditionFailed (S3's answer too)."""
    import boto3
    from botocore.exceptions import ClientError

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="lease-bucket")
    store = S3Store("lease-bucket", "p/leases/job-1.json", "us-east-1")
    first = store.create(b'{"v": 1}')
    assert first is not None and store.create(b'{"v": 2}') is None
    second = store.replace(b'{"v": 3}', first)
    assert second is not None and second != first
    assert store.replace(b'{"v": 4}', first) is None  # the version read is gone
    assert store.read()[:2] == (b'{"v": 3}', second)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="lease-bucket", Key="p/leases/job-1.json", Body=b"x", IfNoneMatch="*")
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


def test_a_dry_run_takes_no_lease_and_asks_aws_nothing(aws_calls, tmp_path, capsys):
    code, out, err = run_cli(
        capsys, "submit", "--instance", "g5.xlarge", "--region", "us-east-1", "--resume-from", "job-1", "--dry-run"
    )
    assert code == 0 and aws_calls == [], err  # the lease is taken by submit_job only, never by a plan
