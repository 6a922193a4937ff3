"""EC2 vCPU quotas with current usage (launcher/backends/ec2/quotas.py), through the real CLI against
moto: what already runs counts.

moto has no EC2 quotas (Service Quotas answers NoSuchResource), so a Stubber on the one
service-quotas client plays that part; the running instances are moto's. SageMaker's quotas:
tests/launcher/backends/sagemaker/test_sagemaker_quotas.py.
"""

from __future__ import annotations

import pytest
from awscalls import calls as calls  # noqa: F401 -- the fixture
from awscalls import requests_pass_the_api_model
from clirun import run_cli

from distrain_cloud.launcher.backends.ec2 import quotas as ec2_quotas
from distrain_cloud.launcher.spec import load_spec

REGION = "us-east-1"


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
    requests_pass_the_api_model(calls, {"ec2.DescribeInstances", "service-quotas.GetServiceQuota"})

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
