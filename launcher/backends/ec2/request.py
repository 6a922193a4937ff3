"""The EC2 request: what a plan is made of (Parts, Where) and the RunInstances request, job.json
and the checks on them that it builds, all pure: no AWS call here (launcher/apimodel.py checks
the request against the API model)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.stack import STACK_TAG

from ...plan import Check
from ...tracking import tracking_env
from .. import cloud
from . import layout

if TYPE_CHECKING:
    from distrain_cloud.infra.job_role import JobRole

    from ...catalog import AmiFamily, InstanceType, NetworkFacts
    from ...plan import Plan
    from ...spec import JobSpec

TAG_PREFIX = "distrain-cloud:"
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64 (EC2's limit; moto accepts more)
CLIENT_TOKEN_LIMIT = 64
MAIN_PORT = 29500
RENDEZVOUS_TIMEOUT_S = 600
HARD_STOP_GRACE_MIN = 10  # the hard stop comes this long after max_run: the agent stops first
# The job's own security group until submit makes it (network.py): AWS names its id.
GROUP_PLACEHOLDER = "<the job's own security group, made at submit>"

# Which flag or spec key sets each part of the request, so a refusal names what the user wrote.
REQUEST_SOURCES = (
    ("ImageId", "ec2.ami_id / ec2.ami_parameter"),
    ("InstanceType", "--instance"),
    ("MinCount", "--nodes"),
    ("MaxCount", "--nodes"),
    ("ClientToken", "--name"),
    ("UserData", "the rendered user data"),
    ("IamInstanceProfile", "--stack"),
    ("SecurityGroupIds", "--stack"),
    ("SubnetId", "ec2.subnet_id"),
    ("NetworkInterfaces", "ec2.subnet_id / ec2.efa"),
    ("Placement", "ec2.placement"),
    ("BlockDeviceMappings", "ec2.volume_size_gb"),
    ("TagSpecifications", "--name / --stack"),
    ("InstanceMarketOptions", "--spot"),
)


@dataclasses.dataclass(frozen=True)
class Parts:
    """What the request is made of besides AWS's answers, fixed at plan time (the job name above all)."""

    job_name: str
    region: str
    instance_type: str
    nodes: int
    processes_per_node: int
    argv: tuple[str, ...]
    secrets: tuple[tuple[str, str], ...]
    prefix: str
    code_sha256: str
    family: AmiFamily
    ami_parameter: str
    spot: bool
    max_run: int
    submitted: float
    efa: bool  # EFA interfaces on each node (multi-node, a type that has them, ec2.efa)
    placement: bool  # the job's own cluster placement group (multi-node, ec2.placement)
    volume_size_gb: int
    requirements: tuple[str, ...]
    # A spot lineage the AWS side keeps going (recovery.wanted: spot, restarts allowed), decided
    # once here: job.json's block, the user data, the role, the requests, the cost and submit read it.
    recovering: bool


@dataclasses.dataclass(frozen=True)
class Where:
    """What only AWS can name; placeholders (in <angle brackets>) until preflight."""

    stack: str
    bucket: str
    instance_profile: str
    security_group: str  # the job's own (network.py); GROUP_PLACEHOLDER until submit makes it
    log_group: str
    ami_id: str
    root_device: str
    subnets: tuple[str, ...]  # the first is tried first; the others are other zones
    placement_group: str | None  # the job's own (its name), multi-node only
    lineage: str
    attempt: int
    checkpoint_uri: str
    # For the job's own role (infra/job_role.py): what only AWS names, placeholders until preflight.
    account: str = "<account>"
    partition: str = "aws"
    boundary: str = "<stack job role boundary>"
    secret_prefix: str = "distrain-cloud/"
    ssm: bool = False
    # The network: the VPC of the job's security group, the type's network cards (the catalog's
    # until preflight asks DescribeInstanceTypes), whether the subnets give public IPv4 addresses.
    vpc: str = "<the stack's VPC>"
    network: NetworkFacts | None = None
    public_ip: bool = True

    @property
    def resolved(self) -> bool:
        return not self.ami_id.startswith("<")


