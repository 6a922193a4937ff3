"""An EC2 job's own network: its security group, its cluster placement group, the zone it runs
in and the EFA interfaces it gets, planned here (pure) and made and retired beside the job.

- Security group: one per job, made at submit, admitting only its own members (all traffic to
  and from the group itself, which EFA needs) and letting nodes out on HTTPS only (S3, the AWS
  APIs, the Hugging Face Hub, pip). No inbound port is open to anything else, so one job's code
  cannot reach another job's rendezvous port or collectives. Tagged with the stack and job tags
  (`infra down` finds what a job left by them), deleted once the job ended and none of its
  instances still holds it (EC2 refuses with DependencyViolation until then: the next look
  tries again).
- Placement group: a multi-node job's own cluster placement group (named after the job), made at
  submit and deleted with the job like its security group. moto does not implement placement
  groups (tests play them: tests/launcher/backends/ec2/test_network.py).
- EFA: one interface per network card (launcher/backends/ec2/request.py renders them).

docs/ec2.md says what a user gets, docs/security.md why jobs are apart, docs/decisions.md why so.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.stack import STACK_TAG

from .request import GROUP_PLACEHOLDER, TAG_PREFIX, payload_of

if TYPE_CHECKING:
    from ...catalog import NetworkFacts
    from ...plan import Plan

HTTPS = 443
# Which flag or spec key sets each part of the requests, so a refusal names what the user wrote.
SOURCES = (("GroupName", "--name"), ("TagSpecifications", "--name / --stack"), ("VpcId", "ec2.subnet_id / --stack"))


# ---------------------------------------------------------------------- plan (pure)


def tags(stack: str, job: str) -> list[dict[str, str]]:
    """The tags every resource of a job carries (request.py's instance tags begin so too)."""
    return [{"Key": STACK_TAG, "Value": stack}, {"Key": f"{TAG_PREFIX}job", "Value": job}]


def group_name(job: str) -> str:
    """The job's security group name (unique in its VPC as the job name is; never `sg-...`)."""
    return f"distrain-cloud-{job}"


def security_group_requests(job: str, stack: str, vpc: str, group: str = GROUP_PLACEHOLDER) -> dict[str, Any]:
    """The requests that make the job's security group `group` (its id, once AWS named it).

    A new VPC security group comes with one egress rule, all traffic to anywhere; it is replaced by
    all traffic to the group's members (EFA needs it: EC2 User Guide, "Get started with EFA and
    NCCL", step 1) and HTTPS to anywhere (S3 and the AWS APIs, the Hub, pip). Security groups do
    not filter traffic to the VPC's DNS resolver, the instance metadata service or the Amazon Time
    Sync Service (Amazon VPC User Guide, "Security groups", "Security group basics"), so nothing
    else is needed to boot."""
    members = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group, "Description": "this job's nodes"}]}
    https = {
        "IpProtocol": "tcp",
        "FromPort": HTTPS,
        "ToPort": HTTPS,
        "IpRanges": [{"CidrIp": "0.0.0.0/0", "Description": "S3, AWS APIs, packages (HTTPS)"}],
        "Ipv6Ranges": [{"CidrIpv6": "::/0", "Description": "S3, AWS APIs, packages (HTTPS)"}],
    }
    return {
        "CreateSecurityGroup": {
            "GroupName": group_name(job),
            "Description": f"distrain-cloud job {job}: admits only its own nodes",
            "VpcId": vpc,
            "TagSpecifications": [{"ResourceType": "security-group", "Tags": tags(stack, job)}],
        },
        "AuthorizeSecurityGroupIngress": {"GroupId": group, "IpPermissions": [members]},
        "AuthorizeSecurityGroupEgress": {"GroupId": group, "IpPermissions": [members, https]},
        "RevokeSecurityGroupEgress": {
            "GroupId": group,
            "IpPermissions": [{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}],
        },
    }


