"""A Plan is everything a submit would send, computed without side effects.

`--dry-run` prints it; `submit` acts on it and nothing else. Most tests assert on plans.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distrain_cloud.infra.errors import UserError


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


@dataclass
class Plan:
    backend: str
    job_name: str
    summary: dict[str, Any]  # what a person wants to see first: instance, nodes, processes, ...
    request: dict[str, Any]  # exactly what will be sent (API request, or command and environment)
    configs: dict[str, Any] = field(default_factory=dict)  # rendered accelerate / DeepSpeed configs
    bundle: dict[str, Any] | None = None  # code bundle sha256, size, S3 key
    cost: dict[str, Any] | None = None
    checks: list[Check] = field(default_factory=list)
    # Things submit needs that are not shown (the bundle's bytes); never secret values.
    payload: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("payload")
        return d

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
