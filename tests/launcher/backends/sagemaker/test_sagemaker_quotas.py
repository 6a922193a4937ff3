"""SageMaker instance and warm-pool quotas with current usage (launcher/backends/sagemaker/quotas.py),
through the real CLI against moto: what already runs counts.

moto has no SageMaker quotas (Service Quotas answers not implemented), so a Stubber on the one
service-quotas client plays that part; the in-progress training jobs are moto's. EC2's quotas:
tests/launcher/backends/ec2/test_ec2_quotas.py.
"""

from __future__ import annotations

import pytest
from awscalls import calls as calls  # noqa: F401 -- the fixture
from awscalls import requests_pass_the_api_model
from clirun import run_cli

from distrain_cloud.launcher.backends.sagemaker import quotas as sagemaker_quotas
from distrain_cloud.launcher.spec import load_spec

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's


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
    requests_pass_the_api_model(
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
