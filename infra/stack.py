"""The distrain-cloud CloudFormation stack (infra/stack.yaml): plan, deploy, inspect, delete.

Plan, then act: `plan_up` creates a change set and returns its changes without executing it;
`execute` runs it; `discard` deletes it. `plan_down` says what `down` would do (and refuses
while stack instances run). `resources` is what the backends call to find the bucket, the job
role boundary and security group: by logical id, because stacks created through a change set have no
Outputs under moto, and describe_stack_resources answers the same on AWS.

boto3 is reached only through `infra.aws` (clients per call, errors as one-line UserErrors).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import DEFAULT_STACK, aws
from .errors import UserError

# The tag every EC2 instance launched for a stack must carry (Key=STACK_TAG, Value=stack name):
# job role boundaries and the launcher policy allow terminating only instances with it, and
# `infra down` refuses while any such instance is alive.
STACK_TAG = "distrain-cloud:stack"
TEMPLATE_PATH = Path(__file__).with_name("stack.yaml")
CAPABILITIES = ["CAPABILITY_IAM"]  # the template names no IAM resource, so not CAPABILITY_NAMED_IAM
DEFAULT_SECRET_PREFIX = "distrain-cloud/"  # stack.yaml's SecretPrefix default

# Logical ids in stack.yaml that `resources` reads.
BUCKET = "Bucket"
JOB_BOUNDARY = "JobBoundary"
SECURITY_GROUP = "NodeSecurityGroup"
LOG_GROUP = "LogGroup"
LAUNCHER_POLICY = "LauncherPolicy"

# Instances in these states still hold the security group and the instance profile.
ALIVE_STATES = ("pending", "running", "stopping", "stopped")

# Stack states whose resources exist and can be used (an update in flight keeps them).
_USABLE = {
    "CREATE_COMPLETE",
    "UPDATE_COMPLETE",
    "UPDATE_ROLLBACK_COMPLETE",
    "IMPORT_COMPLETE",
    "IMPORT_ROLLBACK_COMPLETE",
    "UPDATE_IN_PROGRESS",
    "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
    "UPDATE_ROLLBACK_IN_PROGRESS",
    "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS",
}
_UPDATABLE = {
    "CREATE_COMPLETE",
    "UPDATE_COMPLETE",
    "UPDATE_ROLLBACK_COMPLETE",
    "IMPORT_COMPLETE",
    "IMPORT_ROLLBACK_COMPLETE",
}
# How to get out of each failed state.
_DOWN_THEN_UP = "run `distrain-cloud infra down{flags}`, fix the cause, then `distrain-cloud infra up{flags}`"
_REMEDY = {
    "ROLLBACK_COMPLETE": _DOWN_THEN_UP,
    "ROLLBACK_FAILED": _DOWN_THEN_UP,
    "CREATE_FAILED": _DOWN_THEN_UP,
    "DELETE_FAILED": "remove what blocks the deletion, then run `distrain-cloud infra down{flags}` again",
    "UPDATE_ROLLBACK_FAILED": "run `aws cloudformation continue-update-rollback --stack-name {name}`, then retry",
    "UPDATE_FAILED": "wait for the rollback to finish, fix the cause, then rerun `distrain-cloud infra up{flags}`",
    "IMPORT_ROLLBACK_FAILED": "run `aws cloudformation continue-update-rollback --stack-name {name}`, then retry",
}
_NO_CHANGES = ("didn't contain changes", "No updates are to be performed")
_VPC_ID = re.compile(r"vpc-[0-9a-f]{8,17}")
_CHANGE_SET_WAIT = {"Delay": 3, "MaxAttempts": 200}  # a change set takes seconds to a minute
_STACK_WAIT = {"Delay": 10, "MaxAttempts": 360}  # an hour; IAM and buckets take minutes at most
_INSTANCE_WAIT = {"Delay": 5, "MaxAttempts": 120}


@dataclass(frozen=True)
class Change:
    """One resource change of a change set."""

    action: str  # Add, Modify, Remove, Import, Dynamic
    logical_id: str
    resource_type: str
    replacement: str = ""  # for Modify: True, False or Conditional (CloudFormation's words)
    physical_id: str = ""


@dataclass(frozen=True)
class ChangePlan:
    """What `infra up` would change: a change set not yet executed, or nothing (up to date)."""

    stack: str
    region: str
    change_type: str  # CREATE or UPDATE
    change_set: str | None  # the change set's ARN; None when the stack is up to date
    changes: tuple[Change, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)  # what was passed; "(previous)" for kept values

    @property
    def up_to_date(self) -> bool:
        return self.change_set is None


@dataclass(frozen=True)
class StackResources:
    """The physical resources of a deployed stack, as the backends use them."""

    stack: str
    region: str
    bucket: str
    job_boundary_arn: str  # the permissions boundary of every job role (infra/job_role.py)
    security_group_id: str
    log_group: str
    launcher_policy_arn: str
    account: str = "000000000000"
    partition: str = "aws"
    secret_prefix: str = DEFAULT_SECRET_PREFIX  # the SecretPrefix parameter: what job roles may read
    ssm: bool = False  # EnableSsm: job roles of EC2 jobs get Session Manager's managed policy


@dataclass(frozen=True)
class DownPlan:
    """What `infra down` would do."""

    stack: str
    region: str
    status: str
    bucket: str | None  # kept after deletion
    instances: tuple[dict[str, str], ...]  # alive instances tagged with the stack (terminated first)
    resources: int
    job_roles: tuple[str, ...] = ()  # job roles `down` deleted (under the stack's IAM path)
    leftovers: Leftovers = field(default_factory=lambda: Leftovers())  # what jobs left: ended first with --force


@dataclass(frozen=True)
class Leftovers:
    """What jobs of a stack leave outside it while they live (or when their clean-up never ran):
    found by the stack tag (the job roles by the stack's IAM path). `infra down` refuses while any
    is there, or with --force ends them before it deletes the stack."""

    groups: tuple[str, ...] = ()  # Auto Scaling groups of spot lineages
    templates: tuple[str, ...] = ()  # their launch templates, by name
    roles: tuple[str, ...] = ()  # job roles (each with its instance profile)
    security_groups: tuple[str, ...] = ()  # the jobs' own security groups, by id
    placement_groups: tuple[str, ...] = ()  # multi-node jobs' own cluster placement groups, by name

    def __bool__(self) -> bool:
        return bool(self.groups or self.templates or self.roles or self.security_groups or self.placement_groups)

    def words(self) -> list[str]:
        """One phrase per kind there is, naming at most five of each."""
        kinds = (
            ("Auto Scaling group(s)", self.groups),
            ("launch template(s)", self.templates),
            ("job role(s)", self.roles),
            ("job security group(s)", self.security_groups),
            ("placement group(s)", self.placement_groups),
        )
        return [f"{len(names)} {kind} ({_some(names)})" for kind, names in kinds if names]


def _some(names: Iterable[str], most: int = 5) -> str:
    names = list(names)
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


# --- the template --------------------------------------------------------------------------


def template_body() -> str:
    return TEMPLATE_PATH.read_text()


def load_template(text: str | None = None) -> dict[str, Any]:
    """The template as a dict, short-form intrinsics (`!Ref X`, `!GetAtt A.B`, `!Sub`, ...) turned
    into their long forms ({"Ref": "X"}, {"Fn::GetAtt": ["A", "B"]}, ...)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        if suffix == "Ref":
            return {"Ref": value}
        if suffix == "GetAtt" and isinstance(value, str):
            value = value.split(".", 1)
        return {f"Fn::{suffix}": value}

    Loader.add_multi_constructor("!", intrinsic)
    loaded: dict[str, Any] = yaml.load(template_body() if text is None else text, Loader=Loader)  # noqa: S506
    return loaded


def template_parameters() -> dict[str, dict[str, Any]]:
    parameters: dict[str, dict[str, Any]] = load_template()["Parameters"]
    return parameters


# --- reading the stack ------------------------------------------------------------------------


def _flags(name: str) -> str:
    return "" if name == DEFAULT_STACK else f" --stack {name}"


def _no_stack(name: str, region: str) -> UserError:
    return UserError(f"no distrain-cloud stack {name!r} in {region}: run `distrain-cloud infra up{_flags(name)}`")


def _describe(cf: Any, name: str) -> dict[str, Any] | None:
    """The stack's description, or None when there is none (deleted stacks are not listed by name)."""
    from botocore.exceptions import ClientError

    try:
        described: dict[str, Any] = cf.describe_stacks(StackName=name)["Stacks"][0]
        return described
    except ClientError as exc:
        if aws.error_code(exc) == "ValidationError" and "does not exist" in str(exc):
            return None
        raise


def _failure_reason(cf: Any, stack: Mapping[str, Any]) -> str:
    """The first failure of the stack's latest operation, as "LogicalId: reason" (or the
    stack's own status reason): events list newest first, back to the user-initiated start."""
    events = cf.describe_stack_events(StackName=stack["StackId"]).get("StackEvents", [])
    failures = []
    for event in events:
        if event.get("ResourceStatus", "").endswith("FAILED"):
            reason = event.get("ResourceStatusReason", "")
            if reason and "cancelled" not in reason.lower():
                failures.append(f"{event.get('LogicalResourceId', '?')}: {reason}")
        if (
            event.get("ResourceType") == "AWS::CloudFormation::Stack"
            and event.get("ResourceStatusReason") == "User Initiated"
        ):
            break
    if failures:
        return failures[-1]
    return str(stack.get("StackStatusReason") or "")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _broken(cf: Any, stack: Mapping[str, Any], region: str) -> UserError:
    name, state = stack["StackName"], stack["StackStatus"]
    reason = _one_line(_failure_reason(cf, stack))
    remedy = _REMEDY.get(state, "wait for it to settle, then retry").format(flags=_flags(name), name=name)
    return UserError(
        f"distrain-cloud stack {name!r} in {region} is {state}{f' ({reason})' if reason else ''}: {remedy}"
    )


def _busy(stack: Mapping[str, Any], region: str) -> UserError:
    return UserError(
        f"distrain-cloud stack {stack['StackName']!r} in {region} is {stack['StackStatus']}: "
        "wait until it finishes, then retry"
    )


def _stack_resources(cf: Any, name: str) -> dict[str, dict[str, Any]]:
    # moto lists the resources it cannot create without a logical id: skip those.
    listed = cf.describe_stack_resources(StackName=name).get("StackResources", [])
    return {r["LogicalResourceId"]: r for r in listed if r.get("LogicalResourceId")}


def resources(name: str = DEFAULT_STACK, region: str | None = None) -> StackResources:
    """The deployed stack's bucket, roles, instance profile, security group and log group.

    Raises UserError when there is no stack (saying to run `infra up`), when it is in a failed
    state (saying how to get out of it), or when it lacks a resource this code needs."""
    region = aws.region(region)
    with aws.translate_errors():
        cf = aws.client("cloudformation", region)
        stack = _describe(cf, name)
        if stack is None or stack["StackStatus"] == "REVIEW_IN_PROGRESS":  # a change set never executed
            raise _no_stack(name, region)
        if stack["StackStatus"] in _REMEDY:
            raise _broken(cf, stack, region)
        if stack["StackStatus"] not in _USABLE:
            raise _busy(stack, region)
        found = _stack_resources(cf, name)

    def physical(logical_id: str) -> str:
        resource = found.get(logical_id)
        if not resource or not resource.get("PhysicalResourceId"):
            raise UserError(
                f"distrain-cloud stack {name!r} in {region} has no {logical_id}: it was made from "
                f"another version of infra/stack.yaml; run `distrain-cloud infra up{_flags(name)}`"
            )
        return str(resource["PhysicalResourceId"])

    # Job roles' ARNs follow from the stack's own partition and account (no STS or IAM call).
    partition, account = stack["StackId"].split(":")[1], stack["StackId"].split(":")[4]
    parameters = {p.get("ParameterKey"): p.get("ParameterValue") for p in stack.get("Parameters", [])}
    return StackResources(
        stack=name,
        region=region,
        bucket=physical(BUCKET),
        job_boundary_arn=physical(JOB_BOUNDARY),
        security_group_id=physical(SECURITY_GROUP),
        log_group=physical(LOG_GROUP),
        launcher_policy_arn=physical(LAUNCHER_POLICY),
        account=account,
        partition=partition,
        secret_prefix=str(parameters.get("SecretPrefix") or DEFAULT_SECRET_PREFIX),
        ssm=parameters.get("EnableSsm") == "true",
    )


def tagged_instances(name: str, region: str) -> list[dict[str, str]]:
    """Instances tagged with the stack that still exist (pending, running, stopping, stopped)."""
    ec2 = aws.client("ec2", region)
    found = []
    with aws.translate_errors():
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{STACK_TAG}", "Values": [name]},
                {"Name": "instance-state-name", "Values": list(ALIVE_STATES)},
            ]
        )
        for page in pages:
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    launched = inst.get("LaunchTime")
                    found.append(
                        {
                            "id": inst["InstanceId"],
                            "state": inst["State"]["Name"],
                            "type": inst.get("InstanceType", ""),
                            "launched": launched.isoformat() if launched else "",
                            "name": tags.get("Name", ""),
                        }
                    )
    return found


