"""Instance catalog: what each SageMaker / EC2 instance type holds and what it costs.

Torch-free and boto3-free on purpose: the CLI renders plans, cost estimates and the
`distrain-cloud instances` listing from this table without touching AWS.

Where the figures come from, how old they are and how to update them: docs/catalog.md.
Prices are the on-demand list prices of the snapshot launcher/data/prices.json (EC2's from
SkyPilot's public AWS catalog, SageMaker's hand-kept; each family's date and source are in it and
in every cost line; `python -m distrain_cloud.launcher.pricelist` regenerates it); they drift and
differ per account (savings plans, private pricing).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from dataclasses import dataclass, field

from distrain_cloud.infra.errors import UserError

SNAPSHOT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "prices.json")


@dataclass(frozen=True)
class PriceSource:
    as_of: str  # the date of the figures
    source: str  # where they come from, in full (repository, file, commit; or how they were kept)
    label: str  # the short form every cost line shows


@dataclass(frozen=True)
class Snapshot:
    as_of: str
    source: str
    prices: dict[str, dict[str, float]]  # instance type -> region -> USD per hour
    unverified: dict[str, dict[str, str]]  # instance type -> region -> why the figure is not the Price List's
    sources: dict[str, PriceSource] = dataclasses.field(default_factory=dict)  # family() -> its source

    def source_of(self, instance_name: str) -> PriceSource:
        return self.sources.get(family(instance_name)) or PriceSource(self.as_of, self.source, "")


def family(instance_name: str) -> str:
    """Which source prices a type: SageMaker's ml.* types and EC2's are priced apart."""
    return "sagemaker" if instance_name.startswith("ml.") else "ec2"


def load_snapshot(path: str = SNAPSHOT_PATH) -> Snapshot:
    """The shipped snapshot; a figure that is not a positive finite number is left out (no price)."""
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    prices: dict[str, dict[str, float]] = {}
    for name, by_region in (raw.get("prices") or {}).items():
        for region, usd in (by_region or {}).items():
            if isinstance(usd, (int, float)) and not isinstance(usd, bool) and math.isfinite(usd) and usd > 0:
                prices.setdefault(str(name), {})[str(region)] = float(usd)
    unverified = {
        str(n): {str(r): str(why) for r, why in by_region.items()}
        for n, by_region in (raw.get("unverified") or {}).items()
    }
    sources = {
        str(name): PriceSource(str(s.get("as_of", "unknown date")), str(s.get("source", "")), str(s.get("label", "")))
        for name, s in (raw.get("sources") or {}).items()
        if isinstance(s, dict)
    }
    return Snapshot(str(raw.get("as_of", "unknown date")), str(raw.get("source", "")), prices, unverified, sources)


_SNAPSHOT = load_snapshot()
PRICES_SNAPSHOT = _SNAPSHOT
PRICES_AS_OF: str = _SNAPSHOT.as_of  # the EC2 figures' date; each family's: pricing.list_price_basis
PRICES: dict[str, dict[str, float]] = _SNAPSHOT.prices
PRICES_UNVERIFIED: dict[str, dict[str, str]] = _SNAPSHOT.unverified

PRICE_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")

# NVIDIA compute capability per GPU model (developer.nvidia.com/cuda-gpus).
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "V100": (7, 0),  # Volta
    "T4": (7, 5),  # Turing
    "A100": (8, 0),  # Ampere
    "A10G": (8, 6),  # Ampere
    "L4": (8, 9),  # Ada Lovelace
    "L40S": (8, 9),  # Ada Lovelace
    "H100": (9, 0),  # Hopper
    "H200": (9, 0),  # Hopper
    "B200": (10, 0),  # Blackwell
}


@dataclass(frozen=True)
class InstanceType:
    name: str  # "ml.p3.8xlarge" (SageMaker) or "p3.8xlarge" (EC2)
    vcpus: int
    memory_gib: int
    gpus: int  # 0 for CPU instances
    gpu_model: str | None  # "V100", "A10G", ...; None for CPU instances
    compute_capability: tuple[int, int] | None  # (7, 0) for V100; None for CPU instances
    gpu_memory_gib: int  # per GPU, nominal as NVIDIA states it; 0 for CPU
    efa: bool  # Elastic Fabric Adapter supported
    hourly_usd: dict[str, float] = field(hash=False)  # region -> on-demand list price, USD

    @property
    def sagemaker(self) -> bool:
        """A SageMaker instance type (ml.*), priced with SageMaker's surcharge."""
        return self.name.startswith("ml.")

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def compute_capability_str(self) -> str | None:
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return f"{major}.{minor}"

    @property
    def total_gpu_memory_gib(self) -> int:
        return self.gpus * self.gpu_memory_gib


