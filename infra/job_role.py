"""One IAM role per job: what a job's own code may reach, and nothing of any other job's.

Code inside a job (a `trust_remote_code` model, a dependency, a data set loader) holds the job's
credentials. A role shared by every job cannot tell jobs apart (IAM sees the instance, and
nothing maps an instance to its job), so the launcher makes a role for each job at submit whose
inline policy names that job's S3 prefixes and its instance tag as literals:

- read-write `<prefix>/jobs/<job>/` and the lineage's `<prefix>/checkpoints/<lineage>/`;
- read-only `<prefix>/code/` (content-addressed bundles) and a SageMaker job's input channels;
- an EC2 job: its own log streams, terminate and tag (its status only) the instances tagged with
  its job name, DescribeInstances;
- a SageMaker job: SageMaker's own log group, metrics and image pulls;
- the stack's secrets and parameters (under its SecretPrefix).

Every job role carries the stack's JobBoundary as permissions boundary and lives under the IAM
path `/distrain-cloud/<stack>/`: the launcher policy may create roles only there and only with
that boundary, so a launcher cannot mint a role beyond the union of what jobs may do. An EC2 job's
instance profile has the role's name. The role is deleted once its job has ended (`retire`) and
`infra down` deletes every one left under the stack's path (`retire_all`).

Planning is pure (`JobRole` and its documents); only `create`, `retire` and `retire_all` call AWS.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import aws
from .errors import UserError

PATH_ROOT = "/distrain-cloud/"
POLICY_NAME = "distrain-cloud-job"
JOB_TAG = "distrain-cloud:job"
STACK_TAG = "distrain-cloud:stack"  # infra.stack.STACK_TAG (stack imports this module)
# The only instance tag a job's own code may write: the node agent's status.
NODE_TAG_KEYS = ("distrain-cloud:status",)
SSM_MANAGED_POLICY = "arn:{partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
SAGEMAKER_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
# A new role (and instance profile) reaches EC2 and SageMaker some seconds after IAM made it;
# launches that meet "no such profile / cannot assume the role" are retried this long.
PROPAGATION_S = 90.0
PROPAGATION_POLL_S = 5.0
# IAM's API model: role and instance profile names.
_NAME = re.compile(r"[\w+=,.@-]{1,64}")

SERVICES = {"ec2": "ec2.amazonaws.com", "sagemaker": "sagemaker.amazonaws.com"}

T = TypeVar("T")


def role_path(stack: str) -> str:
    """The IAM path of `stack`'s job roles (and instance profiles)."""
    return f"{PATH_ROOT}{stack}/"


def role_name(job_name: str) -> str:
    """The job's role (and instance profile) name: the job name itself (at most 63 characters of
    [A-Za-z0-9-], within IAM's 64 of [\\w+=,.@-])."""
    if not _NAME.fullmatch(job_name):
        raise UserError(f"--name {job_name}: not usable as an IAM role name (at most 64 of A-Z a-z 0-9 +=,.@_-)")
    return job_name


@dataclass(frozen=True)
class Place:
    """Where a job's data lives and what names its resources, as the policy's literals."""

    partition: str
    region: str
    account: str
    stack: str
    bucket: str
    prefix: str  # the spec's key prefix, no slashes at either end ("" for the bucket's root)
    job: str
    lineage: str

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return (
            f"arn:{self.partition}:{service}:{self.region if region else ''}:{self.account if account else ''}:"
            f"{resource}"
        )


