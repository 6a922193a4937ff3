"""Which backend a job runs on: a record written at submit, so lifecycle commands need no --backend.

Records live in `$DISTRAIN_HOME/jobs/<job>.json` (default `~/.distrain-cloud`); they hold where
the job is (backend, region, work folder), never anything secret. A job with no record (submitted
from another machine) is found by its local folder, else asked of each backend that can look a
job up by name (`Backend.find`: SageMaker).

Records are read back as untrusted (a hand edit, a half-written file, another tool's file in
the folder): one that is not the shape `write_record` writes is refused in one line naming it
(`status`), or skipped with a note (`ls`); it never hides the other jobs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

from .plan import JobRef

if TYPE_CHECKING:
    from .plan import Plan


def records_dir() -> Path:
    return Path(os.environ.get("DISTRAIN_HOME") or Path.home() / ".distrain-cloud") / "jobs"


def check_name(name: str) -> str:
    """A job name is a name, never a path: it is a folder and an S3 prefix too."""
    from .spec import JOB_NAME

    if not JOB_NAME.fullmatch(name):
        raise UserError(f"{name!r} is not a job name (letters, digits and hyphens, as `distrain-cloud ls` shows)")
    return name


def write_record(plan: Plan, *, region: str | None, workdir: Path | None) -> None:
    """Written before the job is started, so every job that may exist can be found."""
    folder = records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "name": plan.job_name,
        "backend": plan.backend,
        "region": region,
        "workdir": str(workdir.resolve()) if workdir else None,
        "instance": plan.summary.get("instance"),
        "created": time.time(),
        **plan.record,  # a backend's own whereabouts (EC2: stack, bucket, prefix)
        # what `resume` plans again: references only, like the spec itself
        "spec": plan.spec.model_dump(mode="json", exclude_defaults=True),
    }
    (folder / f"{check_name(plan.job_name)}.json").write_text(json.dumps(record, indent=2))


# The keys a record's readers use, and the types they may hold (None: absent or null).
_RECORD_KEYS: dict[str, tuple[type, ...]] = {
    "region": (str,),
    "workdir": (str,),
    "stack": (str,),
    "bucket": (str,),
    "prefix": (str,),
    "spec": (dict,),
}


def read_record(name: str) -> dict[str, Any] | None:
    """The record written when job `name` was submitted from this machine, or None; a file
    there that is not a record is a UserError naming it."""
    path = records_dir() / f"{check_name(name)}.json"
    if not path.is_file():
        return None
    record, why = _load_record(path)
    if record is None:
        raise UserError(f"{path} is not a job record ({why}): delete it (or mend it) and run this again")
    return record


def _load_record(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record, "") or (None, what is wrong with it)."""
    from .backends import BACKENDS

    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON, too many digits
        return None, f"not JSON: {type(e).__name__}"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    if record.get("backend") not in BACKENDS:
        return None, f"its backend is {str(record.get('backend'))[:40]!r}, not one of {', '.join(BACKENDS)}"
    for key, types in _RECORD_KEYS.items():
        if record.get(key) is not None and not isinstance(record[key], types):
            return None, f"its {key!r} is a {type(record[key]).__name__}"
    return record, ""


def find_job(
    name: str, *, backend: str | None = None, region: str | None = None, workdir: Path = Path("runs")
) -> JobRef:
    """The job `name`: the backend named, else its record, else its local folder, else the backend
    that finds it by name (`_elsewhere`)."""
    check_name(name)
    if backend:
        return JobRef(name, backend, region, workdir)
    record = read_record(name)
    if record is not None:
        return JobRef(
            name,
            record["backend"],
            region or record.get("region"),
            Path(record["workdir"]) if record.get("workdir") else workdir,
        )
    if (workdir / name / "job.json").is_file():
        return JobRef(name, "local", region, workdir)
    return _elsewhere(name, region, workdir)


def _elsewhere(name: str, region: str | None, workdir: Path) -> JobRef:
    """A job this machine knows nothing of may have been submitted from another one: each backend
    that can look a job up by name alone (`finds_by_name`: SageMaker) is asked where AWS is set
    up (or --region asks for it, whose set-up errors then stand); a name found nowhere is a typo
    more often than not, and says so (exit 2), with the flag that reaches the billed backends
    that cannot look by name."""
    from distrain_cloud.infra import aws

    from .backends import BACKENDS, get_backend

    backends = [get_backend(b) for b in BACKENDS]
    finders = [b for b in backends if b.finds_by_name]
    blind = [b for b in backends if b.billed and not b.finds_by_name]
    where = f"no record on this machine and no folder {workdir / name}"
    if not region:
        region, missing = aws.configured()
        if region is None:
            flags = "".join(f", and --backend {b.name} for an {b.title} job" for b in blind)
            raise UserError(
                f"no job named {name} is known here ({where}){_close_names(name, workdir)}; a job submitted "
                f"from another machine: add --region REGION ({missing}){flags}"
            )
    region = aws.region(region)
    for backend in finders:
        found = backend.find(name, region)
        if found is not None:
            return JobRef(found.name, found.backend, found.region, workdir)
    looked = "".join(f", none on {b.title} in {region}" for b in finders)
    flags = "; ".join(f"an {b.title} job submitted from another machine: add --backend {b.name}" for b in blind)
    raise UserError(f"no job named {name} is known ({where}{looked}){_close_names(name, workdir)}; {flags}")


def _close_names(name: str, workdir: Path) -> str:
    """A hint naming the jobs this machine knows whose names are close to `name`, or nothing."""
    import difflib

    from .spec import JOB_NAME

    # Names from file names, shown only if they are job names (nothing else is printed from there).
    known = {p.stem for p in records_dir().glob("*.json")}
    known |= {p.parent.name for p in workdir.glob("*/job.json")}
    known = {k for k in known if JOB_NAME.fullmatch(k)}
    close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.8)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def recorded_jobs() -> list[dict[str, Any]]:
    """Every record of this machine; a file that is not one is skipped with a note naming it."""
    from .logs import printable

    folder = records_dir()
    if not folder.is_dir():
        return []
    records = []
    for path in sorted(folder.glob("*.json")):
        record, why = _load_record(path)
        if record is None:
            print(printable(f"note: skipped the record {path}: {why} (delete it)"), file=sys.stderr)
        else:
            records.append(record)
    return records


def as_dict(ref: JobRef) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(ref).items()}
