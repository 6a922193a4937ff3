"""An EC2 job's own network (launcher/backends/ec2/network.py): its security group, its zone and
placement group, its EFA interfaces, and the inter-node bandwidth the plan states.

Plans first (no AWS call), then submit and status on moto, with tests/ec2_network.py playing
what moto does not: placement groups, and a security group that cannot be deleted while an
instance is in it.
"""

from __future__ import annotations

import base64
import json
import time

import pytest
from test_ec2_lifecycle import REGION, hand_made_stack, instances, put_node, ref, spec

from distrain_cloud.launcher import apimodel, catalog
from distrain_cloud.launcher.api import plan_job, submit_job
from distrain_cloud.launcher.backends.ec2 import backend as ec2
from distrain_cloud.launcher.backends.ec2 import network
from distrain_cloud.launcher.backends.ec2.request import GROUP_PLACEHOLDER, efa_count
from distrain_cloud.launcher.spec import load_spec

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

PRIVATE = {"subnet_id": "subnet-0123abcd"}  # a subnet of the user's: taken to give no public IPv4 until preflight


def dry(**overrides):
    base = {"instance": "p4d.24xlarge", "region": REGION, "nodes": 2}
    return plan_job(load_spec(None, {**base, **overrides}), dry_run=True)


def encoded(request: dict) -> dict:
    return {**request, "UserData": base64.b64encode(request["UserData"].encode()).decode()}


# ---------------------------------------------------------------- plans


@pytest.mark.slow  # two plans each (5 s on a loaded machine)
@pytest.mark.parametrize(
    ("instance", "cards", "said"),
    [
        ("p4d.24xlarge", 4, "4 EFA interface(s), one per network card, 400 Gbps baseline between nodes"),
        ("p5.48xlarge", 32, "32 EFA interface(s), one per network card, 3200 Gbps baseline between nodes"),
    ],
)
def test_one_efa_per_network_card_in_a_private_subnet_fits_the_api_model(aws_calls, instance, cards, said):
    """AWS's advice for multi-card types: card 0 at device 0 an EFA with ENA, every further card at
    device 1 an EFA-only interface; the RunInstances request and a lineage's launch template both
    pass the EC2 API model, and the plan says what the nodes get between them."""
    plan = dry(instance=instance, ec2=PRIVATE)
    interfaces = plan.request["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (0, 0, "efa"),
        *[(card, 1, "efa-only") for card in range(1, cards)],
    ]
    assert {i["SubnetId"] for i in interfaces} == {PRIVATE["subnet_id"]}  # EFA reaches no other subnet
    assert all(i["Groups"] == [GROUP_PLACEHOLDER] and i["DeleteOnTermination"] for i in interfaces)
    assert apimodel.problems("ec2", "RunInstances", encoded(plan.request)) == []
    assert plan.summary["network"].startswith(said)
    assert dict((c.name, c.ok) for c in plan.checks)["EFA"] is True
    lineage = dry(instance=instance, ec2={**PRIVATE, "max_restarts": 2}, spot=True).configs["recovery"]
    template = lineage["CreateLaunchTemplate"]
    assert len(template["LaunchTemplateData"]["NetworkInterfaces"]) == cards
    assert apimodel.problems("ec2", "CreateLaunchTemplate", template) == []
    assert aws_calls == []


def test_in_the_stacks_default_subnets_one_efa_and_the_plan_says_why(aws_calls):
    """The default subnets give public IPv4 addresses, which EC2 assigns only to instances launched
    with one network interface: a p4d keeps its IP (S3, the AWS APIs) and gets one EFA, not four."""
    plan = dry()
    (interface,) = plan.request["NetworkInterfaces"]
    assert (interface["NetworkCardIndex"], interface["InterfaceType"]) == (0, "efa")
    assert plan.summary["network"].startswith("1 EFA interface, on network card 0 of 4, 100 Gbps baseline")
    assert "set ec2.subnet_id to a private subnet" in plan.summary["network"]
    assert efa_count(catalog.network_facts("p5.48xlarge"), public_ip=True) == 1
    assert efa_count(catalog.network_facts("g4dn.12xlarge"), public_ip=False) == 1
    assert efa_count(catalog.network_facts("g5.xlarge"), public_ip=False) == 0
    assert aws_calls == []


