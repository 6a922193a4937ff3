"""The library under the CLI: plan a job spec, check the plan against AWS, act on it.

No printing of plans here.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

from .backends import get_backend
from .plan import JobRef, Plan
from .spec import JobSpec

if TYPE_CHECKING:
    from .backends import Backend


def plan_job(spec: JobSpec, *, dry_run: bool = False, check: bool | None = None) -> Plan:
    """The plan of `spec`, made without any AWS call; then, when `check` (default: unless a dry
    run), its preflight: the read-only checks only AWS can answer, and the parts only AWS knows."""
    from .checks import offline_checks

    backend = get_backend(spec.backend)
    plan = backend.plan(spec)
    plan.checks += offline_checks(spec, plan)
    return backend.preflight(plan) if (not dry_run if check is None else check) else plan


def submit_job(plan: Plan, *, wait: bool = False) -> int:
    """Take the lineage's lease (one live attempt per lineage: a start that finds another attempt
    live is refused here, having written nothing), record where the job runs (so every job that
    may exist can be found), then start it."""
    from pathlib import Path

    from .jobs import write_record
    from .lease import lineage_lease
    from .plan import refuse_failed_checks

    refuse_failed_checks(plan)  # before the lease: a refused plan takes nothing
    backend = get_backend(plan.backend)
    relaunches = wait and getattr(backend, "relaunches_interrupted", lambda plan: False)(plan)
    until = 0.0  # --max-wait counts from the first submit
    if relaunches:
        until = time.time() + (plan.spec.max_wait or plan.spec.max_run * 2)
    with lineage_lease(plan):
        cwd = plan.request.get("cwd")
        write_record(plan, region=plan.region, workdir=Path(cwd).parent if cwd else None)
        code = backend.submit(plan, wait=wait)
        if not relaunches:
            return code
        return _relaunch_interrupted(backend, JobRef(plan.job_name, plan.backend, plan.region), code, until)


def _relaunch_interrupted(backend: Backend, job: JobRef, code: int, until: float) -> int:
    """`submit --wait` of a spot job its backend does not relaunch (EC2 without a recovering
    lineage), once it ended with `code`: while it ended Interrupted, resume it on new instances (a
    new attempt of its lineage) and follow that, until --max-wait has passed since the first submit."""
    from .backends import wait_for

    while True:
        if backend.status(job)["status"] != "Interrupted":
            return code
        if time.time() >= until:
            print(f"{job.name} was interrupted and --max-wait has passed: not relaunched", file=sys.stderr)
            return code
        print(f"{job.name}: spot capacity was reclaimed; resuming from its checkpoints", file=sys.stderr)
        plan = plan_job(resume_spec(job))
        submit_job(plan)
        job = JobRef(plan.job_name, job.backend, job.region)
        code = wait_for(backend, job)


def resume_spec(job: JobRef) -> JobSpec:
    """The spec of a new attempt of `job`'s lineage: the spec it was submitted with (from this
    machine's record, else from what its backend kept), resuming from its checkpoints."""
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
    update: dict[str, Any] = {"resume_from": job.name, "region": spec.region or job.region}
    if job.backend == "local":  # the folder the job was recorded in, wherever this runs from
        update["local"] = spec.local.model_copy(update={"workdir": job.workdir})
    return spec.model_copy(update=update)


def previous_spec(name: str, *, region: str | None = None) -> JobSpec | None:
    """The spec job `name` was submitted with, from this machine's record (None: no record)."""
    from .jobs import find_job, read_record
    from .spec import JOB_NAME

    if not JOB_NAME.fullmatch(name):
        return None  # not a job: the spec refuses it, naming --resume-from
    record = read_record(name)
    if not record or not record.get("spec"):
        return None
    return resume_spec(find_job(name, region=region))


def check_same_training(previous: JobSpec, spec: JobSpec) -> None:
    """A resumed job loads the earlier job's checkpoints: refuse, in one line, a job that trains
    another model, task or strategy (its weights or optimizer state would not fit)."""
    before, after = _what_trains(previous), _what_trains(spec)
    for key, old in before.items():
        new = after.get(key, old)
        if new != old:
            raise UserError(
                f"--resume-from {spec.resume_from}: that job trained {key} {old}, this one asks for {key} {new}; "
                f"a resumed job keeps its model, task and strategy (drop the change, or start afresh without "
                "--resume-from)"
            )


def spec_changes(previous: JobSpec, spec: JobSpec) -> list[str]:
    """What a resumed job changes from the job it resumes, as the plan shows it."""
    old, new = previous.model_dump(mode="json"), spec.model_dump(mode="json")
    changes = [
        f"{key}: {old[key]} -> {new[key]}"
        for key in new
        if key not in ("resume_from", "train_args", "region", "local") and old.get(key) != new[key]
    ]
    added = new["train_args"][len(old["train_args"]) :]
    if new["train_args"][: len(old["train_args"])] != old["train_args"]:
        added = new["train_args"]
    if added:
        changes.append("training flags: + " + " ".join(added))
    return changes


def _what_trains(spec: JobSpec) -> dict[str, str]:
    from distrain_cloud.training.args import ArgumentError, parse_args

    try:
        # The precision is the launcher's to choose per machine; what trains is the same at any.
        a = parse_args(spec.training_argv("no", "resume-check"))
    except ArgumentError:
        return {"strategy": spec.strategy}  # the plan names the bad flag itself
    model = a.model or a.model_config or f"preset {a.preset or 'tiny-gpt2'}"
    return {"task": a.task, "model": model, "strategy": spec.strategy}
