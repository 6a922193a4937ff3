"""What a job may cost: the on-demand price snapshot, the current EC2 spot price, the worst case.

The snapshot (launcher/data/prices.json, written by `python -m distrain_cloud.launcher.pricelist`
from SkyPilot's public AWS catalog or the AWS Price List) holds on-demand list prices with each
family's date and source; every cost line says both, and says so where a figure was recalled.
A spot job's worst case uses the current spot price where AWS is asked (`--dry-run --check`,
submit: DescribeSpotPriceHistory, the highest price of the region's zones now), else the
snapshot's on-demand price, which is also the most spot can cost (EC2's default maximum spot
price is the on-demand price).

Importing this module reads one small JSON file; boto3 is imported only to ask for a spot price.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .catalog import InstanceType
    from .plan import Check, Plan
    from .spec import JobSpec

SNAPSHOT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "prices.json")
SPOT_PRODUCT = "Linux/UNIX"  # the DLAMIs are Linux; "(Amazon VPC)" variants are the same price
_MAX_PLAUSIBLE_USD = 10_000.0  # per instance-hour: a spot price above this is not a price
MAX_COST_CHECK = "cost <= --max-cost"


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


def list_price_basis(instance_name: str, region: str) -> str:
    """How a cost line names the snapshot's figure: its date and its source ("AWS list price as of
    2026-11-28, SkyPilot AWS catalog @2c3d7ea"), or that it was recalled, not read from a list."""
    from .catalog import PRICES_SNAPSHOT

    source = PRICES_SNAPSHOT.source_of(instance_name)
    basis = f"AWS list price as of {source.as_of}"
    if region in PRICES_SNAPSHOT.unverified.get(instance_name, {}):
        return basis + ", recalled, not read from the Price List"
    return f"{basis}, {source.label}" if source.label else basis


@dataclass(frozen=True)
class SpotPrice:
    usd_per_hour: float  # the highest current price among the zones that answered
    zones: tuple[str, ...]
    read_at: str  # UTC, minutes


def estimate(
    instance: InstanceType,
    region: str,
    nodes: int,
    max_run: int,
    spot: bool,
    *,
    keep_alive: int = 0,
    spot_price: SpotPrice | None = None,
    spot_note: str = "",
) -> dict[str, Any]:
    """The plan's cost: the hourly price it uses (said with where it comes from and its date),
    and the worst case (every node for the whole of max_run, plus a warm pool's keep-alive)."""
    from .catalog import hourly_price

    price = hourly_price(instance, region)
    if price is None:
        return {"hourly_usd": None, "note": f"no list price for {instance.name} in {region}"}
    basis = list_price_basis(instance.name, region)
    hours = max_run / 3600
    cost: dict[str, Any] = {}
    if spot_price is not None:
        per_node = spot_price.usd_per_hour
        cost["price"] = (
            f"${per_node:.4g}/h per node, EC2 spot price now (highest of {', '.join(spot_price.zones)} at "
            f"{spot_price.read_at}); on-demand ${price:.4g}/h, {basis}"
        )
        cost["spot_ceiling_usd"] = round(nodes * price * hours, 2)  # spot never costs more than on-demand
    else:
        per_node = price
        cost["price"] = f"${price:.4g}/h per node on-demand, {basis}"
        if spot:
            cost["spot"] = spot_note or "the current spot price was not read: the worst case is the on-demand price"
    cost["hourly_usd"] = round(nodes * per_node, 2)
    cost["max_run_hours"] = round(hours, 2)
    worst = nodes * per_node * hours
    if keep_alive:
        # A warm pool keeps (and bills) the instances for keep_alive after the job ends.
        cost["keep_alive_usd"] = round(nodes * price * keep_alive / 3600, 2)
        worst += nodes * price * keep_alive / 3600
    cost["worst_case_usd"] = round(worst, 2)
    cost["basis"] = basis if spot_price is None else "EC2 spot price now"
    return cost


def budget_check(max_cost: float, cost: dict[str, Any], nodes: int) -> Check:
    from .plan import Check

    name = f"{MAX_COST_CHECK} {max_cost}"
    worst = cost.get("worst_case_usd")
    if worst is None:
        return Check(name, False, "no price known to compare")
    keep = " + keep-alive" if cost.get("keep_alive_usd") else ""
    return Check(name, worst <= max_cost, f"worst case ${worst}: {nodes} node(s) x max_run{keep}, {cost['basis']}")


def current_spot_price(instance_type: str, region: str) -> tuple[SpotPrice | None, str]:
    """The current EC2 spot price of `instance_type` in `region` (DescribeSpotPriceHistory from
    now: the price in effect in each zone), or None and why not. Advisory: two attempts, and
    every field of the answer is checked before it is believed."""
    import datetime as dt

    from distrain_cloud.infra import aws

    from .backends.cloud import refuse_api_problems

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
    from .catalog import lookup

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


def warm_pool(spec: JobSpec, cost: dict[str, Any]) -> str:
    """What the plan says of a SageMaker warm pool (--keep-alive): how long, and what it costs."""
    seconds = spec.sagemaker.keep_alive or 0
    usd = cost.get("keep_alive_usd")
    price = f" (${usd:.2f} if no job reuses it, {cost['basis']})" if usd is not None else ""
    return (
        f"{seconds} s after the job ends, {spec.nodes} x {spec.instance} stay warm for the next job of the same "
        f"instance settings{price}"
    )
