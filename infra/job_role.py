"""One IAM role per job: what a job's own code may reach, and nothing of any other job's.

Code inside a job (a `trust_remote_code` model, a dependency, a data set loader) holds the job's
credentials. A role shared by every job cannot tell jobs apart (IAM sees the instance, and
nothing maps an instance to its job), so the launcher makes a role for each job at submit whose
inline policy names that job's S3 prefixes and its instance tag as literals:

- read-write `<prefix>/jobs/<job>/` and the lineage's `<prefix>/checkpoints/<lineage>/`;
- read-only its own code bundle `<prefix>/code/<sha256>.tar.gz` and a SageMaker job's input
  channels, each on a `/` boundary (the key itself and `key/...`, never `key-other`);
- an EC2 job: its own log streams, terminate and tag (its status only) the instances tagged with
  its job name, DescribeInstances; a spot lineage: leave its own Auto Scaling group, set its
  desired capacity (never past the MaxSize the launcher set) or suspend its processes, and with
  `--on-demand-after` change the group's instances distribution, nothing else of the group;
- a SageMaker job: SageMaker's own log group, metrics and image pulls;
- exactly the secrets and parameters its `--secret` references name (none without).

Names go into the documents as literals: `*`, `?` and `$` in a key or a name are written as IAM's
`${*}`, `${?}`, `${$}` (IAM User Guide, "IAM policy elements: Variables and tags", "Special
characters"), so no name can widen a grant into a wildcard.

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
# The request parameters of UpdateAutoScalingGroup that IAM can see (Service Authorization
# Reference, "Condition keys for Amazon EC2 Auto Scaling"): a node's one group change (the
# on-demand fallback) names none of them, so it may not either. DesiredCapacity, the instances
# distribution and a few more have no key: docs/security.md lists what that leaves.
GROUP_SHAPE_KEYS = (
    "autoscaling:MinSize",
    "autoscaling:MaxSize",
    "autoscaling:VPCZoneIdentifiers",
    "autoscaling:LaunchConfigurationName",
    "autoscaling:LaunchTemplateVersionSpecified",
    "autoscaling:InstanceTypes",
    "autoscaling:CapacityReservationIds",
)

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
    region: str = ""  # a SageMaker job's trust names its region's training jobs

    @property
    def arn(self) -> str:
        return f"arn:{self.partition}:iam::{self.account}:role{self.path}{self.name}"

    @property
    def instance_profile(self) -> str | None:
        """An EC2 job's instance profile name (the role's); SageMaker jobs pass the role itself."""
        return self.name if self.kind == "ec2" else None

    @property
    def trust(self) -> dict[str, Any]:
        """Who may assume it: the job's own service. SageMaker says which account and training job
        it acts for, so the role trusts SageMaker only for this account's training jobs (IAM User
        Guide, "The confused deputy problem"; SageMaker Developer Guide, "Cross-service confused
        deputy prevention"). EC2 documents no such key for an instance profile's role, and an
        instance profile cannot be attached in another account: its trust names the service only."""
        statement: dict[str, Any] = {
            "Effect": "Allow",
            "Principal": {"Service": SERVICES[self.kind]},
            "Action": "sts:AssumeRole",
        }
        if self.kind == "sagemaker":
            statement["Condition"] = {
                "StringEquals": {"aws:SourceAccount": self.account},
                "ArnLike": {
                    "aws:SourceArn": f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:training-job/*"
                },
            }
        return {"Version": "2012-10-17", "Statement": [statement]}

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


def literal(text: str) -> str:
    """`text` as a literal in a policy's Resource or string condition: IAM reads `*` and `?` as
    wildcards and `${...}` as a variable there; `${*}`, `${?}` and `${$}` are the characters."""
    return re.sub(r"[$*?]", lambda m: "${" + m.group() + "}", text)


def input_key(place: Place, uri: str) -> str | None:
    """The key of input `uri` in the stack's bucket, without a trailing `/`; None for another bucket."""
    if not uri.startswith(f"s3://{place.bucket}/") and uri != f"s3://{place.bucket}":
        return None
    key = uri.removeprefix(f"s3://{place.bucket}").strip("/")
    if not key:
        raise UserError(
            f"--input {uri}: the stack's whole bucket holds every job's code, data and outputs; "
            f"name a folder of it (s3://{place.bucket}/data/...)"
        )
    return key


