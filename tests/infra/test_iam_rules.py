"""What each role may do, decided as IAM decides it: the job's policy intersected with the stack's
boundary (issue 38, sections 3 and 5).

The documents are the real ones: a job's role from `infra/job_role.py` (the fast tests) or from
`plan_job` on a stack that `infra up` made under moto (the slow one); the boundary and the launcher
policy from `infra/stack.yaml`, rendered with the stack's names (`iampolicy.render`, checked
against moto's own CloudFormation rendering in the slow test). moto does not apply boundaries,
ignores `ForAllValues`, `StringLike` and `s3:prefix`, and cannot read `?`: `tests/iampolicy.py`
decides instead, as the IAM User Guide's "Policy evaluation logic" says.

What AWS puts in a request's context is written down where a test builds it (`group_update`,
`tagging`): the condition keys each action carries, from the Service Authorization Reference.
"""

from __future__ import annotations

import pytest
from iampolicy import Request, allowed, decide, render, trusts  # tests/ is on pytest's pythonpath

from distrain_cloud.infra import job_role, stack
from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.backends.ec2 import recovery

REGION, ACCOUNT, STACK = "us-east-1", "123456789012", "distrain-cloud"
BUCKET, PREFIX = "distrain-cloud-bucket-1a2b3c4d", "distrain-cloud"
LOG_GROUP = f"/distrain-cloud/{STACK}/jobs"
BOUNDARY_ARN = f"arn:aws:iam::{ACCOUNT}:policy/{STACK}-JobBoundary-0A1B2C3D"
S3 = f"arn:aws:s3:::{BUCKET}"
STACK_TAG, JOB_TAG = job_role.STACK_TAG, job_role.JOB_TAG

NAMES = {
    "AWS::Partition": "aws",
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::StackName": STACK,
    "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/0a1b2c3d",
    "Bucket": BUCKET,
    "Bucket.Arn": S3,
    "LogGroup": LOG_GROUP,
    "LogGroup.Arn": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{LOG_GROUP}:*",
    "JobBoundary": BOUNDARY_ARN,
    "NodeSecurityGroup": "sg-0123456789abcdef0",
    "NodeSecurityGroup.GroupId": "sg-0123456789abcdef0",
    "Prefix": PREFIX,
    "SecretPrefix": "distrain-cloud/",
}


def stack_policies(ssm: bool = False) -> tuple[dict, dict]:
    """(JobBoundary, LauncherPolicy) of infra/stack.yaml with this stack's names."""
    resources = stack.load_template()["Resources"]
    conditions = {"SsmEnabled": ssm}
    return tuple(  # type: ignore[return-value]
        render(resources[name]["Properties"]["PolicyDocument"], NAMES, conditions)
        for name in ("JobBoundary", "LauncherPolicy")
    )


BOUNDARY, LAUNCHER = stack_policies()


def code_key(sha: str) -> str:
    return f"{PREFIX}/code/{sha * 32}.tar.gz"


def secret_arn(name: str) -> str:
    """A secret's full ARN: its name, `-` and six random characters (Secrets Manager User Guide)."""
    return f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-Xy12Zq"


def parameter_arn(name: str) -> str:
    return f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{name.lstrip('/')}"


# Job A names its secrets in two of the accepted forms, job B in the other two (infra/secret_env.py).
A_SECRETS = (
    f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:distrain-cloud/a-token",  # a partial ARN
    "ssm:/distrain-cloud/a-key",
)
B_SECRETS = ("secretsmanager:distrain-cloud/b-token", parameter_arn("/distrain-cloud/b-key"))


def role(kind: str, job: str, sha: str, secrets=(), *, inputs=(), group=False, on_demand=False) -> job_role.JobRole:
    place = job_role.Place("aws", REGION, ACCOUNT, STACK, BUCKET, PREFIX, job, job)
    return job_role.for_job(
        kind,
        place,
        boundary_arn=BOUNDARY_ARN,
        log_group=LOG_GROUP,
        code_key=code_key(sha),
        secrets=secrets,
        inputs=inputs,
        group=group,
        on_demand_fallback=on_demand,
    )


def may(r: job_role.JobRole, action: str, resource: str, **context) -> bool:
    """Whether code holding job role `r` may: its inline policy within the stack's boundary."""
    return allowed(Request(action, resource, context), [r.policy], BOUNDARY)


