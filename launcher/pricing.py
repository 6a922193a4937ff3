"""What a job may cost: the on-demand price snapshot, the current EC2 spot price, the worst case.

The snapshot (launcher/data/prices.json, written by `python -m distrain_cloud.launcher.pricelist`
from SkyPilot's public AWS catalog or the AWS Price List) holds on-demand list prices with each
family's date and source; every cost line says both, and says so where a figure was recalled.
A spot job's worst case uses the current spot price where AWS is asked (`--dry-run --check`,
submit: DescribeSpotPriceHistory, the highest price of the region's zones now:
backends/ec2/spot_price.py), else the snapshot's on-demand price, which is also the most spot can
cost (EC2's default maximum spot price is the on-demand price). The snapshot itself is read by
catalog.py, which owns the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .catalog import InstanceType
    from .plan import Check

MAX_COST_CHECK = "cost <= --max-cost"


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
