"""Generate the on-demand price snapshot (launcher/data/prices.json) from a published price source.

    python -m distrain_cloud.launcher.pricelist --skypilot-csv vms.csv --commit SHA --as-of DATE
        # SkyPilot's public AWS catalog (skypilot-org/skypilot-catalog, catalogs/v9/aws/vms.csv),
        # generated from the AWS Price List; EC2 types only (it has no SageMaker prices)
    python -m distrain_cloud.launcher.pricelist --offer AmazonEC2=ec2-us-east-1.json \\
        --offer AmazonSageMaker=sagemaker-us-east-1.json ...      # bulk offer files, read from disk
    python -m distrain_cloud.launcher.pricelist --api            # the Price List Query API (GetProducts)

SkyPilot's catalog is a CSV with one row per instance type and availability zone (InstanceType,
AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, Price, SpotPrice, Region, ...; Price is the
on-demand Linux price per hour); its figures for a SageMaker type's EC2 twin are not SageMaker's,
so the ml.* figures of the snapshot are carried over from the snapshot it replaces, with their
source and date, and say so. With the Price List (--offer, --api)
every instance type of launcher/catalog.py gets its on-demand price in each of the
catalog's regions, read from products of the Price List's own schema: a product's attributes
(EC2: instanceType, location/regionCode, operatingSystem Linux, tenancy Shared, preInstalledSw NA,
capacitystatus Used; SageMaker: instanceName, component Training) and its OnDemand term's
hourly priceDimension (pricePerUnit.USD). A type the Price List does not price in a region is
left out of the snapshot (the plan then says it has no price), never guessed. Not imported by
the CLI: only this generator, and the tests, read offer files.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from distrain_cloud.infra.errors import UserError

SERVICES = ("AmazonEC2", "AmazonSageMaker")
# The Price List names regions by location before (and beside) its regionCode attribute.
LOCATIONS = {
    "US East (N. Virginia)": "us-east-1",
    "US West (Oregon)": "us-west-2",
    "EU (Ireland)": "eu-west-1",
    "Europe (Ireland)": "eu-west-1",
}
# The filters GetProducts is asked with (and an offer file's products must match).
EC2_ATTRIBUTES = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
SAGEMAKER_ATTRIBUTES = {"component": "Training"}
PRICING_REGION = "us-east-1"  # the Price List Query API's endpoints: us-east-1, eu-central-1, ap-south-1
SNAPSHOT = Path(__file__).resolve().parent / "data" / "prices.json"


def products(offer: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(product, its OnDemand terms) of each product in `offer`: a bulk offer file ({"products":
    {sku: product}, "terms": {"OnDemand": {sku: terms}}}), or a GetProducts answer or its PriceList
    (items of {"product": ..., "terms": {"OnDemand": ...}}, as objects or JSON strings)."""
    if isinstance(offer, dict) and isinstance(offer.get("products"), dict):
        on_demand = (offer.get("terms") or {}).get("OnDemand") or {}
        for sku, product in offer["products"].items():
            if isinstance(product, dict):
                yield product, on_demand.get(sku) or {}
        return
    if isinstance(offer, dict):  # a saved GetProducts answer (`aws pricing get-products ... > FILE`)
        offer = offer.get("PriceList")
    for item in offer if isinstance(offer, list) else []:
        if isinstance(item, str):
            item = json.loads(item)
        if isinstance(item, dict) and isinstance(item.get("product"), dict):
            yield item["product"], (item.get("terms") or {}).get("OnDemand") or {}


def hourly_usd(terms: dict[str, Any]) -> float | None:
    """The one hourly USD price of a product's OnDemand terms, or None when it has none (a
    product with two different hourly prices is refused: the snapshot would have to guess)."""
    found = set()
    for term in terms.values():
        for dimension in (term.get("priceDimensions") or {}).values() if isinstance(term, dict) else ():
            unit = str(dimension.get("unit", "")).lower()
            usd = (dimension.get("pricePerUnit") or {}).get("USD")
            if unit in ("hrs", "hours", "hour") and usd is not None:
                found.add(float(usd))
    if len(found) > 1:
        raise UserError(f"a product has {len(found)} different hourly prices ({sorted(found)}); which one is meant?")
    return found.pop() if found else None