def listing(prefix: str) -> dict:
    return {"s3:prefix": prefix}


# --- secrets, bundles, outputs ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ec2", "sagemaker"])
def test_a_job_reads_its_own_bundle_and_named_secrets_and_nothing_of_another_jobs(kind):
    a = role(kind, "job-a", "a", A_SECRETS)
    own = [
        ("s3:GetObject", f"{S3}/{code_key('a')}", {}),
        ("s3:ListBucket", S3, listing(code_key("a"))),  # SageMaker's code channel lists its key
        ("secretsmanager:GetSecretValue", secret_arn("distrain-cloud/a-token"), {}),
        ("ssm:GetParameter", parameter_arn("/distrain-cloud/a-key"), {}),
        ("s3:PutObject", f"{S3}/{PREFIX}/jobs/job-a/output/metrics.jsonl", {}),
        ("s3:GetObject", f"{S3}/{PREFIX}/checkpoints/job-a/checkpoint-00000005/model.safetensors", {}),
        ("s3:ListBucket", S3, listing(f"{PREFIX}/jobs/job-a/")),
    ]
    others = [
        ("s3:GetObject", f"{S3}/{code_key('b')}", {}),  # another job's code
        ("s3:ListBucket", S3, listing(f"{PREFIX}/code/")),  # ...or the names of all bundles
        ("secretsmanager:GetSecretValue", secret_arn("distrain-cloud/b-token"), {}),
        ("ssm:GetParameter", parameter_arn("/distrain-cloud/b-key"), {}),
        # A secret under the stack's SecretPrefix that no --secret of A's named.
        ("secretsmanager:GetSecretValue", secret_arn("distrain-cloud/a-token-old"), {}),
        ("s3:GetObject", f"{S3}/{PREFIX}/jobs/job-b/output/model.tar.gz", {}),
        ("s3:PutObject", f"{S3}/{PREFIX}/jobs/job-b/output/metrics.jsonl", {}),
        ("s3:GetObject", f"{S3}/{PREFIX}/jobs/job-a-2/job.json", {}),  # a name that starts like A's
        ("s3:ListBucket", S3, listing(f"{PREFIX}/jobs/")),
        ("s3:ListBucket", S3, listing(f"{PREFIX}/jobs/job-b/")),
        ("s3:PutObject", f"{S3}/{code_key('a')}", {}),  # its own bundle is read-only
    ]
    assert [a_ for a_, r, c in own if not may(a, a_, r, **c)] == []
    assert [(a_, r) for a_, r, c in others if may(a, a_, r, **c)] == []
    # Without --secret, a job reads no secret at all.
    bare = role(kind, "job-c", "c")
    assert not may(bare, "secretsmanager:GetSecretValue", secret_arn("distrain-cloud/a-token"))
    assert not may(bare, "ssm:GetParameter", parameter_arn("/distrain-cloud/a-key"))


def test_a_named_secret_outside_the_stacks_prefix_is_still_refused_by_the_boundary():
    a = role("ec2", "job-a", "a", ["secretsmanager:prod/db-password"])
    request = Request("secretsmanager:GetSecretValue", secret_arn("prod/db-password"))
    assert allowed(request, [a.policy]) and not allowed(request, [a.policy], BOUNDARY)


def test_the_plans_secret_check_refuses_exactly_what_the_boundary_refuses():
    references = [
        "secretsmanager:distrain-cloud/hf-token",
        f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:distrain-cloud/hf-token-Xy12Zq",
        "ssm:/distrain-cloud/wandb-key",
        parameter_arn("/distrain-cloud/wandb-key"),
        "secretsmanager:prod/db-password",  # outside the SecretPrefix
        "ssm:/prod/db-password",
        f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:distrain-cloud/hf-token",  # another region
        "arn:aws:ssm:us-east-1:999999999999:parameter/distrain-cloud/shared",  # another account
    ]
    beyond = job_role.secrets_beyond_boundary(
        references, partition="aws", region=REGION, account=ACCOUNT, secret_prefix="distrain-cloud/"
    )
    for reference in references:
        r = role("ec2", "job-a", "a", [reference])
        (statement,) = [s for s in r.policy["Statement"] if s["Sid"] in ("NamedSecrets", "NamedParameters")]
        action = "ssm:GetParameter" if statement["Sid"] == "NamedParameters" else "secretsmanager:GetSecretValue"
        # What the job would ask for: the resource its own policy names (a suffix in place of `-??????`).
        resource = statement["Resource"][0].replace("-??????", "-Xy12Zq")
        assert allowed(Request(action, resource), [r.policy])  # the job's policy always grants it...
        reachable = allowed(Request(action, resource), [r.policy], BOUNDARY)  # ...the boundary decides
        assert reachable is (reference not in beyond), reference
    assert len(beyond) == 4