def status(name: str = DEFAULT_STACK, region: str | None = None) -> dict[str, Any]:
    """The stack's state, its resources and the instances still alive under its tag.

    A failed stack is reported, not refused (this is where a user looks to find out why)."""
    region = aws.region(region)
    with aws.translate_errors():
        cf = aws.client("cloudformation", region)
        stack = _describe(cf, name)
        if stack is None:
            raise _no_stack(name, region)
        state = stack["StackStatus"]
        reason = _failure_reason(cf, stack) if state in _REMEDY or "ROLLBACK" in state else ""
        listed = _stack_resources(cf, name)
    info: dict[str, Any] = {
        "stack": name,
        "region": region,
        "status": state,
        "reason": _one_line(reason) if reason else "",
        "resources": [
            {
                "logical_id": r["LogicalResourceId"],
                "type": r.get("ResourceType", ""),
                "physical_id": r.get("PhysicalResourceId", ""),
                "status": r.get("ResourceStatus", ""),
            }
            for r in listed.values()
        ],
        "instances": tagged_instances(name, region),
    }
    if state in _REMEDY:
        info["next"] = _REMEDY[state].format(flags=_flags(name), name=name)
    return info


# --- infra up -------------------------------------------------------------------------------------


def default_vpc(region: str) -> str:
    with aws.translate_errors():
        vpcs = (
            aws.client("ec2", region)
            .describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])
            .get("Vpcs", [])
        )
    if not vpcs:
        raise UserError(
            f"no default VPC in {region}: pass --vpc-id with the VPC whose subnets EC2 training nodes will use"
        )
    return str(vpcs[0]["VpcId"])