def _region(attributes: dict[str, Any]) -> str | None:
    return attributes.get("regionCode") or LOCATIONS.get(str(attributes.get("location", "")))


def on_demand_prices(
    service: str, offer: Any, wanted: Iterable[str], regions: Iterable[str]
) -> dict[str, dict[str, float]]:
    """instance type -> region -> on-demand USD per hour, for the `wanted` types of `service`
    ("AmazonEC2": EC2 names; "AmazonSageMaker": ml.* names) in `regions`."""
    wanted, regions = set(wanted), set(regions)
    name_key, match = (
        ("instanceType", EC2_ATTRIBUTES) if service == "AmazonEC2" else ("instanceName", SAGEMAKER_ATTRIBUTES)
    )
    table: dict[str, dict[str, float]] = {}
    for product, terms in products(offer):
        attributes = product.get("attributes") or {}
        name, region = attributes.get(name_key), _region(attributes)
        if name not in wanted or region not in regions:
            continue
        if any(attributes.get(k) != v for k, v in match.items()):
            continue  # Windows, dedicated, reserved capacity, hosting, notebooks, ...
        if "spot" in str(attributes.get("usagetype", "")).lower():
            continue
        price = hourly_usd(terms)
        if price is None or price <= 0:
            continue
        seen = table.setdefault(name, {}).get(region)
        if seen is not None and seen != price:
            raise UserError(f"{service}: {name} in {region} has two on-demand prices ({seen} and {price})")
        table[name][region] = price
    return table


def snapshot(
    tables: dict[str, dict[str, dict[str, float]]],
    *,
    as_of: str,
    source: str,
    regions: Iterable[str],
    sources: dict[str, dict[str, str]] | None = None,
    unverified: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The snapshot's document: every price found, its date and where it came from. `sources`:
    per family ("ec2", "sagemaker": catalog.family) the date, the source and the short label cost
    lines show; by default both are `as_of` and `source`."""
    prices: dict[str, dict[str, float]] = {}
    for table in tables.values():
        for name, by_region in table.items():
            prices.setdefault(name, {}).update(by_region)
    label = source if len(source) <= 40 else "AWS Price List"
    default = {"as_of": as_of, "source": source, "label": label}
    return {
        "as_of": as_of,
        "source": source,
        "sources": sources or {"ec2": default, "sagemaker": default},
        "currency": "USD",
        "unit": "per instance-hour, on-demand, Linux, shared tenancy",
        "regions": list(regions),
        "prices": {name: dict(sorted(prices[name].items())) for name in sorted(prices)},
        "unverified": {name: dict(sorted(why.items())) for name, why in sorted((unverified or {}).items())},
    }


SKYPILOT_REPOSITORY = "skypilot-org/skypilot-catalog"
SKYPILOT_FILE = "catalogs/v9/aws/vms.csv"


def skypilot_prices(
    rows: Iterable[dict[str, str]], wanted: Iterable[str], regions: Iterable[str]
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """instance type -> region -> on-demand USD per hour from SkyPilot's AWS catalog rows (one per
    zone; a row without a Price is a type AWS does not sell on demand there), and the hardware
    the rows disagree with the catalog on (GPU count, vCPUs, memory), said, never corrected."""
    from .catalog import lookup

    wanted, regions = set(wanted), set(regions)
    table: dict[str, dict[str, float]] = {}
    disagree: list[str] = []
    for row in rows:
        name, region = (row.get("InstanceType") or "").strip(), (row.get("Region") or "").strip()
        if name not in wanted or region not in regions:
            continue
        try:
            price = float((row.get("Price") or "").strip())
        except ValueError:
            continue  # no on-demand price in this zone
        if not (math.isfinite(price) and price > 0):
            continue
        seen = table.setdefault(name, {}).get(region)
        if seen is not None and seen != price:
            raise UserError(f"SkyPilot catalog: {name} in {region} has two on-demand prices ({seen} and {price})")
        table[name][region] = price
        instance = lookup(name)
        for column, ours in (
            ("AcceleratorCount", instance.gpus),
            ("vCPUs", instance.vcpus),
            ("MemoryGiB", instance.memory_gib),
        ):
            theirs = (row.get(column) or "").strip() or "0"
            try:
                if float(theirs) != ours:
                    disagree.append(f"{name}: {column} {theirs} in the SkyPilot catalog, {ours} in launcher/catalog.py")
            except ValueError:
                continue
    return table, sorted(set(disagree))


def carried_over(
    path: Path, names: Iterable[str]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]], dict[str, str]]:
    """The figures of `names` in the snapshot at `path`, their notes, and the source of the
    SageMaker figures there: what a source without SageMaker prices keeps."""
    old = json.loads(path.read_text())
    names = set(names)
    prices = {n: dict(by_region) for n, by_region in (old.get("prices") or {}).items() if n in names}
    notes = {n: dict(why) for n, why in (old.get("unverified") or {}).items() if n in names}
    source = (old.get("sources") or {}).get("sagemaker") or {  # a snapshot of one source for all
        "as_of": str(old.get("as_of", "")),
        "source": "hand-kept table of recalled SageMaker list prices, not read from the AWS Price List",
        "label": "recalled, not read from the Price List",
    }
    return prices, notes, dict(source)


def get_products_requests(service: str, name: str, region: str) -> dict[str, Any]:
    """The GetProducts request for one instance type in one region."""
    key, match = ("instanceType", EC2_ATTRIBUTES) if service == "AmazonEC2" else ("instanceName", SAGEMAKER_ATTRIBUTES)
    filters = {key: name, "regionCode": region, **match}
    return {
        "ServiceCode": service,
        "Filters": [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }


def from_api(wanted: dict[str, list[str]], regions: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Ask the Price List Query API (pricing:GetProducts) for each type in each region."""
    from distrain_cloud.infra import aws

    from .backends.cloud import refuse_api_problems

    tables: dict[str, dict[str, dict[str, float]]] = {}
    with aws.translate_errors():
        pricing = aws.client("pricing", PRICING_REGION)
        for service, names in wanted.items():
            items: list[Any] = []
            for name in names:
                for region in regions:
                    request = get_products_requests(service, name, region)
                    refuse_api_problems("pricing", "GetProducts", request, (), "the Price List API")
                    for page in pricing.get_paginator("get_products").paginate(**request):
                        items += page.get("PriceList") or []
            tables[service] = on_demand_prices(service, items, names, regions)
    return tables