def test_names_are_literals_in_the_policy_never_wildcards():
    # "*" and "?" are valid in S3 keys and SageMaker inputs; as policy text they would be wildcards.
    r = role("sagemaker", "job-a", "a", inputs=[f"s3://{BUCKET}/data/*"])
    assert may(r, "s3:GetObject", f"{S3}/data/*/train.jsonl")
    assert not may(r, "s3:GetObject", f"{S3}/data/other/train.jsonl")
    assert not may(r, "s3:ListBucket", S3, **listing("data/other/"))


# --- SageMaker inputs on a `/` boundary -----------------------------------------------------------


def test_a_sagemaker_input_grant_stops_at_its_folder():
    folder = f"{PREFIX}/jobs/gpt2"
    for uri in (f"s3://{BUCKET}/{folder}", f"s3://{BUCKET}/{folder}/"):
        r = role("sagemaker", "train-x", "a", inputs=[uri])
        # The folder, however SageMaker lists it, and the object of that exact name.
        assert may(r, "s3:GetObject", f"{S3}/{folder}/output/model.tar.gz"), uri
        assert may(r, "s3:GetObject", f"{S3}/{folder}"), uri
        assert may(r, "s3:ListBucket", S3, **listing(folder)) and may(r, "s3:ListBucket", S3, **listing(f"{folder}/"))
        # Never another job whose name starts with gpt2.
        assert not may(r, "s3:GetObject", f"{S3}/{PREFIX}/jobs/gpt2-other/output/model.tar.gz"), uri
        assert not may(r, "s3:ListBucket", S3, **listing(f"{PREFIX}/jobs/gpt2-other/")), uri
        assert not may(r, "s3:ListBucket", S3, **listing(f"{PREFIX}/jobs/gpt2-")), uri
    # An object input: the object, never its longer-named siblings.
    r = role("sagemaker", "train-x", "a", inputs=[f"s3://{BUCKET}/data/train.jsonl"])
    assert may(r, "s3:GetObject", f"{S3}/data/train.jsonl")
    assert not may(r, "s3:GetObject", f"{S3}/data/train.jsonl.bak")
    # Another bucket's input gets no grant from the stack (the boundary holds only the stack's bucket).
    other = role("sagemaker", "train-x", "a", inputs=["s3://someone-elses/data/"])
    assert not may(other, "s3:GetObject", "arn:aws:s3:::someone-elses/data/x")


def test_the_whole_bucket_as_an_input_is_one_line_naming_it():
    with pytest.raises(UserError) as refused:
        role("sagemaker", "train-x", "a", inputs=[f"s3://{BUCKET}/"])
    assert str(refused.value).startswith(f"--input s3://{BUCKET}/: the stack's whole bucket")


# --- the job's own Auto Scaling group ---------------------------------------------------------------


def group_arn(name: str) -> str:
    uuid = "0a1b2c3d-0000-4000-8000-000000000000"
    return f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:{uuid}:autoScalingGroupName/{name}"


def group_tags(job: str, stack_name: str = STACK) -> dict:
    return {f"aws:ResourceTag/{STACK_TAG}": stack_name, f"aws:ResourceTag/{JOB_TAG}": job}


def group_update(request: dict) -> dict:
    """The context keys AWS adds to UpdateAutoScalingGroup for what `request` names (Service
    Authorization Reference, "Condition keys for Amazon EC2 Auto Scaling": each "filters access
    by" the parameter "in the request"). DesiredCapacity and the instances distribution have none."""
    context: dict = {}
    for key in ("MinSize", "MaxSize", "LaunchConfigurationName"):
        if key in request:
            context[f"autoscaling:{key}"] = str(request[key])
    if "VPCZoneIdentifier" in request:
        context["autoscaling:VPCZoneIdentifiers"] = request["VPCZoneIdentifier"].split(",")
    template = request.get("LaunchTemplate") or request.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get(
        "LaunchTemplateSpecification"
    )
    if template:
        context["autoscaling:LaunchTemplateVersionSpecified"] = template.get("Version", "$Default") not in (
            "$Latest",
            "$Default",
        )
    overrides = request.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get("Overrides", [])
    if overrides:
        context["autoscaling:InstanceTypes"] = [o["InstanceType"] for o in overrides]
    return context