def placement_group_request(name: str, job: str, stack: str) -> dict[str, Any]:
    """Job `job`'s own cluster placement group `name`: its nodes in one zone, close together (EC2
    User Guide, "Placement strategies": cluster)."""
    return {
        "GroupName": name,
        "Strategy": "cluster",
        "TagSpecifications": [{"ResourceType": "placement-group", "Tags": tags(stack, job)}],
    }


def requests(job: str, stack: str, vpc: str, placement_group: str | None) -> dict[str, Any]:
    """Every request that makes the job's network, as the plan shows them."""
    found = security_group_requests(job, stack, vpc)
    if placement_group:
        found["CreatePlacementGroup"] = placement_group_request(placement_group, job, stack)
    return found


def refuse_problems(found: dict[str, Any]) -> None:
    """Every request of the job's network checked against the EC2 API model."""
    from .. import cloud

    for operation, request in found.items():
        cloud.refuse_api_problems("ec2", operation, request, SOURCES, "EC2")


def bandwidth(nodes: int, facts: NetworkFacts, interfaces: int, public_ip: bool) -> str:
    """The plan's words for the network between the job's nodes."""
    if nodes == 1:
        return f"one node: no traffic between nodes (the type: {facts.performance})"
    if not interfaces:
        return f"TCP over ENA, the type's {facts.performance}; one zone, no EFA"
    gbps = f", {_gbps(facts, interfaces):g} Gbps baseline between nodes" if facts.card_gbps else ""
    most = min(facts.cards, facts.efa_interfaces)
    if interfaces == most:
        return f"{interfaces} EFA interface(s), one per network card{gbps}; the type: {facts.performance}"
    return (
        f"1 EFA interface, on network card 0 of {most}{gbps}; the type: {facts.performance}. The subnet gives "
        "public IPv4 addresses, which EC2 assigns only to instances launched with one network interface: for "
        f"all {most} cards set ec2.subnet_id to a private subnet (a NAT gateway or VPC endpoints for S3 and "
        "the AWS APIs)"
    )


def _gbps(facts: NetworkFacts, interfaces: int) -> float:
    """Baseline bandwidth of `interfaces` cards, at most the whole type's NetworkPerformance where
    that is a plain figure ("400 Gigabit", "4x 100 Gigabit")."""
    import re

    total = (facts.card_gbps or 0.0) * interfaces
    m = re.fullmatch(r"(?:(\d+)x )?(\d+) Gigabit", facts.performance)
    if m:
        total = min(total, float(int(m.group(1) or 1) * int(m.group(2))))
    return total