def catalog_names() -> dict[str, list[str]]:
    from .catalog import all_instances

    names = [i.name for i in all_instances()]
    return {
        "AmazonEC2": [n for n in names if not n.startswith("ml.")],
        "AmazonSageMaker": [n for n in names if n.startswith("ml.")],
    }


def main(argv: list[str] | None = None) -> int:
    from .catalog import PRICE_REGIONS

    parser = argparse.ArgumentParser(prog="python -m distrain_cloud.launcher.pricelist", description=__doc__)
    parser.add_argument(
        "--skypilot-csv", type=Path, metavar="FILE", help="SkyPilot's AWS catalog (vms.csv), read from disk"
    )
    parser.add_argument("--commit", help="the skypilot-catalog commit the CSV was read at (40 hex digits)")
    parser.add_argument("--file", default=SKYPILOT_FILE, help=f"the CSV's path in its repository ({SKYPILOT_FILE})")
    parser.add_argument("--offer", action="append", default=[], metavar="SERVICE=FILE", help="a bulk offer file")
    parser.add_argument("--api", action="store_true", help="ask the Price List Query API (needs pricing:GetProducts)")
    parser.add_argument("--out", type=Path, default=SNAPSHOT, help="where to write the snapshot")
    parser.add_argument("--as-of", help="the snapshot's date (default: the offer's publication date, else today)")
    args = parser.parse_args(argv)
    wanted, regions = catalog_names(), list(PRICE_REGIONS)
    if args.skypilot_csv is not None:
        return _from_skypilot(args, wanted, regions)
    try:
        if args.api == bool(args.offer):
            raise UserError(
                "give --skypilot-csv FILE, --api or one --offer SERVICE=FILE per service, not two and not neither"
            )
        if args.api:
            tables = from_api(wanted, regions)
            as_of = args.as_of or dt.date.today().isoformat()
            source = "AWS Price List Query API (pricing:GetProducts)"
        else:
            tables, dates, files = {}, [], []
            for spec in args.offer:
                service, _, path = spec.partition("=")
                if service not in SERVICES or not path:
                    raise UserError(f"--offer {spec}: write SERVICE=FILE with SERVICE one of {', '.join(SERVICES)}")
                try:
                    offer = json.loads(Path(path).read_text())
                except (OSError, ValueError) as e:
                    raise UserError(f"--offer {spec}: not a readable JSON offer file ({e})") from e
                found = on_demand_prices(service, offer, wanted[service], regions)
                for name, by_region in found.items():
                    tables.setdefault(service, {}).setdefault(name, {}).update(by_region)
                if isinstance(offer, dict) and offer.get("publicationDate"):
                    dates.append(str(offer["publicationDate"])[:10])
                version = offer.get("version") if isinstance(offer, dict) else None
                files.append(f"{service} {version or '(a saved GetProducts answer)'}")
            as_of = args.as_of or (min(dates) if dates else dt.date.today().isoformat())
            source = "AWS Price List bulk offer files: " + ", ".join(files)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    document = snapshot(tables, as_of=as_of, source=source, regions=regions)
    prices = document["prices"]
    missing = [f"{n} {r}" for names in wanted.values() for n in names for r in regions if r not in prices.get(n, {})]
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}: {sum(map(len, document['prices'].values()))} prices as of {as_of}", file=sys.stderr)
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        print(f"note: no on-demand price for {len(missing)}: {', '.join(missing[:10])}{more}", file=sys.stderr)
    return 0


