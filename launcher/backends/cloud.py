"""What every cloud backend shares: region, cost and budget, the bucket check, and the upload.

A cloud backend plans without AWS (`plan`), checks what only AWS can tell (`preflight`), then
acts: refuse failed checks, make sure the bucket is there, upload the code bundle, send the
request. The pieces here are those steps, so a second cloud backend reuses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

from ..plan import Check, Plan

if TYPE_CHECKING:
    from ..catalog import InstanceType

SPOT_PRICE_RANGE = (0.3, 0.7)  # typical spot price as a fraction of on-demand; never above 1.0
ASSUMED_REGION = "us-east-1"


def plan_region(explicit: str | None) -> tuple[str, Check]:
    """The region a pure plan uses: the configured one, else an assumption the plan says out loud
    (a real submit insists on a configured region, in preflight)."""
    from distrain_cloud.infra import aws

    try:
        return aws.region(explicit), Check("region", True)
    except UserError:
        if explicit:
            raise  # a region was named and is unknown: that is an error, not an assumption
        return ASSUMED_REGION, Check("region", None, f"none configured; assumed {ASSUMED_REGION} (pass --region)")


def estimate_cost(instance: InstanceType, region: str, nodes: int, max_run: int, spot: bool) -> dict[str, Any]:
    """The worst case (every node for the whole of max_run at the list price), and the spot range."""
    from ..catalog import hourly_price

    price = hourly_price(instance, region)
    if price is None:
        return {"hourly_usd": None, "note": f"no list price for {instance.name} in {region}"}
    hours = max_run / 3600
    worst = round(nodes * price * hours, 2)
    cost: dict[str, Any] = {
        "hourly_usd": round(nodes * price, 2),
        "max_run_hours": round(hours, 2),
        "worst_case_usd": worst,
    }
    if spot:
        lo, hi = SPOT_PRICE_RANGE
        cost["spot_typical_usd"] = f"{worst * lo:.2f}-{worst * hi:.2f}"
    return cost


def budget_check(max_cost: float, cost: dict[str, Any], nodes: int) -> Check:
    name = f"cost <= --max-cost {max_cost}"
    worst = cost.get("worst_case_usd")
    if worst is None:
        return Check(name, False, "no price known to compare")
    return Check(name, worst <= max_cost, f"worst case ${worst} ({nodes} node(s) x max_run)")


def bucket_check(bucket: str, region: str, *, named_by_user: bool) -> Check:
    """Whether the job's bucket is there and ours (read-only: HeadBucket)."""
    from distrain_cloud.infra import aws

    try:
        aws.client("s3", region).head_bucket(Bucket=bucket)
        return Check("bucket exists", True, bucket)
    except Exception as e:
        if aws.error_code(e) in ("403", "AccessDenied"):  # another account's, or not ours to use
            return Check("bucket usable", False, f"{bucket}: access denied; name another bucket")
        if named_by_user:
            return Check("bucket exists", False, f"{bucket}: create it or drop sagemaker.bucket")
        return Check("bucket exists", True, f"{bucket} will be created")


def upload_code(plan: Plan) -> bool:
    """Make sure the plan's bucket exists, then upload its code bundle unless the same bytes
    are there already (the key is the bundle's sha256). Returns whether it uploaded."""
    from distrain_cloud.infra import aws, resources

    region, bucket = plan.payload["region"], plan.payload["bucket"]
    with aws.translate_errors():
        resources.ensure_bucket(bucket, region)
        return resources.upload_if_absent(bucket, plan.payload["code_key"], plan.payload["bundle"], region)
