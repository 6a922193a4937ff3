"""`infra down` with what jobs left outside the stack (infra/stack.py: leftovers, end_leftovers), on moto.

A spot lineage leaves an Auto Scaling group, its launch template and instances, a job role and its
own security group while it lives (or when its clean-up never ran). `down` names them all in one
line and changes nothing; with --force it ends them in an order AWS accepts, then the stack.

What AWS does that moto does not, played here (a documented double): EC2 refuses to delete a
security group that an instance's network interface still uses, DependencyViolation (Amazon EC2
User Guide, "Delete a security group": "you can't delete a security group that is associated with
an instance"); moto deletes it.
"""

from __future__ import annotations

import boto3
import botocore.client
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from distrain_cloud.infra import job_role, stack
from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import infra_cli

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

REGION = "us-east-1"
ACCOUNT = "123456789012"
JOB = "gpt2-20261128-170000-abcdef"


def _tags(stack_name: str, job: str) -> list[dict[str, str]]:
    return [{"Key": stack.STACK_TAG, "Value": stack_name}, {"Key": job_role.JOB_TAG, "Value": job}]


def _lineage(stack_name: str, job: str, made: stack.StackResources | None = None) -> dict[str, str]:
    """What a live spot lineage of `stack_name` has outside the stack, made as the launcher makes it."""
    ec2 = boto3.client("ec2", REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = ec2.create_security_group(
        GroupName=f"distrain-cloud-{job}",
        Description="the job's own",
        VpcId=vpc,
        TagSpecifications=[{"ResourceType": "security-group", "Tags": _tags(stack_name, job)}],
    )["GroupId"]
    ec2.create_placement_group(
        GroupName=job,
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": _tags(stack_name, job)}],
    )
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(
        LaunchTemplateName=job,
        LaunchTemplateData={
            "ImageId": ami,
            "InstanceType": "c5.large",
            "SecurityGroupIds": [group],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tags(stack_name, job)}],
        },
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": _tags(stack_name, job)}],
    )
    subnet = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"][0]["SubnetId"]
    boto3.client("autoscaling", REGION).create_auto_scaling_group(
        AutoScalingGroupName=job,
        MinSize=0,
        MaxSize=2,
        DesiredCapacity=2,
        VPCZoneIdentifier=subnet,
        PlacementGroup=job,
        MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": job, "Version": "$Latest"}},
            "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 0},
        },
        Tags=[
            {**t, "PropagateAtLaunch": False, "ResourceId": job, "ResourceType": "auto-scaling-group"}
            for t in _tags(stack_name, job)
        ],
    )
    if made is not None:
        place = job_role.Place("aws", REGION, ACCOUNT, made.stack, made.bucket, "distrain-cloud", job, job)
        job_role.create(
            job_role.for_job(
                "ec2",
                place,
                boundary_arn=made.job_boundary_arn,
                log_group=made.log_group,
                code_key=f"distrain-cloud/code/{'0' * 64}.tar.gz",
            )
        )
    return {"group": job, "template": job, "security_group": group, "placement_group": job}