@dataclasses.dataclass(frozen=True)
class Ec2Payload:
    """What an EC2 plan's submit needs beyond the request, shown nowhere (Plan.payload); read by
    backend.py, network.py, recovery.py and rehearse.py, never by the common floor."""

    bundle: bytes  # the code bundle's bytes, uploaded at submit unless its key is there
    parts: Parts  # the job's pieces fixed at plan time
    code_key: str  # the bundle's key in the stack's bucket (its sha256)
    where: Where  # what only AWS names (placeholders until preflight; the security group until submit)
    role: JobRole  # the job's own role, made at submit
    description: dict[str, Any]  # job.json: the contract, and what status retires with the job
    job_json: bytes  # job.json's exact bytes, whose sha256 the user data pins
    network: dict[str, Any]  # the job's security group and placement group requests (network.py)
    recovery: dict[str, Any] | None = None  # a recovering lineage's template, group, hard stop (recovery.py)


def payload_of(plan: Plan) -> Ec2Payload:
    """The plan's EC2 record; a plan of another backend is a bug, said as one."""
    if not isinstance(plan.payload, Ec2Payload):
        raise TypeError(f"{plan.job_name} is a {plan.backend} plan, not an EC2 one")
    return plan.payload


# ---------------------------------------------------------------------- the request