def _check_overrides(overrides: Mapping[str, str]) -> None:
    known = template_parameters()
    for key in overrides:
        if key not in known:
            raise UserError(f"--parameter {key}: the stack has no such parameter; known: {', '.join(sorted(known))}")


def _change_set_name() -> str:
    return "distrain-cloud-" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")


def _changes(described: Mapping[str, Any]) -> tuple[Change, ...]:
    changes = []
    for item in described.get("Changes", []):
        rc = item.get("ResourceChange", {})
        changes.append(
            Change(
                action=rc.get("Action", ""),
                logical_id=rc.get("LogicalResourceId", ""),
                resource_type=rc.get("ResourceType", ""),
                replacement=rc.get("Replacement", "") or "",
                physical_id=rc.get("PhysicalResourceId", "") or "",
            )
        )
    return tuple(changes)


def plan_up(
    name: str = DEFAULT_STACK,
    region: str | None = None,
    vpc_id: str | None = None,
    parameters: Mapping[str, str] | None = None,
) -> ChangePlan:
    """Create a change set that brings stack `name` to this version of the template, wait for
    it and return its changes. Nothing is executed (see `execute` and `discard`).

    A new stack gets `vpc_id` or the region's default VPC; an existing one keeps its previous
    parameter values unless `vpc_id` / `parameters` say otherwise. When nothing would change,
    the empty change set is deleted and the plan is `up_to_date`."""
    from botocore.exceptions import ClientError, WaiterError

    region = aws.region(region)
    overrides = dict(parameters or {})
    _check_overrides(overrides)
    if vpc_id is not None:
        if not _VPC_ID.fullmatch(vpc_id):
            raise UserError(f"--vpc-id {vpc_id!r} is not a VPC id (vpc- and 8 or 17 hex digits)")
        overrides["VpcId"] = vpc_id
    with aws.translate_errors():
        cf = aws.client("cloudformation", region)
        stack = _describe(cf, name)
        state = stack["StackStatus"] if stack else None
        if stack is not None and state in _REMEDY:
            raise _broken(cf, stack, region)
        if stack is not None and state != "REVIEW_IN_PROGRESS" and state not in _UPDATABLE:
            raise _busy(stack, region)
        change_type = "UPDATE" if state in _UPDATABLE else "CREATE"
        shown: dict[str, str] = {}
        request: list[dict[str, Any]] = []
        if change_type == "CREATE":
            if "VpcId" not in overrides:
                overrides["VpcId"] = default_vpc(region)
            shown = dict(overrides)
            request = [{"ParameterKey": k, "ParameterValue": v} for k, v in overrides.items()]
        else:
            # Keep what the stack was deployed with (a user may have set EnableSsm once);
            # parameters new in this template take their defaults.
            previous = {p["ParameterKey"] for p in (stack or {}).get("Parameters", [])}
            for key in template_parameters():
                if key in overrides:
                    request.append({"ParameterKey": key, "ParameterValue": overrides[key]})
                    shown[key] = overrides[key]
                elif key in previous:
                    request.append({"ParameterKey": key, "UsePreviousValue": True})
                    shown[key] = "(previous)"
        try:
            created = cf.create_change_set(
                StackName=name,
                ChangeSetName=_change_set_name(),
                ChangeSetType=change_type,
                TemplateBody=template_body(),
                Parameters=request,
                Capabilities=CAPABILITIES,
                Description="distrain-cloud infra up",
            )
        except ClientError as exc:  # moto (and older CloudFormation) refuse an empty change set outright
            if any(text in str(exc) for text in _NO_CHANGES):
                return ChangePlan(name, region, change_type, None, (), shown)
            raise
        arn = created["Id"]
        try:
            cf.get_waiter("change_set_create_complete").wait(ChangeSetName=arn, WaiterConfig=_CHANGE_SET_WAIT)
        except WaiterError:
            pass  # FAILED is also how CloudFormation says "no changes": read the reason below
        described = cf.describe_change_set(ChangeSetName=arn)
        if described.get("Status") == "FAILED":
            reason = described.get("StatusReason", "")
            _discard(cf, name, arn, change_type)
            if any(text in reason for text in _NO_CHANGES):
                return ChangePlan(name, region, change_type, None, (), shown)
            raise UserError(f"CloudFormation could not plan stack {name!r} in {region}: {_one_line(reason)}")
        if described.get("Status") != "CREATE_COMPLETE":
            _discard(cf, name, arn, change_type)
            raise UserError(
                f"CloudFormation did not finish planning stack {name!r} in {region} "
                f"(change set {described.get('Status')}): retry later"
            )
    return ChangePlan(name, region, change_type, arn, _changes(described), shown)