@dataclass(frozen=True)
class JobRole:
    """One job's role as it will be created: name, path, boundary, trust and inline policy."""

    name: str
    path: str
    kind: str  # "ec2" or "sagemaker"
    account: str
    partition: str
    boundary_arn: str
    policy: dict[str, Any]
    managed_policies: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = field(default=())

    @property
    def arn(self) -> str:
        return f"arn:{self.partition}:iam::{self.account}:role{self.path}{self.name}"

    @property
    def instance_profile(self) -> str | None:
        """An EC2 job's instance profile name (the role's); SageMaker jobs pass the role itself."""
        return self.name if self.kind == "ec2" else None

    @property
    def trust(self) -> dict[str, Any]:
        return {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": SERVICES[self.kind]}, "Action": "sts:AssumeRole"}
            ],
        }

    def shown(self) -> dict[str, Any]:
        """What the plan (and --dry-run) shows of it."""
        shown: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "arn": self.arn,
            "permissions_boundary": self.boundary_arn,
            "trust": self.trust,
            "policy": self.policy,
        }
        if self.instance_profile:
            shown["instance_profile"] = self.instance_profile
        if self.managed_policies:
            shown["managed_policies"] = list(self.managed_policies)
        return shown

    def requests(self) -> list[tuple[str, dict[str, Any]]]:
        """The IAM requests that make it, in order: (operation, parameters)."""
        made: list[tuple[str, dict[str, Any]]] = [
            (
                "CreateRole",
                {
                    "RoleName": self.name,
                    "Path": self.path,
                    "AssumeRolePolicyDocument": json.dumps(self.trust),
                    "Description": f"distrain-cloud job {self.name}: its own S3 prefixes and instances only",
                    "MaxSessionDuration": 3600,
                    "PermissionsBoundary": self.boundary_arn,
                    "Tags": [{"Key": k, "Value": v} for k, v in self.tags],
                },
            ),
            (
                "PutRolePolicy",
                {"RoleName": self.name, "PolicyName": POLICY_NAME, "PolicyDocument": json.dumps(self.policy)},
            ),
        ]
        made += [("AttachRolePolicy", {"RoleName": self.name, "PolicyArn": arn}) for arn in self.managed_policies]
        if self.instance_profile:
            made += [
                (
                    "CreateInstanceProfile",
                    {
                        "InstanceProfileName": self.instance_profile,
                        "Path": self.path,
                        "Tags": [{"Key": k, "Value": v} for k, v in self.tags],
                    },
                ),
                ("AddRoleToInstanceProfile", {"InstanceProfileName": self.instance_profile, "RoleName": self.name}),
            ]
        return made


# --- the policy ---------------------------------------------------------------------------------


def _s3_statements(place: Place, inputs: Iterable[str]) -> list[dict[str, Any]]:
    bucket = f"arn:{place.partition}:s3:::{place.bucket}"
    job_root, lineage_root, code_root = (
        place.key("jobs", place.job),
        place.key("checkpoints", place.lineage),
        place.key("code"),
    )
    read_write = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    listed = [f"{job_root}/*", f"{lineage_root}/*", f"{code_root}/*"]
    read_only = [f"{bucket}/{code_root}/*"]
    for uri in sorted(set(inputs)):  # a SageMaker job's input channels in the stack's bucket
        key = uri.removeprefix(f"s3://{place.bucket}/")
        listed.append(f"{key}*")
        read_only.append(f"{bucket}/{key}*")
    return [
        {"Sid": "BucketLocation", "Effect": "Allow", "Action": "s3:GetBucketLocation", "Resource": bucket},
        # Listing names other jobs' keys too: only under this job's own prefixes.
        {
            "Sid": "ListOwnPrefixes",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket,
            "Condition": {"StringLike": {"s3:prefix": listed}},
        },
        {"Sid": "OwnJob", "Effect": "Allow", "Action": read_write, "Resource": f"{bucket}/{job_root}/*"},
        {"Sid": "OwnLineage", "Effect": "Allow", "Action": read_write, "Resource": f"{bucket}/{lineage_root}/*"},
        {"Sid": "ReadCode", "Effect": "Allow", "Action": "s3:GetObject", "Resource": read_only},
    ]


def _secret_statements(place: Place, secret_prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "Sid": "Secrets",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": place.arn("secretsmanager", f"secret:{secret_prefix}*"),
        },
        {
            "Sid": "Parameters",
            "Effect": "Allow",
            "Action": ["ssm:GetParameter", "ssm:GetParameters"],
            "Resource": place.arn("ssm", f"parameter/{secret_prefix.lstrip('/')}*"),
        },
    ]


def own_instances_condition(place: Place) -> dict[str, str]:
    """The tags that make an instance this job's (both: a job name is unique within a stack)."""
    return {f"aws:ResourceTag/{STACK_TAG}": place.stack, f"aws:ResourceTag/{JOB_TAG}": place.job}


