"""The current EC2 spot price (launcher/backends/ec2/spot_price.py) read where AWS is asked, under
moto: the worst case and the --max-cost check of a spot plan redone with it, and the list price
kept, labelled, where EC2 gives no usable price."""

from __future__ import annotations

import datetime as dt

import pytest
from clirun import run_cli

from distrain_cloud.launcher import apimodel, catalog

REGION = "us-east-1"


def _spot_history(monkeypatch, entries):
    """Answer DescribeSpotPriceHistory with `entries` (moto answers 0.00001 for every type), and
    record the requests; every other call goes to moto."""
    from botocore.awsrequest import AWSResponse

    from distrain_cloud.infra import aws

    real, asked = aws.client, []

    def answer(**_):
        return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), {"SpotPriceHistory": entries}

    def client(service, region=None, **kwargs):
        made = real(service, region, **kwargs)
        if service == "ec2":
            made.meta.events.register(
                "before-parameter-build.ec2.DescribeSpotPriceHistory", lambda params, **_: asked.append(dict(params))
            )
            made.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", answer)
        return made

    monkeypatch.setattr(aws, "client", client)
    return asked


def _entry(zone, price, product="Linux/UNIX", instance="g4dn.12xlarge", minutes_ago=30):
    stamp = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=minutes_ago)
    return {
        "AvailabilityZone": zone,
        "InstanceType": instance,
        "ProductDescription": product,
        "SpotPrice": price,
        "Timestamp": stamp,
    }


@pytest.fixture
def stack(mocked_aws, monkeypatch):
    from test_ec2_lifecycle import hand_made_stack

    return hand_made_stack(monkeypatch)


@pytest.mark.slow  # two plans through the CLI against moto
def test_a_spot_check_uses_the_current_spot_price_for_the_worst_case_and_max_cost(stack, monkeypatch, capsys):
    asked = _spot_history(
        monkeypatch,
        [
            _entry("us-east-1a", "1.4000", minutes_ago=90),  # superseded in its zone
            _entry("us-east-1a", "1.2100"),
            _entry("us-east-1b", "1.6321"),
            _entry("us-east-1c", "NaN"),  # not a price
            _entry("us-east-1d", "-3"),
            _entry("us-east-1e\x1b[2J", "0.1"),  # not a zone
            _entry("us-east-1f", "0.2", product="Windows"),
            _entry("us-east-1a", "0.3", instance="p5.48xlarge"),  # not the type asked for
        ],
    )
    flags = ["submit", "--instance", "g4dn.12xlarge", "--nodes", "2", "--spot", "--max-run", "10h"]
    flags += ["--region", REGION, "--max-cost", "40", "--dry-run"]
    # Without AWS the on-demand price stands in: 2 x 3.912 x (10 h + 10 min grace + 4 x 1 min) = $80.07
    # > $40: the nodes would stop the job at the cap (EC2 enforces --max-cost: test_cost_cap.py).
    code, out, err = run_cli(capsys, *flags)
    assert code == 0 and "[ok  ] cost <= --max-cost 40.0: worst case $80.07: the nodes stop the job" in out, err
    assert asked == []
    # With --check, the highest current price of the zones: 2 x 1.6321 (to the cent) x 10.23 h = $33.41 <= $40.
    code, out, err = run_cli(capsys, *flags, "--check")
    assert code == 0, err
    (cost,) = [line for line in out.splitlines() if line.startswith("cost: ")]
    assert "$1.632/h per node, EC2 spot price now (highest of us-east-1a, us-east-1b at " in cost
    assert "worst_case_usd=33.41" in cost and "spot_ceiling_usd=78.24" in cost
    assert "[ok  ] cost <= --max-cost 40.0: worst case $33.41 (every restart included): the cap is never" in out
    (request,) = asked
    assert request["InstanceTypes"] == ["g4dn.12xlarge"] and request["ProductDescriptions"] == ["Linux/UNIX"]
    assert apimodel.problems("ec2", "DescribeSpotPriceHistory", request) == []


def test_a_spot_price_ec2_does_not_give_leaves_the_list_price_labelled(stack, monkeypatch, capsys):
    _spot_history(monkeypatch, [_entry("us-east-1a", "1e400"), _entry("us-east-1b", "abc")])
    code, out, _ = run_cli(
        capsys, "submit", "--instance", "g4dn.12xlarge", "--spot", "--region", REGION, "--dry-run", "--check"
    )
    assert code == 0
    (cost,) = [line for line in out.splitlines() if line.startswith("cost: ")]
    assert "EC2 gave no current spot price for g4dn.12xlarge in us-east-1: the worst case uses the on-demand" in cost
    assert f"AWS list price as of {catalog.PRICES_AS_OF}" in cost