def _discard(cf: Any, name: str, change_set: str, change_type: str) -> None:
    cf.delete_change_set(ChangeSetName=change_set)
    if change_type == "CREATE":
        # A CREATE change set leaves an empty stack in REVIEW_IN_PROGRESS; remove it too.
        stack = _describe(cf, name)
        if stack is not None and stack["StackStatus"] == "REVIEW_IN_PROGRESS":
            cf.delete_stack(StackName=stack["StackId"])


def discard(plan: ChangePlan) -> None:
    """Delete the plan's change set without executing it (and the empty stack a first plan made)."""
    if plan.change_set is None:
        return
    with aws.translate_errors():
        _discard(aws.client("cloudformation", plan.region), plan.stack, plan.change_set, plan.change_type)


def execute(plan: ChangePlan) -> str:
    """Execute the plan's change set and wait until the stack settles; returns its final status.

    Raises UserError with the first failure's reason (and how to get out) when it fails."""
    from botocore.exceptions import WaiterError

    if plan.change_set is None:
        raise UserError(f"stack {plan.stack!r} in {plan.region} is up to date: nothing to execute")
    waiter = "stack_create_complete" if plan.change_type == "CREATE" else "stack_update_complete"
    with aws.translate_errors():
        cf = aws.client("cloudformation", plan.region)
        cf.execute_change_set(ChangeSetName=plan.change_set)
        try:
            cf.get_waiter(waiter).wait(StackName=plan.stack, WaiterConfig=_STACK_WAIT)
        except WaiterError:
            stack = _describe(cf, plan.stack)
            if stack is None:
                raise UserError(f"stack {plan.stack!r} in {plan.region} was deleted while `infra up` ran") from None
            if stack["StackStatus"] == "UPDATE_ROLLBACK_COMPLETE":
                reason = _one_line(_failure_reason(cf, stack))
                raise UserError(
                    f"`infra up` failed and stack {plan.stack!r} was rolled back to its previous state "
                    f"(still usable): {reason}"
                ) from None
            if stack["StackStatus"] in _REMEDY:
                raise _broken(cf, stack, plan.region) from None
            raise _busy(stack, plan.region) from None
        settled = _describe(cf, plan.stack) or {"StackStatus": "DELETE_COMPLETE"}
        return str(settled["StackStatus"])