def ec2_policy(place: Place, *, log_group: str, secret_prefix: str) -> dict[str, Any]:
    """The inline policy of an EC2 job's role."""
    group = place.arn("logs", f"log-group:{log_group}")
    instances = place.arn("ec2", "instance/*")
    statements = _s3_statements(place, ())
    statements += [
        # The node agent names its streams <job>/node-<rank>.
        {
            "Sid": "OwnLogStreams",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [group, f"{group}:log-stream:{place.job}/*"],
        },
        # A node ends itself, and node 0 ends a silent peer: only this job's instances.
        {
            "Sid": "TerminateOwnInstances",
            "Effect": "Allow",
            "Action": "ec2:TerminateInstances",
            "Resource": instances,
            "Condition": {"StringEquals": own_instances_condition(place)},
        },
        # A node reports its status in a tag; the stack, job and lineage tags stay as launched.
        {
            "Sid": "TagOwnStatus",
            "Effect": "Allow",
            "Action": "ec2:CreateTags",
            "Resource": instances,
            "Condition": {
                "StringEquals": own_instances_condition(place),
                "ForAllValues:StringEquals": {"aws:TagKeys": list(NODE_TAG_KEYS)},
            },
        },
        # Describe calls have no resource-level scoping in EC2.
        {"Sid": "DescribeInstances", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        # A spot lineage's nodes (launcher/backends/ec2/agent/elastic.py) leave their job's Auto Scaling group at the
        # lineage's end and may switch its purchase option to on-demand: that group only.
        {
            "Sid": "OwnAutoScalingGroup",
            "Effect": "Allow",
            "Action": ["autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:UpdateAutoScalingGroup"],
            "Resource": place.arn("autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{place.job}"),
            "Condition": {"StringEquals": own_instances_condition(place)},
        },
        # Never a bigger group: a job's code must not raise what its lineage may cost.
        {
            "Sid": "NoGroupGrowth",
            "Effect": "Deny",
            "Action": "autoscaling:UpdateAutoScalingGroup",
            "Resource": "*",
            "Condition": {"Null": {"autoscaling:MaxSize": "false"}},
        },
    ]
    return {"Version": "2012-10-17", "Statement": statements + _secret_statements(place, secret_prefix)}


def sagemaker_policy(place: Place, *, inputs: Iterable[str] = (), secret_prefix: str) -> dict[str, Any]:
    """The inline policy of a SageMaker job's role. SageMaker itself uses it too: it reads the code
    and input channels, syncs the checkpoints and writes the output under jobs/<job>/."""
    group = place.arn("logs", f"log-group:{SAGEMAKER_LOG_GROUP}")
    statements = _s3_statements(place, [u for u in inputs if u.startswith(f"s3://{place.bucket}/")])
    statements += [
        {
            "Sid": "TrainingLogs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [group, f"{group}:log-stream:{place.job}/*"],
        },
        # PutMetricData has no resource-level scoping; the namespace condition narrows it.
        {
            "Sid": "TrainingMetrics",
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",
            "Condition": {"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}},
        },
        # The Hugging Face training images live in AWS's own ECR accounts (--image-uri may name any).
        {
            "Sid": "ImagePull",
            "Effect": "Allow",
            "Action": [
                "ecr:GetAuthorizationToken",
                "ecr:BatchCheckLayerAvailability",
                "ecr:GetDownloadUrlForLayer",
                "ecr:BatchGetImage",
            ],
            "Resource": "*",
        },
    ]
    return {"Version": "2012-10-17", "Statement": statements + _secret_statements(place, secret_prefix)}


def for_job(
    kind: str,
    place: Place,
    *,
    boundary_arn: str,
    log_group: str = "",
    secret_prefix: str = "distrain-cloud/",
    inputs: Iterable[str] = (),
    ssm: bool = False,
) -> JobRole:
    """The role of job `place.job` of kind "ec2" or "sagemaker" (pure)."""
    if kind == "ec2":
        policy = ec2_policy(place, log_group=log_group, secret_prefix=secret_prefix)
    else:
        policy = sagemaker_policy(place, inputs=inputs, secret_prefix=secret_prefix)
    managed = (SSM_MANAGED_POLICY.format(partition=place.partition),) if ssm and kind == "ec2" else ()
    return JobRole(
        name=role_name(place.job),
        path=role_path(place.stack),
        kind=kind,
        account=place.account,
        partition=place.partition,
        boundary_arn=boundary_arn,
        policy=policy,
        managed_policies=managed,
        tags=((STACK_TAG, place.stack), (JOB_TAG, place.job)),
    )


def for_job_at(
    kind: str,
    *,
    partition: str,
    region: str,
    account: str,
    stack: str,
    bucket: str,
    prefix: str,
    job: str,
    lineage: str,
    boundary_arn: str,
    log_group: str = "",
    secret_prefix: str = "distrain-cloud/",
    inputs: Iterable[str] = (),
    ssm: bool = False,
) -> JobRole:
    """`for_job` with its Place spelled out: what each backend calls with the names it planned."""
    place = Place(
        partition=partition,
        region=region,
        account=account,
        stack=stack,
        bucket=bucket,
        prefix=prefix,
        job=job,
        lineage=lineage,
    )
    return for_job(
        kind,
        place,
        boundary_arn=boundary_arn,
        log_group=log_group,
        secret_prefix=secret_prefix,
        inputs=inputs,
        ssm=ssm,
    )


# --- acting -------------------------------------------------------------------------------------


def create(role: JobRole) -> None:
    """Make the role (and an EC2 job's instance profile). On any failure, what was made is
    deleted again and the error goes on: nothing is left half-made."""
    iam = aws.client("iam")
    made = False
    try:
        with aws.translate_errors():
            for operation, params in role.requests():
                getattr(iam, _snake(operation))(**params)
                made = True  # CreateRole went through: from here on, undo on failure
    except BaseException:
        if made:  # (a role of that name that existed before is not this submit's to delete)
            retire(role.name)
        raise


def retire(name: str) -> bool:
    """Delete job role `name`, its instance profile and policies, if they exist; True if it did.
    Safe to repeat: a role already gone costs one call."""
    from botocore.exceptions import ClientError

    iam = aws.client("iam")

    def gone(call: Callable[[], Any]) -> None:
        try:
            call()
        except ClientError as e:
            if aws.error_code(e) != "NoSuchEntity":
                raise

    with aws.translate_errors():
        try:
            path = iam.get_role(RoleName=name)["Role"].get("Path", "/")
        except ClientError as e:
            if aws.error_code(e) != "NoSuchEntity":
                raise
            return False  # (create makes the role first: no profile is ever left without it)
        if not path.startswith(PATH_ROOT):  # a role of that name that no launcher made: not ours to delete
            return False
        gone(lambda: iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name))
        gone(lambda: iam.delete_instance_profile(InstanceProfileName=name))
        gone(lambda: iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME))
        for attached in iam.list_attached_role_policies(RoleName=name).get("AttachedPolicies", []):
            arn = str(attached["PolicyArn"])
            gone(lambda: iam.detach_role_policy(RoleName=name, PolicyArn=arn))  # noqa: B023 -- called at once
        gone(lambda: iam.delete_role(RoleName=name))
    return True


def retire_all(stack: str) -> list[str]:
    """Delete every job role (and instance profile) under `stack`'s path; -> their names."""
    iam = aws.client("iam")
    path = role_path(stack)
    with aws.translate_errors():
        roles = [
            r["RoleName"] for page in iam.get_paginator("list_roles").paginate(PathPrefix=path) for r in page["Roles"]
        ]
        profiles = [
            p["InstanceProfileName"]
            for page in iam.get_paginator("list_instance_profiles").paginate(PathPrefix=path)
            for p in page["InstanceProfiles"]
            if not p.get("Roles")
        ]
    for name in roles:
        retire(name)
    with aws.translate_errors():
        for name in profiles:  # emptied by hand, or by a retire cut short
            iam.delete_instance_profile(InstanceProfileName=name)
    return roles


def retry_while_propagating(call: Callable[[], T], is_propagation: Callable[[Exception], bool]) -> T:
    """`call()`, again every PROPAGATION_POLL_S while it fails with an error `is_propagation`
    says comes from a role IAM made moments ago, for at most PROPAGATION_S."""
    until = time.monotonic() + PROPAGATION_S
    while True:
        try:
            return call()
        except Exception as e:
            if not is_propagation(e) or time.monotonic() >= until:
                raise
        time.sleep(PROPAGATION_POLL_S)


def _snake(operation: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()