@pytest.fixture
def aws_rules(monkeypatch):
    """Every delete call in order, and EC2's refusal to delete a security group still in use."""
    calls: list[str] = []
    real = botocore.client.BaseClient._make_api_call

    def call(self, operation, params):
        if operation.startswith("Delete") or operation == "TerminateInstances":
            calls.append(operation)
        if operation == "DeleteSecurityGroup":
            ec2 = boto3.client("ec2", REGION)
            pages = ec2.describe_instances(Filters=[{"Name": "instance.group-id", "Values": [params["GroupId"]]}])
            holding = [
                i["InstanceId"]
                for r in pages["Reservations"]
                for i in r["Instances"]
                if i["State"]["Name"] != "terminated"
            ]
            if holding:
                error = {
                    "Code": "DependencyViolation",
                    "Message": f"resource {params['GroupId']} has a dependent object",
                }
                raise ClientError({"Error": error}, operation)
        return real(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", call)
    monkeypatch.setattr(stack, "_DEPENDENCY_S", 0)  # a refusal is final here: nothing frees the group later
    return calls


def _alive(stack_name: str) -> list[str]:
    return [i["id"] for i in stack.tagged_instances(stack_name, REGION)]


@pytest.mark.slow  # a stack up and down on moto, with a lineage beside it
def test_down_names_what_jobs_left_and_force_ends_it_in_an_order_aws_accepts(mocked_aws, aws_rules):
    stack.execute(stack.plan_up(region=REGION))
    made = stack.resources(region=REGION)
    live = _lineage(stack.DEFAULT_STACK, JOB, made)
    other = _lineage("another-stack", "theirs-20261128-170000-000000")  # not ours: never touched
    assert len(_alive(stack.DEFAULT_STACK)) == 2

    with pytest.raises(UserError) as refused:
        stack.down(region=REGION)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("stack 'distrain-cloud': 2 instance(s) tagged")
    for words in (
        f"1 Auto Scaling group(s) ({JOB})",
        f"1 launch template(s) ({JOB})",
        f"1 job role(s) ({JOB})",
        f"1 job security group(s) ({live['security_group']})",
        f"1 placement group(s) ({live['placement_group']})",
        "or pass --force to end them first",
    ):
        assert words in message, message
    assert made.security_group_id not in message  # the stack's own group goes with the stack
    assert aws_rules == [] and stack.resources(region=REGION) == made  # nothing changed

    shown = CliRunner().invoke(infra_cli.app, ["down", "--force", "--yes"])
    assert shown.exit_code == 0, shown.output
    assert f"and first end what jobs left: 1 Auto Scaling group(s) ({JOB}); 1 launch template(s)" in shown.output
    assert f"deleted 1 job role(s) left under /distrain-cloud/{stack.DEFAULT_STACK}/" in shown.output

    # The order AWS accepts: the group (so nothing relaunches), its instances gone, then the
    # template, the role, the security group (refused while an instance held it), the stack.
    firsts = [aws_rules.index(op) for op in ("DeleteAutoScalingGroup", "DeleteLaunchTemplate", "DeleteRole")]
    assert firsts == sorted(firsts)
    assert aws_rules.index("DeleteRole") < aws_rules.index("DeleteSecurityGroup") < aws_rules.index("DeleteStack")
    # The placement group after its instances (the double refuses it while one lives: InUse).
    assert aws_rules.index("DeleteAutoScalingGroup") < aws_rules.index("DeletePlacementGroup")
    assert "DependencyViolation" not in shown.output

    assert _alive(stack.DEFAULT_STACK) == [] and stack.leftovers(stack.DEFAULT_STACK, REGION) == stack.Leftovers()
    with pytest.raises(UserError, match="run `distrain-cloud infra up`"):
        stack.resources(region=REGION)
    theirs = stack.leftovers("another-stack", REGION)
    assert theirs.groups == (other["group"],) and theirs.security_groups == (other["security_group"],)
    assert theirs.placement_groups == (other["placement_group"],)
    assert len(_alive("another-stack")) == 2


@pytest.mark.slow  # moto's EC2 and Auto Scaling on first use
def test_a_security_group_still_in_use_is_not_deleted_and_the_refusal_says_so(mocked_aws, aws_rules):
    """Were an instance left holding the job's group, the double refuses as EC2 does: the error
    reaches the user (one line), it is not swallowed."""
    held = _lineage(stack.DEFAULT_STACK, JOB)
    ec2 = boto3.client("ec2", REGION)
    with pytest.raises(UserError, match="DependencyViolation|dependent object"):
        from distrain_cloud.infra import aws

        with aws.translate_errors():
            stack._delete_security_group(ec2, held["security_group"])
    assert held["security_group"] in stack.leftovers(stack.DEFAULT_STACK, REGION).security_groups


def test_down_waits_while_aws_still_deletes_a_group_and_says_so_past_its_bound(monkeypatch):
    """AWS deletes a group asynchronously (DescribeAutoScalingGroups lists it, "Delete in progress",
    until its instances are gone: EC2 Auto Scaling User Guide, "Delete your Auto Scaling
    infrastructure"); moto deletes at once. `down` waits for it, for at most _GROUP_GONE_S."""
    import time

    answers = [[{"AutoScalingGroupName": "g", "Status": "Delete in progress"}]] * 2 + [[]]

    class Groups:
        def describe_auto_scaling_groups(self, AutoScalingGroupNames):
            return {"AutoScalingGroups": answers.pop(0)}

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    stack._wait_groups_gone(Groups(), ["g"])
    assert answers == [] and slept == [10, 10]

    class Stuck:
        def describe_auto_scaling_groups(self, AutoScalingGroupNames):
            return {"AutoScalingGroups": [{"AutoScalingGroupName": "g"}]}

    monkeypatch.setattr(stack, "_GROUP_GONE_S", 0)
    with pytest.raises(
        UserError,
        match=r"^the Auto Scaling group\(s\) g are still being deleted: run `distrain-cloud infra down --force`",
    ):
        stack._wait_groups_gone(Stuck(), ["g"])