def test_the_jobs_own_security_group_admits_only_its_members_and_fits_the_api_model(aws_calls):
    plan = dry(nodes=2)
    requests = plan.configs["network"]
    for operation, request in requests.items():
        assert apimodel.problems("ec2", operation, request) == [], operation
    create = requests["CreateSecurityGroup"]
    instance_tags = plan.request["TagSpecifications"][0]["Tags"]
    # The stack and job tags as the instances carry them: `infra down` finds the group by them.
    assert create["TagSpecifications"] == [{"ResourceType": "security-group", "Tags": instance_tags[:2]}]
    assert [t["Key"] for t in instance_tags[:2]] == ["distrain-cloud:stack", "distrain-cloud:job"]
    (members,) = requests["AuthorizeSecurityGroupIngress"]["IpPermissions"]
    assert members == {
        "IpProtocol": "-1",
        "UserIdGroupPairs": [{"GroupId": GROUP_PLACEHOLDER, "Description": "this job's nodes"}],
    }
    out = requests["AuthorizeSecurityGroupEgress"]["IpPermissions"]
    assert out[0] == members and (out[1]["IpProtocol"], out[1]["FromPort"], out[1]["ToPort"]) == ("tcp", 443, 443)
    assert requests["RevokeSecurityGroupEgress"]["IpPermissions"] == [
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}  # the all-out rule every new group has
    ]
    pg = requests["CreatePlacementGroup"]
    assert (pg["GroupName"], pg["Strategy"]) == (plan.job_name, "cluster")
    assert plan.request["Placement"] == {"GroupName": plan.job_name}
    assert plan.configs["job.json"]["network"] == {
        "security_group": f"distrain-cloud-{plan.job_name}",
        "placement_group": plan.job_name,
    }
    assert aws_calls == []


def test_a_single_node_job_has_its_own_group_and_no_placement_group(aws_calls):
    """One node: its own group, no placement group, and a lineage's group over every zone
    (test_recovery.py submits one) with AZRebalance suspended all the same."""
    plan = dry(instance="g5.xlarge", nodes=1, spot=True)
    assert plan.request["SecurityGroupIds"] == [GROUP_PLACEHOLDER] and "Placement" not in plan.request
    assert "CreatePlacementGroup" not in plan.configs["network"]
    assert plan.summary["network"] == "one node: no traffic between nodes (the type: Up to 10 Gigabit)"
    lineage = plan.configs["recovery"]
    assert "PlacementGroup" not in lineage["CreateAutoScalingGroup"]
    assert lineage["SuspendProcesses"]["ScalingProcesses"] == ["AZRebalance"]
    assert aws_calls == []


def test_the_catalogs_network_facts_are_the_ec2_apis(mocked_aws):
    """The offline facts the plan states bandwidth from are DescribeInstanceTypes' (moto ships the
    EC2 API's own answers; it has none for p3, whose rows say so)."""
    import boto3

    client = boto3.client("ec2", region_name=REGION)
    compared = 0
    for instance in catalog.all_instances():
        if instance.sagemaker or instance.name.startswith("p3."):
            continue
        (found,) = client.describe_instance_types(InstanceTypes=[instance.name])["InstanceTypes"]
        assert network.facts_from_api(found["NetworkInfo"]) == catalog.network_facts(instance), instance.name
        assert (catalog.network_facts(instance).efa_interfaces > 0) == instance.efa, instance.name
        compared += 1
    assert compared == len([i for i in catalog.all_instances() if not i.sagemaker]) - 3


# ---------------------------------------------------------------- on moto


@pytest.fixture
def stack(mocked_aws, monkeypatch, tmp_path):
    monkeypatch.setenv("DISTRAIN_HOME", str(tmp_path / "home"))
    return hand_made_stack(monkeypatch)


def groups_of(job: str) -> list[dict]:
    import boto3

    filters = [{"Name": "tag:distrain-cloud:job", "Values": [job]}]
    return boto3.client("ec2", region_name=REGION).describe_security_groups(Filters=filters)["SecurityGroups"]


def placement_groups() -> list[str]:
    """The region's live placement groups (EC2 lists deleted ones for a while: tests/ec2_network.py)."""
    import boto3

    found = boto3.client("ec2", region_name=REGION).describe_placement_groups()["PlacementGroups"]
    return sorted(g["GroupName"] for g in found if g["State"] in ("pending", "available"))