def _s3_statements(place: Place, code_key: str, inputs: Iterable[str]) -> list[dict[str, Any]]:
    bucket = f"arn:{place.partition}:s3:::{place.bucket}"
    job_root = literal(place.key("jobs", place.job))
    lineage_root = literal(place.key("checkpoints", place.lineage))
    read_write = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    # Its own bundle only (content-addressed: another job's code is another key). SageMaker's code
    # channel lists the key as its prefix, so the listing grant names it too.
    listed = [f"{job_root}/*", f"{lineage_root}/*", literal(code_key)]
    read_only = [f"{bucket}/{literal(code_key)}"]
    # A SageMaker job's input channels in the stack's bucket, on a `/` boundary: `.../jobs/gpt2`
    # reaches the object `jobs/gpt2` and everything under `jobs/gpt2/`, never `jobs/gpt2-other/`.
    keys = sorted({k for k in (input_key(place, u) for u in inputs) if k is not None})
    for key in keys:
        listed += [literal(key), f"{literal(key)}/*"]
        read_only += [f"{bucket}/{literal(key)}", f"{bucket}/{literal(key)}/*"]
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


def secret_resources(place: Place, references: Iterable[str]) -> tuple[list[str], list[str]]:
    """(Secrets Manager ARNs, SSM parameter ARNs) that `references` (`--secret` values) name.

    A secret's ARN ends in `-` and six random characters that a reference by name or by partial
    ARN does not carry: those get `-??????` (Secrets Manager User Guide, "Permissions policy
    examples"). A full ARN is granted as written, and with `-??????` too, because a name may end in
    `-` and six characters itself and nothing tells the two apart."""
    from .secret_env import parse_reference

    secrets: set[str] = set()
    parameters: set[str] = set()
    for reference in references:
        service, ident, _ = parse_reference(reference)
        if service == "ssm":
            parameters.add(
                literal(reference)
                if reference.startswith("arn:")
                else place.arn("ssm", f"parameter/{literal(ident.lstrip('/'))}")
            )
        elif ident.startswith("arn:"):
            secrets |= {literal(ident), literal(ident) + "-??????"}
        else:
            secrets.add(place.arn("secretsmanager", f"secret:{literal(ident)}-??????"))
    return sorted(secrets), sorted(parameters)


def secrets_beyond_boundary(
    references: Iterable[str], *, partition: str, region: str, account: str, secret_prefix: str
) -> list[str]:
    """The references (`--secret` values) that the stack's JobBoundary refuses whatever the job's
    policy says: it allows secrets `secret:<SecretPrefix>*` and parameters `parameter/<SecretPrefix>*`
    of the stack's own region and account only (infra/stack.yaml)."""
    from .secret_env import parse_reference

    place = Place(partition, region, account, "", "", "", "", "")
    secrets_root = place.arn("secretsmanager", f"secret:{secret_prefix}")
    parameters_root = place.arn("ssm", f"parameter/{secret_prefix}")
    beyond = []
    for reference in references:
        service, ident, _ = parse_reference(reference)
        if service == "ssm":
            arn = reference if reference.startswith("arn:") else place.arn("ssm", f"parameter/{ident.lstrip('/')}")
            root = parameters_root
        else:
            arn = ident if ident.startswith("arn:") else place.arn("secretsmanager", f"secret:{ident}")
            root = secrets_root
        if not arn.startswith(root):
            beyond.append(reference)
    return beyond


