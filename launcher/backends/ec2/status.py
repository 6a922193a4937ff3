"""An EC2 job's status, read from what the launcher and the nodes wrote in S3 (every byte of it
hostile: bounded and checked) and from the instances EC2 still lists."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from enum import Enum
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.stack import ALIVE_STATES

from . import layout
from .request import HARD_STOP_GRACE_MIN, RENDEZVOUS_TIMEOUT_S, TAG_PREFIX

if TYPE_CHECKING:
    pass

LAUNCH_GRACE_S = 600  # a job this young with no instance visible yet is still launching


SPOT_TERMINATION = "Server.SpotInstanceTermination"
_UNIQUE_NAME = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{6}$")


class Ec2JobStatus(str, Enum):
    InProgress = "InProgress"
    Completed = "Completed"
    Failed = "Failed"
    Interrupted = "Interrupted"  # spot capacity reclaimed; `resume` continues from the checkpoints
    Stopped = "Stopped"  # cancel or deadline; checkpoints saved
    Lost = "Lost"  # the instances ended and left no record


TERMINAL = frozenset(s for s in Ec2JobStatus if s is not Ec2JobStatus.InProgress)


# When nodes disagree, the job's status is the first of these any node reports.
_PRECEDENCE = ("Failed", "Interrupted", "Stopped", "Completed")


def read_description(s3: Any, bucket: str, prefix: str, job_name: str) -> dict[str, Any] | None:
    """Job `job_name`'s description, checked: the launcher's copy, else (a job submitted before
    there was one) the job's own job.json; None when there is neither."""
    for key in (layout.submitted_key(prefix, job_name), layout.job_key(prefix, job_name, layout.JOB_JSON)):
        description = read_json(s3, bucket, key)
        if description is not None:
            return check_description(description, job_name, f"s3://{bucket}/{key}")
    return None


def job_names(s3: Any, bucket: str, prefix: str) -> list[str]:
    from ...logs import printable
    from ...spec import JOB_NAME

    names = []
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=layout.jobs_folder(prefix), Delimiter="/"
    )
    for page in pages:
        for folder in page.get("CommonPrefixes", []):
            name = folder["Prefix"].rstrip("/").rsplit("/", 1)[-1]
            if JOB_NAME.fullmatch(name):
                names.append(name)
            else:  # no job of ours is named so: whoever wrote it, it is not one to read
                print(printable(f"note: skipped s3://{bucket}/{folder['Prefix']}: not a job name"), file=sys.stderr)
    return names


def created_key(job_name: str) -> str:
    match = _UNIQUE_NAME.search(job_name)
    return match.group(1) if match else ""


def read_json(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The JSON object at `key`, or None when there is no such object. Whoever can write the
    job's prefix writes these: anything but a JSON object of at most RECORD_LIMIT bytes is one
    UserError naming it (`bad_record`)."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    try:
        with contextlib.closing(s3.get_object(Bucket=bucket, Key=key)["Body"]) as body:
            data = body.read(RECORD_LIMIT + 1)
    except ClientError as e:
        if aws.error_code(e) in ("NoSuchKey", "404"):
            return None
        raise
    where = f"s3://{bucket}/{key}"
    if len(data) > RECORD_LIMIT:
        raise bad_record(where, f"over {RECORD_LIMIT // 1024} KiB")
    try:
        loaded = json.loads(data)
    except (ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON, too many digits
        raise bad_record(where, f"not JSON: {type(e).__name__}") from None
    if not isinstance(loaded, dict):
        raise bad_record(where, f"a JSON {type(loaded).__name__}, not an object")
    return loaded


# A record's size limit: job.json with its spec is a few KiB, a node record less.
RECORD_LIMIT = 1024 * 1024


# A node count far above what a spec allows (64), and still small enough to count through.
_MAX_NODES = 4096


# The keys of job.json that status, ls, logs, report and resume read: (types, required).
_NUMBER = (int, float)


_DESCRIPTION_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "job": ((str,), True),
    "nodes": ((int,), True),
    "lineage": ((str,), True),
    "attempt": ((int,), True),
    "deadline": (_NUMBER, True),
    "log_group": ((str,), False),  # `logs` says so when it is missing
    "checkpoint_uri": ((str,), True),
    "model_uri": ((str,), True),
    "output_uri": ((str,), True),
    "submitted": (_NUMBER, False),
    "instance_type": ((str,), False),
    "spot": ((bool,), False),
    "spec": ((dict,), False),
}


# A node record's keys (agent/node.py writes them), none required but status.
_NODE_KEYS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "exit_code": (int,),
    "reason": (str,),
    "phase": (str,),
    "instance_id": (str,),
    "time": _NUMBER,
}