def test_a_lineage_may_leave_its_own_group_and_go_on_demand_but_never_reshape_it():
    from distrain_cloud.launcher.spec import load_spec

    spec = load_spec(
        None, {"instance": "g5.xlarge", "nodes": 2, "spot": True, "ec2.max_restarts": 3, "ec2.on_demand_after": 1}
    )
    on_demand = recovery.description_block("job-a", 2, spec)["on_demand_request"]  # what a node sends
    a = role("ec2", "job-a", "a", group=True, on_demand=True)
    mine, tags = group_arn("job-a"), group_tags("job-a")
    update = "autoscaling:UpdateAutoScalingGroup"
    assert may(a, "autoscaling:TerminateInstanceInAutoScalingGroup", mine, **tags)
    assert may(a, "autoscaling:SetDesiredCapacity", mine, **tags)  # AWS refuses more than MaxSize itself
    assert may(a, "autoscaling:SuspendProcesses", mine, **tags)  # launches stop at the lineage's end
    assert not may(a, "autoscaling:ResumeProcesses", mine, **tags)
    assert may(a, update, mine, **tags, **group_update(on_demand))
    reshaped = {
        "MinSize": {"MinSize": 2},
        "MaxSize": {"MaxSize": 64},
        "subnets": {"VPCZoneIdentifier": "subnet-1,subnet-2"},
        "template": {"LaunchTemplate": {"LaunchTemplateName": "job-b", "Version": "3"}},
        "types": {
            "MixedInstancesPolicy": {
                "LaunchTemplate": {
                    "LaunchTemplateSpecification": {"LaunchTemplateName": "job-a", "Version": "$Latest"},
                    "Overrides": [{"InstanceType": "p5.48xlarge"}],
                }
            }
        },
    }
    for what, request in reshaped.items():
        context = group_update({"AutoScalingGroupName": "job-a", **request})
        assert not may(a, update, mine, **tags, **context), what
        # Nor may a broader role a launcher might mint: the boundary refuses it too.
        anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        assert not allowed(Request(update, mine, {**tags, **context}), [anything], BOUNDARY), what
    # Nothing of another job's group; no tagging or deleting even its own.
    for action in (
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "autoscaling:SetDesiredCapacity",
        "autoscaling:SuspendProcesses",
        update,
    ):
        assert not may(a, action, group_arn("job-b"), **group_tags("job-b")), action
    assert not may(a, "autoscaling:CreateOrUpdateTags", mine, **tags, **{f"aws:RequestTag/{JOB_TAG}": "job-b"})
    assert not may(a, "autoscaling:DeleteAutoScalingGroup", mine, **tags)
    assert not may(a, "autoscaling:PutScheduledUpdateGroupAction", mine, **tags)  # the hard stop stays
    # Without --on-demand-after the group cannot be updated at all; a job without a group has none.
    plain = role("ec2", "job-a", "a", group=True)
    assert not may(plain, update, mine, **tags, **group_update(on_demand))
    assert may(plain, "autoscaling:TerminateInstanceInAutoScalingGroup", mine, **tags)
    assert not may(role("ec2", "job-a", "a"), "autoscaling:TerminateInstanceInAutoScalingGroup", mine, **tags)


def test_a_node_tags_only_its_own_status():
    a = role("ec2", "job-a", "a")
    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0123456789abcdef0"
    mine = group_tags("job-a")
    assert may(a, "ec2:CreateTags", instance, **mine, **{"aws:TagKeys": ["distrain-cloud:status"]})
    for keys in (["distrain-cloud:status", JOB_TAG], [STACK_TAG], ["Name"]):
        assert not may(a, "ec2:CreateTags", instance, **mine, **{"aws:TagKeys": keys}), keys
    assert not may(a, "ec2:CreateTags", instance, **group_tags("job-b"), **{"aws:TagKeys": ["distrain-cloud:status"]})


