"""Quotas with current usage, through the real CLI against moto: what already runs counts.

moto has no EC2 or SageMaker quotas (Service Quotas answers NoSuchResource / not implemented),
so a Stubber on the one service-quotas client plays that part; everything else (the running
instances, the in-progress training jobs) is moto's.
"""

from __future__ import annotations

import pytest
from clirun import run_cli

from distrain_cloud.launcher import apimodel
from distrain_cloud.launcher.backends.ec2 import quotas as ec2_quotas
from distrain_cloud.launcher.backends.sagemaker import quotas as sagemaker_quotas
from distrain_cloud.launcher.spec import load_spec

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's


def _ec2_quota(stub, code: str, value: float) -> None:
    name = next(n for c, n in ec2_quotas.EC2_VCPU_QUOTAS.values() if c == code)
    quota = {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": name, "Value": value, "Adjustable": True}
    stub.add_response("get_service_quota", {"Quota": quota}, {"ServiceCode": "ec2", "QuotaCode": code})


def _run(instance_type: str, count: int, *, spot: bool = False) -> None:
    import boto3
    from test_ec2_lifecycle import AMI

    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    boto3.client("ec2", region_name=REGION).run_instances(
        ImageId=AMI, MinCount=count, MaxCount=count, InstanceType=instance_type, **extra
    )


def _instances() -> int:
    import boto3

    reservations = boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
    return sum(len(r["Instances"]) for r in reservations)


@pytest.fixture
def calls(monkeypatch):
    import botocore.session
    from test_ec2_lifecycle import Calls

    seen = Calls()
    real = botocore.session.Session.create_client

    def create_client(self, *args, **kwargs):
        client = real(self, *args, **kwargs)
        client.meta.events.register("provide-client-params", seen)
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    return seen


def _requests_pass_the_api_model(calls, operations: set[str]) -> None:
    """Every request the quota checks sent is one the service's API model accepts."""
    sent = [(op, params) for op, params in zip(calls.ops, calls.params, strict=True) if op in operations]
    assert {op for op, _ in sent} == operations
    for op, params in sent:
        service, operation = op.split(".")
        assert apimodel.problems(service, operation, params) == [], op


@pytest.fixture
def stack(mocked_aws, monkeypatch):
    from test_ec2_lifecycle import hand_made_stack

    return hand_made_stack(monkeypatch)


@pytest.mark.slow  # a plan through the CLI against moto
def test_ec2_vcpus_already_running_count_against_the_quota(stack, stub_client, capsys, calls):
    _run("g4dn.12xlarge", 2)  # 96 on-demand G vCPUs
    _run("g5.xlarge", 1, spot=True)  # 4 spot G vCPUs: the spot quota's, not the on-demand one's
    _run("p3.2xlarge", 1)  # 8 P vCPUs: another quota
    _run("m5.xlarge", 1)  # 4 standard vCPUs: another quota
    stub = stub_client("service-quotas", REGION)
    _ec2_quota(stub, "L-DB2E81BA", 128.0)
    _ec2_quota(stub, "L-3819A6DF", 64.0)
    before = _instances()

    # A submit is refused in one line before anything is made or paid for.
    code, out, err = run_cli(
        capsys, "submit", "--instance", "g4dn.12xlarge", "--region", REGION, "--max-run", "1h", "--yes"
    )
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line == (
        "error: plan check failed, nothing was created: vCPU quota: on-demand G and VT instances "
        "(Running On-Demand G and VT instances: 128 vCPUs allowed, 96 in use by 2 running instance(s), 48 needed "
        "by this job (1 x 48): 144 > 128; stop instances of this class or request an increase to at least 144 in "
        "the Service Quotas console (quota L-DB2E81BA))"
    )
    assert _instances() == before
    _requests_pass_the_api_model(calls, {"ec2.DescribeInstances", "service-quotas.GetServiceQuota"})

    # The spot quota counts the spot instances only: 4 in use + 48 <= 64.
    spot = ec2_quotas.ec2_vcpu_check(load_spec(None, {"instance": "g4dn.12xlarge", "spot": True}), REGION)
    assert (spot.name, spot.ok) == ("vCPU quota: spot G and VT instances", True)
    assert spot.detail == (
        "All G and VT Spot Instance Requests: 64 vCPUs allowed, 4 in use by 1 running instance(s), 48 needed "
        "by this job (1 x 48)"
    )


def test_an_unread_ec2_quota_is_skipped_and_still_shows_the_usage(stack):
    _run("g4dn.12xlarge", 1)
    check = ec2_quotas.ec2_vcpu_check(load_spec(None, {"instance": "g4dn.xlarge", "region": REGION}), REGION)
    assert check.ok is None  # moto has no EC2 quotas: not a refusal
    assert check.detail.startswith("Running On-Demand G and VT instances: not checked (")
    assert check.detail.endswith("; 48 vCPUs in use")


def test_ec2_quota_classes():
    assert [ec2_quotas.ec2_quota_class(t) for t in ("p4d.24xlarge", "g6e.xlarge", "vt1.3xlarge", "c5.2xlarge")] == [
        "P",
        "G and VT",
        "G and VT",
        "Standard",
    ]
    assert ec2_quotas.ec2_quota_class("inf2.xlarge") is None and ec2_quotas.ec2_quota_class("trn1.32xlarge") is None


def _training_job(name: str, instance_type: str, count: int, *, spot: bool, role: str, status: str) -> None:
    import boto3
    from moto.sagemaker.models import sagemaker_backends

    request = {
        "TrainingJobName": name,
        "AlgorithmSpecification": {
            "TrainingImage": "123.dkr.ecr.us-east-1.amazonaws.com/x:1",
            "TrainingInputMode": "File",
        },
        "RoleArn": role,
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/out/"},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600, **({"MaxWaitTimeInSeconds": 7200} if spot else {})},
        "EnableManagedSpotTraining": spot,
    }
    boto3.client("sagemaker", region_name=REGION).create_training_job(**request)
    # moto completes every job at once: this one is still running.
    sagemaker_backends[ACCOUNT][REGION].training_jobs[name].training_job_status = status


@pytest.mark.slow  # a plan through the CLI against moto
def test_sagemaker_in_progress_jobs_on_the_type_count_against_the_quota(mocked_aws, stub_client, capsys, calls):
    import boto3

    role = boto3.client("iam").create_role(
        RoleName="distrain-sm",
        AssumeRolePolicyDocument='{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": '
        '{"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}',
    )["Role"]["Arn"]
    _training_job("running-1", "ml.g5.12xlarge", 2, spot=False, role=role, status="InProgress")
    _training_job("running-spot", "ml.g5.12xlarge", 1, spot=True, role=role, status="InProgress")  # spot quota's
    _training_job("running-other", "ml.p3.2xlarge", 4, spot=False, role=role, status="InProgress")  # another type
    _training_job("ended", "ml.g5.12xlarge", 3, spot=False, role=role, status="Completed")  # holds nothing
    stub = stub_client("service-quotas", REGION)
    page = {
        "Quotas": [
            {"QuotaName": "ml.g5.12xlarge for training job usage", "Value": 3.0},
            {"QuotaName": "ml.g5.12xlarge for spot training job usage", "Value": 4.0},
        ]
    }
    for _ in range(2):
        stub.add_response("list_service_quotas", page, {"ServiceCode": "sagemaker"})

    base = ["submit", "--instance", "ml.g5.12xlarge", "--nodes", "2", "--role", role, "--region", REGION]
    code, out, err = run_cli(capsys, *base, "--max-run", "1h", "--dry-run", "--check")
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line == (
        "error: plan check failed, nothing was created: quota: ml.g5.12xlarge for training job usage (3 allowed, "
        "2 in use by 1 in-progress job(s), 2 needed: 4 > 3; wait for those jobs, stop one (`distrain-cloud cancel "
        'JOB`) or request an increase to at least 4 for "ml.g5.12xlarge for training job usage" in the Service '
        "Quotas console)"
    )
    _requests_pass_the_api_model(
        calls, {"sagemaker.ListTrainingJobs", "sagemaker.DescribeTrainingJob", "service-quotas.ListServiceQuotas"}
    )
    spot = sagemaker_quotas.sagemaker_instance_check(
        load_spec(None, {"instance": "ml.g5.12xlarge", "nodes": 2, "spot": True}), REGION
    )
    assert (spot.name, spot.ok) == ("quota: ml.g5.12xlarge for spot training job usage", True)
    assert spot.detail == "4 allowed, 1 in use by 1 in-progress job(s), 2 needed"


def test_a_warm_pool_beyond_its_quota_is_said_not_refused(stub_client):
    stub = stub_client("service-quotas", REGION)
    page = {
        "Quotas": [
            {"QuotaName": "ml.g5.12xlarge for training job usage", "Value": 4.0},
            {"QuotaName": "ml.g5.12xlarge for training warm pool usage", "Value": 0.0},  # AWS's default
            {"QuotaName": "ml.g5.2xlarge for training warm pool usage", "Value": 8.0},
        ]
    }
    stub.add_response("list_service_quotas", page, {"ServiceCode": "sagemaker"})
    spec = load_spec(None, {"instance": "ml.g5.12xlarge", "nodes": 2, "sagemaker.keep_alive": "30m"})
    check = sagemaker_quotas.sagemaker_warm_pool_check(spec, REGION)
    assert (check.name, check.ok) == ("warm pool quota: ml.g5.12xlarge", None)  # the job runs; no pool is kept
    assert check.detail.startswith(
        "ml.g5.12xlarge for training warm pool usage: 0 allowed, 2 needed: the job runs but SageMaker keeps no "
        "warm pool after it; request an increase"
    )
    stub.add_response("list_service_quotas", page, {"ServiceCode": "sagemaker"})
    spec = load_spec(None, {"instance": "ml.g5.2xlarge", "sagemaker.keep_alive": 600})
    assert sagemaker_quotas.sagemaker_warm_pool_check(spec, REGION).ok is True