@pytest.mark.slow  # two submits on moto (4 s here)
def test_each_job_has_its_own_group_its_nodes_use_and_it_goes_with_the_job(stack):
    import boto3

    pair = plan_job(spec(nodes=2))
    one = plan_job(spec(nodes=1))
    assert pair.payload.where.public_ip and pair.payload.where.network.cards == 1  # DescribeInstanceTypes'
    submit_job(pair)
    submit_job(one)
    (group,) = groups_of(pair.job_name)
    (other,) = groups_of(one.job_name)
    assert group["GroupName"] == f"distrain-cloud-{pair.job_name}" and group["VpcId"] == other["VpcId"]
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags == {"distrain-cloud:stack": "distrain-cloud", "distrain-cloud:job": pair.job_name}
    # In: only its own members. Out: its members and HTTPS; the all-out default rule is gone.
    assert [[p["GroupId"] for p in rule["UserIdGroupPairs"]] for rule in group["IpPermissions"]] == [[group["GroupId"]]]
    out = {(r["IpProtocol"], r.get("FromPort")) for r in group["IpPermissionsEgress"]}
    assert out == {("-1", None), ("tcp", 443)}
    assert not [r for r in group["IpPermissionsEgress"] if r["IpProtocol"] == "-1" and r["IpRanges"]]
    # Each job's nodes are in their own group only.
    for plan, own in ((pair, group), (one, other)):
        for node in instances(plan.job_name):
            held = {g["GroupId"] for nic in node["NetworkInterfaces"] for g in nic["Groups"]}
            assert held == {own["GroupId"]}, plan.job_name
    assert placement_groups() == [pair.job_name]  # the multi-node job's own; none for one node
    assert len({n["Placement"]["AvailabilityZone"] for n in instances(pair.job_name)}) == 1
    # Ended, but its instances still hold the group: nothing is deleted yet.
    for rank in (0, 1):
        put_node(pair.job_name, rank, status="Completed", exit_code=0, reason="", step=10)
    assert ec2.BACKEND.status(ref(pair.job_name))["status"] == "Completed"
    assert len(groups_of(pair.job_name)) == 1 and placement_groups() == [pair.job_name]
    # AWS refuses while an instance is in them; retire() is quiet and says something is left.
    assert network.retire(REGION, pair.job_name, placement_group=True) is False
    assert len(groups_of(pair.job_name)) == 1 and placement_groups() == [pair.job_name]
    ids = [n["InstanceId"] for n in instances(pair.job_name)]
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=ids)
    assert ec2.BACKEND.status(ref(pair.job_name))["status"] == "Completed"
    assert groups_of(pair.job_name) == [] and placement_groups() == []
    assert len(groups_of(one.job_name)) == 1  # the other job's, still running, stays


def play_spot_scores(monkeypatch, best_zone_id: str, asked: list) -> None:
    """GetSpotPlacementScores (moto has none): every zone scores 3 but `best_zone_id`, 9, as EC2
    answers with SingleAvailabilityZone (EC2 User Guide, "Spot placement score")."""
    from botocore.awsrequest import AWSResponse

    from distrain_cloud.infra import aws

    real = aws.client

    def record(params, **_):
        asked.append(dict(params))

    def answer(**_):
        zones = boto3_zone_ids()
        scores = [{"Region": REGION, "AvailabilityZoneId": z, "Score": 9 if z == best_zone_id else 3} for z in zones]
        return AWSResponse("https://ec2", 200, {}, None), {"SpotPlacementScores": scores}

    def client(service, region=None, **kw):
        c = real(service, region, **kw)
        if service == "ec2":
            c.meta.events.register("provide-client-params.ec2.GetSpotPlacementScores", record)
            c.meta.events.register_first("before-call.ec2.GetSpotPlacementScores", answer)
        return c

    monkeypatch.setattr(aws, "client", client)


def boto3_zone_ids() -> list[str]:
    import boto3

    return sorted(
        {s["AvailabilityZoneId"] for s in boto3.client("ec2", region_name=REGION).describe_subnets()["Subnets"]}
    )


