"""A node's first step, before the bundle (and so the node agent) is there: fetch the bundle and
check its sha256, or write this node's Failed record and the stop marker its peers watch.

Run with the AMI's python and boto3 (`boot.py fetch` or `boot.py fail REASON`). The user data
carries this file's text (user_data.py reads it as package data), with the line below replaced by
the job's values; nothing here imports the launcher.
"""

import hashlib
import json
import os
import sys
import tarfile
import time
import urllib.request
from typing import Any

import boto3

BUCKET, CODE_KEY, CODE_SHA256, JOB_PREFIX, FAILED_EXIT = "", "", "", "", 3  # the job's values


def imds(path: str) -> str:
    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    put = urllib.request.Request(
        base + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "600"}
    )
    token = urllib.request.urlopen(put, timeout=5).read().decode()
    get = urllib.request.Request(base + "/latest/meta-data/" + path, headers={"X-aws-ec2-metadata-token": token})
    return str(urllib.request.urlopen(get, timeout=5).read().decode())


def put_once(s3: Any, key: str, body: dict[str, Any]) -> None:
    """Write `body` at `key` unless something is there already (the first, specific word stays)."""
    try:
        s3.head_object(Bucket=BUCKET, Key=key)
        return
    except Exception:
        pass
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode(), ContentType="application/json")


def fail(reason: str) -> None:
    """This node's Failed record, the stop marker its peers watch, then its instance terminated."""
    s3, rank, me = boto3.client("s3"), imds("ami-launch-index"), imds("instance-id")
    now = time.time()
    record = {"status": "Failed", "exit_code": 1, "reason": reason, "step": None, "instance_id": me, "time": now}
    put_once(s3, JOB_PREFIX + "/nodes/" + rank + ".json", record)
    detail = f"node {rank} failed: {reason}"
    stop = {"reason": "peer-failed", "by": me, "rank": int(rank), "detail": detail, "time": now}
    put_once(s3, JOB_PREFIX + "/stop", stop)
    try:  # power-off terminates it too; this is at once, and the role may do it for stack instances
        boto3.client("ec2").terminate_instances(InstanceIds=[me])
    except Exception as e:
        print(f"could not terminate {me}: {e}", file=sys.stderr)


def fetch() -> None:
    work = os.environ["WORK"]  # the user data exports it
    path = os.path.join(work, "code.tar.gz")
    boto3.client("s3").download_file(BUCKET, CODE_KEY, path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != CODE_SHA256:
        fail(
            f"bundle hash mismatch: s3://{BUCKET}/{CODE_KEY} has sha256 {digest[:12]}..., "
            f"the plan hashed {CODE_SHA256[:12]}..."
        )
        sys.exit(FAILED_EXIT)
    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # no links or paths out
    with tarfile.open(path) as tar:
        tar.extractall(os.path.join(work, "code"), **safe)


if __name__ == "__main__":
    if sys.argv[1] == "fail":
        fail(sys.argv[2])
    else:
        fetch()