# --- the launcher: tags only at creation ----------------------------------------------------------


def tagging(**tags: str) -> dict:
    """The context of a request carrying `tags` (IAM User Guide, "Controlling access to AWS
    resources using tags": aws:RequestTag/<key> per tag, aws:TagKeys all keys)."""
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": list(tags)}


def launcher_may(action: str, resource: str, **context) -> bool:
    return allowed(Request(action, resource, context), [LAUNCHER])


def test_a_launcher_cannot_tag_a_foreign_group_or_template_into_the_stack_and_delete_it():
    template = f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/lt-0123456789abcdef0"
    foreign_group, ours = group_arn("someone-elses-web-tier"), group_arn("job-a")
    stack_tag = {STACK_TAG: STACK}
    # Tagging an existing template or group into the stack: refused (the first step of tag-then-delete).
    assert not launcher_may("ec2:CreateTags", template, **tagging(**stack_tag))
    assert not launcher_may("autoscaling:CreateOrUpdateTags", foreign_group, **tagging(**stack_tag))
    # ...so the second step finds no stack tag on them.
    assert not launcher_may("ec2:DeleteLaunchTemplate", template)
    assert not launcher_may("autoscaling:DeleteAutoScalingGroup", foreign_group)
    assert not launcher_may("autoscaling:UpdateAutoScalingGroup", foreign_group)
    # What a lineage needs still goes: tags written as the template and the group are made
    # (EC2 User Guide, "Grant permission to tag resources during creation": CreateTags is authorized
    # with ec2:CreateAction), and changes only where the stack tag is.
    assert launcher_may("ec2:CreateLaunchTemplate", template, **tagging(**stack_tag))
    assert launcher_may(
        "ec2:CreateTags", template, **tagging(**stack_tag), **{"ec2:CreateAction": "CreateLaunchTemplate"}
    )
    assert not launcher_may("ec2:CreateLaunchTemplate", template, **tagging(team="x"))
    assert launcher_may("autoscaling:CreateAutoScalingGroup", ours, **tagging(**stack_tag))
    assert not launcher_may("autoscaling:CreateAutoScalingGroup", ours, **tagging(team="x"))
    for action in (
        "autoscaling:DeleteAutoScalingGroup",
        "autoscaling:PutScheduledUpdateGroupAction",
        "autoscaling:SuspendProcesses",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ):
        assert launcher_may(action, ours, **{f"aws:ResourceTag/{STACK_TAG}": STACK}), action
        assert not launcher_may(action, ours, **{f"aws:ResourceTag/{STACK_TAG}": "another-stack"}), action
    assert launcher_may("ec2:DeleteLaunchTemplate", template, **{f"aws:ResourceTag/{STACK_TAG}": STACK})
    # Instances: tagged only at launch, as before.
    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0123456789abcdef0"
    assert not launcher_may("ec2:CreateTags", instance, **tagging(**stack_tag))
    assert not launcher_may("ec2:TerminateInstances", instance)


# --- trust ------------------------------------------------------------------------------------------


def test_trust_policies_carry_the_confused_deputy_conditions():
    sagemaker = role("sagemaker", "job-a", "a")
    assume = "sts:AssumeRole"
    service = {"Service": "sagemaker.amazonaws.com"}

    def context(account: str, job: str = "job-a") -> dict:
        return {
            "aws:SourceAccount": account,
            "aws:SourceArn": f"arn:aws:sagemaker:{REGION}:{account}:training-job/{job}",
        }

    assert trusts(sagemaker.trust, Request(assume, sagemaker.arn, context(ACCOUNT), service))
    # Another account's training job, handed this role's ARN, gets nothing; nor does a call without the keys.
    assert not trusts(sagemaker.trust, Request(assume, sagemaker.arn, context("999999999999"), service))
    assert not trusts(sagemaker.trust, Request(assume, sagemaker.arn, {}, service))
    assert not trusts(
        sagemaker.trust, Request(assume, sagemaker.arn, context(ACCOUNT), {"Service": "ec2.amazonaws.com"})
    )
    ec2 = role("ec2", "job-a", "a")
    assert trusts(ec2.trust, Request(assume, ec2.arn, {}, {"Service": "ec2.amazonaws.com"}))
    assert not trusts(ec2.trust, Request(assume, ec2.arn, {}, service))


