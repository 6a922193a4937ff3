"""The distrain-cloud stack (infra/stack.yaml + infra/stack.py) and `infra up|status|down`, under moto.

moto's CloudFormation applies only part of the template (no bucket policy, public-access block,
versioning, lifecycle, ownership, egress rule or placement group; IAM conditions unenforced):
what it applies is read back from the mocked services, the rest is asserted on the parsed
template.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import boto3
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from distrain_cloud.infra import job_role, stack
from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import infra_cli

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
CODE_KEY = "distrain-cloud/code/" + "ab" * 32 + ".tar.gz"
SECRETS = ("secretsmanager:distrain-cloud/hf-token", "ssm:/distrain-cloud/wandb-key")


def _up(name: str = stack.DEFAULT_STACK, **kwargs) -> stack.StackResources:
    stack.execute(stack.plan_up(name, REGION, **kwargs))
    return stack.resources(name, REGION)


def _doc(document) -> dict:
    """A policy document as IAM returns it: JSON (AWS, or decoded by boto3), or, for inline role
    policies made by moto's CloudFormation, a Python repr."""
    if isinstance(document, dict):
        return document
    try:
        return json.loads(document)
    except json.JSONDecodeError:
        return ast.literal_eval(document)


def _statements(resource: dict) -> dict[str, dict]:
    """Sid -> statement of a template role's (first) inline policy or a managed policy."""
    props = resource["Properties"]
    document = props["Policies"][0]["PolicyDocument"] if "Policies" in props else props["PolicyDocument"]
    return {s["Sid"]: s for s in document["Statement"]}


def _job_role(made: stack.StackResources, job: str, kind: str = "ec2") -> job_role.JobRole:
    place = job_role.Place("aws", REGION, ACCOUNT, made.stack, made.bucket, "distrain-cloud", job, job)
    return job_role.for_job(
        kind, place, boundary_arn=made.job_boundary_arn, log_group=made.log_group, code_key=CODE_KEY, secrets=SECRETS
    )


def _moto_stack(name: str):
    from moto.cloudformation.models import cloudformation_backends

    return next(s for s in cloudformation_backends[ACCOUNT][REGION].stacks.values() if s.name == name)


def _launch_tagged(name: str, count: int = 2) -> list[str]:
    ec2 = boto3.client("ec2", REGION)
    reply = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=count,
        MaxCount=count,
        InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": stack.STACK_TAG, "Value": name}]}],
    )
    return [i["InstanceId"] for i in reply["Instances"]]


# --- the template ------------------------------------------------------------------------------


@pytest.mark.slow  # cfn-lint loads its whole rule and schema set
def test_template_passes_cfn_lint():
    from cfnlint.api import ManualArgs, lint_file

    # Informational checks too: they asked for explicit deletion policies on stateful resources.
    matches = lint_file(stack.TEMPLATE_PATH, config=ManualArgs(include_checks=["I"], regions=[REGION]))
    assert [str(m) for m in matches] == []


