"""SageMaker's quotas with what is already running: the limit against current usage plus this job.

A quota is the account's, shared by everything running in the region, so comparing it with this
job alone passes jobs AWS then refuses (after the code bundle and the job role were made). Each
check reads the quota (Service Quotas) and the usage (the in-progress training jobs on the
instance type) and fails, in one line with the numbers and the quota's name as the Service
Quotas console shows it, when they do not fit.

Advisory where AWS does not answer: a quota that cannot be read is a skipped check ("not
checked"), never a refusal. Every field of an answer is checked before it is counted
(`cloud.as_list`, `cloud.as_number`). EC2's vCPU quotas: backends/ec2/quotas.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...plan import Check
from ..cloud import as_list, as_number

if TYPE_CHECKING:
    from ...spec import JobSpec

_MAX_PAGES = 20  # ListTrainingJobs pages of 100
_MAX_DESCRIBED = 100  # in-progress training jobs described one by one


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
        for q in as_list(page.get("Quotas")):
            if not isinstance(q, dict) or not isinstance(q.get("QuotaName"), str):
                continue
            quota_name = q["QuotaName"]
            if warm_pool_of:
                words = quota_name.lower().split()
                if warm_pool_of in words and "warm" in words and "pool" in words:
                    value = as_number(q.get("Value"))
                    return None if value is None else (quota_name[:200], value)
            elif quota_name == console:
                return as_number(q.get("Value"))
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
        for job in as_list(page.get("TrainingJobSummaries")):
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
        groups = as_list(config.get("InstanceGroups")) or [config]  # a heterogeneous cluster lists groups
        held = sum(
            int(as_number(g.get("InstanceCount")) or 0)
            for g in groups
            if isinstance(g, dict) and g.get("InstanceType") == instance_type
        )
        if held:
            instances, jobs = instances + held, jobs + 1
    return instances, jobs
