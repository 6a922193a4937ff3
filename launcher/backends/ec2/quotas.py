"""EC2's vCPU quota with what is already running: the limit against current usage plus this job.

A quota is the account's, shared by everything running in the region, so comparing it with this
job alone passes jobs AWS then refuses (after the code bundle, the job role and the first attempt
were paid for). The check reads the quota (Service Quotas) and the usage (the running and pending
instances of the quota's class, on-demand and spot apart) and fails, in one line with the numbers
and the quota's name as the Service Quotas console shows it, when they do not fit.

Advisory where AWS does not answer: a quota that cannot be read is a skipped check ("not
checked"), never a refusal. Every field of an answer is checked before it is counted
(`cloud.as_list`, `cloud.as_number`). SageMaker's quotas: backends/sagemaker/quotas.py.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ...plan import Check
from ..cloud import as_list, as_number

if TYPE_CHECKING:
    from ...spec import JobSpec

# EC2's vCPU quotas: (class, spot) -> (Service Quotas code, the name its console shows).
EC2_VCPU_QUOTAS = {
    ("P", False): ("L-417A185B", "Running On-Demand P instances"),
    ("G and VT", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("Standard", False): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("P", True): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G and VT", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("Standard", True): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
# The letters before a type's generation number name its quota class ("g4dn" -> "g", "vt1" -> "vt").
_CLASSES = {"p": "P", "g": "G and VT", "vt": "G and VT"} | {c: "Standard" for c in "acdhimrtz"}
_MAX_PAGES = 20  # DescribeInstances pages of 1000


def ec2_quota_class(instance_type: str) -> str | None:
    match = re.match(r"[a-z]+", instance_type)
    return _CLASSES.get(match.group(0)) if match else None


def ec2_vcpu_check(spec: JobSpec, region: str) -> Check:
    """The vCPU quota of the job's instance class (on-demand or spot) against the vCPUs of that
    class already running or pending in the region plus this job's."""
    from distrain_cloud.infra import aws

    from ...catalog import lookup

    instance = lookup(spec.instance)
    kind = ec2_quota_class(instance.name)
    name = f"vCPU quota: {'spot' if spec.spot else 'on-demand'} {kind or instance.name.split('.')[0]} instances"
    if kind is None:
        return Check(name, None, f"not checked: no known vCPU quota class for {instance.name}")
    code, console = EC2_VCPU_QUOTAS[(kind, spec.spot)]
    need = spec.nodes * instance.vcpus
    try:
        in_use, count = _ec2_vcpus_in_use(region, kind, spec.spot)
    except Exception as e:  # not answered: the quota alone is still worth reading
        in_use, count, usage_error = None, 0, aws.error_code(e) or type(e).__name__
    else:
        usage_error = ""
    try:
        quotas = aws.client("service-quotas", region, max_attempts=2)
        limit = as_number(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except Exception as e:  # no permission to ask, or not answered (moto has no EC2 quotas)
        seen = f"; {in_use} vCPUs in use" if in_use is not None else ""
        return Check(name, None, f"{console}: not checked ({aws.error_code(e) or type(e).__name__}){seen}")
    if limit is None:
        return Check(name, None, f"{console}: Service Quotas gave no value")
    if in_use is None:
        ok = limit >= need
        return Check(
            name,
            ok,
            f"{console}: {limit:g} vCPUs allowed, {need} needed; usage not read ({usage_error})"
            + ("" if ok else f"; request an increase to at least {need} in the Service Quotas console"),
        )
    total = in_use + need
    ok = total <= limit
    detail = (
        f"{console}: {limit:g} vCPUs allowed, {in_use} in use by {count} running instance(s), "
        f"{need} needed by this job ({spec.nodes} x {instance.vcpus})"
    )
    if not ok:
        detail += (
            f": {total} > {limit:g}; stop instances of this class or request an increase to at least {total} "
            f"in the Service Quotas console (quota {code})"
        )
    return Check(name, ok, detail)


def _ec2_vcpus_in_use(region: str, kind: str, spot: bool) -> tuple[int, int]:
    """(vCPUs, instances) of the running and pending instances of quota class `kind`, spot or
    on-demand, in `region`."""
    from distrain_cloud.infra import aws

    from ...catalog import _CATALOG

    ec2 = aws.client("ec2", region, max_attempts=2)
    types: list[str] = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
        PaginationConfig={"MaxItems": _MAX_PAGES * 1000, "PageSize": 1000},
    )
    for page in pages:
        for reservation in as_list(page.get("Reservations")):
            for instance in as_list(reservation.get("Instances") if isinstance(reservation, dict) else None):
                if not isinstance(instance, dict):
                    continue
                kind_of, lifecycle = instance.get("InstanceType"), instance.get("InstanceLifecycle")
                if not isinstance(kind_of, str) or ec2_quota_class(kind_of) != kind:
                    continue
                # Spot instances count against the spot quota only; capacity blocks against neither.
                if (lifecycle == "spot") == spot and lifecycle in (None, "spot"):
                    types.append(kind_of)
    vcpus = {t: _CATALOG[t].vcpus for t in set(types) if t in _CATALOG}
    unknown = sorted(set(types) - set(vcpus))
    for start in range(0, len(unknown), 100):
        answer = ec2.describe_instance_types(InstanceTypes=unknown[start : start + 100])
        for info in as_list(answer.get("InstanceTypes")):
            count = as_number((info.get("VCpuInfo") or {}).get("DefaultVCpus")) if isinstance(info, dict) else None
            if count is not None and isinstance(info.get("InstanceType"), str):
                vcpus[info["InstanceType"]] = int(count)
    missing = [t for t in types if t not in vcpus]
    if missing:
        raise LookupError(f"vCPUs of {', '.join(sorted(set(missing)))} unknown")
    return sum(vcpus[t] for t in types), len(types)