# --- infra down -----------------------------------------------------------------------------------


def plan_down(name: str = DEFAULT_STACK, region: str | None = None, force: bool = False) -> DownPlan:
    """What `down` would do. Refuses (UserError) when there is no stack, while it is busy, and
    while instances tagged with it are alive unless `force`."""
    region = aws.region(region)
    with aws.translate_errors():
        cf = aws.client("cloudformation", region)
        stack = _describe(cf, name)
        if stack is None:
            raise UserError(f"no distrain-cloud stack {name!r} in {region}: nothing to delete")
        state = stack["StackStatus"]
        if state.endswith("_IN_PROGRESS") and state not in ("REVIEW_IN_PROGRESS", "DELETE_IN_PROGRESS"):
            raise _busy(stack, region)
        listed = _stack_resources(cf, name)
    instances = tagged_instances(name, region)
    own_group = listed.get(SECURITY_GROUP, {}).get("PhysicalResourceId")
    left = leftovers(name, region, keep={own_group} if own_group else set())
    if (instances or left) and not force:
        ids = _some(i["id"] for i in instances)
        alive = [f"{len(instances)} instance(s) tagged {STACK_TAG}={name} are still alive in {region} ({ids})"]
        alive = alive if instances else []
        raise UserError(
            f"stack {name!r}: " + "; ".join(alive + left.words())
            + ": wait for their jobs to end (`distrain-cloud status JOB` retires an ended job's), "
            "or pass --force to end them first"
        )  # fmt: skip
    bucket = listed.get(BUCKET, {}).get("PhysicalResourceId")
    return DownPlan(name, region, state, bucket or None, tuple(instances), len(listed), leftovers=left)