# One row per instance shape; it yields the SageMaker type (ml.<name>) and the EC2 type
# (<name>) with the same hardware. Their prices come from the snapshot (launcher/pricing.py).
_ROWS = (
    # name           vCPU  mem GiB GPUs  GPU     GPU GiB  EFA
    ("p3.2xlarge", 8, 61, 1, "V100", 16, False),
    ("p3.8xlarge", 32, 244, 4, "V100", 16, False),
    ("p3.16xlarge", 64, 488, 8, "V100", 16, False),
    ("p3dn.24xlarge", 96, 768, 8, "V100", 32, True),
    ("g4dn.xlarge", 4, 16, 1, "T4", 16, False),
    ("g4dn.12xlarge", 48, 192, 4, "T4", 16, True),
    ("g5.xlarge", 4, 16, 1, "A10G", 24, False),
    ("g5.2xlarge", 8, 32, 1, "A10G", 24, False),
    ("g5.12xlarge", 48, 192, 4, "A10G", 24, True),
    ("g5.48xlarge", 192, 768, 8, "A10G", 24, True),
    ("g6.xlarge", 4, 16, 1, "L4", 24, False),
    ("g6.12xlarge", 48, 192, 4, "L4", 24, True),
    ("g6.48xlarge", 192, 768, 8, "L4", 24, True),
    ("g6e.xlarge", 4, 32, 1, "L40S", 48, False),
    ("g6e.12xlarge", 48, 384, 4, "L40S", 48, True),
    ("g6e.48xlarge", 192, 1536, 8, "L40S", 48, True),
    ("p4d.24xlarge", 96, 1152, 8, "A100", 40, True),
    ("p4de.24xlarge", 96, 1152, 8, "A100", 80, True),
    ("p5.48xlarge", 192, 2048, 8, "H100", 80, True),
    # H200 and B200: hardware from the AWS instance-type pages, checked against SkyPilot's AWS
    # catalog (AcceleratorCount, vCPUs, MemoryGiB) by the price generator. B200 memory as NVIDIA
    # states it for HGX B200 (1,440 GB for 8); the catalog reads 183,359 MiB per GPU.
    ("p5en.48xlarge", 192, 2048, 8, "H200", 141, True),
    ("p6-b200.48xlarge", 192, 2048, 8, "B200", 180, True),
    ("m5.xlarge", 4, 16, 0, None, 0, False),
    ("c5.2xlarge", 8, 16, 0, None, 0, False),
)

# EC2 types without a SageMaker twin here: SageMaker sells them through training plans, and no
# source here publishes an on-demand SageMaker price for them (docs/catalog.md).
EC2_ONLY = frozenset({"p5en.48xlarge", "p6-b200.48xlarge"})


@dataclass(frozen=True)
class NetworkFacts:
    """What EC2's DescribeInstanceTypes says of a type's network (NetworkInfo), for the plan's
    EFA interfaces and the inter-node bandwidth it states without asking AWS; preflight asks."""

    cards: int  # MaximumNetworkCards
    efa_interfaces: int  # EfaInfo.MaximumEfaInterfaces (0: no EFA)
    card_gbps: float | None  # NetworkCards[0].BaselineBandwidthInGbps (every card the same on these types)
    performance: str  # NetworkPerformance, AWS's words for the whole instance