def facts_from_api(info: dict[str, Any]) -> NetworkFacts:
    """NetworkFacts from DescribeInstanceTypes' NetworkInfo of one type."""
    from ...catalog import NetworkFacts

    cards = info.get("NetworkCards") or [{}]
    gbps = cards[0].get("BaselineBandwidthInGbps")
    return NetworkFacts(
        cards=int(info.get("MaximumNetworkCards") or 1),
        efa_interfaces=int((info.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0)
        if info.get("EfaSupported")
        else 0,
        card_gbps=float(gbps) if gbps else None,
        performance=str(info.get("NetworkPerformance") or "?"),
    )


def with_group(plan: Plan, group: str) -> Plan:
    """`plan` with its job's security group id (named by AWS at submit) in place of the
    placeholder, in every request that names it."""
    found = payload_of(plan)
    payload = dataclasses.replace(
        found,
        where=dataclasses.replace(found.where, security_group=group),
        network=_put(found.network, group),
        recovery=_put(found.recovery, group) if found.recovery is not None else None,
    )
    return dataclasses.replace(plan, request=_put(plan.request, group), payload=payload)


def _put(value: Any, group: str) -> Any:
    """`value` with security group id `group` wherever it holds the placeholder."""
    if isinstance(value, dict):
        return {k: _put(v, group) for k, v in value.items()}
    if isinstance(value, list):
        return [_put(v, group) for v in value]
    return group if value == GROUP_PLACEHOLDER else value


# ---------------------------------------------------------------------- submit and clean-up


def create(plan: Plan) -> str:
    """Make the job's security group (with its rules) and placement group; -> the group's id.
    A retried submit of the same plan finds its group and group rules already there."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    payload = payload_of(plan)
    found = payload.network
    with aws.translate_errors():
        ec2 = aws.client("ec2", payload.parts.region)
        try:
            group = str(ec2.create_security_group(**found["CreateSecurityGroup"])["GroupId"])
        except ClientError as e:
            if aws.error_code(e) != "InvalidGroup.Duplicate":
                raise
            group = _find_group(ec2, found["CreateSecurityGroup"])
        rules = _put(found, group)
        for send, operation in (
            (ec2.authorize_security_group_ingress, "AuthorizeSecurityGroupIngress"),
            (ec2.authorize_security_group_egress, "AuthorizeSecurityGroupEgress"),
            (ec2.revoke_security_group_egress, "RevokeSecurityGroupEgress"),
        ):
            try:
                send(**rules[operation])
            except ClientError as e:  # a retried submit: the rule is there already, or gone already
                if aws.error_code(e) not in ("InvalidPermission.Duplicate", "InvalidPermission.NotFound"):
                    raise
        if "CreatePlacementGroup" in found:
            try:
                ec2.create_placement_group(**found["CreatePlacementGroup"])
            except ClientError as e:
                if aws.error_code(e) != "InvalidPlacementGroup.Duplicate":
                    raise
    return group


def _find_group(ec2: Any, create: dict[str, Any]) -> str:
    filters = [
        {"Name": "group-name", "Values": [create["GroupName"]]},
        {"Name": "vpc-id", "Values": [create["VpcId"]]},
    ]
    return str(ec2.describe_security_groups(Filters=filters)["SecurityGroups"][0]["GroupId"])


def retire(region: str, job: str, *, placement_group: bool) -> bool:
    """Delete job `job`'s security group(s) (found by its job tag and the stack tag key) and, with
    `placement_group`, its placement group; -> whether nothing of them is left. Quiet while an
    instance still holds them (DependencyViolation, InvalidPlacementGroup.InUse: the next look
    tries again); other failures are a note, never an error: status must still answer."""
    from botocore.exceptions import BotoCoreError, ClientError

    from distrain_cloud.infra import aws

    later = ("DependencyViolation", "InvalidPlacementGroup.InUse", "InvalidGroup.InUse")
    gone = ("InvalidGroup.NotFound", "InvalidPlacementGroup.Unknown")
    left = False
    try:
        ec2 = aws.client("ec2", region, max_attempts=3)
        filters = [{"Name": f"tag:{TAG_PREFIX}job", "Values": [job]}, {"Name": "tag-key", "Values": [STACK_TAG]}]
        groups = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
        deletes = [("delete_security_group", {"GroupId": str(g["GroupId"])}) for g in groups]
        if placement_group:
            deletes.append(("delete_placement_group", {"GroupName": job}))
        for method, params in deletes:
            try:
                getattr(ec2, method)(**params)
            except ClientError as e:
                if aws.error_code(e) in gone:
                    continue
                left = True
                if aws.error_code(e) not in later:
                    print(f"note: {job}'s {' '.join(method.split('_')[1:])} was not deleted: {e}", file=sys.stderr)
    except (ClientError, BotoCoreError) as e:
        print(f"note: {job}'s security group was not looked up: {e}", file=sys.stderr)
        return False
    return not left


def retire_when_done(name: str, description: dict[str, Any], info: dict[str, Any], holding: bool) -> None:
    """Retire job `name`'s network once the job ended and none of its instances (`holding`) can
    still use it. The names are the launcher's own; job.json only says which the job has."""
    network = description.get("network")
    if isinstance(network, dict) and info.get("terminal") and not holding:
        retire(str(description.get("region")), name, placement_group=bool(network.get("placement_group")))
