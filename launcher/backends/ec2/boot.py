"""A node's first step, before the bundle (and so the node agent) is there: fetch the bundle and
check its sha256, or say why this node cannot run its agent.

Run with the AMI's python and boto3 (`boot.py fetch` or `boot.py fail REASON`). The user data
carries this file's text (user_data.py reads it as package data), with the line below replaced by
the job's values; nothing here imports the launcher.

A plain job's node that fails writes its Failed record and the stop marker its peers watch. A
node of a spot lineage (GROUP set: launcher/backends/ec2/recovery.py) belongs to an Auto Scaling
group that replaces whatever powers off, so its failure is one of the lineage's BUDGET: below it
the node powers off and the group replaces it (a retry: a pip mirror or IAM may come back); the
failure that uses the budget up ends the lineage Failed with its own reason, and every node that
fails after the end leaves the group, lowering its desired capacity (agent/elastic.py counts an
agent's failures in the same slots). Nothing here writes the lineage's stop: that is a user's cancel.
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
from botocore.exceptions import BotoCoreError, ClientError

BUCKET, CODE_KEY, CODE_SHA256, JOB_PREFIX, FAILED_EXIT, GROUP, BUDGET = "", "", "", "", 3, "", 0  # the job's values
# A new job role's rights reach every AWS endpoint within seconds to a minute or two (IAM is
# eventually consistent): a refusal in that window is worth waiting for, not a failed node.
IAM_PATIENCE_S = 150
NOT_YET = ("AccessDenied", "InvalidAccessKeyId", "InvalidClientTokenId", "ExpiredToken")


def imds(path: str) -> str:
    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    put = urllib.request.Request(
        base + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "600"}
    )
    token = urllib.request.urlopen(put, timeout=5).read().decode()
    get = urllib.request.Request(base + "/latest/meta-data/" + path, headers={"X-aws-ec2-metadata-token": token})
    return str(urllib.request.urlopen(get, timeout=5).read().decode())


def patiently(call: Any, *args: Any) -> Any:
    """`call(*args)`, again every 10 s while IAM refuses it (or no credentials came yet), for IAM_PATIENCE_S."""
    until = time.monotonic() + IAM_PATIENCE_S
    while True:
        try:
            return call(*args)
        except (ClientError, BotoCoreError) as e:
            code = e.response.get("Error", {}).get("Code") if isinstance(e, ClientError) else "NoCredentials"
            if code not in (*NOT_YET, "NoCredentials") or time.monotonic() > until:
                raise
            print(f"{code}: the role may not be usable yet", file=sys.stderr)
            time.sleep(10)


def put_once(s3: Any, key: str, body: dict[str, Any]) -> bool:
    """Write `body` at `key` unless something is there already (the first, specific word stays);
    -> whether this call wrote it. S3 decides (If-None-Match); a boto3 too old to send it looks first."""
    data = json.dumps(body).encode()
    try:
        s3.put_object(Bucket=BUCKET, Key=key, Body=data, ContentType="application/json", IfNoneMatch="*")
        return True
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in (
            "PreconditionFailed",
            "ConditionalRequestConflict",
            "412",
            "409",
        ):
            return False
        raise
    except BotoCoreError:  # this botocore does not know IfNoneMatch
        pass
    try:
        s3.head_object(Bucket=BUCKET, Key=key)
        return False
    except ClientError:
        pass
    s3.put_object(Bucket=BUCKET, Key=key, Body=data, ContentType="application/json")
    return True


def fail(reason: str) -> None:
    """This node cannot run its agent: a lineage's node counts it (`fail_in_lineage`); a plain job's
    writes its Failed record and the stop marker its peers watch, then terminates its instance."""
    if GROUP:
        fail_in_lineage(reason)
        return
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


def fail_in_lineage(reason: str) -> None:
    """One of the lineage's BUDGET failures, in the first free slot of `failures/` (a conditional
    write: two nodes never take one slot). Below the budget: nothing more, the group replaces this
    node once it powers off. The last slot: the lineage's end, Failed with this reason. Past it, or
    once the lineage ended: leave the group (desired capacity lowered) with its launches suspended."""
    s3, asg, me = boto3.client("s3"), boto3.client("autoscaling"), imds("instance-id")
    now = time.time()
    body = {"instance_id": me, "reason": reason, "by": "boot", "time": now}
    slot = 1
    while slot <= BUDGET and not patiently(put_once, s3, f"{JOB_PREFIX}/failures/{slot}.json", body):
        slot += 1  # taken: the next
    if slot == BUDGET:
        why = f"{BUDGET} node failures, the last: {reason}"
        put_once(s3, f"{JOB_PREFIX}/lineage.json", {"status": "Failed", "reason": why, "by": me, "time": now})
    elif slot < BUDGET and not ended(s3):
        print(f"node failure {slot} of {BUDGET}: the Auto Scaling group replaces this node", file=sys.stderr)
        return
    try:  # nothing replaces a node that cannot leave, nor one that crashes later
        asg.suspend_processes(AutoScalingGroupName=GROUP, ScalingProcesses=["Launch"])
    except Exception as e:
        print(f"could not suspend the group's launches: {e}", file=sys.stderr)
    try:
        asg.terminate_instance_in_auto_scaling_group(InstanceId=me, ShouldDecrementDesiredCapacity=True)
    except Exception as e:  # the power-off that follows still ends this instance
        print(f"could not leave the group: {e}", file=sys.stderr)


def ended(s3: Any) -> bool:
    try:
        s3.head_object(Bucket=BUCKET, Key=f"{JOB_PREFIX}/lineage.json")
        return True
    except ClientError:
        return False


def fetch() -> None:
    work = os.environ["WORK"]  # the user data exports it
    path = os.path.join(work, "code.tar.gz")
    # A client per try: one made before the role's credentials reached IMDS would never have any.
    patiently(lambda: boto3.client("s3").download_file(BUCKET, CODE_KEY, path))
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
