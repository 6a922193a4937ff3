"""One job's credentials reach its own S3 prefixes and instances, never another job's (issue 29, section 1).

Two jobs, A and B, are submitted through the real path (`plan_job` + `submit_job`, with the stack
that `infra up` makes). A's credentials are what A's code would hold: the role of the instance
profile A's instances were launched with (EC2), or the RoleArn of A's training job (SageMaker),
assumed through STS. Then moto enforces IAM on every call made with them
(`set_initial_no_auth_action_count(0)`): moto applies the assumed role's inline policies and
knows S3 object ARNs, so reading, writing and deleting B's job.json and checkpoints and writing a
code bundle are refused by moto itself, while A's own files and the bundle's read go through.

What moto cannot show: it checks EC2 calls against resource "*" and ignores their conditions,
and it never applies a permissions boundary. TerminateInstances and CreateTags on B's instances
are therefore judged by moto's own policy evaluator (`IAMPolicy`, the one its enforcement uses)
on A's policy as IAM holds it, with the instance's ARN and its tags as condition values (it
evaluates StringEquals). The `ForAllValues:StringEquals` on aws:TagKeys that keeps A's code from
rewriting its own job/stack tags is not evaluated by moto: it is asserted on the document. The
boundary's limits are asserted on the template (tests/infra/test_stack.py).
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError

from distrain_cloud.infra import stack
from distrain_cloud.launcher.api import plan_job, submit_job
from distrain_cloud.launcher.backends.ec2 import preflight as ec2_preflight
from distrain_cloud.launcher.spec import load_spec

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Tried to parse AWS::")]

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
AMI = "ami-dca37ea5"  # a Deep Learning AMI in moto's image list
JOB_TAG, STACK_TAG, STATUS_TAG = "distrain-cloud:job", stack.STACK_TAG, "distrain-cloud:status"


@pytest.fixture
def made(mocked_aws, monkeypatch) -> stack.StackResources:
    monkeypatch.setattr(ec2_preflight, "resolve_ami", lambda parameter, region: AMI)
    stack.execute(stack.plan_up(stack.DEFAULT_STACK, REGION))
    return stack.resources(stack.DEFAULT_STACK, REGION)


def _submit(**overrides) -> tuple[str, dict]:
    plan = plan_job(load_spec(None, {"region": REGION, "max_run": "2h", **overrides}))
    assert submit_job(plan) == 0
    return plan.job_name, plan


def _credentials(role_arn: str) -> dict[str, str]:
    """What code holding `role_arn` gets (an instance's metadata service or SageMaker hand out the same)."""
    # moto's CloudFormation stores a template role's inline policy in a form its own enforcement
    # cannot read (the shared stack roles before issue 29): put the same document back as JSON.
    iam, name = boto3.client("iam"), role_arn.rsplit("/", 1)[1]
    for policy in iam.list_role_policies(RoleName=name)["PolicyNames"]:
        document = _document(iam.get_role_policy(RoleName=name, PolicyName=policy)["PolicyDocument"])
        iam.put_role_policy(RoleName=name, PolicyName=policy, PolicyDocument=json.dumps(document))
    creds = boto3.client("sts", REGION).assume_role(RoleArn=role_arn, RoleSessionName="job-code")["Credentials"]
    return {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
    }


def _instances(job: str) -> list[dict]:
    found = boto3.client("ec2", REGION).describe_instances(Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [job]}])
    return [i for r in found["Reservations"] for i in r["Instances"]]


def _instance_role(job: str) -> str:
    """The role of the instance profile job `job`'s instances were launched with."""
    profile = _instances(job)[0]["IamInstanceProfile"]["Arn"].rsplit("/", 1)[1]
    (role,) = boto3.client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
    return str(role["Arn"])


def _inline_policy(role_arn: str) -> dict:
    iam, name = boto3.client("iam"), role_arn.rsplit("/", 1)[1]
    (policy,) = iam.list_role_policies(RoleName=name)["PolicyNames"]
    return _document(iam.get_role_policy(RoleName=name, PolicyName=policy)["PolicyDocument"])


def _document(document) -> dict:
    if isinstance(document, dict):
        return document
    try:
        return json.loads(document)
    except json.JSONDecodeError:  # moto's CloudFormation stores inline role policies as Python reprs
        import ast

        return ast.literal_eval(document)