def bad_record(where: str, why: str) -> UserError:
    return UserError(f"{where} is not a record distrain-cloud wrote ({why}); `aws s3 cp {where} -` shows it")


def _wrong_type(record: dict[str, Any], key: str, types: tuple[type, ...], required: bool) -> str | None:
    """What is wrong with `record[key]`, or None. A bool is no number; a number must be finite
    and within what time and counts can hold."""
    if key not in record or record[key] is None:
        return f"it has no {key!r}" if required else None
    value = record[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return f"its {key!r} is a {type(value).__name__}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (-1e11 < value < 1e11):
        return f"its {key!r} is out of range"
    return None


def check_description(description: dict[str, Any], job_name: str, where: str) -> dict[str, Any]:
    """job.json of EC2 job `job_name`, checked to be the shape `job_description` writes."""
    for key, (types, required) in _DESCRIPTION_KEYS.items():
        wrong = _wrong_type(description, key, types, required)
        if wrong:
            raise bad_record(where, wrong)
    if description["job"] != job_name:
        raise bad_record(where, f"it names another job, {description['job'][:80]!r}")
    if not 1 <= description["nodes"] <= _MAX_NODES or description["attempt"] < 0:
        raise bad_record(where, f"{description['nodes']} nodes, attempt {description['attempt']}")
    return description


def check_node_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """A node's record (`nodes/<rank>.json`), checked to be what the node agent writes."""
    status = record.get("status")
    if not isinstance(status, str) or status not in {s.value for s in Ec2JobStatus}:
        raise bad_record(where, f"its 'status' is {str(record.get('status'))[:40]!r}")
    for key, types in _NODE_KEYS.items():
        wrong = _wrong_type(record, key, types, False)
        if wrong:
            raise bad_record(where, wrong)
    if (record.get("step") or 0) < 0:
        raise bad_record(where, "its 'step' is negative")
    return record


def job_files(s3: Any, bucket: str, prefix: str, job_name: str) -> dict[str, Any]:
    """What the nodes and the launcher wrote beside job.json: node records by rank, the stop
    marker, a failed launch."""
    root = layout.job_key(prefix, job_name)
    nodes: dict[int, dict[str, Any]] = {}
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/{layout.NODES}/")
    for page in pages:
        for item in page.get("Contents", []):
            rank = re.fullmatch(r"nodes/([0-9]{1,6})\.json", item["Key"].removeprefix(f"{root}/"))
            record = read_json(s3, bucket, item["Key"]) if rank else None
            if rank and record is not None:
                nodes[int(rank.group(1))] = check_node_record(record, f"s3://{bucket}/{item['Key']}")
    found: dict[str, Any] = {"nodes": nodes}
    for name, key in (("stop", layout.STOP), ("launch", layout.LAUNCH)):
        record = read_json(s3, bucket, f"{root}/{key}")
        wrong = record and _wrong_type(record, "reason", (str,), False)
        if wrong:
            raise bad_record(f"s3://{bucket}/{root}/{key}", wrong)
        found[name] = record
    return found


def tagged_instances(region: str, job_name: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Instances tagged with a distrain-cloud job (or with `job_name`), by job name."""
    from distrain_cloud.infra import aws

    key = f"{TAG_PREFIX}job"
    filters = [{"Name": f"tag:{key}", "Values": [job_name]}] if job_name else [{"Name": "tag-key", "Values": [key]}]
    found: dict[str, list[dict[str, Any]]] = {}
    with aws.translate_errors():
        pages = aws.client("ec2", region).get_paginator("describe_instances").paginate(Filters=filters)
        for page in pages:
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    launched = inst.get("LaunchTime")
                    found.setdefault(tags.get(key, ""), []).append(
                        {
                            "id": inst["InstanceId"],
                            "state": inst["State"]["Name"],
                            "reason": (inst.get("StateReason") or {}).get("Code", ""),
                            "node_status": tags.get(f"{TAG_PREFIX}status", ""),
                            # What it costs: from its launch to the time its state last changed, if
                            # it ended (EC2 names that time in StateTransitionReason).
                            "launched": launched.timestamp() if hasattr(launched, "timestamp") else None,
                            "ended": transition_time(inst.get("StateTransitionReason"))
                            if inst["State"]["Name"] not in ALIVE_STATES
                            else None,
                        }
                    )
    return found


_TRANSITION = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def transition_time(reason: Any) -> float | None:
    """The epoch in a StateTransitionReason such as "User initiated (2026-11-28 17:00:00 GMT)"."""
    import calendar

    m = _TRANSITION.search(reason) if isinstance(reason, str) else None
    return float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))) if m else None


def job_status(
    description: dict[str, Any], found: dict[str, Any], instances: list[dict[str, Any]], *, now: float
) -> dict[str, Any]:
    """A job's status from its description, what its nodes wrote and its instances (pure)."""
    name, n = description["job"], int(description["nodes"])
    nodes: dict[int, dict[str, Any]] = found.get("nodes", {})
    final = {r: rec for r, rec in nodes.items() if rec.get("status") in _PRECEDENCE}
    alive = [i for i in instances if i["state"] in ALIVE_STATES]
    stop, launch_failed = found.get("stop"), found.get("launch")
    # A node that failed before every node met ended the job's instances itself: nothing more comes.
    gave_up = any(rec.get("status") == "Failed" and rec.get("gave_up") is True for rec in final.values())
    # Instances that have written nothing by the time every working node has met or given up never
    # ran their user data: no agent, no hard stop. Only a node's failure or a person ends them.
    age = now - float(description.get("submitted", 0))
    reported = {str(rec.get("instance_id")) for rec in nodes.values()}
    quiet_after = LAUNCH_GRACE_S + float(description.get("rendezvous_timeout_s", RENDEZVOUS_TIMEOUT_S))
    silent = [i["id"] for i in alive if i["id"] not in reported] if age > quiet_after else []
    failed = any(rec.get("status") == "Failed" for rec in final.values())
    left_over = bool(alive) and (gave_up or (failed and len(silent) == len(alive)))
    status, detail = Ec2JobStatus.InProgress, ""
    if launch_failed and not instances:
        status, detail = Ec2JobStatus.Failed, f"not launched: {launch_failed.get('reason', '')}"
    elif len(final) == n or (final and not alive) or left_over:
        status = Ec2JobStatus(next(s for s in _PRECEDENCE if any(r["status"] == s for r in final.values())))
        missing = sorted(set(range(n)) - set(final))
        if missing and status is not Ec2JobStatus.Failed:
            status = Ec2JobStatus.Stopped if stop else Ec2JobStatus.Lost
        detail = _final_detail(status, final, missing, description)
        if left_over:  # the node that gave up could not terminate them, or no agent ever ran there
            ids = ", ".join(i["id"] for i in alive)
            detail += f"; still running: {ids}: `distrain-cloud cancel {name} --now` ends them"
    elif alive:
        detail = _progress(nodes, alive, n, stop)
        if not nodes and len(silent) == len(alive):
            detail = (
                f"no node has reported {int(age // 60)} min after submit: their user data may not have run "
                f"(see the instances' console output); `distrain-cloud cancel {name} --now` ends them"
            )
        if now > float(description["deadline"]) + HARD_STOP_GRACE_MIN * 60:
            detail += f"; instances past the job's deadline: `distrain-cloud cancel {name} --now`"
    elif instances and any(i["reason"] == SPOT_TERMINATION for i in instances):
        status = Ec2JobStatus.Interrupted
        detail = f"spot capacity was reclaimed before the nodes reported; `distrain-cloud resume {name}` continues it"
    elif stop and (instances or launch_failed or nodes):
        status = Ec2JobStatus.Stopped
        why = stop.get("reason", "?")
        detail = f"stopped ({why}) before its nodes wrote a final record; its last checkpoint, if any, stays"
    elif instances or nodes or now - float(description.get("submitted", 0)) > LAUNCH_GRACE_S:
        status = Ec2JobStatus.Lost
        detail = f"its instances ended without a record: see `distrain-cloud logs {name}`"
    else:
        detail = "launching"
    return {
        "job_name": name,
        "status": status.value,
        "terminal": status in TERMINAL,
        "instance": f"{n} x {description.get('instance_type', '?')}" + (" (spot)" if description.get("spot") else ""),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(description.get("submitted", 0)))),
        "detail": detail,
        "lineage": description["lineage"],
        "attempt": description["attempt"],
        "nodes": {str(r): rec.get("status") for r, rec in sorted(nodes.items())},
        "instances": {i["id"]: i["state"] for i in instances},
        "checkpoints": description["checkpoint_uri"],
        "model_artifacts": description["model_uri"] if status is Ec2JobStatus.Completed else None,
    }


