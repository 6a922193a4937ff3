"""A Plan is everything a submit would send, computed without side effects.

`--dry-run` prints it; `submit` acts on it and nothing else. Most tests assert on plans.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from .spec import JobSpec, TrainingFlags


@dataclass(frozen=True)
class JobRef:
    """Enough to find a job again: its name and where it runs (every
    backend's lifecycle calls take one; launcher/jobs.py finds and records them)."""

    name: str
    backend: str
    region: str | None = None
    workdir: Path = Path("runs")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: could not be checked (offline, or no permission to look)
    detail: str = ""


@dataclass(frozen=True)
class LeaseTarget:
    """Where a plan's lineage keeps its lease (launcher/lease.py), and what the lease's body says
    of the job beyond its name: set by the backend once it knows (a cloud plan checked against
    AWS; a local plan at once), read by lease.py, which names no backend."""

    lineage: str  # the chain of jobs sharing one checkpoint folder
    # s3:// of the lineage's checkpoints: the lease lives beside them (lease.lease_key); None: a
    # lineage of this machine, whose lease is a file beside the job records.
    checkpoint_uri: str | None
    region: str | None  # of the checkpoints' bucket; None for a lineage of this machine
    attempt: int | None = None  # the lineage's attempt this job is (EC2 numbers them); None: unnumbered
    # The rest of what the backend's holder_state reads back from the body (EC2: bucket, prefix;
    # local: the runs folder), each named in the backend's lease_fields.
    extra: tuple[tuple[str, str], ...] = ()
    # The bucket this plan's submit creates if it is absent (a first SageMaker job's default
    # bucket): a lease there may create it first.
    submit_creates: str | None = None


class HeldLease(Protocol):
    """A lease taken for this plan (lease.Lease), as a backend marks it once its job exists."""

    launched: bool


@dataclass
class Plan:
    backend: str
    job_name: str
    summary: dict[str, Any]  # what a person wants to see first: instance, nodes, processes, ...
    request: dict[str, Any]  # exactly what will be sent (API request, or command and environment)
    # The spec as the backend planned it (local: data paths made absolute): what checks.py checks,
    # what the job record keeps for `resume`, and what api.submit_job's relaunch loop reads.
    spec: JobSpec = field(repr=False)
    configs: dict[str, Any] = field(default_factory=dict)  # rendered accelerate / DeepSpeed configs
    bundle: dict[str, Any] | None = None  # code bundle sha256, size, S3 key
    cost: dict[str, Any] | None = None
    checks: list[Check] = field(default_factory=list)
    # What the common floor reads besides (api.py, lease.py, jobs.py, cli.py); never shown.
    region: str | None = field(default=None, repr=False)  # where the job runs; None: this machine
    lease: LeaseTarget | None = field(default=None, repr=False)  # None: not placed (a plan not checked)
    # The training flags every node receives, parsed once for this plan: what checks.py and the
    # W&B line (tracking.wandb_run) read, so that no part of a plan parses them again.
    training: TrainingFlags | None = field(default=None, repr=False)
    # A backend's own whereabouts, kept in the job record (EC2: stack, bucket, prefix; local: lineage).
    record: dict[str, Any] = field(default_factory=dict, repr=False)
    bundle_listing: str | None = field(default=None, repr=False)  # the code bundle's files (--bundle-files)
    held: HeldLease | None = field(default=None, repr=False)  # the lineage's lease while submit starts the job
    # The backend's own record of what submit needs and nobody shows (the bundle's bytes, the
    # requests' parts): one frozen dataclass per backend (ec2.request.Ec2Payload, ...), read only
    # by that backend. Never secret values.
    payload: object = field(default=None, repr=False)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def to_dict(self) -> dict[str, Any]:
        """What a person and `--json` see: the shown fields, never the floor's or the backend's own."""
        return asdict(_Shown(**{f.name: getattr(self, f.name) for f in fields(_Shown)}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def render(self) -> str:
        """The human view of a plan."""
        lines = [f"job {self.job_name}  ({self.backend})"]
        lines += [f"  {k}: {v}" for k, v in self.summary.items()]
        if self.cost:
            lines.append("cost: " + ", ".join(f"{k}={v}" for k, v in self.cost.items()))
        if self.bundle:
            lines.append("code bundle: " + ", ".join(f"{k}={v}" for k, v in self.bundle.items()))
        lines.append("checks:")
        for c in self.checks:
            mark = {True: "ok  ", False: "FAIL", None: "skip"}[c.ok]
            lines.append(f"  [{mark}] {c.name}" + (f": {c.detail}" if c.detail else ""))
        lines.append("request:")
        lines += ["  " + line for line in json.dumps(self.request, indent=2, default=str).splitlines()]
        for name, config in self.configs.items():
            lines.append(f"{name}:")
            lines += ["  " + line for line in json.dumps(config, indent=2, default=str).splitlines()]
        return "\n".join(lines)


@dataclass
class _Shown:
    """The fields of a Plan that to_dict, to_json and render show, in their order."""

    backend: str
    job_name: str
    summary: dict[str, Any]
    request: dict[str, Any]
    configs: dict[str, Any]
    bundle: dict[str, Any] | None
    cost: dict[str, Any] | None
    checks: list[Check]


def refuse_failed_checks(plan: Plan, *, exit_code: int = 2) -> None:
    """The one refusal for a plan with failed checks: before anything is created (exit_code 1:
    the dry run's, whose plan was printed)."""
    failed = plan.failed_checks
    if failed:
        error = UserError(
            "plan check failed, nothing was created: " + "; ".join(f"{c.name} ({c.detail})" for c in failed)
        )
        error.exit_code = exit_code
        raise error


def unique_job_name(prefix: str, max_len: int = 63) -> str:
    """<prefix>-<UTC time>-<6 hex>: sortable, unique, within SageMaker's 63 characters."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    suffix = f"-{stamp}-{secrets.token_hex(3)}"
    return prefix[: max_len - len(suffix)].rstrip("-") + suffix