def run_instances_request(parts: Parts, where: Where, user_data: str, subnet: int = 0) -> dict[str, Any]:
    """The RunInstances request of `parts` placed at `where`, in its subnet number `subnet` (the
    next zones, when the first has no capacity)."""
    tags = [
        {"Key": STACK_TAG, "Value": where.stack},
        {"Key": f"{TAG_PREFIX}job", "Value": parts.job_name},
        {"Key": f"{TAG_PREFIX}lineage", "Value": where.lineage},
        {"Key": f"{TAG_PREFIX}attempt", "Value": str(where.attempt)},
        {"Key": f"{TAG_PREFIX}code-sha256", "Value": parts.code_sha256},
        {"Key": "Name", "Value": parts.job_name},
    ]
    efa = efa_interfaces(parts, where)
    kinds = ["instance", "volume"] + (["network-interface"] if efa else [])
    request: dict[str, Any] = {
        "ImageId": where.ami_id,
        "InstanceType": parts.instance_type,
        "MinCount": parts.nodes,  # all or nothing
        "MaxCount": parts.nodes,
        "ClientToken": client_token(parts.job_name, where.attempt, subnet),
        "UserData": user_data,
        "IamInstanceProfile": {"Name": where.instance_profile},
        "InstanceInitiatedShutdownBehavior": "terminate",
        # IMDSv2 only, and one hop: a container on the node (a second hop) gets no token, so no
        # role credentials (DLAMIs default to 2).
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [
            {
                "DeviceName": where.root_device,
                "Ebs": {
                    "VolumeSize": parts.volume_size_gb,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in kinds],
    }
    subnet_id = where.subnets[subnet]
    if efa:  # the interfaces carry the security group and subnet then
        request["NetworkInterfaces"] = [
            {
                "DeviceIndex": 0 if card == 0 else 1,
                "NetworkCardIndex": card,
                "InterfaceType": "efa" if card == 0 else "efa-only",
                "Groups": [where.security_group],
                "SubnetId": subnet_id,
                "DeleteOnTermination": True,
            }
            for card in range(efa)
        ]
    else:
        request["SecurityGroupIds"] = [where.security_group]
        request["SubnetId"] = subnet_id
    if where.placement_group:
        request["Placement"] = {"GroupName": where.placement_group}
    if parts.spot:  # one-time: an interrupted node is gone; the lineage resumes on new ones
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return request


def efa_count(facts: NetworkFacts, public_ip: bool) -> int:
    """EFA interfaces per node: one per network card, AWS's advice for multi-card types (EC2 User
    Guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network cards"); one
    where the subnet gives public IPv4 addresses, which EC2 assigns only to an instance launched
    with one network interface (EC2 API Reference, InstanceNetworkInterfaceSpecification,
    AssociatePublicIpAddress: "You cannot specify more than one network interface")."""
    most = min(facts.cards, facts.efa_interfaces)
    return min(most, 1) if public_ip else most


def efa_interfaces(parts: Parts, where: Where) -> int:
    """How many EFA interfaces each node gets (efa_count): one per network card, as AWS
    advises for multi-card types (EC2 User Guide, "Maximize network bandwidth on Amazon EC2
    instances with multiple network cards"): network card 0 at device index 0 an EFA with ENA
    (the primary interface, which carries the node's IP traffic), every further card at device
    index 1 an EFA-only interface (no IP address: none of the subnet's addresses is used up)."""
    from ...catalog import network_facts

    if not parts.efa:
        return 0
    return efa_count(where.network or network_facts(parts.instance_type), where.public_ip)


def client_token(job_name: str, attempt: int, subnet: int = 0) -> str:
    """RunInstances' idempotency token: the same for every retry of one launch (botocore's, or
    a resubmitted plan), different for another attempt or zone. At most 64 characters."""
    token = f"{job_name}-a{attempt}" + (f"-z{subnet}" if subnet else "")
    if len(token) <= CLIENT_TOKEN_LIMIT:
        return token
    digest = hashlib.sha256(token.encode()).hexdigest()[:10]
    return f"{token[: CLIENT_TOKEN_LIMIT - 11]}-{digest}"


def job_description(parts: Parts, where: Where, spec: JobSpec) -> dict[str, Any]:
    """job.json, what every node agent reads (the contract's keys; references only)."""
    root = f"s3://{where.bucket}/{layout.job_key(parts.prefix, parts.job_name)}"
    return {
        "job": parts.job_name,
        "lineage": where.lineage,
        "attempt": where.attempt,
        "nodes": parts.nodes,
        "processes_per_node": parts.processes_per_node,
        "train_argv": list(parts.argv),
        "secrets": dict(parts.secrets),
        "region": parts.region,
        "bucket": where.bucket,
        "prefix": parts.prefix,
        "code_sha256": parts.code_sha256,
        "deadline": parts.submitted + parts.max_run,
        "log_group": where.log_group,
        "stack_tag": {"Key": STACK_TAG, "Value": where.stack},
        "rendezvous_timeout_s": RENDEZVOUS_TIMEOUT_S,
        "checkpoint_uri": where.checkpoint_uri,
        "model_uri": f"{root}/model/",
        "output_uri": f"{root}/output/",
        "main_port": MAIN_PORT,
        # The training processes' W&B variables (values, never secrets).
        "env": tracking_env(lineage=where.lineage, instance=parts.instance_type),
        # Beyond the contract, for `status`, `ls` and `resume` (the node agent ignores them).
        "instance_type": parts.instance_type,
        "spot": parts.spot,
        "submitted": parts.submitted,
        "spec": spec.model_dump(mode="json", exclude_defaults=True),
    }


def train_requirements() -> list[str]:
    """The `[train]` extra of the installed distrain-cloud, without torch: what a node installs
    besides the bundle's requirements.txt (a PyTorch DLAMI has torch and little else)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("distrain-cloud") or []
    except PackageNotFoundError:
        return []
    found = []
    for item in declared:
        requirement, _, marker = item.partition(";")
        name = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
        if "extra" in marker and '"train"' in marker and name and name.group(0).lower() != "torch":
            found.append(requirement.strip().replace(" ", ""))
    return found


def refuse_api_problems(request: dict[str, Any]) -> None:
    """Raise one UserError naming the flag or key behind each part of `request` that breaks the
    EC2 API model. The model wants UserData in base64, as botocore sends it."""
    import base64

    encoded = {**request, "UserData": base64.b64encode(request["UserData"].encode()).decode()}
    cloud.refuse_api_problems("ec2", "RunInstances", encoded, REQUEST_SOURCES, "EC2")


def user_data_size_check(user_data: str) -> Check:
    size = len(user_data.encode())
    return Check(f"user data <= {USER_DATA_LIMIT} bytes", size <= USER_DATA_LIMIT, f"{size} bytes")


def secret_free_check(user_data: str, description: dict[str, Any], secrets: dict[str, str]) -> Check:
    """User data is readable through the instance's metadata: it must hold no secret, not even a
    reference (those travel in job.json, resolved on the node). Credentials of this machine's
    environment must appear nowhere."""
    import os

    leaked = [env for env, ref in secrets.items() if ref in user_data]
    text = user_data + json.dumps(description)
    for variable in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN", "WANDB_API_KEY"):
        value = os.environ.get(variable, "")
        if len(value) >= 8 and value in text:
            leaked.append(variable)
    if leaked:
        return Check("user data holds no secret", False, f"{', '.join(leaked)} would be sent; report this as a bug")
    return Check("user data holds no secret", True, "references only, in job.json; resolved on the node")


def hardware(instance: InstanceType) -> str:
    if not instance.gpus:
        return f"{instance.vcpus} vCPUs, no GPU"
    return f"{instance.gpus} x {instance.gpu_model}, cc {instance.compute_capability_str}"


def lineage_checkpoint_uri(where: Where, parts: Parts) -> str:
    return f"s3://{where.bucket}/{layout.checkpoint_folder(parts.prefix, where.lineage)}"
