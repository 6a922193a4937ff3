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
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..logs import LogLine
    from ..plan import JobRef, Plan
    from ..spec import JobSpec


class Backend(Protocol):
    """What the common floor (api.py, lease.py, jobs.py, cli.py) asks a backend; it never asks
    which backend it holds. The order of a job's life:

    1. `plan(spec)`: the exact requests, without a network call; `preflight(plan)` adds what only
       the cloud can tell (read-only); `submit(plan)` acts on it (after api.submit_job took the
       lineage's lease: `holder_state` answers for a lease this backend's job holds).
    2. `status`, `log_lines`, `cancel`, `fetch_outputs` take the JobRef that jobs.find_job made
       (from this machine's record, else by asking each backend's `find`).

    Optional, found with getattr: `job_spec(job)` (the spec a job was submitted with, for `resume`
    from another machine), `relaunches_interrupted(plan)` (whether `submit --wait` resumes a job
    that ended Interrupted; api.submit_job runs that loop) and `refuse_empty_resume(job)` (a
    UserError when `resume` would train nothing or from step 1: local, whose checkpoints are here).
    """

    name: str
    # Whether `cancel(job, now=True)` means something here: stopping at once, without the
    # checkpoint a plain cancel waits for. The others refuse `--now` (`refuse_now`).
    stops_now: bool
    # How a person names the backend in a sentence ("EC2", "SageMaker", "local").
    title: str
    # Whether its jobs run on paid cloud machines, not this one: a submit asks for a yes and
    # notes a default --max-run (cli.py), and a job of it may have been submitted from another
    # machine (jobs.py names the flag that reaches it).
    billed: bool
    # Whether `find` can look a job up by its name alone (SageMaker's DescribeTrainingJob); the
    # others need the job's record, or `--backend` (jobs.py says which in a not-found error).
    finds_by_name: bool
    # The fields of a lineage lease's body that `holder_state` reads (they come from the plan's
    # LeaseTarget): lease.py refuses a body that lacks one, or holds one that is not well formed.
    lease_fields: tuple[str, ...]

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

    def cancel(self, job: JobRef, *, now: bool = False) -> str:
        """Stop the job; returns the line the CLI prints. Plain: the job saves a checkpoint on the
        way out and this says so. `now` (only where `stops_now`): stop it at once, nothing saved;
        a backend without that way refuses with `refuse_now(self, job)` before any request."""

    def find(self, name: str, region: str | None) -> JobRef | None:
        """The job `name` submitted from another machine (this one has no record of it), where the
        service can answer by name alone (SageMaker's DescribeTrainingJob), in `region` (None: the
        configured one); None where it cannot, or has no such job. Only asked where
        `finds_by_name`."""

    def fetch_outputs(self, job: JobRef, dest: Path) -> dict[str, Any]:
        """Cloud backends: bring what `report` reads (output/metrics.jsonl, output/sample.txt,
        model/training_args.json) from S3 into `dest`; returns the job's status. A local job's
        folder already holds them."""


BACKENDS = {"local": "local", "sagemaker": "sagemaker.backend", "ec2": "ec2.backend"}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}, {_picked_by_instance()}")
    module = importlib.import_module(f"{__name__}.{BACKENDS[name]}")
    return module.BACKEND  # type: ignore[no-any-return]


def _picked_by_instance() -> str:
    """How --instance picks each backend, in the backends' own words (spec.py's example of each, its
    title), as refuse_now asks each backend: a new backend is named here without a line of this."""
    from ..spec import INSTANCE_EXAMPLES

    picks = (f"{INSTANCE_EXAMPLES[name]} for {get_backend(name).title}" for name in BACKENDS)
    return "or let the instance pick it (" + ", ".join(picks) + ")"


def refuse_now(backend: Backend, job: JobRef) -> NoReturn:
    """The refusal of `cancel --now` for a backend that cannot stop a job at once: one line naming
    the backends that can (each backend's `stops_now`)."""
    takers = sorted((b.title for b in map(get_backend, BACKENDS) if b.stops_now), key=str.lower)
    raise UserError(f"--now applies to {' and '.join(takers)} jobs; {job.name} is a {backend.name} job: drop --now")


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