def _s3_keys(name: str, plan: dict) -> dict[str, str]:
    checkpoints = plan.summary["checkpoints"].removeprefix("s3://").split("/", 1)[1]
    return {
        "job.json": f"distrain-cloud/jobs/{name}/job.json",
        "checkpoint": f"{checkpoints}checkpoint-00000005/model.safetensors",
        "checkpoints": checkpoints,
    }


def _lease(keys: dict[str, str]) -> str:
    from distrain_cloud.launcher.lease import lease_key

    lineage = keys["checkpoints"].rstrip("/").rsplit("/", 1)[1]
    return lease_key(f"s3://bucket/{keys['checkpoints']}", lineage)[1]


def _s3_isolation(bucket: str, creds: dict[str, str], own: dict[str, str], other: dict[str, str], code_key: str):
    """With `creds` under enforced IAM: every call on `other`'s keys and a bundle write -> AccessDenied;
    `own`'s job.json, checkpoints and the bundle's read succeed. Returns the calls that were not denied."""
    from moto.core import set_initial_no_auth_action_count

    admin = boto3.client("s3", REGION)
    admin.put_object(Bucket=bucket, Key=other["checkpoint"], Body=b"B's weights")
    not_denied: list[str] = []

    @set_initial_no_auth_action_count(0)
    def as_job_a() -> None:
        s3 = boto3.client("s3", REGION, **creds)
        # A's own work goes through.
        assert json.loads(s3.get_object(Bucket=bucket, Key=own["job.json"])["Body"].read())["job"]
        s3.put_object(Bucket=bucket, Key=own["checkpoint"], Body=b"A's weights")
        assert s3.get_object(Bucket=bucket, Key=own["checkpoint"])["Body"].read() == b"A's weights"
        assert s3.list_objects_v2(Bucket=bucket, Prefix=own["checkpoints"])["KeyCount"] == 1
        s3.delete_object(Bucket=bucket, Key=own["checkpoint"])
        assert s3.get_object(Bucket=bucket, Key=code_key)["Body"].read()[:2] == b"\x1f\x8b"  # the bundle, gzip
        # Everything of B's, and the shared code, is refused.
        attempts = {
            "read B's job.json": lambda: s3.get_object(Bucket=bucket, Key=other["job.json"]),
            "rewrite B's job.json": lambda: s3.put_object(Bucket=bucket, Key=other["job.json"], Body=b"{}"),
            "delete B's job.json": lambda: s3.delete_object(Bucket=bucket, Key=other["job.json"]),
            "read B's checkpoint": lambda: s3.get_object(Bucket=bucket, Key=other["checkpoint"]),
            "plant a checkpoint of B's": lambda: s3.put_object(
                Bucket=bucket, Key=other["checkpoints"] + "checkpoint-00000009/COMPLETE", Body=b""
            ),
            "delete B's checkpoint": lambda: s3.delete_object(Bucket=bucket, Key=other["checkpoint"]),
            "overwrite a code bundle": lambda: s3.put_object(Bucket=bucket, Key=code_key, Body=b"evil"),
            # The lineage lease is the launcher's alone: a job can neither free nor forge its own or B's.
            "rewrite its own lineage's lease": lambda: s3.put_object(Bucket=bucket, Key=_lease(own), Body=b"{}"),
            "rewrite B's lineage lease": lambda: s3.put_object(Bucket=bucket, Key=_lease(other), Body=b"{}"),
            # The launcher's copy of job.json (what status and resume trust) is out of its job's reach.
            "rewrite its own job.json's launcher copy": lambda: s3.put_object(
                Bucket=bucket,
                Key=own["job.json"].replace("/jobs/", "/submitted/").replace("/job.json", ".json"),
                Body=b"{}",
            ),
        }
        for what, call in attempts.items():
            try:
                call()
            except ClientError as e:
                if e.response["Error"]["Code"] == "AccessDenied":
                    continue
                raise
            not_denied.append(what)

    as_job_a()
    return not_denied


