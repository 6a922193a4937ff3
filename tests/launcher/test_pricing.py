"""Prices a user can trust: the snapshot's generator run on recorded Price List files and the date in
every cost line. The current EC2 spot price read where AWS is asked (launcher/backends/ec2/spot_price.py)
is tests/launcher/backends/ec2/test_spot_price.py.

The two files in tests/launcher/data follow the AWS Price List's real schemas: a bulk offer file
(products by sku, terms.OnDemand by sku, priceDimensions with pricePerUnit.USD) and a saved
GetProducts answer (PriceList items as JSON strings). They are small excerpts written after that
schema, with the distractors a real file is full of (Windows, dedicated tenancy, unused
reservations, pre-installed software, hosting and notebook prices, other regions, data transfer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run_cli

from distrain_cloud.launcher import apimodel, catalog, pricelist, pricing

DATA = Path(__file__).parent / "data"
EC2_OFFER = DATA / "pricelist-AmazonEC2-excerpt.json"
SAGEMAKER_ANSWER = DATA / "pricelist-AmazonSageMaker-get-products.json"
REGION = "us-east-1"


# ------------------------------------------------------------------ the generator


def test_the_generator_reads_on_demand_linux_prices_from_recorded_price_list_files(tmp_path, capsys):
    out = tmp_path / "prices.json"
    code = pricelist.main(
        ["--offer", f"AmazonEC2={EC2_OFFER}", "--offer", f"AmazonSageMaker={SAGEMAKER_ANSWER}", "--out", str(out)]
    )
    assert code == 0
    snap = json.loads(out.read_text())
    assert snap["as_of"] == "2025-11-01"  # the offer file's publicationDate
    assert "AmazonEC2 20251101000000" in snap["source"] and "AmazonSageMaker" in snap["source"]
    assert snap["prices"] == {
        # Windows 0.71, dedicated 0.578, SQL 1.006, RHEL 0.5836, Tokyo 0.71 and unused reservations left out
        "g4dn.xlarge": {"eu-west-1": 0.587, "us-east-1": 0.526, "us-west-2": 0.526},
        "g5.12xlarge": {"eu-west-1": 6.33167},
        "p4d.24xlarge": {"us-east-1": 21.9576},  # its Reserved term (13.40) is not on-demand
        "ml.g5.12xlarge": {"us-east-1": 7.09},  # Training, not Hosting or Notebook
        "ml.g4dn.xlarge": {"eu-west-1": 0.824},
    }
    assert "g4dn.metal" not in snap["prices"]  # not a catalog type
    assert snap["unverified"] == {}
    err = capsys.readouterr().err
    assert "7 prices as of 2025-11-01" in err and "no on-demand price for" in err  # what is missing is said

    # What the catalog would make of it: the date, and no "recalled" label on Price List figures.
    loaded = catalog.load_snapshot(str(out))
    assert loaded.as_of == "2025-11-01" and loaded.prices["p4d.24xlarge"]["us-east-1"] == 21.9576


def test_a_product_with_two_on_demand_prices_is_refused_in_one_line(tmp_path, capsys):
    offer = json.loads(EC2_OFFER.read_text())
    twin = json.loads(json.dumps(offer["products"]["8ZQ4J3KDV6H2YMPC"]))
    twin["sku"] = "TWIN000000000000"
    offer["products"]["TWIN000000000000"] = twin
    term = json.loads(json.dumps(offer["terms"]["OnDemand"]["8ZQ4J3KDV6H2YMPC"]).replace("0.5260000000", "0.61"))
    offer["terms"]["OnDemand"]["TWIN000000000000"] = term
    path = tmp_path / "offer.json"
    path.write_text(json.dumps(offer))
    assert pricelist.main(["--offer", f"AmazonEC2={path}", "--out", str(tmp_path / "p.json")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "error: AmazonEC2: g4dn.xlarge in us-east-1 has two on-demand prices (0.526 and 0.61)"
    assert not (tmp_path / "p.json").exists()


def test_the_price_list_api_requests_pass_the_api_model_and_are_read_alike(stub_client):
    for service, name in (("AmazonEC2", "p5.48xlarge"), ("AmazonSageMaker", "ml.g5.12xlarge")):
        assert apimodel.problems("pricing", "GetProducts", pricelist.get_products_requests(service, name, REGION)) == []
    stub = stub_client("pricing", "us-east-1")
    answer = json.loads(SAGEMAKER_ANSWER.read_text())
    stub.add_response(
        "get_products", answer, pricelist.get_products_requests("AmazonSageMaker", "ml.g5.12xlarge", REGION)
    )
    tables = pricelist.from_api({"AmazonSageMaker": ["ml.g5.12xlarge"]}, [REGION])
    assert tables == {"AmazonSageMaker": {"ml.g5.12xlarge": {REGION: 7.09}}}


# ------------------------------------------------------------------ the shipped snapshot


def test_the_catalog_reads_its_prices_from_the_shipped_snapshot():
    snap = json.loads(Path(catalog.SNAPSHOT_PATH).read_text())
    assert snap["as_of"] == catalog.PRICES_AS_OF and snap["source"]
    for instance in catalog.all_instances():
        assert instance.hourly_usd == snap["prices"][instance.name], instance.name
    # A figure not read from the Price List says so, and why.
    for name, by_region in snap["unverified"].items():
        for region, why in by_region.items():
            assert why and region in snap["prices"][name]
            assert "not read from the Price List" in pricing.list_price_basis(name, region)


SKYPILOT_CSV = DATA / "skypilot-aws-vms-excerpt.csv"
SKYPILOT_COMMIT = "2c3d7ea7d76bf84cf80d382e946c1609571485fd"


def test_the_shipped_ec2_prices_are_the_generators_output_from_skypilots_catalog(tmp_path, capsys):
    """Every EC2 figure shipped is what the generator reads from SkyPilot's public AWS catalog
    (tests/launcher/data/skypilot-aws-vms-excerpt.csv: rows of catalogs/v9/aws/vms.csv at the commit
    the snapshot names, the first zone of each region for the catalog's types, plus distractors:
    other regions, a zone without an on-demand price); nothing EC2 is hand-kept any more."""
    shipped = json.loads(Path(catalog.SNAPSHOT_PATH).read_text())
    out = tmp_path / "prices.json"
    out.write_text(Path(catalog.SNAPSHOT_PATH).read_text())  # the SageMaker figures it carries over
    argv = ["--skypilot-csv", str(SKYPILOT_CSV), "--commit", SKYPILOT_COMMIT, "--as-of", "2026-11-28"]
    assert pricelist.main([*argv, "--out", str(out)]) == 0
    generated = json.loads(out.read_text())
    assert generated == shipped  # regenerating changes nothing: the shipped file is this output
    ec2 = shipped["sources"]["ec2"]
    assert (
        ec2["as_of"] == "2026-11-28" and SKYPILOT_COMMIT in ec2["source"] and "catalogs/v9/aws/vms.csv" in ec2["source"]
    )
    assert all(name.startswith("ml.") for name in shipped["unverified"])  # only SageMaker is still recalled
    assert shipped["prices"]["p5en.48xlarge"] == {"us-east-1": 63.296, "us-west-2": 63.296}  # H200
    assert shipped["prices"]["p6-b200.48xlarge"] == {"us-east-1": 113.9328, "us-west-2": 113.9328}  # B200
    assert shipped["prices"]["p4d.24xlarge"]["us-east-1"] == 21.957642
    assert "eu-west-1" not in shipped["prices"]["g6e.12xlarge"]  # not sold on demand in Ireland
    err = capsys.readouterr().err
    assert "59 EC2 prices as of 2026-11-28" in err and "g6e.12xlarge eu-west-1" in err  # what is missing is said
    assert "launcher/catalog.py" not in err  # the catalog's hardware agrees with SkyPilot's rows


def test_the_skypilot_generator_refuses_two_prices_and_a_missing_commit(tmp_path, capsys):
    rows = SKYPILOT_CSV.read_text().splitlines()
    twin = next(r for r in rows if r.startswith("g5.xlarge,") and ",us-east-1," in r).replace("1.006", "1.1")
    bad = tmp_path / "vms.csv"
    bad.write_text("\n".join([*rows, twin]) + "\n")
    out = tmp_path / "p.json"
    argv = ["--skypilot-csv", str(bad), "--as-of", "2026-11-28", "--out", str(out)]
    assert pricelist.main([*argv, "--commit", SKYPILOT_COMMIT]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: SkyPilot catalog: g5.xlarge in us-east-1 has two on-demand prices (1.006 and 1.1)"
    )
    assert pricelist.main(argv) == 2
    assert "needs --commit SHA" in capsys.readouterr().err
    assert not out.exists()


def test_cost_lines_name_each_figures_source_and_date():
    ec2 = pricing.list_price_basis("g5.12xlarge", "us-east-1")
    assert ec2 == "AWS list price as of 2026-11-28, SkyPilot AWS catalog @2c3d7ea"
    assert pricing.list_price_basis("ml.g5.12xlarge", "us-east-1") == (
        "AWS list price as of 2025-07, recalled, not read from the Price List"
    )


# ------------------------------------------------------------------ cost lines


@pytest.mark.slow  # a plan with its code bundle: about 3 s here
def test_every_cost_line_of_a_dry_run_says_the_snapshot_date(capsys, no_aws_config):
    code, out, err = run_cli(capsys, "submit", "--instance", "ml.g5.12xlarge", "--region", REGION, "--dry-run")
    assert code == 0
    (cost,) = [line for line in out.splitlines() if line.startswith("cost: ")]
    basis = pricing.list_price_basis("ml.g5.12xlarge", REGION)  # SageMaker's figures: their own date
    assert basis.startswith("AWS list price as of 2025-07") and f"{basis}, hourly_usd" in cost
    assert "worst_case_usd=170.16" in cost and f"worst case $170.16, {basis}" in err  # the default-limit note
    code, out, _ = run_cli(capsys, "instances")
    for line in out.splitlines():  # each row: its family's date and source
        assert pricing.list_price_basis(line.split()[0], REGION).removeprefix("AWS ") in line, line
    assert any("list price as of 2026-11-28, SkyPilot AWS catalog @2c3d7ea" in line for line in out.splitlines())


def test_a_spot_plan_without_aws_says_the_on_demand_figure_stands_in(capsys, no_aws_config):
    code, out, _ = run_cli(
        capsys, "submit", "--instance", "g5.xlarge", "--spot", "--max-run", "10h", "--region", REGION, "--dry-run"
    )
    assert code == 0
    (cost,) = [line for line in out.splitlines() if line.startswith("cost: ")]
    assert "on-demand, AWS list price as of" in cost and "current spot price is read at submit" in cost
