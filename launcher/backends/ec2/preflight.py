"""EC2 preflight's reads: what only AWS can name before a launch (the AMI an SSM parameter
points to, the subnets to launch in and their zones' order, the type's network cards, a resumed
job's lineage and attempt), each a read-only call whose verdict is a Check in the plan.

backend.py's `preflight` calls these and builds the plan's `Where` from the answers. Tests replace
`resolve_ami` (moto serves none of the public /aws/service/* parameters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

from ...plan import Check
from . import layout, network, recovery
from .request import payload_of
from .status import read_description

if TYPE_CHECKING:
    from ...catalog import NetworkFacts
    from ...plan import Plan
    from .request import Parts


def resolve_ami(parameter: str, region: str) -> str:
    """The AMI id in SSM parameter `parameter` (a public DLAMI parameter, or one of the user's).
    Tests replace this function: moto cannot serve /aws/service/* parameters."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    try:
        value = aws.client("ssm", region).get_parameter(Name=parameter)["Parameter"]["Value"]
    except ClientError as e:
        if aws.error_code(e) == "ParameterNotFound":
            raise UserError(
                f"SSM parameter {parameter} does not exist in {region}: set ec2.ami_parameter or ec2.ami_id"
            ) from None
        raise
    return str(value)


def check_image(ami_id: str, region: str, plan: Plan, checks: list[Check]) -> str | None:
    """Add the AMI checks; returns its root device name (None when it could not be described)."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    from ...catalog import AMI_FAMILIES, lookup

    parts = payload_of(plan).parts
    try:
        images = aws.client("ec2", region).describe_images(ImageIds=[ami_id]).get("Images", [])
    except ClientError as e:
        if aws.error_code(e).startswith("InvalidAMIID"):
            images = []
        else:
            raise
    if not images:
        checks.append(Check("AMI exists", False, f"{ami_id} is not an AMI in {region}"))
        return None
    image = images[0]
    name = str(image.get("Name", ""))
    checks.append(Check("AMI exists", True, f"{ami_id} ({name})"))
    model = lookup(parts.instance_type).gpu_model
    if model and "OSS Nvidia Driver" in name and model not in AMI_FAMILIES["oss-pytorch"].gpu_models:
        checks[:] = [c for c in checks if c.name != "AMI drives the GPU"]  # the plan's verdict was the family's
        checks.append(
            Check(
                "AMI drives the GPU",
                False,
                f"{name} has the OSS NVIDIA driver, which cannot run {parts.instance_type}'s {model}; "
                f"drop ec2.ami_id (the {parts.family.name} family's AMI is the default)",
            )
        )
    root = image.get("RootDeviceName")
    return str(root) if root else None


def choose_subnets(
    subnet_id: str | None, security_group: str, parts: Parts, region: str, checks: list[Check]
) -> tuple[tuple[str, ...], str, bool]:
    """(subnets, their VPC, whether they give public IPv4 addresses): the subnet to launch in,
    then one per other zone to try when it has no capacity, each in a zone where EC2 offers the
    instance type (DescribeInstanceTypeOfferings). The spec's only, or the default subnets of the
    stack security group's VPC (any public one if none). A multi-node launch stays in one subnet:
    a single-node lineage's group spans them all, a multi-node one takes the first (recovery.py),
    which for a spot job is the zone EC2 scores likeliest to hold all its nodes now."""
    from distrain_cloud.infra import aws

    ec2 = aws.client("ec2", region)
    offered = _offered_zones(parts.instance_type, region)
    if subnet_id:
        (found,) = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
        zone = found.get("AvailabilityZone", "?")
        if offered is not None and zone not in offered:
            checks.append(
                Check(
                    "subnet",
                    False,
                    f"ec2.subnet_id {subnet_id} is in {zone}, where EC2 offers no {parts.instance_type}; "
                    f"choose a subnet in {', '.join(sorted(offered)) or 'another region'}",
                )
            )
        else:
            checks.append(Check("subnet", True, f"{subnet_id} ({zone})"))
        return (subnet_id,), str(found["VpcId"]), bool(found.get("MapPublicIpOnLaunch"))
    groups = ec2.describe_security_groups(GroupIds=[security_group])["SecurityGroups"]
    vpc = groups[0]["VpcId"]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    usable = [s for s in subnets if s.get("DefaultForAz")] or [s for s in subnets if s.get("MapPublicIpOnLaunch")]
    if not usable:
        raise UserError(f"the stack's VPC {vpc} has no default or public subnet in {region}: set ec2.subnet_id")
    by_zone: dict[str, dict[str, Any]] = {}
    for s in sorted(usable, key=lambda s: (s.get("AvailabilityZone", ""), s["SubnetId"])):
        if offered is None or s.get("AvailabilityZone") in offered:
            by_zone.setdefault(s.get("AvailabilityZone", ""), s)
    if not by_zone:
        zones = sorted({s.get("AvailabilityZone", "?") for s in usable})
        raise UserError(
            f"--instance {parts.instance_type}: EC2 offers it in none of the zones of the stack's VPC "
            f"({', '.join(zones)}) in {region}: choose another type or region"
        )
    ordered = list(by_zone.values())
    scored = ""
    if parts.spot and parts.nodes > 1 and len(ordered) > 1:  # one zone for all: the likeliest to hold them
        scores = _spot_scores(parts, region)
        if scores:
            ordered.sort(key=lambda s: -scores.get(str(s.get("AvailabilityZoneId")), 0))
            scored = f", spot placement score {scores.get(str(ordered[0].get('AvailabilityZoneId')), 0)} of 10"
    chosen = tuple(s["SubnetId"] for s in ordered)
    others = f"{len(chosen) - 1} other zone(s) if it is full"
    if parts.nodes > 1:
        others += " (all nodes in one zone each time)"
    checks.append(Check("subnet", True, f"{chosen[0]} ({ordered[0].get('AvailabilityZone', '?')}{scored}); {others}"))
    return chosen, str(vpc), any(bool(s.get("MapPublicIpOnLaunch")) for s in ordered)


def _spot_scores(parts: Parts, region: str) -> dict[str, int]:
    """Zone id -> how likely EC2 says a spot request for all of the job's nodes in that one zone
    is to succeed now (GetSpotPlacementScores, 1 to 10; EC2 User Guide, "Spot placement score").
    Advisory: {} when EC2 does not answer (no ec2:GetSpotPlacementScores, throttled)."""
    from distrain_cloud.infra import aws

    request = {
        "InstanceTypes": [parts.instance_type],
        "TargetCapacity": parts.nodes,
        "SingleAvailabilityZone": True,
        "RegionNames": [region],
    }
    try:
        answer = aws.client("ec2", region, max_attempts=2).get_spot_placement_scores(**request)
    except Exception:  # the order of the zones only: never a reason to refuse the job
        return {}
    scores: dict[str, int] = {}
    for item in answer.get("SpotPlacementScores", []):
        zone, score = item.get("AvailabilityZoneId"), item.get("Score")
        if isinstance(zone, str) and isinstance(score, int) and not isinstance(score, bool):
            scores[zone] = max(0, min(score, 10))
    return scores


def _offered_zones(instance_type: str, region: str) -> set[str] | None:
    """The zones of `region` where EC2 offers `instance_type`; None when that is not known (the
    launcher may lack ec2:DescribeInstanceTypeOfferings): every zone is tried then."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    try:
        pages = (
            aws.client("ec2", region)
            .get_paginator("describe_instance_type_offerings")
            .paginate(LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
        )
        found = {o["Location"] for page in pages for o in page.get("InstanceTypeOfferings", [])}
    except ClientError as e:
        if aws.error_code(e) in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return None
        raise
    # None named: no zone to prefer; every zone is tried, and RunInstances' own refusal says why.
    return found or None


def network_facts(instance_type: str, region: str) -> NetworkFacts | None:
    """The type's network cards and EFA interfaces as the EC2 API says (DescribeInstanceTypes);
    None (the catalog's then) when it does not say (no right to ask, a type it does not list)."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    try:
        (found,) = aws.client("ec2", region).describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except (ClientError, ValueError):
        return None
    return network.facts_from_api(found.get("NetworkInfo") or {})


def previous_attempt(job_name: str, bucket: str, parts: Parts, checks: list[Check]) -> tuple[str, int, str]:
    """(lineage, attempt, checkpoint URI) of a new attempt after EC2 job `job_name`."""
    from distrain_cloud.infra import aws

    s3 = aws.client("s3", parts.region)
    previous = read_description(s3, bucket, parts.prefix, job_name)
    if previous is None:
        raise UserError(
            f"--resume-from {job_name}: no EC2 job of that name in s3://{bucket}/{parts.prefix}/jobs/ "
            f"({parts.region}); `distrain-cloud ls` lists the jobs"
        )
    lineage, attempt, uri = str(previous["lineage"]), int(previous["attempt"]) + 1, str(previous["checkpoint_uri"])
    if recovery.is_lineage(previous):  # its group counted attempts on from its own number
        attempt = max([attempt - 1, *recovery.attempt_numbers(s3, bucket, layout.job_key(parts.prefix, job_name))]) + 1
    checks.append(Check(f"resume from {job_name}", True, f"lineage {lineage}, attempt {attempt}, {uri}"))
    return lineage, attempt, uri