def test_the_boundary_and_launcher_policy_need_an_allow_for_what_the_nodes_do():
    # The boundary caps: each job statement's actions are within it (a statement the boundary did
    # not cover would be silently dead on AWS, and moto would not notice).
    a = role("ec2", "job-a", "a", A_SECRETS, group=True, on_demand=True)
    assert decide(Request("s3:GetObject", f"{S3}/{code_key('a')}"), [a.policy], BOUNDARY) == "allow"
    assert may(a, "logs:PutLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{LOG_GROUP}:log-stream:job-a/node-0")
    assert not may(
        a, "logs:PutLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{LOG_GROUP}:log-stream:job-b/node-0"
    )
    assert may(a, "ec2:TerminateInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0", **group_tags("job-a"))
    assert not may(a, "ec2:TerminateInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0", **group_tags("job-b"))


# --- the real path: roles as plan_job makes them, documents as CloudFormation rendered them -------


@pytest.mark.slow  # a stack under moto, two plans
def test_planned_roles_within_the_boundary_that_infra_up_made(mocked_aws, monkeypatch):
    import json

    import boto3

    from distrain_cloud.launcher.api import plan_job
    from distrain_cloud.launcher.backends.ec2 import preflight as ec2_preflight
    from distrain_cloud.launcher.spec import load_spec

    monkeypatch.setattr(ec2_preflight, "resolve_ami", lambda parameter, region: "ami-dca37ea5")  # a DLAMI moto lists
    stack.execute(stack.plan_up(STACK, REGION))
    made = stack.resources(STACK, REGION)
    iam = boto3.client("iam")

    def document(arn: str) -> dict:
        version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        found = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
        return found if isinstance(found, dict) else json.loads(found)

    boundary, launcher = document(made.job_boundary_arn), document(made.launcher_policy_arn)
    described = boto3.client("cloudformation", REGION).describe_stacks(StackName=STACK)["Stacks"][0]
    # The fast tests' rendering is CloudFormation's (moto's), given this stack's names.
    names = {
        **NAMES,
        "Bucket": made.bucket,
        "Bucket.Arn": f"arn:aws:s3:::{made.bucket}",
        "JobBoundary": made.job_boundary_arn,
        "NodeSecurityGroup": made.security_group_id,
        "NodeSecurityGroup.GroupId": made.security_group_id,
        **{p["ParameterKey"]: p["ParameterValue"] for p in described.get("Parameters", [])},  # VpcId, Prefix, ...
        "AWS::StackId": described["StackId"],
        # CloudFormation's LogGroup.Arn ends in ":*" (AWS::Logs::LogGroup, "Return values"); moto's does not.
        "LogGroup.Arn": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{LOG_GROUP}",
    }
    resources = stack.load_template()["Resources"]
    conditions = {"SsmEnabled": False}
    rendered = render(resources["LauncherPolicy"]["Properties"]["PolicyDocument"], names, conditions)
    assert rendered == launcher
    assert render(resources["JobBoundary"]["Properties"]["PolicyDocument"], names, conditions) == boundary

    base = {"region": REGION, "max_run": "2h", "stack": STACK}
    lineage = plan_job(
        load_spec(
            None,
            {
                **base,
                "instance": "g4dn.xlarge",
                "spot": True,
                "ec2.max_restarts": 2,
                "ec2.on_demand_after": 1,
                "secrets": {"HF_TOKEN": "secretsmanager:distrain-cloud/a-token"},
            },
        )
    )
    a, role_a = lineage.job_name, lineage.configs["job_role"]
    trainer = plan_job(
        load_spec(
            None,
            {
                **base,
                "instance": "ml.g5.xlarge",
                "inputs": {"train": f"s3://{made.bucket}/{PREFIX}/jobs/{a}"},
                "secrets": {"WANDB_API_KEY": "ssm:/distrain-cloud/b-key"},
            },
        )
    )
    role_b = trainer.configs["job_role"]
    assert role_a["permissions_boundary"] == role_b["permissions_boundary"] == made.job_boundary_arn
    bucket = f"arn:aws:s3:::{made.bucket}"

    def may_(shown: dict, action: str, resource: str, **context) -> bool:
        return allowed(Request(action, resource, context), [shown["policy"]], boundary)

    secret_a = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:distrain-cloud/a-token-Xy12Zq"
    parameter_b = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/distrain-cloud/b-key"
    assert may_(role_a, "s3:GetObject", f"{bucket}/{lineage.payload.code_key}")
    assert may_(role_a, "secretsmanager:GetSecretValue", secret_a)
    assert not may_(role_a, "ssm:GetParameter", parameter_b)
    assert may_(role_b, "ssm:GetParameter", parameter_b)
    assert not may_(role_b, "secretsmanager:GetSecretValue", secret_a)
    # B reads A's outputs, which it named, and nothing of a job whose name merely starts like A's.
    assert may_(role_b, "s3:GetObject", f"{bucket}/{PREFIX}/jobs/{a}/output/model.tar.gz")
    assert not may_(role_b, "s3:GetObject", f"{bucket}/{PREFIX}/jobs/{a}-other/output/model.tar.gz")
    assert not may_(role_b, "s3:PutObject", f"{bucket}/{PREFIX}/jobs/{a}/output/model.tar.gz")
    if lineage.payload.code_key != trainer.payload.code_key:  # (the same code is the same bundle)
        assert not may_(role_b, "s3:GetObject", f"{bucket}/{lineage.payload.code_key}")
    # The lineage's nodes: the on-demand switch it planned goes; a resize does not.
    group, tags = group_arn(a), group_tags(a)
    on_demand = lineage.configs["job.json"]["recovery"]["on_demand_request"]
    assert may_(role_a, "autoscaling:UpdateAutoScalingGroup", group, **tags, **group_update(on_demand))
    assert not may_(role_a, "autoscaling:UpdateAutoScalingGroup", group, **tags, **group_update({"MaxSize": 9}))
    assert may_(role_a, "autoscaling:TerminateInstanceInAutoScalingGroup", group, **tags)
    assert not may_(role_b, "autoscaling:TerminateInstanceInAutoScalingGroup", group, **tags)
    # Both plans checked their --secret references against the stack's SecretPrefix.
    for plan in (lineage, trainer):
        (reach,) = [c for c in plan.checks if c.name == "job role can read each --secret"]
        assert reach.ok is True, reach
    # A reference the boundary would refuse stops the submit before anything is made.
    from distrain_cloud.launcher.api import submit_job

    outside = plan_job(
        load_spec(None, {**base, "instance": "ml.g5.xlarge", "secrets": {"HF_TOKEN": "secretsmanager:prod/hf"}})
    )
    with pytest.raises(UserError) as refused:
        submit_job(outside)
    message = str(refused.value)
    assert "\n" not in message and "--secret HF_TOKEN=secretsmanager:prod/hf: job roles of this stack" in message
    assert iam.list_roles(PathPrefix="/distrain-cloud/")["Roles"] == []
    assert boto3.client("sagemaker", REGION).list_training_jobs()["TrainingJobSummaries"] == []
    # The SageMaker role trusts this account's training jobs only.
    assert role_b["trust"]["Statement"][0]["Condition"]["StringEquals"] == {"aws:SourceAccount": ACCOUNT}
    assert (
        allowed(
            Request(
                "ec2:CreateTags", f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/lt-0", tagging(**{STACK_TAG: STACK})
            ),
            [launcher],
        )
        is False
    )


@pytest.mark.parametrize("instance", ["g4dn.xlarge", "ml.g5.xlarge"])
def test_a_dry_run_names_the_secrets_in_the_role_and_leaves_their_check_to_submit(aws_calls, instance):
    from distrain_cloud.launcher.api import plan_job
    from distrain_cloud.launcher.spec import load_spec

    secrets = {"HF_TOKEN": "secretsmanager:prod/hf-token"}
    plan = plan_job(
        load_spec(None, {"instance": instance, "region": REGION, "max_run": "2h", "secrets": secrets}), dry_run=True
    )
    assert aws_calls == []
    (reach,) = [c for c in plan.checks if c.name == "job role can read each --secret"]
    assert reach.ok is None and "at submit" in reach.detail
    named = {s["Sid"]: s["Resource"] for s in plan.configs["job_role"]["policy"]["Statement"]}
    assert named["NamedSecrets"] == [f"arn:aws:secretsmanager:{REGION}:<account>:secret:prod/hf-token-??????"]
    assert "NamedParameters" not in named
