"""Backends behind one interface; the CLI never sees past it.

A backend turns a JobSpec into a Plan without any network call (`plan`), checks the plan
against what only the cloud can tell (`preflight`, read-only), and acts on it (`submit`).
Lifecycle calls take a JobRef (launcher/plan.py). Modules are imported only when used.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..logs import LogLine
    from ..plan import JobRef, Plan
    from ..spec import JobSpec


class Backend(Protocol):
    name: str

    def plan(self, spec: JobSpec) -> Plan: ...

    def preflight(self, plan: Plan) -> Plan:
        """The plan with the read-only live checks added (and what only the cloud can name)."""

    def submit(self, plan: Plan, *, wait: bool = False) -> int:
        """Act on the plan; returns the CLI's exit code."""

    def status(self, job: JobRef) -> dict[str, Any]:
        """At least job_name, status, terminal (bool) and detail."""

    def holder_state(self, holder: dict[str, Any]) -> tuple[bool, str] | None:
        """(ended, status) of the job that holds a lineage's lease (launcher/lease.py), read where
        the lease's body `holder` says it lives; None when there is no such job there (yet)."""

    def list_jobs(self, *, region: str | None, workdir: Path, limit: int) -> list[dict[str, Any]]: ...

    def log_lines(self, job: JobRef, *, follow: bool = False) -> Iterator[LogLine]:
        """The job's log, line by line, every host; with `follow`, until the job ends."""

    def cancel(self, job: JobRef) -> str: ...

    def fetch_outputs(self, job: JobRef, dest: Path) -> dict[str, Any]:
        """Cloud backends: bring what `report` reads (output/metrics.jsonl, output/sample.txt,
        model/training_args.json) from S3 into `dest`; returns the job's status. A local job's
        folder already holds them."""


BACKENDS = {"local": "local", "sagemaker": "sagemaker.backend", "ec2": "ec2.backend"}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise UserError(
            f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)} "
            "(--instance picks it: local, ml.g5.12xlarge for SageMaker, g5.12xlarge for EC2)"
        )
    module = importlib.import_module(f"{__name__}.{BACKENDS[name]}")
    return module.BACKEND  # type: ignore[no-any-return]


# A rehearsal is a fault played on the user's own account through one backend's machinery (`spot`:
# an EC2 spot lineage, one node interrupted with AWS FIS). It is a registration like BACKENDS, not a
# Backend method: it is one backend's own command, with flags no other backend would take, and the
# CLI declares those flags itself so that `--help` imports no backend. The module exposes
# `Options`, `plan_rehearsal` and `run_rehearsal`; cli.rehearse_spot is a thin command over them.
REHEARSALS = {"spot": "ec2.rehearse"}


def rehearsal(name: str) -> ModuleType:
    """The module that plays rehearsal `name` (a key of REHEARSALS)."""
    return importlib.import_module(f"{__name__}.{REHEARSALS[name]}")


def wait_for(backend: Backend, job: JobRef, *, poll: float = 15.0) -> int:
    """Follow a job until it ends, printing each change of state once; 0 only if it completed."""
    from ..logs import printable

    seen = None
    while True:
        info = backend.status(job)
        state = (info["status"], info.get("secondary_status"))
        if state != seen:
            shown = info["status"] + (f" / {info['secondary_status']}" if info.get("secondary_status") else "")
            print(
                printable(  # the status and its detail come from the job: shown, not obeyed
                    f"{time.strftime('%H:%M:%S')} {job.name}: {shown}"
                    + (f" - {info['detail']}" if info.get("detail") else "")
                ),
                file=sys.stderr,
                flush=True,
            )
            seen = state
        if info["terminal"]:
            return 0 if info["status"] == "Completed" else 1
        time.sleep(poll)
