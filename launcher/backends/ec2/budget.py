"""What an EC2 job may cost and what holds it there, in the plan: the worst case, `--max-cost` as
the nodes enforce it (agent/costclock.py), the spot maximum price, and the plan's words on what the
time limit and the cap cover. Pure: no AWS call.

The worst case is every node for the whole time a job may run: max-run from submit plus the hard
stop's grace (request.HARD_STOP_GRACE_MIN: the nodes and, for a lineage, the group's scheduled
action end everything then, whenever it booted), at the price the job may pay: on-demand for an
on-demand job and for a spot lineage that may fall back to on-demand (`--on-demand-after`), the
spot price otherwise; plus EC2's one-minute minimum for every launch (every attempt of a lineage).
A lineage never runs more than `--nodes` instances at once (its group's MaxSize), so this covers
every restart.

With `--max-cost`, the nodes keep the job's cost clock and stop it with a checkpoint before the
cap would be passed, so a cap below the worst case is a budget, not a refusal: the plan says when
the nodes stop. The clock counts spot at its maximum price, which the plan then sets to the
on-demand list price (AWS's default maximum, made explicit so that the clock's price bounds the
bill whatever the list price does): the real bill is lower than the clock's figure.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from ...plan import Check
from .request import HARD_STOP_GRACE_MIN, payload_of

if TYPE_CHECKING:
    from ...plan import Plan
    from ...spec import JobSpec

MIN_BILLED_S = 60  # EC2 bills a Linux instance per second, at least a minute per launch
# The least a capped job must be able to pay beyond its stop: boot, install and a few steps.
MIN_USEFUL_S = 15 * 60


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h"


def max_price(usd_per_hour: float) -> str:
    """The spot maximum price as the APIs take it (a string of USD per hour), never below the figure."""
    return f"{math.ceil(usd_per_hour * 100_000) / 100_000:.5f}".rstrip("0").rstrip(".")


def on_demand(spec: JobSpec, region: str) -> float | None:
    from ...catalog import hourly_price, lookup

    return hourly_price(lookup(spec.instance), region)


def launches(spec: JobSpec, recovering: bool) -> int:
    """How many times each node may be launched: every attempt of a lineage (`recovering`: the
    plan's request.Parts.recovering)."""
    return spec.ec2.max_restarts + 1 if recovering else 1


def worst_case(spec: JobSpec, region: str, cost: dict[str, Any], recovering: bool) -> dict[str, Any]:
    """`cost` (pricing.estimate's) with the EC2 worst case: max-run plus the hard stop's grace, at
    on-demand where the job may fall back to it, plus a minute per launch."""
    price = on_demand(spec, region)
    if price is None or cost.get("hourly_usd") is None:
        return cost
    fallback = spec.spot and spec.ec2.on_demand_after is not None
    per_node = price
    if spec.spot and not fallback and "spot_ceiling_usd" in cost:  # the spot price now was read
        per_node = (cost["hourly_usd"] + 0.005) / spec.nodes  # hourly_usd is rounded to the cent: a bound
    seconds = spec.max_run + HARD_STOP_GRACE_MIN * 60
    minimum = launches(spec, recovering) * MIN_BILLED_S
    worst = spec.nodes * per_node * (seconds + minimum) / 3600
    what = cost["basis"] if per_node != price else "on-demand" + (" (--on-demand-after)" if fallback else "")
    return {
        **cost,
        "worst_case_usd": round(worst, 2),
        "worst_case": (
            f"{spec.nodes} node(s) x (max-run {_hours(spec.max_run)} + {HARD_STOP_GRACE_MIN} min hard-stop grace"
            f" + {launches(spec, recovering)} x 1 min minimum per launch) at ${per_node:.4g}/h {what}"
        ),
    }


def clock_prices(spec: JobSpec, region: str) -> dict[str, float] | None:
    """What the cost clock counts an hour of one node at, by purchase option; spot at its maximum price."""
    price = on_demand(spec, region)
    if price is None:
        return None
    return {"on-demand": price, "spot": float(max_price(price))}


def description_block(spec: JobSpec, region: str) -> dict[str, Any] | None:
    """job.json's `cost`: the cap and the prices the nodes' clock counts (None without --max-cost)."""
    prices = clock_prices(spec, region)
    if spec.max_cost is None or prices is None:
        return None
    return {"max_usd": spec.max_cost, "usd_per_hour": prices}


def stop_reserve_s() -> float:
    """How long the nodes' stop takes, as the agent counts it (its defaults), plus a tick to notice."""
    from .agent.costclock import TICK_S, reserve_s
    from .agent.job import Settings

    return reserve_s(Settings()) + TICK_S


def check(spec: JobSpec, region: str, cost: dict[str, Any]) -> Check:
    """--max-cost on EC2: enforced by the nodes, so it refuses only a cap that cannot pay for a
    short run and its stop; otherwise it says whether and when the nodes stop the job."""
    from ...pricing import MAX_COST_CHECK

    assert spec.max_cost is not None
    name = f"{MAX_COST_CHECK} {spec.max_cost}"
    prices = clock_prices(spec, region)
    worst = cost.get("worst_case_usd")
    if prices is None or worst is None:
        return Check(name, False, "no price known to count the cost by")
    per_node = max(prices.values()) if spec.spot else prices["on-demand"]
    rate = spec.nodes * per_node
    least = rate * (MIN_USEFUL_S + stop_reserve_s()) / 3600
    if spec.max_cost < least:
        return Check(
            name,
            False,
            f"${spec.max_cost:g} cannot pay for {spec.nodes} node(s) to boot, train 15 min and stop with a checkpoint "
            f"(${least:.2f} at ${per_node:.4g}/h each): raise --max-cost or use fewer nodes",
        )
    if worst <= spec.max_cost:
        return Check(name, True, f"worst case ${worst} (every restart included): the cap is never reached")
    hours = (spec.max_cost / rate) - stop_reserve_s() / 3600
    return Check(
        name,
        True,
        f"worst case ${worst}: the nodes stop the job with a checkpoint before ${spec.max_cost:g} "
        f"(after about {hours:.2g} h of {spec.nodes} node(s) at ${per_node:.4g}/h each"
        + (", spot counted at its maximum price" if spec.spot else "")
        + ")",
    )


def limits(spec: JobSpec, recovering: bool) -> str:
    """The plan's words on what the time limit and the cap cover, and what happens at the end."""
    deadline = f"max-run {_hours(spec.max_run)} counts from submit"
    cap = f" and --max-cost ${spec.max_cost:g}" if spec.max_cost is not None else ""
    if recovering:
        covers = (
            f"{deadline}{cap} cover the whole lineage: every attempt and every node, the group's replacements "
            f"included (a restart does not start them again); after the last restart (--max-restarts "
            f"{spec.ec2.max_restarts}) the lineage ends Interrupted and the group launches nothing more"
        )
    else:
        after = "nothing restarts it"
        if spec.spot:
            after = "a spot interruption ends the job Interrupted; " + after
        covers = f"{deadline}{cap} cover this job's {spec.nodes} node(s); {after}"
    ends = (
        f"; at max-run the nodes stop with a checkpoint and every instance ends by max-run + {HARD_STOP_GRACE_MIN} min"
    )
    if spec.max_cost is not None:
        ends += "; at the cap the nodes stop with a checkpoint (Stopped, reason max-cost)"
    resume = "; `distrain-cloud resume` continues from the last checkpoint, as a new job with its own limits"
    return covers + ends + resume


def apply(plan: Plan, spec: JobSpec, region: str) -> Plan:
    """`plan` with the EC2 worst case, --max-cost's check and the limits line (after pricing's
    own cost and check, which this replaces)."""
    from ...pricing import MAX_COST_CHECK

    recovering = payload_of(plan).parts.recovering
    cost = worst_case(spec, region, plan.cost or {}, recovering) if plan.cost else plan.cost
    checks = [c for c in plan.checks if not c.name.startswith(MAX_COST_CHECK)]
    if spec.max_cost is not None:
        checks.append(check(spec, region, cost or {}))
    return dataclasses.replace(
        plan, cost=cost, checks=checks, summary={**plan.summary, "limits": limits(spec, recovering)}
    )


def with_max_price(request: dict[str, Any], lineage: dict[str, Any] | None, spec: JobSpec, region: str) -> None:
    """Set the spot maximum price the clock counts (a capped spot job only), in the RunInstances
    request and, for a lineage, the group's instances distribution (a launch template used by a
    mixed instances policy may not ask for spot itself)."""
    prices = clock_prices(spec, region)
    if spec.max_cost is None or not spec.spot or prices is None:
        return
    price = max_price(prices["spot"])
    if "InstanceMarketOptions" in request:
        request["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] = price
    if lineage:
        lineage["CreateAutoScalingGroup"]["MixedInstancesPolicy"]["InstancesDistribution"]["SpotMaxPrice"] = price


def clock_status(
    region: str, bucket: str, prefix: str, name: str, description: dict[str, Any], *, now: float | None = None
) -> str | None:
    """`status`'s line on a capped job: what its nodes' cost clock has counted, against the cap;
    None without a cap. Advisory: a part that is not one is skipped, a failed look is said."""
    import time

    from distrain_cloud.infra import aws
    from distrain_cloud.infra.errors import UserError

    from . import layout
    from .agent.costclock import MAX_PARTS, STALE_TICKS, TICK_S, part_of, spend
    from .status import read_json

    block = description.get("cost")
    cap = block.get("max_usd") if isinstance(block, dict) else None
    if not isinstance(cap, (int, float)) or isinstance(cap, bool):
        return None
    folder = layout.job_key(prefix, name, layout.COST) + "/"
    try:
        s3 = aws.client("s3", region, max_attempts=2)
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=folder, MaxKeys=MAX_PARTS).get("Contents", [])
        parts = []
        for item in listed:
            try:
                found = part_of(read_json(s3, bucket, item["Key"]))
            except UserError:  # planted or garbled: the nodes skip it too
                found = None
            if found is not None:
                parts.append(found)
    except Exception as e:
        return f"the nodes' cost clock was not read ({aws.error_code(e) or type(e).__name__}); --max-cost ${cap:g}"
    counted = spend(parts, time.time() if now is None else now, STALE_TICKS * TICK_S)
    return (
        f"${counted.usd:.2f} of --max-cost ${cap:g} counted by the nodes ({counted.instances} instance(s), spot at "
        "its maximum price); they stop the job with a checkpoint before the cap"
    )
