"""The library under the CLI: plan a job spec, check the plan against AWS, act on it.

No printing of plans here.
"""

from __future__ import annotations

from .backends import get_backend
from .jobs import JobRef
from .plan import Plan
from .spec import JobSpec


def plan_job(spec: JobSpec, *, dry_run: bool = False, check: bool | None = None) -> Plan:
    """The plan of `spec`, made without any AWS call; then, when `check` (default: unless a dry
    run), its preflight: the read-only checks only AWS can answer, and the parts only AWS knows."""
    backend = get_backend(spec.backend)
    plan = backend.plan(spec)
    return backend.preflight(plan) if (not dry_run if check is None else check) else plan


def submit_job(plan: Plan, *, wait: bool = False) -> int:
    """Record where the job runs (first, so every job that may exist can be found), then start it."""
    from pathlib import Path

    from .jobs import write_record

    cwd = plan.request.get("cwd")
    write_record(plan, region=plan.payload.get("region"), workdir=Path(cwd).parent if cwd else None)
    return get_backend(plan.backend).submit(plan, wait=wait)


def resume_spec(job: JobRef) -> JobSpec:
    """The spec of a new attempt of `job`'s lineage: the spec it was submitted with (from this
    machine's record, else from what its backend kept), resuming from its checkpoints."""
    from distrain_cloud.infra.errors import UserError

    from .jobs import read_record

    record = read_record(job.name) or {}
    spec = JobSpec.model_validate(record["spec"]) if record.get("spec") else None
    if spec is None:
        remote = getattr(get_backend(job.backend), "job_spec", None)
        spec = remote(job) if remote else None
    if spec is None:
        raise UserError(
            f"no record of {job.name}'s job spec on this machine: submit the spec again with --resume-from {job.name}"
        )
    return spec.model_copy(update={"resume_from": job.name, "region": spec.region or job.region})