def _secret_statements(place: Place, references: Iterable[str]) -> list[dict[str, Any]]:
    secrets, parameters = secret_resources(place, references)
    statements: list[dict[str, Any]] = []
    if secrets:
        statements.append(
            {"Sid": "NamedSecrets", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": secrets}
        )
    if parameters:
        statements.append(
            {
                "Sid": "NamedParameters",
                "Effect": "Allow",
                "Action": ["ssm:GetParameter", "ssm:GetParameters"],
                "Resource": parameters,
            }
        )
    return statements


def own_instances_condition(place: Place) -> dict[str, str]:
    """The tags that make an instance this job's (both: a job name is unique within a stack)."""
    return {f"aws:ResourceTag/{STACK_TAG}": place.stack, f"aws:ResourceTag/{JOB_TAG}": place.job}


def _group_statements(place: Place, *, on_demand_fallback: bool) -> list[dict[str, Any]]:
    """A spot lineage's nodes (launcher/backends/ec2/agent/elastic.py) and its group (recovery.py)."""
    group = place.arn("autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{literal(place.job)}")
    statements: list[dict[str, Any]] = [
        # A node leaves the group at the lineage's end, lowering its desired capacity, or the lineage
        # empties it: AWS refuses a desired capacity above the MaxSize the launcher set (--nodes). At
        # the end the nodes also suspend the group's launches (SuspendProcesses; never ResumeProcesses).
        {
            "Sid": "LeaveOwnGroup",
            "Effect": "Allow",
            "Action": [
                "autoscaling:TerminateInstanceInAutoScalingGroup",
                "autoscaling:SetDesiredCapacity",
                "autoscaling:SuspendProcesses",
            ],
            "Resource": group,
            "Condition": {"StringEquals": own_instances_condition(place)},
        }
    ]
    if on_demand_fallback:
        # --on-demand-after: one UpdateAutoScalingGroup naming only the instances distribution. Every
        # request parameter IAM can see must be absent: no size, subnets, template or types.
        statements.append(
            {
                "Sid": "OwnGroupOnDemand",
                "Effect": "Allow",
                "Action": "autoscaling:UpdateAutoScalingGroup",
                "Resource": group,
                "Condition": {
                    "StringEquals": own_instances_condition(place),
                    "Null": {key: "true" for key in GROUP_SHAPE_KEYS},
                },
            }
        )
    return statements


def ec2_policy(
    place: Place,
    *,
    log_group: str,
    code_key: str,
    secrets: Iterable[str] = (),
    group: bool = False,
    on_demand_fallback: bool = False,
) -> dict[str, Any]:
    """The inline policy of an EC2 job's role (`group`: a spot lineage's, with its Auto Scaling group)."""
    log_group_arn = place.arn("logs", f"log-group:{log_group}")
    instances = place.arn("ec2", "instance/*")
    statements = _s3_statements(place, code_key, ())
    statements += [
        # The node agent names its streams <job>/node-<rank>.
        {
            "Sid": "OwnLogStreams",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [log_group_arn, f"{log_group_arn}:log-stream:{literal(place.job)}/*"],
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
    ]
    if group:
        statements += _group_statements(place, on_demand_fallback=on_demand_fallback)
    return {"Version": "2012-10-17", "Statement": statements + _secret_statements(place, secrets)}


def sagemaker_policy(
    place: Place, *, code_key: str, inputs: Iterable[str] = (), secrets: Iterable[str] = ()
) -> dict[str, Any]:
    """The inline policy of a SageMaker job's role. SageMaker itself uses it too: it reads the code
    and input channels, syncs the checkpoints and writes the output under jobs/<job>/."""
    log_group = place.arn("logs", f"log-group:{SAGEMAKER_LOG_GROUP}")
    statements = _s3_statements(place, code_key, inputs)
    statements += [
        {
            "Sid": "TrainingLogs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [log_group, f"{log_group}:log-stream:{literal(place.job)}/*"],
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
    return {"Version": "2012-10-17", "Statement": statements + _secret_statements(place, secrets)}


def for_job(
    kind: str,
    place: Place,
    *,
    boundary_arn: str,
    code_key: str,
    log_group: str = "",
    secrets: Iterable[str] = (),
    inputs: Iterable[str] = (),
    ssm: bool = False,
    group: bool = False,
    on_demand_fallback: bool = False,
) -> JobRole:
    """The role of job `place.job` of kind "ec2" or "sagemaker" (pure). `code_key`: its bundle's
    key; `secrets`: its `--secret` references; `group`/`on_demand_fallback`: an EC2 spot lineage's
    Auto Scaling group, and whether its nodes may switch it to on-demand."""
    secrets = tuple(secrets)
    if kind == "ec2":
        policy = ec2_policy(
            place,
            log_group=log_group,
            code_key=code_key,
            secrets=secrets,
            group=group,
            on_demand_fallback=on_demand_fallback,
        )
    else:
        policy = sagemaker_policy(place, code_key=code_key, inputs=inputs, secrets=secrets)
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
        region=place.region,
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
    code_key: str,
    log_group: str = "",
    secrets: Iterable[str] = (),
    inputs: Iterable[str] = (),
    ssm: bool = False,
    group: bool = False,
    on_demand_fallback: bool = False,
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
        code_key=code_key,
        log_group=log_group,
        secrets=secrets,
        inputs=inputs,
        ssm=ssm,
        group=group,
        on_demand_fallback=on_demand_fallback,
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