def leftovers(name: str, region: str, keep: set[str] | None = None) -> Leftovers:
    """What jobs of stack `name` left in `region` (and IAM): groups and launch templates by the
    stack tag, job security groups by the stack tag and the job tag key (`keep`: the stack's own
    group, which carries the stack tag too), placement groups by the stack tag, job roles by the
    stack's IAM path."""
    from . import job_role

    tag = [{"Name": f"tag:{STACK_TAG}", "Values": [name]}]
    with aws.translate_errors():
        asg = aws.client("autoscaling", region)
        groups = [
            str(g["AutoScalingGroupName"])
            for page in asg.get_paginator("describe_auto_scaling_groups").paginate(Filters=tag)
            for g in page.get("AutoScalingGroups", [])
        ]
        ec2 = aws.client("ec2", region)
        templates = [
            str(t["LaunchTemplateName"])
            for page in ec2.get_paginator("describe_launch_templates").paginate(Filters=tag)
            for t in page.get("LaunchTemplates", [])
        ]
        job_groups = [{"Name": "tag-key", "Values": [job_role.JOB_TAG]}, *tag]
        security_groups = [
            str(g["GroupId"])
            for page in ec2.get_paginator("describe_security_groups").paginate(Filters=job_groups)
            for g in page.get("SecurityGroups", [])
            if g["GroupId"] not in (keep or set())
        ]
        # DescribePlacementGroups has no paginator: it answers every group of the region at once,
        # those being deleted or just deleted too (state deleting, deleted): not leftovers.
        live = [*tag, {"Name": "state", "Values": ["pending", "available"]}]
        placement_groups = [
            str(g["GroupName"]) for g in ec2.describe_placement_groups(Filters=live).get("PlacementGroups", [])
        ]
        iam = aws.client("iam")
        roles = [
            str(r["RoleName"])
            for page in iam.get_paginator("list_roles").paginate(PathPrefix=job_role.role_path(name))
            for r in page["Roles"]
        ]
    found = (groups, templates, roles, security_groups, placement_groups)
    return Leftovers(*(tuple(sorted(names)) for names in found))