# From DescribeInstanceTypes (NetworkInfo) as moto 5.2.5 ships it (moto/ec2/resources/
# instance_types.json, recorded from the EC2 API; tests/launcher/backends/ec2/test_network.py compares every
# row with it). The p3 rows are not in that file: their NetworkPerformance is the EC2 P3
# instance page's, their baseline unknown here.
_NETWORK: dict[str, NetworkFacts] = {
    name: NetworkFacts(*facts)
    for name, facts in {
        "p3.2xlarge": (1, 0, None, "Up to 10 Gigabit"),
        "p3.8xlarge": (1, 0, None, "10 Gigabit"),
        "p3.16xlarge": (1, 0, None, "25 Gigabit"),
        "p3dn.24xlarge": (1, 1, 100.0, "100 Gigabit"),
        "g4dn.xlarge": (1, 0, 5.0, "Up to 25 Gigabit"),
        "g4dn.12xlarge": (1, 1, 50.0, "50 Gigabit"),
        "g5.xlarge": (1, 0, 2.5, "Up to 10 Gigabit"),
        "g5.2xlarge": (1, 0, 5.0, "Up to 10 Gigabit"),
        "g5.12xlarge": (1, 1, 40.0, "40 Gigabit"),
        "g5.48xlarge": (1, 1, 100.0, "100 Gigabit"),
        "g6.xlarge": (1, 0, 2.5, "Up to 10 Gigabit"),
        "g6.12xlarge": (1, 1, 40.0, "40 Gigabit"),
        "g6.48xlarge": (1, 1, 100.0, "100 Gigabit"),
        "g6e.xlarge": (1, 0, 2.5, "Up to 20 Gigabit"),
        "g6e.12xlarge": (1, 1, 100.0, "100 Gigabit"),
        "g6e.48xlarge": (4, 4, 400.0, "400 Gigabit"),
        "p4d.24xlarge": (4, 4, 100.0, "4x 100 Gigabit"),
        "p4de.24xlarge": (4, 4, 100.0, "4x 100 Gigabit"),
        "p5.48xlarge": (32, 32, 100.0, "3200 Gigabit"),
        "p5en.48xlarge": (16, 16, 200.0, "3200 Gigabit"),
        "p6-b200.48xlarge": (8, 8, 200.0, "3200 Gigabit"),
        "m5.xlarge": (1, 0, 1.25, "Up to 10 Gigabit"),
        "c5.2xlarge": (1, 0, 2.5, "Up to 10 Gigabit"),
    }.items()
}


def network_facts(instance: InstanceType | str) -> NetworkFacts:
    """The network facts of `instance` (a SageMaker type has its EC2 twin's hardware)."""
    name = instance if isinstance(instance, str) else instance.name
    return _NETWORK[lookup(name).name.removeprefix("ml.")]


# AWS Deep Learning AMI families for EC2 jobs, resolved at submit from public SSM parameters
# (/aws/service/deeplearning/ami/x86_64/<type>/latest/ami-id). Which family can drive which GPU
# follows the AMIs' release notes: the OSS-driver AMIs support G4dn, G5, G6, G6e, P4d/P4de and P5
# but not P3, whose V100s need the proprietary-driver base AMI (Amazon Linux 2). docs/ec2.md
# says which names were seen where; none was resolved on real AWS from here.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/{}/latest/ami-id"


@dataclass(frozen=True)
class AmiFamily:
    name: str
    ssm_parameter: str  # the public SSM parameter holding the newest AMI id of the family
    gpu_models: frozenset[str]  # the GPUs its NVIDIA driver can run
    python: str  # the interpreter jobs run with
    root_device: str  # the root volume's device name (the block device mapping resizes it)
    # A pip requirement for torch when the AMI has none (a base AMI), else None: use the AMI's.
    torch: str | None
    description: str


AMI_FAMILIES: dict[str, AmiFamily] = {
    family.name: family
    for family in (
        AmiFamily(
            name="oss-pytorch",
            ssm_parameter=DLAMI_PARAMETER.format("oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04"),
            # B200 (P6-B200): among the instances the DLAMI release notes list for the OSS-driver
            # PyTorch AMIs (CUDA 12.8+); not booted from here.
            gpu_models=frozenset({"T4", "A10G", "L4", "L40S", "A100", "H100", "H200", "B200"}),
            python="/opt/pytorch/bin/python",
            root_device="/dev/sda1",
            torch=None,
            description="Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04)",
        ),
        AmiFamily(
            name="proprietary-base",
            ssm_parameter=DLAMI_PARAMETER.format("base-proprietary-nvidia-driver-amazon-linux-2"),
            gpu_models=frozenset({"V100"}),
            python="/usr/bin/python3.10",
            root_device="/dev/xvda",
            # PyPI's torch 2.7 wheels are CUDA 12.6 builds, which still run on V100 (compute 7.0).
            torch="torch==2.7.1",
            description="Deep Learning Base Proprietary Nvidia Driver AMI (Amazon Linux 2)",
        ),
    )
}


