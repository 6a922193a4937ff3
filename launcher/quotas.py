"""Quota checks with what is already running: the limit against current usage plus this job.

A quota is the account's, shared by everything running in the region, so comparing it with this
job alone passes jobs AWS then refuses (after the code bundle, the job role and, on EC2, the
first attempt were paid for). Each check here reads the quota (Service Quotas) and the usage
(EC2: the running and pending instances of the quota's class, on-demand and spot apart;
SageMaker: the in-progress training jobs on the instance type) and fails, in one line with the
numbers and the quota's name as the Service Quotas console shows it, when they do not fit.

Advisory where AWS does not answer: a quota that cannot be read is a skipped check ("not
checked"), never a refusal. Every field of an answer is checked before it is counted.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .plan import Check

if TYPE_CHECKING:
    from .spec import JobSpec

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
_MAX_PAGES = 20  # DescribeInstances pages of 1000; ListTrainingJobs pages of 100
_MAX_DESCRIBED = 100  # in-progress training jobs described one by one


def ec2_quota_class(instance_type: str) -> str | None:
    match = re.match(r"[a-z]+", instance_type)
    return _CLASSES.get(match.group(0)) if match else None


def ec2_vcpu_check(spec: JobSpec, region: str) -> Check:
    """The vCPU quota of the job's instance class (on-demand or spot) against the vCPUs of that
    class already running or pending in the region plus this job's."""
    from distrain_cloud.infra import aws

    from .catalog import lookup

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
        limit = _number(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
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

    from .catalog import _CATALOG

    ec2 = aws.client("ec2", region, max_attempts=2)
    types: list[str] = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
        PaginationConfig={"MaxItems": _MAX_PAGES * 1000, "PageSize": 1000},
    )
    for page in pages:
        for reservation in _list(page.get("Reservations")):
            for instance in _list(reservation.get("Instances") if isinstance(reservation, dict) else None):
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
        for info in _list(answer.get("InstanceTypes")):
            count = _number((info.get("VCpuInfo") or {}).get("DefaultVCpus")) if isinstance(info, dict) else None
            if count is not None and isinstance(info.get("InstanceType"), str):
                vcpus[info["InstanceType"]] = int(count)
    missing = [t for t in types if t not in vcpus]
    if missing:
        raise LookupError(f"vCPUs of {', '.join(sorted(set(missing)))} unknown")
    return sum(vcpus[t] for t in types), len(types)


def sagemaker_instance_check(spec: JobSpec, region: str) -> Check:
    """SageMaker's per-type quota ("ml.g5.12xlarge for [spot ]training job usage") against the
    instances of that type the in-progress training jobs hold plus this job's."""
    from distrain_cloud.infra import aws

    console = f"{spec.instance} for {'spot ' if spec.spot else ''}training job usage"
    name = f"quota: {console}"
    try:
        limit = _sagemaker_quota(region, console)
    except Exception as e:  # no permission or not answered: say so, don't block
        return Check(name, None, f"not checked ({aws.error_code(e) or type(e).__name__})")
    if limit is None:
        return Check(name, None, "Service Quotas did not list it")
    try:
        in_use, jobs = _sagemaker_instances_in_use(region, spec.instance, spec.spot)
    except Exception as e:
        why = aws.error_code(e) or type(e).__name__
        return Check(
            name, limit >= spec.nodes, f"{limit:g} allowed, {spec.nodes} needed; in-progress jobs not read ({why})"
        )
    total = in_use + spec.nodes
    ok = total <= limit
    detail = f"{limit:g} allowed, {in_use} in use by {jobs} in-progress job(s), {spec.nodes} needed"
    if not ok:
        detail += (
            f": {total} > {limit:g}; wait for those jobs, stop one (`distrain-cloud cancel JOB`) or request an "
            f'increase to at least {total} for "{console}" in the Service Quotas console'
        )
    return Check(name, ok, detail)