def end_leftovers(left: Leftovers, name: str, region: str) -> None:
    """End what jobs left, in the order AWS accepts: the groups first (deleted with their
    instances: ForceDelete), so nothing launches again; every instance of the stack gone, since a
    security group in use by an instance cannot be deleted (DependencyViolation) and a template or
    role may still serve one, and a placement group holding an instance cannot be deleted either
    (InvalidPlacementGroup.InUse); then the launch templates, the job roles, the security groups
    and the placement groups."""
    from botocore.exceptions import ClientError

    from . import job_role

    with aws.translate_errors():
        asg = aws.client("autoscaling", region)
        for group in left.groups:
            try:
                asg.delete_auto_scaling_group(AutoScalingGroupName=group, ForceDelete=True)
            except ClientError as e:
                if "not found" not in aws.error_message(e).lower():
                    raise
        _wait_groups_gone(asg, left.groups)
    _terminate_all(name, region)
    with aws.translate_errors():
        ec2 = aws.client("ec2", region)
        for template in left.templates:
            missing = "InvalidLaunchTemplateName.NotFoundException"
            _delete(ec2.delete_launch_template, missing, LaunchTemplateName=template)
    job_role.retire_all(name)
    with aws.translate_errors():
        for group in left.security_groups:
            _delete_security_group(ec2, group)
        for placement in left.placement_groups:
            _delete(ec2.delete_placement_group, "InvalidPlacementGroup.Unknown", GroupName=placement)


