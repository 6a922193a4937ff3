"""Where an EC2 job's records are, and the launcher's writes and reads of them: the stack's
bucket, a job's description (job.json) found by its name, the stop marker, the node records' ETags
a cancel watches for an answer, and the terminate a silent node gets.

A job's keys are layout.py's; what the records say is status.py's to read (as hostile bytes). The
backend (status, cancel, list), recovery.py and rehearse.py use these; none of them import backend.py.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.stack import ALIVE_STATES

from . import layout
from .status import read_description, read_json, tagged_instances

if TYPE_CHECKING:
    from distrain_cloud.infra.stack import StackResources

    from ...plan import JobRef

# How long a graceful cancel waits for each live instance's agent to answer the stop marker (a new
# record: an agent of this version writes one at once, an older one within its 30 s heartbeat,
# after polling every 5 s) before it terminates that instance itself.
CANCEL_ANSWER_S = 45
CANCEL_POLL_S = 3


def stack_resources(name: str, region: str) -> StackResources:
    """The stack's resources; with no stack, one line saying to run `infra up`."""
    from distrain_cloud.infra import stack

    return stack.resources(name, region)


def job_location(job_name: str, region: str) -> tuple[str, str]:
    """(bucket, prefix) of an EC2 job: from the record written when it was submitted here, else
    the default stack's bucket and the default prefix."""
    from distrain_cloud.infra.stack import DEFAULT_STACK

    from ...jobs import read_record

    record = read_record(job_name) or {}
    if record.get("bucket") and not str(record["bucket"]).startswith("<"):
        return str(record["bucket"]), str(record.get("prefix", "distrain-cloud"))
    return stack_resources(str(record.get("stack") or DEFAULT_STACK), region).bucket, str(
        record.get("prefix", "distrain-cloud")
    )


def described(job: JobRef) -> tuple[str, str, str, dict[str, Any]]:
    """(region, bucket, prefix, job.json) of EC2 job `job`; one-line UserError when there is none."""
    from distrain_cloud.infra import aws

    region = aws.region(job.region)
    bucket, prefix = job_location(job.name, region)
    with aws.translate_errors():
        description = read_description(aws.client("s3", region), bucket, prefix, job.name)
    if description is None:
        raise UserError(
            f"no EC2 job {job.name} in s3://{bucket}/{prefix}/jobs/ ({region}); `distrain-cloud ls` lists the jobs"
        )
    return region, bucket, prefix, description


def places(region: str) -> list[tuple[str, str]]:
    """Every (bucket, prefix) EC2 jobs of this machine's records live in, and the default stack's."""
    from distrain_cloud.infra.stack import DEFAULT_STACK

    from ...jobs import recorded_jobs

    found = {
        (str(r["bucket"]), str(r.get("prefix", "distrain-cloud")))
        for r in recorded_jobs()
        if r.get("backend") == "ec2" and r.get("region") == region and r.get("bucket")
    }
    try:
        found.add((stack_resources(DEFAULT_STACK, region).bucket, "distrain-cloud"))
    except UserError:
        pass  # no default stack: only recorded jobs
    return sorted(found)


def put_json(region: str, bucket: str, key: str, body: dict[str, Any]) -> None:
    from distrain_cloud.infra import aws

    with aws.translate_errors():
        aws.client("s3", region).put_object(
            Bucket=bucket, Key=key, Body=json.dumps(body).encode(), ContentType="application/json"
        )


def write_stop(job: JobRef, reason: str) -> None:
    from distrain_cloud.infra import aws

    region = aws.region(job.region)
    bucket, prefix = job_location(job.name, region)
    put_json(
        region,
        bucket,
        layout.job_key(prefix, job.name, layout.STOP),
        {"reason": reason, "by": "launcher", "time": time.time()},
    )


def terminate(region: str, ids: list[str]) -> None:
    from distrain_cloud.infra import aws

    with aws.translate_errors():
        aws.client("ec2", region).terminate_instances(InstanceIds=ids)


def record_etags(s3: Any, bucket: str, prefix: str, job_name: str) -> dict[str, str]:
    """node record key -> its ETag: what a record that moved no longer has."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=layout.job_key(prefix, job_name, layout.NODES) + "/"
    )
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", [])}


def unanswered(
    s3: Any, bucket: str, prefix: str, job_name: str, region: str, before: dict[str, str], records: str | None
) -> list[str]:
    """The job's live instances whose agent has not answered the stop marker within CANCEL_ANSWER_S:
    no node record under `records` (the job's own key, or a lineage's live attempt; None: no
    attempt is live, so none) moved since `before`, none is final, none is in its final sync (which
    writes no heartbeat but ends by itself). Instances that end meanwhile answered."""
    until = time.monotonic() + CANCEL_ANSWER_S
    while True:
        alive = {i["id"] for i in tagged_instances(region, job_name).get(job_name, []) if i["state"] in ALIVE_STATES}
        answered = set()
        for key, etag in (record_etags(s3, bucket, prefix, records) if records else {}).items():
            record = read_json(s3, bucket, key) or {}
            ending = record.get("status") != "InProgress" or record.get("phase") == "final-sync"
            if etag != before.get(key) or ending:
                answered.add(str(record.get("instance_id")))
        silent = sorted(alive - answered)
        if not silent or time.monotonic() >= until:
            return silent
        time.sleep(min(CANCEL_POLL_S, max(0.0, until - time.monotonic())))
