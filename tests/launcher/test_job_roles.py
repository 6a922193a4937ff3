"""A job's own IAM role through the launcher: planned without AWS, made before anything else at
submit, retried while IAM propagates, removed when the launch fails and once the job has ended.

The isolation the role gives is shown under enforced IAM in tests/infra/test_job_isolation.py.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from distrain_cloud.infra import job_role
from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.stack import StackResources
from distrain_cloud.launcher.api import plan_job, submit_job
from distrain_cloud.launcher.backends.ec2 import backend as ec2
from distrain_cloud.launcher.backends.ec2 import preflight as ec2_preflight
from distrain_cloud.launcher.backends.ec2 import records as ec2_records
from distrain_cloud.launcher.backends.sagemaker import backend as sagemaker
from distrain_cloud.launcher.plan import JobRef
from distrain_cloud.launcher.spec import load_spec

REGION = "us-east-1"
ACCOUNT = "123456789012"
AMI = "ami-dca37ea5"  # a Deep Learning AMI in moto's image list
LOG_GROUP = "/distrain-cloud/distrain-cloud/jobs"
PATH = "/distrain-cloud/distrain-cloud/"


@pytest.fixture
def stack(mocked_aws, monkeypatch) -> StackResources:
    """What `infra up` makes, by hand (as in test_ec2_lifecycle.py)."""
    ec2_client = boto3.client("ec2", REGION)
    vpc = ec2_client.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = ec2_client.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
    document = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    boundary = boto3.client("iam").create_policy(PolicyName="job-boundary", PolicyDocument=json.dumps(document))
    boto3.client("s3", REGION).create_bucket(Bucket="stack-bucket")
    boto3.client("logs", REGION).create_log_group(logGroupName=LOG_GROUP)
    made = StackResources(
        stack="distrain-cloud",
        region=REGION,
        bucket="stack-bucket",
        job_boundary_arn=boundary["Policy"]["Arn"],
        security_group_id=group,
        log_group=LOG_GROUP,
        launcher_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/launcher",
        account=ACCOUNT,
    )
    monkeypatch.setattr(ec2_records, "stack_resources", lambda name, region: made)
    monkeypatch.setattr(sagemaker, "_stack_resources", lambda name, region: made)
    monkeypatch.setattr(ec2_preflight, "resolve_ami", lambda parameter, region: AMI)
    monkeypatch.setattr(job_role, "PROPAGATION_POLL_S", 0.0)
    return made


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Every AWS call made from here on ("iam.CreateRole", ...); `fail` below injects errors."""
    import botocore.client

    made: list[str] = []
    real = botocore.client.BaseClient._make_api_call

    def record(self, operation_name, api_params):
        name = f"{self.meta.service_model.service_name}.{operation_name}"
        made.append(name)
        for when, error in list(_failures):
            if when(name, api_params):
                raise error
        return real(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", record)
    _failures.clear()
    return made


_failures: list = []


def fail(call: str, code: str, message: str, times: int | None = None) -> None:
    """Make `call` ("ec2.RunInstances") fail with `code`: `times` times, or always."""
    left = [times]

    def when(name: str, params: dict) -> bool:
        if name != call or left[0] == 0:
            return False
        if left[0] is not None:
            left[0] -= 1
        return True

    error = ClientError({"Error": {"Code": code, "Message": message}}, call.split(".")[1])
    _failures.append((when, error))


def ec2_spec(**overrides):
    return load_spec(None, {"instance": "g4dn.12xlarge", "region": REGION, "max_run": "2h", **overrides})


def roles() -> list[str]:
    return sorted(r["RoleName"] for r in boto3.client("iam").list_roles(PathPrefix="/distrain-cloud/")["Roles"])


def profiles() -> list[str]:
    listed = boto3.client("iam").list_instance_profiles(PathPrefix="/distrain-cloud/")["InstanceProfiles"]
    return sorted(p["InstanceProfileName"] for p in listed)


def alive(job: str) -> list[str]:
    found = boto3.client("ec2", REGION).describe_instances(
        Filters=[
            {"Name": "tag:distrain-cloud:job", "Values": [job]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    return [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]]


# ---------------------------------------------------------------- the plan


def test_the_plan_shows_the_jobs_role_and_its_policy_without_asking_aws(aws_calls):
    plan = plan_job(ec2_spec(nodes=2, stack="team-a"), dry_run=True)
    job = plan.job_name
    assert aws_calls == []
    shown = plan.configs["job_role"]
    assert (shown["name"], shown["path"], shown["instance_profile"]) == (job, "/distrain-cloud/team-a/", job)
    assert plan.request["IamInstanceProfile"] == {"Name": job}
    statements = {s["Sid"]: s for s in shown["policy"]["Statement"]}
    bucket = "arn:aws:s3:::<stack-team-a-bucket>"
    assert statements["OwnJob"]["Resource"] == f"{bucket}/distrain-cloud/jobs/{job}/*"
    assert statements["OwnLineage"]["Resource"] == f"{bucket}/distrain-cloud/checkpoints/{job}/*"
    assert statements["ReadCode"] == {
        "Sid": "ReadCode",
        "Effect": "Allow",
        "Action": "s3:GetObject",
        "Resource": [f"{bucket}/{plan.payload.code_key}"],  # its own bundle, no other job's
    }
    own = {"aws:ResourceTag/distrain-cloud:stack": "team-a", "aws:ResourceTag/distrain-cloud:job": job}
    assert statements["TerminateOwnInstances"]["Condition"] == {"StringEquals": own}
    assert statements["TagOwnStatus"]["Condition"]["StringEquals"] == own
    assert plan.configs["job.json"]["role"] == job
    (check,) = [c for c in plan.checks if c.name == "job role isolates the job"]
    assert check.ok and f"/distrain-cloud/team-a/{job}" in check.detail


def test_a_stack_name_iam_cannot_hold_in_a_path_is_one_line_before_any_call(aws_calls):
    with pytest.raises(UserError) as refused:
        plan_job(ec2_spec(stack="team a"), dry_run=True)
    message = str(refused.value)
    assert message.startswith("IAM would refuse this job, nothing was sent: --stack: Path ")
    assert "\n" not in message and aws_calls == []


# ---------------------------------------------------------------- submit


def test_submit_makes_the_role_first_then_job_json_then_launches_retrying_while_iam_propagates(stack, calls):
    plan = plan_job(ec2_spec(nodes=2))
    job = plan.job_name
    calls.clear()
    # EC2 does not see the new instance profile at first (IAM is eventually consistent).
    message = f"Value ({job}) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
    fail("ec2.RunInstances", "InvalidParameterValue", message, times=2)
    assert submit_job(plan) == 0
    made = calls.index("iam.CreateRole")
    assert calls[made : made + 4] == [
        "iam.CreateRole",
        "iam.PutRolePolicy",
        "iam.CreateInstanceProfile",
        "iam.AddRoleToInstanceProfile",
    ]
    # Then job.json (the last PutObject: the bundle went up before), the job's own network
    # (launcher/backends/ec2/network.py), then the launch, tried until seen.
    network = [
        "ec2.CreateSecurityGroup",
        "ec2.AuthorizeSecurityGroupIngress",
        "ec2.AuthorizeSecurityGroupEgress",
        "ec2.RevokeSecurityGroupEgress",
        "ec2.CreatePlacementGroup",
    ]
    assert calls[made + 4 :] == ["s3.PutObject"] * 2 + network + ["ec2.RunInstances"] * 3  # job.json: 2 copies
    role = boto3.client("iam").get_role(RoleName=job)["Role"]
    assert role["Path"] == PATH and role["PermissionsBoundary"]["PermissionsBoundaryArn"] == stack.job_boundary_arn
    tags = {t["Key"]: t["Value"] for t in role["Tags"]}
    assert tags == {"distrain-cloud:stack": "distrain-cloud", "distrain-cloud:job": job}
    (name,) = boto3.client("iam").list_role_policies(RoleName=job)["PolicyNames"]
    assert (
        boto3.client("iam").get_role_policy(RoleName=job, PolicyName=name)["PolicyDocument"]
        == (plan.configs["job_role"]["policy"])
    )
    assert profiles() == [job] and len(alive(job)) == 2
    assert boto3.client("iam").list_attached_role_policies(RoleName=job)["AttachedPolicies"] == []  # no SSM


def test_a_launch_that_fails_for_good_leaves_no_role_and_no_profile(stack, calls, monkeypatch):
    monkeypatch.setattr(job_role, "PROPAGATION_S", 0.0)  # IAM never catches up within the bound
    plan = plan_job(ec2_spec())
    fail("ec2.RunInstances", "InvalidParameterValue", "Invalid IAM Instance Profile name")
    with pytest.raises(UserError, match=r"^AWS RunInstances failed \(InvalidParameterValue\)"):
        submit_job(plan)
    assert roles() == [] and profiles() == [] and alive(plan.job_name) == []
    # No capacity anywhere: the same.
    _failures.clear()
    plan = plan_job(ec2_spec())
    fail("ec2.RunInstances", "InsufficientInstanceCapacity", "no capacity")
    with pytest.raises(UserError, match="AWS has no capacity"):
        submit_job(plan)
    assert roles() == [] and profiles() == []


# ---------------------------------------------------------------- after the job


def test_the_role_is_deleted_once_status_sees_the_job_ended_with_no_live_instance(stack, calls, capsys):
    plan = plan_job(ec2_spec(nodes=2))
    submit_job(plan)
    job = JobRef(plan.job_name, "ec2", REGION)
    assert ec2.BACKEND.status(job)["status"] == "InProgress" and roles() == [job.name]  # still in use
    for rank in (0, 1):
        record = {"status": "Completed", "exit_code": 0, "time": time.time()}
        key = f"distrain-cloud/jobs/{job.name}/nodes/{rank}.json"
        boto3.client("s3").put_object(Bucket="stack-bucket", Key=key, Body=json.dumps(record).encode())
    info = ec2.BACKEND.status(job)
    assert info["status"] == "Completed" and roles() == [job.name]  # its instances still run: kept
    boto3.client("ec2", REGION).terminate_instances(InstanceIds=alive(job.name))
    # A deletion IAM refuses: one note, status still answers, the role stays for the next look.
    fail("iam.DeleteRole", "AccessDenied", "not allowed", times=1)
    assert ec2.BACKEND.status(job)["status"] == "Completed" and roles() == [job.name]
    (note,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: job role")]
    assert note.startswith(f"note: job role {job.name} was not deleted: AWS denied DeleteRole")
    assert ec2.BACKEND.status(job)["status"] == "Completed"
    assert roles() == [] and profiles() == []
    calls.clear()
    assert ec2.BACKEND.status(job)["status"] == "Completed"  # asked again: one IAM call finds it gone
    assert [c for c in calls if c.startswith("iam.")] == ["iam.GetRole"]


@pytest.mark.slow  # two EC2 jobs launched and ended on moto: about 5 s
def test_ls_and_cancel_now_delete_the_roles_of_ended_jobs(stack):
    first, second = plan_job(ec2_spec()), plan_job(ec2_spec())
    submit_job(first)
    submit_job(second)
    boto3.client("ec2", REGION).terminate_instances(InstanceIds=alive(first.job_name))
    boto3.client("s3").put_object(
        Bucket="stack-bucket", Key=f"distrain-cloud/jobs/{first.job_name}/stop", Body=b'{"reason": "cancel"}'
    )
    # The first job's code rewrote its own job.json to name the second job's role: never followed.
    key = f"distrain-cloud/jobs/{first.job_name}/job.json"
    hostile = {**json.loads(boto3.client("s3").get_object(Bucket="stack-bucket", Key=key)["Body"].read())}
    hostile["role"] = second.job_name
    boto3.client("s3").put_object(Bucket="stack-bucket", Key=key, Body=json.dumps(hostile).encode())
    rows = {r["job_name"]: r for r in ec2.BACKEND.list_jobs(region=REGION, workdir=None, limit=10)}
    assert rows[first.job_name]["terminal"] and not rows[second.job_name]["terminal"]
    assert roles() == [second.job_name]  # the ended job's role went; the running one's stays
    job = JobRef(second.job_name, "ec2", REGION)
    assert "terminating 1 instance" in ec2.BACKEND.cancel_now(job)
    assert ec2.BACKEND.status(job)["terminal"] and roles() == []


# ---------------------------------------------------------------- SageMaker


def test_a_sagemaker_job_gets_its_own_role_retried_while_iam_propagates_and_deleted_when_it_ends(stack, calls):
    plan = plan_job(load_spec(None, {"instance": "ml.g5.xlarge", "region": REGION, "max_run": "2h"}))
    job = plan.job_name
    assert plan.request["RoleArn"] == f"arn:aws:iam::{ACCOUNT}:role{PATH}{job}"
    fail("sagemaker.CreateTrainingJob", "ValidationException", "Could not assume role " + plan.request["RoleArn"], 1)
    assert submit_job(plan) == 0
    assert calls.count("sagemaker.CreateTrainingJob") == 2
    role = boto3.client("iam").get_role(RoleName=job)["Role"]
    assert role["Arn"] == plan.request["RoleArn"] and profiles() == []  # no instance profile: SageMaker assumes it
    trust = role["AssumeRolePolicyDocument"]
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert sagemaker.BACKEND.status(JobRef(job, "sagemaker", REGION))["status"] == "Completed"  # moto's at once
    assert roles() == []
    # With --role, the user's role is used unchanged (the plan says: not isolated) and never deleted.
    trust = {"Version": "2012-10-17", "Statement": [{**trust["Statement"][0], "Effect": "Allow"}]}
    mine = boto3.client("iam").create_role(RoleName="mine", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    spec = load_spec(None, {"instance": "ml.g5.xlarge", "region": REGION, "sagemaker.role": mine["Arn"]})
    plan = plan_job(spec)
    assert "not isolated" in plan.summary["role"] and plan.payload.role is None
    assert submit_job(plan) == 0
    assert sagemaker.BACKEND.status(JobRef(plan.job_name, "sagemaker", REGION))["status"] == "Completed"
    assert [r["Arn"] for r in boto3.client("iam").list_roles()["Roles"]] == [mine["Arn"]]