def ami_family(instance: InstanceType, name: str | None = None, parameter: str | None = None) -> AmiFamily:
    """The AMI family of an EC2 job: the one named (ec2.ami_family), else the one whose SSM
    parameter is given, else the first that drives the instance's GPU (a CPU instance gets the
    first). UserError when the family is unknown or its driver cannot run the GPU; a parameter
    of no known family is judged by its name (an OSS-driver AMI never runs V100s)."""
    gpu = instance.gpu_model
    if name is None and parameter is not None:
        name = next((f.name for f in AMI_FAMILIES.values() if f.ssm_parameter == parameter), None)
        oss = AMI_FAMILIES["oss-pytorch"].gpu_models
        if name is None and "oss-nvidia-driver" in parameter and gpu is not None and gpu not in oss:
            raise UserError(
                f"ec2.ami_parameter {parameter}: an OSS-driver AMI cannot run {instance.name}'s {gpu} GPUs; "
                f"drop ec2.ami_parameter (the default for {instance.name} is the {_fits(gpu)} family)"
            )
    if name is not None:
        family = AMI_FAMILIES.get(name)
        if family is None:
            raise UserError(f"ec2.ami_family {name!r} is unknown; choose one of: {', '.join(AMI_FAMILIES)}")
        if gpu is not None and gpu not in family.gpu_models:
            raise UserError(
                f"ec2.ami_family {name}: its NVIDIA driver cannot run {instance.name}'s {gpu} GPUs; "
                f"use ec2.ami_family {_fits(gpu)}"
            )
        return family
    for family in AMI_FAMILIES.values():
        if gpu is None or gpu in family.gpu_models:
            return family
    raise UserError(f"no known AMI family drives {instance.name}'s {gpu} GPUs; set ec2.ami_id and ec2.ami_family")


def _fits(gpu: str) -> str:
    return " or ".join(f.name for f in AMI_FAMILIES.values() if gpu in f.gpu_models) or "(none known)"


def _build() -> dict[str, InstanceType]:
    table: dict[str, InstanceType] = {}
    for name, vcpus, mem, gpus, gpu, gpu_gib, efa in _ROWS:
        for full_name in (name,) if name in EC2_ONLY else (f"ml.{name}", name):
            table[full_name] = InstanceType(
                name=full_name,
                vcpus=vcpus,
                memory_gib=mem,
                gpus=gpus,
                gpu_model=gpu,
                compute_capability=GPU_COMPUTE_CAPABILITY[gpu] if gpu else None,
                gpu_memory_gib=gpu_gib,
                efa=efa,
                hourly_usd=dict(PRICES.get(full_name, {})),
            )
    return table


_CATALOG = _build()


def all_instances() -> tuple[InstanceType, ...]:
    """Every known instance type: the SageMaker (ml.*) ones first, then the EC2 ones."""
    return tuple(sorted(_CATALOG.values(), key=lambda i: not i.sagemaker))


def lookup(name: str) -> InstanceType:
    """The catalog entry for `name` ("ml.g5.12xlarge" or "g5.12xlarge"); UserError if unknown."""
    key = name.strip().lower()
    try:
        return _CATALOG[key]
    except KeyError:
        pass
    if difflib.get_close_matches(key, ["local"], n=1, cutoff=0.75):
        raise UserError(f"unknown instance type {name!r}; did you mean local? (this machine)")
    # Suggest from the same platform first: a typo in "ml.p3.8xlrge" means a SageMaker type.
    same_platform = [n for n in _CATALOG if n.startswith("ml.") == key.startswith("ml.")]
    close = difflib.get_close_matches(key, same_platform, n=1, cutoff=0.6) or difflib.get_close_matches(
        key, list(_CATALOG), n=1, cutoff=0.6
    )
    if close:
        raise UserError(f"unknown instance type {name!r}; did you mean {close[0]}? (see `distrain-cloud instances`)")
    raise UserError(f"unknown instance type {name!r} (see `distrain-cloud instances` for the known ones)")


def hourly_price(instance: InstanceType | str, region: str) -> float | None:
    """On-demand list price in USD per hour, or None where the catalog has no price."""
    if isinstance(instance, str):
        instance = lookup(instance)
    return instance.hourly_usd.get(region)