@pytest.mark.slow  # a lineage on moto (3 s here)
def test_a_multi_node_lineage_stays_in_one_zone_in_its_placement_group_with_azrebalance_off(stack, monkeypatch):
    import boto3

    # The zone EC2 scores likeliest to hold both spot nodes at once is the one (not the first by name).
    subnets = boto3.client("ec2", region_name=REGION).describe_subnets()["Subnets"]
    best = max(
        (s for s in subnets if s["AvailabilityZone"] in ("us-east-1c", "us-east-1d")),
        key=lambda s: s["AvailabilityZone"],
    )
    asked: list = []
    play_spot_scores(monkeypatch, best["AvailabilityZoneId"], asked)
    plan = plan_job(spec(nodes=2, spot=True))
    requests = plan.payload.recovery
    group = requests["CreateAutoScalingGroup"]
    assert group["VPCZoneIdentifier"] == best["SubnetId"] and group["PlacementGroup"] == plan.job_name
    (request,) = asked
    assert (request["TargetCapacity"], request["SingleAvailabilityZone"], request["InstanceTypes"]) == (
        2,
        True,
        ["g4dn.12xlarge"],
    )
    assert apimodel.problems("ec2", "GetSpotPlacementScores", request) == []
    assert "spot placement score 9 of 10" in {c.name: c.detail for c in plan.checks}["subnet"]
    assert requests["SuspendProcesses"] == {"AutoScalingGroupName": plan.job_name, "ScalingProcesses": ["AZRebalance"]}
    assert apimodel.problems("autoscaling", "SuspendProcesses", requests["SuspendProcesses"]) == []
    submit_job(plan)
    asg = boto3.client("autoscaling", region_name=REGION)
    (found,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[plan.job_name])["AutoScalingGroups"]
    assert [p["ProcessName"] for p in found["SuspendedProcesses"]] == ["AZRebalance"]
    assert found["PlacementGroup"] == plan.job_name and placement_groups() == [plan.job_name]
    (subnet,) = boto3.client("ec2", region_name=REGION).describe_subnets(SubnetIds=[found["VPCZoneIdentifier"]])[
        "Subnets"
    ]
    assert {n["Placement"]["AvailabilityZone"] for n in instances(plan.job_name)} == {subnet["AvailabilityZone"]}
    (sg,) = groups_of(plan.job_name)
    template = boto3.client("ec2", region_name=REGION).describe_launch_template_versions(
        LaunchTemplateName=plan.job_name
    )
    data = template["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert [i["Groups"] for i in data["NetworkInterfaces"]] == [[sg["GroupId"]]]  # the job's own, not a placeholder
    # The lineage ends and its nodes leave: status retires the group, then the network.
    key = f"distrain-cloud/jobs/{plan.job_name}/lineage.json"
    body = json.dumps({"status": "Completed", "reason": "", "time": time.time()}).encode()
    boto3.client("s3").put_object(Bucket="stack-bucket", Key=key, Body=body)
    for node in instances(plan.job_name):
        asg.terminate_instance_in_auto_scaling_group(InstanceId=node["InstanceId"], ShouldDecrementDesiredCapacity=True)
    assert ec2.BACKEND.status(ref(plan.job_name))["status"] == "Completed"
    assert groups_of(plan.job_name) == [] and placement_groups() == []


@pytest.mark.slow  # a submit on moto (2 s here)
def test_a_retried_submit_makes_nothing_twice_and_a_failed_launch_leaves_no_group(stack, monkeypatch):
    """A submit sent again (its answer lost) finds the group, its rules and the placement group as
    they are (InvalidGroup.Duplicate, InvalidPermission.Duplicate / NotFound,
    InvalidPlacementGroup.Duplicate); a launch that fails for good deletes them."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws
    from distrain_cloud.infra.errors import UserError

    real = aws.client

    def refuse(params, **_):
        raise ClientError({"Error": {"Code": "InvalidParameterValue", "Message": "no"}}, "RunInstances")

    def client(service, region=None, **kw):
        c = real(service, region, **kw)
        if service == "ec2":
            c.meta.events.register_first("before-call.ec2.RunInstances", refuse)
        return c

    plan = plan_job(spec(nodes=2))
    first = network.create(plan)
    assert network.create(plan) == first
    (group,) = groups_of(plan.job_name)
    assert group["GroupId"] == first and len(group["IpPermissions"]) == 1 and len(group["IpPermissionsEgress"]) == 2
    assert placement_groups() == [plan.job_name]
    monkeypatch.setattr(aws, "client", client)
    with pytest.raises(UserError, match="InvalidParameterValue"):
        submit_job(plan)  # the same plan again: its network is found, then RunInstances is refused
    assert groups_of(plan.job_name) == [] and placement_groups() == []


def test_the_launcher_policy_grants_what_a_jobs_network_sends_on_stack_tagged_resources_only(aws_calls):
    """Every EC2 request of a job's network is an action of the stack's launcher policy, made only
    with the stack tag and changed or deleted only where the stack tag is."""
    from distrain_cloud.infra import stack

    launcher = {
        s["Sid"]: s
        for s in stack.load_template()["Resources"]["LauncherPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    }
    granted = {a for s in launcher.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    plan = dry(spot=True)  # a multi-node lineage: the most a job's network sends
    sent = {f"ec2:{op}" for op in plan.configs["network"]} | {"ec2:DeleteSecurityGroup", "ec2:DeletePlacementGroup"}
    sent |= {"ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:GetSpotPlacementScores"}
    sent |= {"autoscaling:SuspendProcesses"}
    assert "SuspendProcesses" in plan.configs["recovery"] and "CreatePlacementGroup" in plan.configs["network"]
    assert sent <= granted, sent - granted
    request_tag = {"StringEquals": {"aws:RequestTag/distrain-cloud:stack": {"Ref": "AWS::StackName"}}}
    resource_tag = {"StringEquals": {"aws:ResourceTag/distrain-cloud:stack": {"Ref": "AWS::StackName"}}}
    assert launcher["JobNetworkCreate"]["Condition"] == request_tag
    assert launcher["JobNetwork"]["Condition"] == resource_tag
    assert set(launcher["JobNetwork"]["Action"]) >= {
        "ec2:DeleteSecurityGroup",
        "ec2:DeletePlacementGroup",
        "ec2:RunInstances",
    }
    assert launcher["JobSecurityGroupsInVpc"]["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:vpc/${VpcId}"
    }
    assert aws_calls == []
