"""The library under the CLI: load a spec, plan it, act on the plan. No printing of plans here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .backends import get_backend
from .plan import Plan
from .spec import JobSpec, load_spec


def plan_job(spec: JobSpec, *, dry_run: bool = False) -> Plan:
    """Pure unless dry_run is False, in which case read-only cloud checks may run."""
    return get_backend(spec.backend).plan(spec, dry_run=dry_run)


def submit_job(plan: Plan, *, wait: bool = False) -> int:
    return get_backend(plan.backend).submit(plan, wait=wait)


def load(path: Path | None, overrides: dict[str, Any]) -> JobSpec:
    return load_spec(path, overrides)