def test_an_ec2_jobs_credentials_reach_only_its_own_prefixes_and_instances(made):
    from moto.iam.access_control import IAMPolicy, PermissionResult

    a, plan_a = _submit(instance="g4dn.12xlarge", nodes=2)
    b, plan_b = _submit(instance="g4dn.12xlarge", nodes=2)
    role_a = _instance_role(a)
    not_denied = _s3_isolation(
        made.bucket, _credentials(role_a), _s3_keys(a, plan_a), _s3_keys(b, plan_b), plan_a.payload.code_key
    )
    assert not_denied == []
    assert role_a != _instance_role(b)  # each job's instances carry a role of their own

    policy = IAMPolicy(json.dumps(_inline_policy(role_a)))
    instance_arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{{}}"

    def permitted(action: str, instance: dict, **extra: str) -> bool:
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        context = {f"aws:ResourceTag/{STACK_TAG}": tags[STACK_TAG], f"aws:ResourceTag/{JOB_TAG}": tags[JOB_TAG]}
        result = policy.is_action_permitted(
            action, instance_arn.format(instance["InstanceId"]), incoming_condition_values={**context, **extra}
        )
        return result == PermissionResult.PERMITTED

    status_tag = {"aws:TagKeys": STATUS_TAG}
    for mine in _instances(a):  # node 0 may end a silent peer of its own job; each node tags its status
        assert permitted("ec2:TerminateInstances", mine) and permitted("ec2:CreateTags", mine, **status_tag)
    for theirs in _instances(b):
        assert not permitted("ec2:TerminateInstances", theirs)
        assert not permitted("ec2:CreateTags", theirs, **status_tag)
    assert policy.is_action_permitted("ec2:DescribeInstances", "*") == PermissionResult.PERMITTED
    # Which tag keys A's code may write (moto does not evaluate ForAllValues): its status only.
    tagging = [s for s in _inline_policy(role_a)["Statement"] if "ec2:CreateTags" in s["Action"]]
    assert [s["Condition"].get("ForAllValues:StringEquals") for s in tagging] == [{"aws:TagKeys": [STATUS_TAG]}]


def test_a_sagemaker_jobs_role_reaches_only_its_own_prefixes(made):
    a, plan_a = _submit(instance="ml.g5.xlarge")
    b, plan_b = _submit(instance="ml.g5.xlarge")
    sagemaker = boto3.client("sagemaker", REGION)
    role_a = sagemaker.describe_training_job(TrainingJobName=a)["RoleArn"]
    own, other = _s3_keys(a, plan_a), _s3_keys(b, plan_b)
    # SageMaker jobs have no job.json: their output folder plays its part.
    own["job.json"], other["job.json"] = (f"distrain-cloud/jobs/{n}/output/output.tar.gz" for n in (a, b))
    boto3.client("s3", REGION).put_object(Bucket=made.bucket, Key=own["job.json"], Body=b'{"job": "a"}')
    boto3.client("s3", REGION).put_object(Bucket=made.bucket, Key=other["job.json"], Body=b"{}")

    not_denied = _s3_isolation(made.bucket, _credentials(role_a), own, other, plan_a.payload.code_key)
    assert not_denied == []
    assert role_a != sagemaker.describe_training_job(TrainingJobName=b)["RoleArn"]


def test_an_input_prefix_that_names_other_keys_fails_the_plan_before_anything_is_made(made, capsys):
    """SageMaker reads every key that starts with an S3Prefix URI; the job's own role reads an input
    only on a `/` boundary. `.../data` beside `data-old/` would be denied inside a billed job: the
    plan's check fails first, names the key (escaped: any writer of the bucket chose it) and the
    fix, and nothing is created. With the folder named, the same submit goes through."""
    from clirun import run_cli

    s3 = boto3.client("s3", REGION)
    for key in ("data/train.jsonl", "data-old\x1b[2J/train.jsonl"):
        s3.put_object(Bucket=made.bucket, Key=key, Body=b"{}\n")
    submit = ["submit", "--instance", "ml.g5.xlarge", "--region", REGION, "--max-run", "2h", "--yes"]

    code, _, err = run_cli(capsys, *submit, "--input", f"train=s3://{made.bucket}/data")
    assert code == 2 and "plan check failed, nothing was created" in err, err
    assert "--input train reads only its own keys" in err and "'data-old [2J/'" in err, err
    assert f"name the folder: --input train=s3://{made.bucket}/data/" in err and "\x1b" not in err
    assert boto3.client("sagemaker", REGION).list_training_jobs()["TrainingJobSummaries"] == []

    code, _, err = run_cli(capsys, *submit, "--input", f"train=s3://{made.bucket}/data/")
    assert code == 0, err
    (job,) = boto3.client("sagemaker", REGION).list_training_jobs()["TrainingJobSummaries"]
    assert job["TrainingJobStatus"]