def sagemaker_checks(spec: JobSpec, region: str) -> list[Check]:
    """The SageMaker preflight's quota checks: the instance quota, and with --keep-alive the
    warm pool's."""
    checks = [sagemaker_instance_check(spec, region)]
    if spec.sagemaker.keep_alive:
        checks.append(sagemaker_warm_pool_check(spec, region))
    return checks


def sagemaker_warm_pool_check(spec: JobSpec, region: str) -> Check:
    """Advisory: SageMaker keeps a warm pool only within the account's warm pool quota for the
    type (0 until raised), and otherwise runs the job and keeps nothing; so a short quota is
    said, not refused (it costs nothing)."""
    from distrain_cloud.infra import aws

    name = f"warm pool quota: {spec.instance}"
    try:
        found = _sagemaker_quota(region, None, warm_pool_of=spec.instance)
    except Exception as e:
        return Check(name, None, f"not checked ({aws.error_code(e) or type(e).__name__})")
    if found is None:
        return Check(name, None, "Service Quotas listed no warm pool quota for it")
    console, limit = found
    if limit >= spec.nodes:
        return Check(name, True, f"{console}: {limit:g} allowed, {spec.nodes} needed")
    return Check(
        name,
        None,
        f"{console}: {limit:g} allowed, {spec.nodes} needed: the job runs but SageMaker keeps no warm pool after it; "
        f"request an increase in the Service Quotas console, or drop --keep-alive",
    )


def _sagemaker_quota(region: str, console: str | None, *, warm_pool_of: str = "") -> Any:
    """The value of SageMaker quota `console`; or, with `warm_pool_of`, (name, value) of the warm
    pool quota of that instance type (its name holds the type and "warm pool"). None: not listed."""
    from distrain_cloud.infra import aws

    quotas = aws.client("service-quotas", region, max_attempts=2)
    for page in quotas.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker"):
        for q in _list(page.get("Quotas")):
            if not isinstance(q, dict) or not isinstance(q.get("QuotaName"), str):
                continue
            quota_name = q["QuotaName"]
            if warm_pool_of:
                words = quota_name.lower().split()
                if warm_pool_of in words and "warm" in words and "pool" in words:
                    value = _number(q.get("Value"))
                    return None if value is None else (quota_name[:200], value)
            elif quota_name == console:
                return _number(q.get("Value"))
    return None


def _sagemaker_instances_in_use(region: str, instance_type: str, spot: bool) -> tuple[int, int]:
    """(instances of `instance_type`, jobs holding them) among the in-progress training jobs
    that are spot (or not) like this one."""
    from distrain_cloud.infra import aws

    sagemaker = aws.client("sagemaker", region, max_attempts=2)
    names: list[str] = []
    pages = sagemaker.get_paginator("list_training_jobs").paginate(
        StatusEquals="InProgress", PaginationConfig={"MaxItems": _MAX_PAGES * 100, "PageSize": 100}
    )
    for page in pages:
        for job in _list(page.get("TrainingJobSummaries")):
            if isinstance(job, dict) and isinstance(job.get("TrainingJobName"), str):
                names.append(job["TrainingJobName"])
    if len(names) > _MAX_DESCRIBED:
        raise LookupError(f"{len(names)} in-progress jobs: too many to describe")
    instances = jobs = 0
    for job_name in names:
        described = sagemaker.describe_training_job(TrainingJobName=job_name)
        if bool(described.get("EnableManagedSpotTraining")) != spot:
            continue
        config = described.get("ResourceConfig") if isinstance(described.get("ResourceConfig"), dict) else {}
        groups = _list(config.get("InstanceGroups")) or [config]  # a heterogeneous cluster lists groups
        held = sum(
            int(_number(g.get("InstanceCount")) or 0)
            for g in groups
            if isinstance(g, dict) and g.get("InstanceType") == instance_type
        )
        if held:
            instances, jobs = instances + held, jobs + 1
    return instances, jobs


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < 1e12 else None
