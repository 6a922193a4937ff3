import dataclasses
import json
import os
import sys

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import catalog
from distrain_cloud.launcher.catalog import GPU_COMPUTE_CAPABILITY, PRICE_REGIONS, all_instances, hourly_price, lookup

WANTED = [
    "ml.p3.2xlarge",
    "ml.p3.8xlarge",
    "ml.p3.16xlarge",
    "ml.p3dn.24xlarge",
    "ml.g4dn.xlarge",
    "ml.g4dn.12xlarge",
    "ml.g5.xlarge",
    "ml.g5.2xlarge",
    "ml.g5.12xlarge",
    "ml.g5.48xlarge",
    "ml.g6.xlarge",
    "ml.g6.12xlarge",
    "ml.g6.48xlarge",
    "ml.g6e.xlarge",
    "ml.g6e.12xlarge",
    "ml.g6e.48xlarge",
    "ml.p4d.24xlarge",
    "ml.p4de.24xlarge",
    "ml.p5.48xlarge",
    "ml.m5.xlarge",
    "ml.c5.2xlarge",
]


@pytest.mark.parametrize("name", WANTED + [n[3:] for n in WANTED])
def test_covers_the_common_training_types_on_both_platforms(name):
    assert lookup(name).name == name


def test_lookup_tolerates_case_and_spaces():
    assert lookup("  ML.P4D.24XLARGE ") is lookup("ml.p4d.24xlarge")


def test_known_figures():
    p3 = lookup("ml.p3.8xlarge")
    assert (p3.gpus, p3.gpu_model, p3.compute_capability, p3.gpu_memory_gib, p3.efa) == (4, "V100", (7, 0), 16, False)
    p5 = lookup("p5.48xlarge")
    assert (p5.vcpus, p5.memory_gib, p5.gpus, p5.gpu_model, p5.compute_capability, p5.efa) == (
        192,
        2048,
        8,
        "H100",
        (9, 0),
        True,
    )
    assert lookup("ml.p4de.24xlarge").gpu_memory_gib == 80 and lookup("ml.p4d.24xlarge").gpu_memory_gib == 40
    assert lookup("ml.p3dn.24xlarge").gpu_memory_gib == 32
    assert lookup("g6e.xlarge").gpu_model == "L40S" and lookup("g6.xlarge").gpu_model == "L4"
    assert lookup("ml.g5.12xlarge").compute_capability_str == "8.6"


@pytest.mark.parametrize(
    "typo, suggestion",
    [
        ("ml.p3.8xlrge", "ml.p3.8xlarge"),
        ("ml.g5.12xlarg", "ml.g5.12xlarge"),
        ("p5.48xlarg", "p5.48xlarge"),
        ("ml.p4d.24xl", "ml.p4d.24xlarge"),
    ],
)
def test_unknown_instance_suggests_a_close_match(typo, suggestion):
    with pytest.raises(UserError) as err:
        lookup(typo)
    msg = str(err.value)
    assert f"unknown instance type {typo!r}; did you mean {suggestion}?" in msg
    assert "distrain-cloud instances" in msg
    assert "\n" not in msg


def test_unknown_instance_without_close_match():
    with pytest.raises(UserError, match=r"unknown instance type 'banana'.*distrain-cloud instances") as err:
        lookup("banana")
    assert "did you mean" not in str(err.value)


# EC2 types the source (SkyPilot's AWS catalog, launcher/data/prices.json) prices in no Irish
# zone: AWS does not sell them on demand in eu-west-1. The plan says "no list price" there.
NOT_IN_IRELAND = {
    "g6.xlarge", "g6.12xlarge", "g6.48xlarge", "g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge",
    "p4de.24xlarge", "p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge",
}  # fmt: skip