def _delete(delete: Any, missing: str, **request: str) -> None:
    """A delete request that takes "no such thing" (the error code `missing`) as done: a job's own
    clean-up may have got there first."""
    from botocore.exceptions import ClientError

    try:
        delete(**request)
    except ClientError as e:
        if aws.error_code(e) != missing:
            raise


_GROUP_GONE_S = 600  # a group's deletion waits for its instances to terminate: minutes
_DEPENDENCY_S = 300  # a terminated instance's network interface is released within minutes


def _wait_groups_gone(asg: Any, groups: Iterable[str]) -> None:
    import time

    names = list(groups)
    until = time.monotonic() + _GROUP_GONE_S
    while names:
        found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=names)["AutoScalingGroups"]
        names = [str(g["AutoScalingGroupName"]) for g in found]
        if not names:
            return
        if time.monotonic() > until:
            raise UserError(
                f"the Auto Scaling group(s) {_some(names)} are still being deleted: "
                "run `distrain-cloud infra down --force` again"
            )
        time.sleep(10)


def _terminate_all(name: str, region: str) -> None:
    """Terminate every instance tagged with the stack and wait until each is terminated (those
    shutting down too: they still hold their security group)."""
    ec2 = aws.client("ec2", region)
    with aws.translate_errors():
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{STACK_TAG}", "Values": [name]},
                {"Name": "instance-state-name", "Values": [*ALIVE_STATES, "shutting-down"]},
            ]
        )
        ids = [i["InstanceId"] for page in pages for r in page.get("Reservations", []) for i in r.get("Instances", [])]
    terminate(ids, region)


def _delete_security_group(ec2: Any, group: str) -> None:
    """Delete `group`, again while AWS still says an interface uses it (a terminated instance's
    interface goes a little after the instance), for at most _DEPENDENCY_S."""
    import time

    from botocore.exceptions import ClientError

    until = time.monotonic() + _DEPENDENCY_S
    while True:
        try:
            ec2.delete_security_group(GroupId=group)
            return
        except ClientError as e:
            code = aws.error_code(e)
            if code == "InvalidGroup.NotFound":
                return
            if code != "DependencyViolation" or time.monotonic() > until:
                raise
        time.sleep(10)


def terminate(instance_ids: Iterable[str], region: str) -> None:
    """Terminate instances and wait until they are gone (they hold the security group)."""
    ids = list(instance_ids)
    if not ids:
        return
    with aws.translate_errors():
        ec2 = aws.client("ec2", region)
        ec2.terminate_instances(InstanceIds=ids)
        ec2.get_waiter("instance_terminated").wait(InstanceIds=ids, WaiterConfig=_INSTANCE_WAIT)


def down(name: str = DEFAULT_STACK, region: str | None = None, force: bool = False) -> DownPlan:
    """Delete the stack and wait until it is gone; returns what was done. With `force`, alive
    instances tagged with the stack are terminated first; without, their presence refuses.
    Job roles left under the stack's IAM path go first (the boundary cannot be deleted while
    roles use it). The bucket is retained (DeletionPolicy: Retain): it outlives the stack with its data."""
    from botocore.exceptions import WaiterError

    from . import job_role

    plan = plan_down(name, region, force)
    if plan.leftovers:  # only with force: without, plan_down refused
        end_leftovers(plan.leftovers, name, plan.region)
    terminate([i["id"] for i in plan.instances], plan.region)
    plan = dataclasses.replace(plan, job_roles=tuple(sorted({*plan.leftovers.roles, *job_role.retire_all(name)})))
    with aws.translate_errors():
        cf = aws.client("cloudformation", plan.region)
        stack = _describe(cf, name)
        if stack is None:
            return plan
        cf.delete_stack(StackName=stack["StackId"])
        try:
            cf.get_waiter("stack_delete_complete").wait(StackName=stack["StackId"], WaiterConfig=_STACK_WAIT)
        except WaiterError:
            raise _broken(cf, cf.describe_stacks(StackName=stack["StackId"])["Stacks"][0], plan.region) from None
    return plan
