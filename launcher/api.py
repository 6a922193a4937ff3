"""The library under the CLI: plan a job spec, check the plan against AWS, act on it.

No printing of plans here.
"""

from __future__ import annotations

from .backends import get_backend
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