def test_template_bucket_settings_that_moto_does_not_apply():
    resources = stack.load_template()["Resources"]
    bucket = resources["Bucket"]
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    props = bucket["Properties"]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-old-code-bundles"]["Prefix"] == {"Fn::Sub": "${Prefix}/code/"}
    assert rules["expire-old-code-bundles"]["ExpirationInDays"] == {"Ref": "CodeRetentionDays"}
    assert rules["abort-stale-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    assert all(r["Status"] == "Enabled" for r in rules.values())

    (tls,) = resources["BucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert tls["Effect"] == "Deny" and tls["Principal"] == "*" and tls["Action"] == "s3:*"
    assert tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert tls["Resource"] == [{"Fn::GetAtt": ["Bucket", "Arn"]}, {"Fn::Sub": "${Bucket.Arn}/*"}]


def test_template_terminate_and_tag_only_stack_instances():
    resources = stack.load_template()["Resources"]
    # No role of the stack's own: every job gets one at submit (infra/job_role.py), under this boundary.
    assert [r for r in resources.values() if r["Type"] in ("AWS::IAM::Role", "AWS::IAM::InstanceProfile")] == []
    stack_tag = {"aws:ResourceTag/distrain-cloud:stack": {"Ref": "AWS::StackName"}}
    boundary = _statements(resources["JobBoundary"])
    assert boundary["TerminateStackInstances"]["Action"] == "ec2:TerminateInstances"
    assert boundary["TerminateStackInstances"]["Condition"] == {"StringEquals": stack_tag}
    assert boundary["TagStackInstances"]["Condition"]["StringEquals"] == stack_tag
    # ...and job code can write the status tag only: never the stack, job or lineage tags.
    assert boundary["TagStackInstances"]["Condition"]["ForAllValues:StringEquals"] == {
        "aws:TagKeys": ["distrain-cloud:status"]
    }
    ec2_actions = {
        a
        for s in boundary.values()
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        if a.startswith("ec2:")
    }
    assert ec2_actions == {"ec2:TerminateInstances", "ec2:CreateTags", "ec2:DescribeInstances"}
    assert not any(a.startswith(("iam:", "sts:")) for s in boundary.values() for a in s["Action"])
    assert boundary["BucketObjects"]["Resource"] == {"Fn::Sub": "${Bucket.Arn}/*"}

    launcher = _statements(resources["LauncherPolicy"])
    assert launcher["TerminateStackInstances"]["Condition"] == {"StringEquals": stack_tag}
    assert launcher["RunTaggedInstances"]["Condition"] == {
        "StringEquals": {"aws:RequestTag/distrain-cloud:stack": {"Ref": "AWS::StackName"}}
    }
    assert launcher["TagAtLaunch"]["Condition"] == {"StringEquals": {"ec2:CreateAction": "RunInstances"}}
    # What the plan's price and quota checks read (launcher/pricing.py, launcher/quotas.py): read-only.
    assert "ec2:DescribeSpotPriceHistory" in launcher["DescribeEc2"]["Action"]
    assert launcher["ReadQuotas"]["Action"] == ["servicequotas:GetServiceQuota", "servicequotas:ListServiceQuotas"]
    # Job roles: made only under the stack's path and only with its boundary; passed only to EC2/SageMaker.
    on_path = {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/distrain-cloud/${AWS::StackName}/*"}
    iam = {s["Sid"] for s in launcher.values() if any(a.startswith("iam:") for a in _actions(s))}
    assert iam == {
        "CreateJobRoles",
        "AttachSessionManager",
        "ManageJobRoles",
        "JobInstanceProfiles",
        "PassJobRoles",
        "SpotServiceLinkedRole",
        "AutoScalingServiceLinkedRole",
    }
    # A spot lineage's group and template (launcher/backends/ec2/recovery.py): made with the stack tag, changed
    # only where it is; its nodes may never make their group bigger.
    request_tag = {"StringEquals": {"aws:RequestTag/distrain-cloud:stack": {"Ref": "AWS::StackName"}}}
    assert launcher["LineageGroupsCreate"]["Condition"] == launcher["LineageTemplates"]["Condition"] == request_tag
    assert launcher["LineageGroups"]["Condition"] == {"StringEquals": stack_tag}
    # The boundary refuses any group update naming a parameter IAM can see, as each job's policy does.
    assert boundary["StackAutoScalingGroups"]["Condition"] == {
        "StringEquals": stack_tag,
        "Null": {key: "true" for key in job_role.GROUP_SHAPE_KEYS},
    }
    # The stack tag is written only as a template is made; no launcher may tag an existing group.
    assert launcher["TagLineageTemplatesAtCreation"]["Condition"]["StringEquals"]["ec2:CreateAction"] == (
        "CreateLaunchTemplate"
    )
    assert "autoscaling:CreateOrUpdateTags" not in {a for s in launcher.values() for a in _actions(s)}
    for sid in ("CreateJobRoles", "AttachSessionManager", "ManageJobRoles", "PassJobRoles"):
        assert launcher[sid]["Resource"] == on_path, sid
    assert launcher["JobInstanceProfiles"]["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:instance-profile/distrain-cloud/${AWS::StackName}/*"
    }
    bounded = {"iam:PermissionsBoundary": {"Ref": "JobBoundary"}}
    assert launcher["CreateJobRoles"]["Condition"] == {"StringEquals": bounded}
    assert launcher["AttachSessionManager"]["Condition"]["StringEquals"]["iam:PermissionsBoundary"] == {
        "Ref": "JobBoundary"
    }
    # Whatever lifts or swaps a boundary is granted nowhere.
    granted = {a for s in launcher.values() for a in _actions(s)}
    assert not granted & {
        "iam:DeleteRolePermissionsBoundary",
        "iam:PutRolePermissionsBoundary",
        "iam:UpdateAssumeRolePolicy",
    }
    assert launcher["PassJobRoles"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": ["sagemaker.amazonaws.com", "ec2.amazonaws.com"]}
    }


def _actions(statement: dict) -> list[str]:
    return [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]


def test_template_optional_parts_follow_their_parameters():
    template = stack.load_template()
    # Each multi-node job makes its own placement group (backends/ec2/network.py): the stack has none.
    assert not any(r["Type"] == "AWS::EC2::PlacementGroup" for r in template["Resources"].values())
    boundary = _statements(template["Resources"]["JobBoundary"])
    assert boundary["SessionManager"]["Effect"] == {"Fn::If": ["SsmEnabled", "Allow", "Deny"]}
    launcher = _statements(template["Resources"]["LauncherPolicy"])
    assert launcher["AttachSessionManager"]["Effect"] == {"Fn::If": ["SsmEnabled", "Allow", "Deny"]}
    assert template["Parameters"]["VpcId"]["Type"] == "AWS::EC2::VPC::Id"
    assert "Default" not in template["Parameters"]["VpcId"]


def test_importing_the_library_and_cli_loads_no_boto3():
    code = (
        "import sys, distrain_cloud.infra.stack, distrain_cloud.launcher.infra_cli; "
        "print(sorted(m for m in ('boto3', 'botocore', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- up, up again, down, up ----------------------------------------------------------------------


@pytest.mark.slow  # three stack operations on moto
def test_up_twice_is_a_no_op_then_down_and_up_again(mocked_aws):
    cf = boto3.client("cloudformation", REGION)
    first = stack.plan_up(region=REGION)
    assert first.change_type == "CREATE" and not first.up_to_date
    assert {c.logical_id for c in first.changes} == set(stack.load_template()["Resources"])  # every resource
    assert {c.action for c in first.changes} == {"Add"}
    assert first.parameters["VpcId"].startswith("vpc-")  # the default VPC
    assert stack.execute(first) == "CREATE_COMPLETE"
    made = stack.resources(region=REGION)

    again = stack.plan_up(region=REGION)
    assert again.up_to_date and again.change_type == "UPDATE" and again.changes == ()
    pending = [
        c
        for c in cf.list_change_sets(StackName=stack.DEFAULT_STACK)["Summaries"]
        if c.get("ExecutionStatus") != "EXECUTE_COMPLETE"
    ]  # moto lists executed ones too
    assert pending == []  # none left behind
    assert stack.resources(region=REGION) == made

    # A job role left behind (its job never seen to end) is named, and goes with the stack only
    # with --force (tests/infra/test_down.py); others' roles stay.
    left = _job_role(made, "left-behind-20261128-000000-abcdef")
    job_role.create(left)
    boto3.client("iam").create_role(RoleName="someone-elses", AssumeRolePolicyDocument="{}")
    with pytest.raises(UserError, match=f"1 job role\\(s\\) \\({left.name}\\)"):
        stack.down(region=REGION)
    done = stack.down(region=REGION, force=True)
    assert done.bucket == made.bucket and done.instances == () and done.job_roles == (left.name,)
    assert [r["RoleName"] for r in boto3.client("iam").list_roles()["Roles"]] == ["someone-elses"]
    assert boto3.client("iam").list_instance_profiles()["InstanceProfiles"] == []
    with pytest.raises(UserError, match="no distrain-cloud stack 'distrain-cloud' in us-east-1"):
        stack.resources(region=REGION)
    s3 = boto3.client("s3", REGION)
    assert made.bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]  # retained

    remade = _up()
    assert remade.bucket != made.bucket and remade.job_boundary_arn != made.job_boundary_arn


@pytest.mark.slow
def test_resources_are_found_by_logical_id(mocked_aws):
    made = _up()
    # Stacks made through change sets have no Outputs under moto: resources() must not need them.
    described = boto3.client("cloudformation", REGION).describe_stacks(StackName=stack.DEFAULT_STACK)
    assert not described["Stacks"][0].get("Outputs")
    assert made.job_boundary_arn.startswith(f"arn:aws:iam::{ACCOUNT}:policy/")
    assert boto3.client("iam").get_policy(PolicyArn=made.job_boundary_arn)["Policy"]["Arn"] == made.job_boundary_arn
    assert (made.account, made.partition, made.secret_prefix, made.ssm) == (ACCOUNT, "aws", "distrain-cloud/", False)
    assert made.log_group == "/distrain-cloud/distrain-cloud/jobs"
    assert made.security_group_id.startswith("sg-")
    assert made.launcher_policy_arn.startswith(f"arn:aws:iam::{ACCOUNT}:policy/")


def test_security_properties_that_moto_applies(mocked_aws):
    made = _up(parameters={"LogRetentionDays": "14", "EnableSsm": "true"})
    s3 = boto3.client("s3", REGION)
    (rule,) = s3.get_bucket_encryption(Bucket=made.bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"

    ec2 = boto3.client("ec2", REGION)
    (group,) = ec2.describe_security_groups(GroupIds=[made.security_group_id])["SecurityGroups"]
    (ingress,) = group["IpPermissions"]  # the only way in: from members of the same group
    assert ingress["IpProtocol"] == "-1" and ingress["IpRanges"] == [] and ingress["Ipv6Ranges"] == []
    assert [p["GroupId"] for p in ingress["UserIdGroupPairs"]] == [made.security_group_id]

    # The stack makes no role: nothing a job could use is shared between jobs.
    assert boto3.client("iam").list_roles()["Roles"] == []
    # Each job's role trusts its own service only; with EnableSsm, an EC2 job's role (only) gets
    # Session Manager's managed policy (off by default: tests/launcher/test_job_roles.py).
    assert made.ssm is True
    ssm = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    for kind, service, managed in (
        ("ec2", "ec2.amazonaws.com", (ssm,)),
        ("sagemaker", "sagemaker.amazonaws.com", ()),
    ):
        place = job_role.Place("aws", REGION, ACCOUNT, made.stack, made.bucket, "distrain-cloud", kind, kind)
        role = job_role.for_job(
            kind, place, boundary_arn=made.job_boundary_arn, log_group=made.log_group, ssm=made.ssm, code_key=CODE_KEY
        )
        assert [(s["Effect"], s["Principal"], s["Action"]) for s in role.trust["Statement"]] == [
            ("Allow", {"Service": service}, "sts:AssumeRole")
        ]
        assert role.managed_policies == managed and role.boundary_arn == made.job_boundary_arn

    (log_group,) = boto3.client("logs", REGION).describe_log_groups(logGroupNamePrefix=made.log_group)["logGroups"]
    assert log_group["retentionInDays"] == 14


@pytest.mark.slow
def test_job_role_policy_under_enforced_iam(mocked_aws):
    """A job role as the launcher makes it, assumed, evaluated by moto's IAM enforcement.

    moto's enforcement knows resource ARNs only for S3 (other services are checked against "*"),
    so logs are judged by the same evaluator moto's enforcement uses, with the ARNs a node would
    touch; secrets and parameters (whose `?` wildcards moto's matcher cannot read) by
    tests/iampolicy.py, within the boundary. (tests/infra/test_job_isolation.py: another job's keys;
    tests/infra/test_iam_rules.py: every rule with the boundary.)"""
    from moto.core import set_initial_no_auth_action_count
    from moto.iam.access_control import IAMPolicy, PermissionResult

    made = _up()
    job = "job-20261128-000000-abcdef"
    role = _job_role(made, job)
    job_role.create(role)
    creds = boto3.client("sts", REGION).assume_role(RoleArn=role.arn, RoleSessionName="node")["Credentials"]
    s3_admin = boto3.client("s3", REGION)
    s3_admin.create_bucket(Bucket="someone-elses-bucket")
    s3_admin.put_object(Bucket="someone-elses-bucket", Key="data.txt", Body=b"not yours")

    @set_initial_no_auth_action_count(0)
    def as_node() -> None:
        s3 = boto3.client(
            "s3",
            REGION,
            aws_access_key_id=creds["AccessKeyId"],
            aws_secret_access_key=creds["SecretAccessKey"],
            aws_session_token=creds["SessionToken"],
        )
        key = f"distrain-cloud/checkpoints/{job}/step-1/model.bin"
        s3.put_object(Bucket=made.bucket, Key=key, Body=b"weights")
        assert s3.get_object(Bucket=made.bucket, Key=key)["Body"].read() == b"weights"
        for call in (
            lambda: s3.get_object(Bucket="someone-elses-bucket", Key="data.txt"),
            lambda: s3.put_object(Bucket="someone-elses-bucket", Key="x", Body=b"x"),
            lambda: s3.list_objects_v2(Bucket="someone-elses-bucket"),
            lambda: s3.put_object(Bucket=made.bucket, Key="distrain-cloud/other/x", Body=b"x"),
        ):
            with pytest.raises(ClientError) as denied:
                call()
            assert denied.value.response["Error"]["Code"] == "AccessDenied"

    as_node()

    iam = boto3.client("iam")
    (policy_name,) = iam.list_role_policies(RoleName=role.name)["PolicyNames"]
    policy = IAMPolicy(
        json.dumps(_doc(iam.get_role_policy(RoleName=role.name, PolicyName=policy_name)["PolicyDocument"]))
    )
    assert iam.get_role(RoleName=role.name)["Role"]["PermissionsBoundary"]["PermissionsBoundaryArn"] == (
        made.job_boundary_arn
    )
    arn = f"arn:aws:{{}}:{REGION}:{ACCOUNT}:{{}}"
    group = arn.format("logs", f"log-group:{made.log_group}")
    parameter = arn.format("ssm", "parameter/distrain-cloud/wandb-key")
    allowed = [
        ("logs:CreateLogStream", f"{group}:log-stream:{job}/node-0"),
        ("logs:PutLogEvents", f"{group}:log-stream:{job}/node-0"),
    ]
    refused = [
        ("logs:PutLogEvents", f"{group}:log-stream:another-job/node-0"),  # another job's stream
        ("logs:PutLogEvents", arn.format("logs", "log-group:/aws/lambda/other:log-stream:x")),
        ("logs:DeleteLogGroup", group),
        ("ssm:PutParameter", parameter),
        ("s3:DeleteBucket", f"arn:aws:s3:::{made.bucket}"),
        ("iam:PassRole", role.arn),
        ("iam:PutRolePolicy", role.arn),
        ("ec2:RunInstances", arn.format("ec2", "instance/*")),
    ]
    assert [a for a, r in allowed if policy.is_action_permitted(a, r) != PermissionResult.PERMITTED] == []
    assert [a for a, r in refused if policy.is_action_permitted(a, r) == PermissionResult.PERMITTED] == []

    # moto's evaluator cannot read a secret grant's `?` wildcards: the test evaluator decides, with
    # the role's policy as IAM holds it and the boundary as moto's CloudFormation rendered it.
    from iampolicy import Request  # tests/ is on pytest's pythonpath
    from iampolicy import allowed as iam_allows

    document = _doc(iam.get_role_policy(RoleName=role.name, PolicyName=policy_name)["PolicyDocument"])
    version = iam.get_policy(PolicyArn=made.job_boundary_arn)["Policy"]["DefaultVersionId"]
    boundary = _doc(
        iam.get_policy_version(PolicyArn=made.job_boundary_arn, VersionId=version)["PolicyVersion"]["Document"]
    )
    secrets = [
        (arn.format("secretsmanager", "secret:distrain-cloud/hf-token-AbCdEf"), True),
        (parameter, True),
        (arn.format("secretsmanager", "secret:prod/db-password-AbCdEf"), False),
        # Another job's secret, though under the stack's SecretPrefix: this job named only its own.
        (arn.format("secretsmanager", "secret:distrain-cloud/team-b-token-AbCdEf"), False),
        (arn.format("ssm", "parameter/distrain-cloud/team-b-key"), False),
    ]
    for resource, expected in secrets:
        action = "ssm:GetParameter" if ":ssm:" in resource else "secretsmanager:GetSecretValue"
        assert iam_allows(Request(action, resource), [document], boundary) is expected, resource


# --- down -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_down_refuses_while_stack_instances_run_and_force_terminates_them(mocked_aws):
    made = _up()
    ids = _launch_tagged(stack.DEFAULT_STACK)
    _launch_tagged("another-stack", 1)  # not ours: never counted, never terminated
    with pytest.raises(UserError) as refused:
        stack.down(region=REGION)
    message = str(refused.value)
    assert "\n" not in message and "2 instance(s) tagged distrain-cloud:stack=distrain-cloud" in message
    assert "--force" in message and all(i in message for i in ids)
    assert stack.resources(region=REGION) == made  # nothing changed

    done = stack.down(region=REGION, force=True)
    assert sorted(i["id"] for i in done.instances) == sorted(ids)
    ec2 = boto3.client("ec2", REGION)
    states = {
        i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
    }
    assert {states[i] for i in ids} == {"terminated"}
    assert sorted(states.values()).count("running") == 1  # the other stack's instance
    with pytest.raises(UserError, match="run `distrain-cloud infra up`"):
        stack.resources(region=REGION)


def test_down_without_a_stack_is_one_line(mocked_aws):
    with pytest.raises(UserError, match=r"^no distrain-cloud stack 'nope' in us-east-1: nothing to delete$"):
        stack.down("nope", REGION)


# --- bad states -----------------------------------------------------------------------------------


def test_no_stack_says_to_run_infra_up(mocked_aws):
    with pytest.raises(UserError) as info:
        stack.resources(region=REGION)
    assert str(info.value) == "no distrain-cloud stack 'distrain-cloud' in us-east-1: run `distrain-cloud infra up`"
    with pytest.raises(UserError, match=r"run `distrain-cloud infra up --stack team-a`$"):
        stack.status("team-a", REGION)


@pytest.mark.slow
def test_a_failed_stack_is_one_line_and_nothing_changes(mocked_aws):
    from moto.cloudformation.models import Event

    _up()
    moto_stack = _moto_stack(stack.DEFAULT_STACK)
    moto_stack.status = "ROLLBACK_COMPLETE"
    moto_stack.events.append(
        Event(
            stack_id=moto_stack.stack_id,
            stack_name=moto_stack.name,
            logical_resource_id="NodeRole",
            physical_resource_id="",
            resource_type="AWS::IAM::Role",
            resource_status="CREATE_FAILED",
            resource_status_reason="User: arn:aws:iam::123456789012:user/dev is not authorized to perform: "
            "iam:CreateRole\non resource: example",
            resource_properties=None,
        )
    )
    cf = boto3.client("cloudformation", REGION)
    change_sets = cf.list_change_sets(StackName=stack.DEFAULT_STACK)["Summaries"]  # moto keeps executed ones
    expected = (
        "distrain-cloud stack 'distrain-cloud' in us-east-1 is ROLLBACK_COMPLETE (NodeRole: User: "
        "arn:aws:iam::123456789012:user/dev is not authorized to perform: iam:CreateRole on resource: "
        "example): run `distrain-cloud infra down`, fix the cause, then `distrain-cloud infra up`"
    )
    for attempt in (lambda: stack.resources(region=REGION), lambda: stack.plan_up(region=REGION)):
        with pytest.raises(UserError) as info:
            attempt()
        assert str(info.value) == expected
    assert cf.list_change_sets(StackName=stack.DEFAULT_STACK)["Summaries"] == change_sets  # up planned nothing

    info = stack.status(region=REGION)  # status reports it rather than refusing
    assert info["status"] == "ROLLBACK_COMPLETE" and info["reason"].startswith("NodeRole: User:")
    assert info["next"].startswith("run `distrain-cloud infra down`")
    stack.down(region=REGION)  # the way out
    _up()


def test_a_busy_stack_is_one_line(mocked_aws):
    _up()
    _moto_stack(stack.DEFAULT_STACK).status = "UPDATE_IN_PROGRESS"
    with pytest.raises(UserError, match=r"is UPDATE_IN_PROGRESS: wait until it finishes, then retry$"):
        stack.plan_up(region=REGION)
    with pytest.raises(UserError, match="UPDATE_IN_PROGRESS"):
        stack.down(region=REGION)
    assert stack.resources(region=REGION).bucket  # resources still exist during an update


@pytest.mark.slow
def test_no_default_vpc_and_bad_inputs(mocked_aws):
    ec2 = boto3.client("ec2", REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    for subnet in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
        ec2.delete_subnet(SubnetId=subnet["SubnetId"])
    ec2.delete_vpc(VpcId=vpc)
    with pytest.raises(UserError, match=r"^no default VPC in us-east-1: pass --vpc-id "):
        stack.plan_up(region=REGION)
    with pytest.raises(UserError, match=r"^--vpc-id 'default' is not a VPC id"):
        stack.plan_up(region=REGION, vpc_id="default")
    with pytest.raises(UserError, match=r"^--parameter EnableSSM: the stack has no such parameter; known: "):
        stack.plan_up(region=REGION, parameters={"EnableSSM": "true"})
    other = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    made = _up(vpc_id=other)
    (group,) = ec2.describe_security_groups(GroupIds=[made.security_group_id])["SecurityGroups"]
    assert group["VpcId"] == other
    assert boto3.client("cloudformation", REGION).list_stacks()["StackSummaries"][0]["StackStatus"] == "CREATE_COMPLETE"


# --- the commands ---------------------------------------------------------------------------------


def _invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(infra_cli.app, list(args), input=input)


def _stacks() -> list[str]:
    summaries = boto3.client("cloudformation", REGION).list_stacks()["StackSummaries"]
    return [s["StackStatus"] for s in summaries if s["StackStatus"] != "DELETE_COMPLETE"]


def test_cli_up_shows_the_change_set_and_asks(mocked_aws, monkeypatch):
    dry = _invoke("up", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "change set for stack 'distrain-cloud' in us-east-1 (create):" in dry.output
    assert "  Add      Bucket " in dry.output and "AWS::IAM::ManagedPolicy" in dry.output
    assert dry.output.rstrip().endswith("dry run: change set deleted, nothing changed")
    assert _stacks() == []  # no change set and no empty REVIEW_IN_PROGRESS stack left behind

    refused = _invoke("up")  # CliRunner's stdin is not a terminal
    assert isinstance(refused.exception, UserError)
    assert str(refused.exception) == (
        "`infra up` asks before changing anything and stdin is not a terminal: rerun with --yes"
    )
    assert _stacks() == []

    monkeypatch.setattr(infra_cli, "_interactive", lambda: True)
    declined = _invoke("up", input="n\n")
    assert declined.exit_code == 0 and "execute this change set?" in declined.output
    assert declined.output.rstrip().endswith("nothing changed") and _stacks() == []

    applied = _invoke("up", input="y\n")
    assert applied.exit_code == 0, applied.output
    assert "stack 'distrain-cloud' in us-east-1: CREATE_COMPLETE" in applied.output
    assert "launcher policy:  arn:aws:iam::123456789012:policy/" in applied.output

    again = _invoke("up", "--yes")
    assert again.exit_code == 0
    assert again.output == "stack 'distrain-cloud' in us-east-1 is up to date: nothing to change\n"


@pytest.mark.slow
def test_cli_status_and_down(mocked_aws):
    made = _up()
    ids = _launch_tagged(stack.DEFAULT_STACK, 1)
    shown = _invoke("status")
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("stack 'distrain-cloud' in us-east-1: CREATE_COMPLETE\n")
    assert made.bucket in shown.output and made.security_group_id in shown.output
    assert f"{ids[0]}  running" in shown.output
    as_json = json.loads(_invoke("status", "--json").output)
    assert as_json["instances"][0]["id"] == ids[0]

    refused = _invoke("down", "--yes")
    assert isinstance(refused.exception, UserError) and "--force" in str(refused.exception)
    assert _stacks() == ["CREATE_COMPLETE"]

    no_prompt = _invoke("down", "--force")
    assert isinstance(no_prompt.exception, UserError) and "rerun with --yes" in str(no_prompt.exception)
    assert _stacks() == ["CREATE_COMPLETE"]

    done = _invoke("down", "--force", "--yes")
    assert done.exit_code == 0, done.output
    assert f"and first terminate 1 instance(s): {ids[0]}" in done.output
    assert f"bucket {made.bucket} was kept" in done.output
    assert _stacks() == []


def test_cli_bad_parameter_is_one_line(mocked_aws):
    result = _invoke("up", "--parameter", "EnableSsm")
    assert str(result.exception) == "--parameter expects KEY=VALUE, got 'EnableSsm'"
