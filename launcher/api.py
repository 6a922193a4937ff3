"""The library under the CLI: plan a job spec, act on the plan. No printing of plans here."""

from __future__ import annotations

from .backends import get_backend
from .plan import Plan
from .spec import JobSpec


def plan_job(spec: JobSpec, *, dry_run: bool = False) -> Plan:
    """Pure unless dry_run is False, in which case read-only cloud checks may run."""
    return get_backend(spec.backend).plan(spec, dry_run=dry_run)


def submit_job(plan: Plan, *, wait: bool = False) -> int:
    return get_backend(plan.backend).submit(plan, wait=wait)

