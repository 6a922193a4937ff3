"""`--max-cost` on EC2 in the plan (launcher/backends/ec2/budget.py): the worst case (max-run plus the
hard stop's grace, on-demand where the lineage may fall back to it, a minute per launch), the check
that refuses only a cap too small to run, the cost block job.json gives the nodes' clock, the spot
maximum price the clock counts, and the plan's words on what the limits cover.

The clock itself is tests/launcher/backends/ec2/agent/test_cost_clock.py; the rehearsal of the cap reached on a lineage
is tests/launcher/backends/ec2/test_cost_rehearsal.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import apimodel, catalog
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.plan import refuse_failed_checks
from distrain_cloud.launcher.spec import load_spec

PRICE = catalog.hourly_price("g4dn.12xlarge", "us-east-1")
assert PRICE is not None


def dry(**overrides):
    base = {"instance": "g4dn.12xlarge", "region": "us-east-1", "nodes": 2, "max_run": "2h"}
    return plan_job(load_spec(None, {**base, **overrides}), dry_run=True)


def cap_check(plan):
    (check,) = [c for c in plan.checks if c.name.startswith("cost <= --max-cost")]
    return check


def test_the_worst_case_covers_the_hard_stops_grace_and_prices_on_demand_after_at_on_demand():
    on_demand = dry()
    assert on_demand.cost["worst_case_usd"] == pytest.approx(2 * PRICE * (7200 + 600 + 60) / 3600, abs=0.01)
    assert "+ 10 min hard-stop grace" in on_demand.cost["worst_case"]
    # A spot lineage with --on-demand-after may run almost all of max-run on-demand: priced so, with
    # the minimum minute of each of its (1 + 3 restarts) launches per node.
    fallback = dry(spot=True, ec2={"max_restarts": 3, "on_demand_after": 1})
    assert fallback.cost["worst_case_usd"] == pytest.approx(2 * PRICE * (7200 + 600 + 4 * 60) / 3600, abs=0.01)
    assert fallback.cost["worst_case"].endswith("on-demand (--on-demand-after)")


def test_a_cap_below_the_worst_case_is_enforced_by_the_nodes_and_a_cap_too_small_to_run_is_refused():
    plan = dry(max_cost=5)
    check = cap_check(plan)
    assert check.ok and check.detail.startswith(f"worst case ${plan.cost['worst_case_usd']}: the nodes stop the job")
    hours = float(re.search(r"after about ([0-9.]+) h", check.detail).group(1))
    assert hours == pytest.approx(5 / (2 * PRICE) - (5 + 110 + 600 + 60 + 60) / 3600, abs=0.05)
    assert plan.configs["job.json"]["cost"] == {"max_usd": 5.0, "usd_per_hour": {"on-demand": PRICE, "spot": PRICE}}
    assert cap_check(dry(max_cost=100)).detail.endswith("the cap is never reached")
    small = dry(max_cost=2)
    assert (
        not cap_check(small).ok
        and "$2 cannot pay for 2 node(s) to boot, train 15 min and stop" in cap_check(small).detail
    )
    with pytest.raises(UserError, match=r"plan check failed, nothing was created: cost <= --max-cost 2\.0"):
        refuse_failed_checks(small)


def test_the_cost_block_is_in_the_job_json_the_user_data_pins():
    plan = dry(max_cost=50, spot=True, ec2={"max_restarts": 0})
    description = plan.configs["job.json"]
    assert description["cost"]["max_usd"] == 50.0
    pinned = re.search(r"--job-sha256 '?([0-9a-f]{64})", "\n".join(plan.configs["user_data"])).group(1)
    assert hashlib.sha256(plan.payload.job_json).hexdigest() == pinned
    assert json.loads(plan.payload.job_json)["cost"] == description["cost"]
    assert "cost" not in dry().configs["job.json"]  # no cap, no clock


def test_a_capped_spot_job_sets_the_maximum_price_the_clock_counts_and_the_api_model_takes_it():
    plain = dry(max_cost=50, spot=True, ec2={"max_restarts": 0})
    spot = plain.request["InstanceMarketOptions"]["SpotOptions"]
    assert float(spot["MaxPrice"]) == plain.configs["job.json"]["cost"]["usd_per_hour"]["spot"] >= PRICE
    encoded = {**plain.request, "UserData": base64.b64encode(plain.request["UserData"].encode()).decode()}
    assert apimodel.problems("ec2", "RunInstances", encoded) == []
    lineage = dry(max_cost=50, spot=True, ec2={"max_restarts": 2})
    group = lineage.configs["recovery"]["CreateAutoScalingGroup"]
    distribution = group["MixedInstancesPolicy"]["InstancesDistribution"]
    assert float(distribution["SpotMaxPrice"]) == lineage.configs["job.json"]["cost"]["usd_per_hour"]["spot"]
    assert apimodel.problems("autoscaling", "CreateAutoScalingGroup", group) == []
    # A launch template used by a mixed instances policy may not ask for spot itself.
    assert "InstanceMarketOptions" not in lineage.configs["recovery"]["CreateLaunchTemplate"]["LaunchTemplateData"]
    uncapped = dry(spot=True, ec2={"max_restarts": 2})
    assert "MaxPrice" not in uncapped.request["InstanceMarketOptions"]["SpotOptions"]
    assert (
        "SpotMaxPrice"
        not in uncapped.configs["recovery"]["CreateAutoScalingGroup"]["MixedInstancesPolicy"]["InstancesDistribution"]
    )


def test_the_plan_says_what_the_limits_cover_and_what_happens_after_the_last_restart():
    lineage = dry(spot=True, max_cost=60, ec2={"max_restarts": 3}).summary["limits"]
    assert "max-run 2 h counts from submit and --max-cost $60 cover the whole lineage: every attempt" in lineage
    assert (
        "after the last restart (--max-restarts 3) the lineage ends Interrupted and the group launches nothing"
        in lineage
    )
    assert "at the cap the nodes stop with a checkpoint (Stopped, reason max-cost)" in lineage
    assert "every instance ends by max-run + 10 min" in lineage
    plain = dry(spot=True, ec2={"max_restarts": 0}).summary["limits"]
    assert "cover this job's 2 node(s); a spot interruption ends the job Interrupted; nothing restarts it" in plain
    assert "max-cost" not in plain and "`distrain-cloud resume` continues from the last checkpoint" in plain
    assert "limits: max-run 2 h counts from submit" in dry().render()


def test_a_plain_job_stopped_at_the_cap_says_so_in_status():
    """A job without recovery: its nodes' final records carry the cap's words, which `status` shows."""
    from distrain_cloud.launcher.backends.ec2.status import job_status

    words = "max-cost reached: $4.81 spent by 2 instance(s), and a stop takes up to $1.43 more"
    record = {"status": "Stopped", "exit_code": 143, "reason": words, "instance_id": "i-0", "time": 1.0}
    found = {"nodes": {0: record, 1: {**record, "instance_id": "i-1"}}, "stop": {"reason": "max-cost"}}
    description = {"job": "gpt2-x", "lineage": "gpt2-x", "attempt": 1, "nodes": 2, "submitted": 0.0}
    description |= {"model_uri": "s3://b/m/", "checkpoint_uri": "s3://b/c/", "instance_type": "g4dn.xlarge"}
    shown = job_status(description, found, [], now=3600.0)
    assert shown["status"] == "Stopped" and shown["terminal"]
    assert shown["detail"].startswith(f"stopped ({words}); checkpoints saved: `distrain-cloud resume gpt2-x`")