def _final_detail(
    status: Ec2JobStatus, final: dict[int, dict[str, Any]], missing: list[int], description: dict[str, Any]
) -> str:
    name = description["job"]
    if status is Ec2JobStatus.Failed:
        rank, record = next((r, rec) for r, rec in sorted(final.items()) if rec["status"] == "Failed")
        return f"node {rank}: {record.get('reason') or 'failed (exit ' + str(record.get('exit_code')) + ')'}"
    if missing:
        return f"node(s) {', '.join(map(str, missing))} ended without a record: see `distrain-cloud logs {name}`"
    if status is Ec2JobStatus.Completed:
        return f"model in {description['model_uri']}"
    reason = next((rec.get("reason") for rec in final.values() if rec.get("reason")), "")
    what = (
        "spot capacity was reclaimed" if status is Ec2JobStatus.Interrupted else f"stopped ({reason or 'on request'})"
    )
    return f"{what}; checkpoints saved: `distrain-cloud resume {name}` continues it"


def _progress(nodes: dict[int, dict[str, Any]], alive: list[dict[str, Any]], n: int, stop: Any) -> str:
    failed = sorted(r for r, rec in nodes.items() if rec.get("status") == "Failed")
    if failed:
        reason = nodes[failed[0]].get("reason") or "failed"
        return f"node {failed[0]} failed ({reason}); the others are stopping"
    if stop:
        return f"stopping ({stop.get('reason', '?')}): every node saves a checkpoint, then ends"
    phases = [rec for rec in nodes.values() if rec.get("status") == "InProgress"]
    steps = [int(rec["step"]) for rec in phases if rec.get("step") is not None]
    if steps:
        return f"training, step {max(steps)}"
    joined = [re.fullmatch(r"rendezvous (\d+)/(\d+)", str(rec.get("phase", ""))) for rec in phases]
    counts = [int(m.group(1)) for m in joined if m]
    if counts:
        return f"rendezvous {max(counts)}/{n}"
    if any(str(rec.get("phase")) == "training" for rec in phases):
        return "training"
    running = sum(1 for i in alive if i["state"] == "running")
    return f"starting: {running}/{n} instance(s) running"
