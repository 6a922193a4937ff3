"""Backends behind one interface; the CLI never sees past it.

A backend turns a JobSpec into a Plan (pure: `dry_run=True` makes no network call at all)
and acts on a Plan. Modules are imported only when their backend is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from ..plan import Plan
    from ..spec import JobSpec


class Backend(Protocol):
    name: str

    def plan(self, spec: "JobSpec", *, dry_run: bool = False) -> "Plan": ...

    def submit(self, plan: "Plan", *, wait: bool = False) -> int:
        """Act on the plan; returns the CLI's exit code."""

    def status(self, job_name: str, **options: Any) -> dict[str, Any]: ...

    def list_jobs(self, **options: Any) -> list[dict[str, Any]]: ...

    def logs(self, job_name: str, *, follow: bool = False, **options: Any) -> int: ...

    def cancel(self, job_name: str, **options: Any) -> str: ...


_MODULES = {"local": "local", "sagemaker": "sagemaker"}


def get_backend(name: str) -> Backend:
    if name not in _MODULES:
        raise UserError(f"the {name} backend is not available yet; use --instance local or a SageMaker type "
                        "such as ml.g5.12xlarge")
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return module.BACKEND