@pytest.mark.parametrize("instance", all_instances(), ids=lambda i: i.name)
def test_every_instance_has_prices_where_its_source_sells_it(instance):
    for region in PRICE_REGIONS:
        price = hourly_price(instance, region)
        if region == "eu-west-1" and instance.name in NOT_IN_IRELAND:
            assert price is None, instance.name
            continue
        assert isinstance(price, float) and 0 < price < 200, (instance.name, region, price)
    # Ireland is never cheaper than N. Virginia for these types.
    if "eu-west-1" in instance.hourly_usd:
        assert instance.hourly_usd["eu-west-1"] >= instance.hourly_usd["us-east-1"]


def test_gpu_instances_are_most_of_the_catalog():
    gpu = [i for i in all_instances() if i.is_gpu]
    assert len(gpu) >= 2 * 19


def test_sagemaker_costs_more_than_the_same_ec2_instance():
    for sm in (i for i in all_instances() if i.sagemaker):
        ec2 = lookup(sm.name[3:])
        for region in PRICE_REGIONS:
            if hourly_price(ec2, region) is not None:  # the hand-kept SageMaker figures name Ireland for all
                assert hourly_price(sm, region) > hourly_price(ec2, region), (sm.name, region)


def test_sagemaker_and_ec2_twins_share_the_hardware():
    for sm in (i for i in all_instances() if i.sagemaker):
        ec2 = lookup(sm.name[3:])
        assert dataclasses.replace(sm, name=ec2.name, hourly_usd=ec2.hourly_usd) == ec2


def test_gpu_fields_agree():
    for i in all_instances():
        if i.is_gpu:
            assert i.gpu_model in GPU_COMPUTE_CAPABILITY, i.name
            assert i.compute_capability == GPU_COMPUTE_CAPABILITY[i.gpu_model]
            assert i.gpu_memory_gib > 0 and i.total_gpu_memory_gib == i.gpus * i.gpu_memory_gib
        else:
            assert (i.gpu_model, i.compute_capability, i.gpu_memory_gib) == (None, None, 0), i.name


def test_hourly_price_by_name_and_unknown_region():
    assert hourly_price("ml.g5.xlarge", "us-east-1") == lookup("ml.g5.xlarge").hourly_usd["us-east-1"]
    assert hourly_price("ml.g5.xlarge", "ap-southeast-7") is None
    with pytest.raises(UserError):
        hourly_price("ml.g5.xlarg", "us-east-1")


def test_all_instances_lists_sagemaker_first_and_each_once():
    names = [i.name for i in all_instances()]
    assert len(names) == len(set(names))
    first_ec2 = next(n for n in names if not n.startswith("ml."))
    assert all(not n.startswith("ml.") for n in names[names.index(first_ec2) :])


def test_instances_are_hashable_and_serialisable():
    i = lookup("ml.p4d.24xlarge")
    assert {i: 1}[i] == 1
    assert json.loads(json.dumps(dataclasses.asdict(i)))["hourly_usd"]["us-west-2"] == i.hourly_usd["us-west-2"]


def _sagemaker_core_gpu_info():
    for entry in sys.path:
        path = os.path.join(entry or os.curdir, "sagemaker", "core", "image_uri_config", "instance_gpu_info.json")
        if os.path.isfile(path):
            with open(path) as f:
                return json.load(f)
    pytest.skip("sagemaker-core is not installed")


def test_gpu_counts_and_memory_agree_with_sagemaker_core():
    info = _sagemaker_core_gpu_info()["us-east-1"]
    checked = 0
    for i in all_instances():
        if i.name in info:
            assert i.gpus == info[i.name]["Count"], i.name
            # sagemaker-core states A10G as 22.35 GiB (24 GB); allow for GB vs GiB.
            total_gib = info[i.name]["TotalGpuMemoryInMiB"] / 1024
            assert abs(total_gib - i.total_gpu_memory_gib) <= 0.1 * i.total_gpu_memory_gib, i.name
            checked += 1
    assert checked >= 12


def test_catalog_module_documents_its_price_date():
    assert catalog.PRICES_AS_OF and catalog.__doc__ and "docs/catalog.md" in catalog.__doc__
