"""The simulator of AWS's control-plane rules (tests/awsrules.py): each rule it plays, on moto.

Other tests rehearse faults on it (tests/launcher/backends/ec2/test_lineage_faults.py); these pin that it plays what
it says, and that moto alone does not (so that the simulator is not a no-op).
"""

from __future__ import annotations

import base64
import time

import pytest
from awsrules import SPOT_TERMINATION, AwsRules

REGION = "us-east-1"
AMI = "ami-0123456789abcdef0"  # moto launches any id (describe_images would take seconds to build its list)


def make_group(name: str, nodes: int = 2, *, tag: str | None = None) -> None:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    data = {
        "ImageId": AMI,
        "InstanceType": "c5.large",
        "UserData": base64.b64encode(b"#!/bin/bash").decode(),
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": [{"Key": "distrain-cloud:job", "Value": tag or name}]}
        ],
    }
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    boto3.client("autoscaling", region_name=REGION).create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=0,
        MaxSize=nodes,
        DesiredCapacity=nodes,
        VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"},
    )


def asg():
    import boto3

    return boto3.client("autoscaling", region_name=REGION)


def group(name: str) -> dict:
    (found,) = asg().describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return found


@pytest.fixture
def aws(mocked_aws):
    with AwsRules(REGION) as rules:
        yield rules


def test_a_group_replaces_what_powers_off_but_not_what_left_or_while_launch_is_suspended(aws):
    make_group("job-g")
    first, second = aws.group_instances("job-g")
    aws.power_off(first)
    assert aws.group_instances("job-g") == [second]  # no replacement before the health check (moto's comes at once)
    (line,) = [e for e in aws.advance(60) if "launches" in e]
    (third,) = set(aws.group_instances("job-g")) - {second}
    assert "desired 2" in line
    asg().terminate_instance_in_auto_scaling_group(InstanceId=second, ShouldDecrementDesiredCapacity=True)
    aws.advance(60)
    assert aws.group_instances("job-g") == [third] and group("job-g")["DesiredCapacity"] == 1
    asg().suspend_processes(AutoScalingGroupName="job-g", ScalingProcesses=["Launch"])
    aws.power_off(third, behaviour="stop")  # a stopped instance is unhealthy too
    aws.advance(60)
    assert aws.group_instances("job-g") == [] and group("job-g")["DesiredCapacity"] == 1
    import boto3

    (reservation,) = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[third])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "terminated"


def test_a_leave_refused_is_a_validation_error_as_on_aws(aws):
    from botocore.exceptions import ClientError

    make_group("job-g", nodes=1)
    (only,) = aws.group_instances("job-g")
    asg().update_auto_scaling_group(AutoScalingGroupName="job-g", MinSize=1)
    with pytest.raises(ClientError, match="min size constraint"):
        asg().terminate_instance_in_auto_scaling_group(InstanceId=only, ShouldDecrementDesiredCapacity=True)
    aws.power_off(only)
    aws.advance(60)  # out of service: in no group any more
    with pytest.raises(ClientError, match="Instance Id not found"):
        asg().terminate_instance_in_auto_scaling_group(InstanceId=only, ShouldDecrementDesiredCapacity=True)


def test_scheduled_actions_fire_at_their_start_time_per_group(aws):
    make_group("job-a")
    make_group("job-b")
    at = aws.now + 3600
    for name, start in (("job-a", at), ("job-b", at + 600)):  # one action name, two groups (moto keeps one)
        asg().put_scheduled_update_group_action(
            AutoScalingGroupName=name,
            ScheduledActionName="lineage-hard-stop",
            StartTime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
            MinSize=0,
            MaxSize=0,
            DesiredCapacity=0,
        )
    aws.tick(at - 1)
    assert len(aws.group_instances("job-a")) == 2
    aws.tick(at)
    assert aws.group_instances("job-a") == [] and group("job-a")["MaxSize"] == 0
    assert len(aws.group_instances("job-b")) == 2
    aws.tick(at + 600)
    assert aws.group_instances("job-b") == []
    assert aws.billed_seconds("job-a") == pytest.approx(2 * 3600) and aws.billed_seconds("job-b") == pytest.approx(
        2 * 4200
    )
    assert aws.live() == []


def test_a_reclaimed_spot_node_gets_its_notice_then_terminates_and_is_replaced(aws):
    import boto3

    from distrain_cloud.launcher.backends.ec2.agent.imds import Imds

    make_group("job-g", nodes=1)
    (node,) = aws.group_instances("job-g")
    metadata = Imds(aws.imds(node).endpoint)
    assert metadata.identity().instance_id == node and metadata.spot_notice() is None
    aws.reclaim(node)
    notice = metadata.spot_notice()
    assert notice is not None and notice["action"] == "terminate"
    assert notice["time"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(aws.now + 120))
    aws.advance(119)
    assert aws.group_instances("job-g") == [node]  # two minutes: it may still save a checkpoint
    aws.advance(1)
    (replacement,) = aws.group_instances("job-g")
    assert replacement != node
    (reservation,) = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[node])["Reservations"]
    assert reservation["Instances"][0]["StateReason"]["Code"] == SPOT_TERMINATION
    assert aws.seconds_of(node) == pytest.approx(120)


def test_az_rebalance_moves_an_instance_without_a_notice_unless_suspended(aws):
    make_group("job-g", nodes=2)
    before = aws.group_instances("job-g")
    new, old = aws.rebalance("job-g")
    assert old == before[0] and set(aws.group_instances("job-g")) == {before[1], new}
    assert aws.imds(old).identity.spot_action is None  # no notice: the node just ends
    asg().suspend_processes(AutoScalingGroupName="job-g", ScalingProcesses=["AZRebalance"])
    assert aws.rebalance("job-g") == []


def test_moto_alone_plays_none_of_it(mocked_aws):
    """Why the simulator exists: moto replaces a terminated instance at once even with Launch
    suspended, and never runs a scheduled action whose time has passed."""
    import boto3

    make_group("job-g", nodes=1)
    asg().suspend_processes(AutoScalingGroupName="job-g", ScalingProcesses=["Launch"])
    asg().put_scheduled_update_group_action(
        AutoScalingGroupName="job-g",
        ScheduledActionName="lineage-hard-stop",
        StartTime="2020-01-01T00:00:00Z",
        DesiredCapacity=0,
    )
    (first,) = [i["InstanceId"] for i in group("job-g")["Instances"]]
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[first])
    (replacement,) = [i["InstanceId"] for i in group("job-g")["Instances"]]
    assert replacement != first and group("job-g")["DesiredCapacity"] == 1
