"""The current EC2 spot price (DescribeSpotPriceHistory), and a spot plan's cost redone with it.

EC2-only: SageMaker publishes no current managed-spot price. Advisory: where AWS does not answer,
the worst case stays at the on-demand list price (launcher/pricing.py), the most spot can cost.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from ...pricing import SpotPrice

if TYPE_CHECKING:
    from ...plan import Plan
    from ...spec import JobSpec

SPOT_PRODUCT = "Linux/UNIX"  # the DLAMIs are Linux; "(Amazon VPC)" variants are the same price
_MAX_PLAUSIBLE_USD = 10_000.0  # per instance-hour: a spot price above this is not a price


def current_spot_price(instance_type: str, region: str) -> tuple[SpotPrice | None, str]:
    """The current EC2 spot price of `instance_type` in `region` (DescribeSpotPriceHistory from
    now: the price in effect in each zone), or None and why not. Advisory: two attempts, and
    every field of the answer is checked before it is believed."""
    import datetime as dt

    from distrain_cloud.infra import aws

    from ..cloud import refuse_api_problems

    now = dt.datetime.now(dt.timezone.utc)
    request = {
        "InstanceTypes": [instance_type],
        "ProductDescriptions": [SPOT_PRODUCT],
        "StartTime": now,
        "MaxResults": 100,
    }
    refuse_api_problems("ec2", "DescribeSpotPriceHistory", request, (("InstanceTypes", "--instance"),), "EC2")
    try:
        history = aws.client("ec2", region, max_attempts=2).describe_spot_price_history(**request)
    except Exception as e:  # no permission, throttled, no credentials: the list price stands
        return None, f"the current spot price was not read ({aws.error_code(e) or type(e).__name__})"
    newest: dict[str, tuple[Any, float]] = {}
    entries = history.get("SpotPriceHistory") if isinstance(history, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("InstanceType") != instance_type:
            continue
        zone, product = entry.get("AvailabilityZone"), entry.get("ProductDescription")
        if not (isinstance(zone, str) and 0 < len(zone) <= 64 and zone.isprintable()):
            continue
        if not (isinstance(product, str) and product.startswith(SPOT_PRODUCT)):
            continue
        try:
            usd = float(entry.get("SpotPrice"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(usd) and 0 < usd < _MAX_PLAUSIBLE_USD):
            continue
        stamp = entry.get("Timestamp")
        key = stamp.timestamp() if isinstance(stamp, dt.datetime) else 0.0
        if zone not in newest or key >= newest[zone][0]:
            newest[zone] = (key, usd)
    if not newest:
        return None, f"EC2 gave no current spot price for {instance_type} in {region}"
    return (
        SpotPrice(
            usd_per_hour=max(usd for _, usd in newest.values()),
            zones=tuple(sorted(newest)),
            read_at=now.strftime("%Y-%m-%dT%H:%MZ"),
        ),
        "",
    )


def with_current_spot_price(plan: Plan, spec: JobSpec, region: str) -> Plan:
    """An EC2 spot plan's cost and --max-cost check redone with the spot price AWS gives now
    (preflight: `--dry-run --check` and submit); other plans as they are."""
    from ...catalog import lookup
    from ...pricing import MAX_COST_CHECK, budget_check, estimate

    if not spec.spot:
        return plan
    instance = lookup(spec.instance)
    price, why = current_spot_price(instance.name, region)
    note = "" if price else f"{why}: the worst case uses the on-demand list price, the most spot can cost"
    cost = estimate(instance, region, spec.nodes, spec.max_run, True, spot_price=price, spot_note=note)
    checks = [c for c in plan.checks if not c.name.startswith(MAX_COST_CHECK)]
    if spec.max_cost is not None:
        checks.append(budget_check(spec.max_cost, cost, spec.nodes))
    return dataclasses.replace(plan, cost=cost, checks=checks)