def _from_skypilot(args: argparse.Namespace, wanted: dict[str, list[str]], regions: list[str]) -> int:
    """--skypilot-csv: EC2 figures from SkyPilot's catalog, SageMaker's carried over."""
    try:
        if args.api or args.offer:
            raise UserError("--skypilot-csv: give it alone (not with --api or --offer)")
        if not (args.commit and re.fullmatch(r"[0-9a-f]{40}", args.commit)):
            raise UserError("--skypilot-csv needs --commit SHA: the skypilot-catalog commit it was read at (40 hex)")
        if not (args.as_of and re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.as_of)):
            raise UserError("--skypilot-csv needs --as-of YYYY-MM-DD: the day the CSV was read at that commit")
        try:
            with args.skypilot_csv.open(newline="", encoding="utf-8") as f:
                rows = csv.DictReader(f)
                if not {"InstanceType", "Price", "Region"} <= set(rows.fieldnames or ()):
                    raise UserError(f"--skypilot-csv {args.skypilot_csv}: no InstanceType, Price and Region columns")
                ec2, disagree = skypilot_prices(rows, wanted["AmazonEC2"], regions)
        except OSError as e:
            raise UserError(f"--skypilot-csv {args.skypilot_csv}: not readable ({e})") from e
        base = args.out if args.out.is_file() else SNAPSHOT
        sagemaker, notes, sagemaker_source = carried_over(base, wanted["AmazonSageMaker"])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = f"{SKYPILOT_REPOSITORY}, {args.file} at commit {args.commit}"
    ec2_source = {
        "as_of": args.as_of,
        "source": f"SkyPilot's public AWS catalog, generated from the AWS Price List ({where}; read {args.as_of})",
        "label": f"SkyPilot AWS catalog @{args.commit[:7]}",
    }
    carried = " (carried over: SkyPilot's catalog has no SageMaker prices)"
    if not sagemaker_source.get("source", "").endswith(carried):
        sagemaker_source["source"] = sagemaker_source.get("source", "") + carried
    document = snapshot(
        {"AmazonEC2": ec2, "AmazonSageMaker": sagemaker},
        as_of=args.as_of,
        source=f"EC2: {ec2_source['source']}. SageMaker: {sagemaker_source['source']}",
        regions=regions,
        sources={"ec2": ec2_source, "sagemaker": sagemaker_source},
        unverified=notes,
    )
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    found = sum(map(len, ec2.values()))
    print(f"wrote {args.out}: {found} EC2 prices as of {args.as_of} from {where}", file=sys.stderr)
    missing = [f"{n} {r}" for n in wanted["AmazonEC2"] for r in regions if r not in ec2.get(n, {})]
    if missing:
        print(f"note: the catalog prices no {len(missing)}: {', '.join(missing)}", file=sys.stderr)
    for line in disagree:
        print(f"note: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
