"""How a cloud job starts: unpack the code bundle, then run the job script it carries.

The script itself (`training/job_entry.sh`: requirements, PYTHONPATH, secrets, node launcher)
travels in the bundle, so what a backend puts in its request is one short line. Every cloud
backend renders its start from here: SageMaker's ContainerEntrypoint, and EC2's user data,
which fetches the bundle and hands over to the node agent inside it (docs/ec2.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from .bundle import ARCHIVE_ROOT

JOB_SCRIPT = f"{ARCHIVE_ROOT}/job_entry.sh"  # its path inside the unpacked bundle
# The container's root; overridden only to rehearse a job outside SageMaker (tests).
SAGEMAKER_ROOT = "${DISTRAIN_SAGEMAKER_ROOT:-/opt/ml}"


def unpack_and_run(archive_glob: str, code_dir: str, script_args: str) -> str:
    """One shell line: unpack the bundle into `code_dir` and hand over to its job script."""
    return (
        f'mkdir -p "{code_dir}" && tar -xzf {archive_glob} -C "{code_dir}" && '
        f'exec bash "{code_dir}/{JOB_SCRIPT}" {script_args}'
    )


def sagemaker_entrypoint(code_channel: str) -> list[str]:
    """The ContainerEntrypoint: SageMaker puts the bundle in the code channel's folder."""
    line = unpack_and_run(
        f'"$R"/input/data/{code_channel}/*.tar.gz',
        "$R/code",
        '--hyperparameters "$R/input/config/hyperparameters.json"',
    )
    return ["/bin/bash", "-c", f"R={SAGEMAKER_ROOT}; {line}"]


# Switches that let a test run the very same user data on one machine (docs/ec2.md); on EC2
# none is set and the defaults are the real behaviour.
EC2_REHEARSAL_SWITCHES = {
    "DISTRAIN_EC2_HARD_STOP": "shutdown -h",  # gets "+<minutes>"
    "DISTRAIN_EC2_PYTHON": "the AMI family's python",
    "DISTRAIN_EC2_WORK": "/opt/distrain",
    "DISTRAIN_EC2_POWEROFF": "shutdown -h now",
    "DISTRAIN_EC2_PER_BOOT": "/var/lib/cloud/scripts/per-boot",  # cloud-init runs its scripts at every boot
}
HARD_STOP_HOOK = "distrain-hard-stop"  # the per-boot script that re-arms the hard stop after a reboot
NODE_AGENT = "distrain_cloud.training.node_agent"
BOOTSTRAP_FAILED_EXIT = 3  # boot.py's exit when the bundle is not the planned one

# Runs on the node with the AMI's python and boto3, before the bundle (and so the node agent)
# is there: fetch and verify the bundle, and write the node's Failed record if it cannot start.
_BOOT_PY = '''import hashlib, json, os, sys, tarfile, time, urllib.request
import boto3

BUCKET, CODE_KEY, CODE_SHA256, JOB_PREFIX = {bucket!r}, {code_key!r}, {code_sha256!r}, {job_prefix!r}
WORK = os.environ["WORK"]


def imds(path):
    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    put = urllib.request.Request(
        base + "/latest/api/token", method="PUT", headers={{"X-aws-ec2-metadata-token-ttl-seconds": "600"}}
    )
    token = urllib.request.urlopen(put, timeout=5).read().decode()
    get = urllib.request.Request(base + "/latest/meta-data/" + path, headers={{"X-aws-ec2-metadata-token": token}})
    return urllib.request.urlopen(get, timeout=5).read().decode()


def put_once(s3, key, body):
    """Write `body` at `key` unless something is there already (the first, specific word stays)."""
    try:
        s3.head_object(Bucket=BUCKET, Key=key)
        return
    except Exception:
        pass
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode(), ContentType="application/json")


def fail(reason):
    """This node's Failed record, the stop marker its peers watch, then its instance terminated."""
    s3, rank, me = boto3.client("s3"), imds("ami-launch-index"), imds("instance-id")
    now = time.time()
    record = {{"status": "Failed", "exit_code": 1, "reason": reason, "step": None, "instance_id": me, "time": now}}
    put_once(s3, JOB_PREFIX + "/nodes/" + rank + ".json", record)
    stop = {{"reason": "peer-failed", "by": me, "rank": int(rank), "detail": "node %s failed: %s" % (rank, reason),
            "time": now}}
    put_once(s3, JOB_PREFIX + "/stop", stop)
    try:  # power-off terminates it too; this is at once, and the role may do it for stack instances
        boto3.client("ec2").terminate_instances(InstanceIds=[me])
    except Exception as e:
        print("could not terminate %s: %s" % (me, e), file=sys.stderr)


def fetch():
    path = os.path.join(WORK, "code.tar.gz")
    boto3.client("s3").download_file(BUCKET, CODE_KEY, path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != CODE_SHA256:
        fail("bundle hash mismatch: s3://%s/%s has sha256 %s..., the plan hashed %s..." % (
            BUCKET, CODE_KEY, digest[:12], CODE_SHA256[:12]))
        sys.exit({exit_code})
    safe = {{"filter": "data"}} if hasattr(tarfile, "data_filter") else {{}}  # no links or paths out of the folder
    with tarfile.open(path) as tar:
        tar.extractall(os.path.join(WORK, "code"), **safe)


if sys.argv[1] == "fail":
    fail(sys.argv[2])
else:
    fetch()
'''


def ec2_user_data(
    *,
    job: str,
    attempt: int,
    region: str,
    bucket: str,
    job_prefix: str,
    code_key: str,
    code_sha256: str,
    job_sha256: str,
    hard_stop_minutes: int,
    python: str,
    torch: str | None,
    requirements: Sequence[str],
    hard_stop_at: int | None = None,
) -> str:
    """The user data of every node of an EC2 job (bash, small, references only), in order: the
    hard stop (with shutdown behaviour terminate it ends the instance whatever else happens) and
    the per-boot hook that re-arms it after a reboot, the bundle fetched and its sha256 checked,
    the training requirements installed against the AMI's torch, then the node agent from the
    bundle, given job.json's sha256 to check before it trusts a byte of it. A node that cannot
    get that far writes its Failed record and the stop marker its peers watch, terminates itself
    and powers off. `job_prefix` is `<prefix>/jobs/<job>` in `bucket`."""
    q = shlex.quote
    boot = _BOOT_PY.format(
        bucket=bucket,
        code_key=code_key,
        code_sha256=code_sha256,
        job_prefix=job_prefix,
        exit_code=BOOTSTRAP_FAILED_EXIT,
    )
    pip = '"$PY" -m pip install --quiet --disable-pip-version-check'
    venv = (
        f"# This AMI has no torch: a virtualenv gets one that runs on its GPUs.\n"
        f'"$PY" -m venv "$WORK/venv"\nPY="$WORK/venv/bin/python"\n{pip} {q(torch)}\n'
        if torch
        else ""
    )
    extra = " ".join(q(r) for r in requirements)
    # The hard stop: minutes from boot, or (a recovering lineage, whose replacements boot later)
    # one epoch for every node: the minutes left then, and power-off at once once it has passed.
    hard_stop = (
        f"${{DISTRAIN_EC2_HARD_STOP:-shutdown -h}} +{hard_stop_minutes} || true\n"
        f"HARD_STOP_AT=$(( $(date +%s) + {hard_stop_minutes} * 60 ))"
        if hard_stop_at is None
        else f"HARD_STOP_AT={int(hard_stop_at)}\n"
        'LEFT=$(( (HARD_STOP_AT - $(date +%s) + 59) / 60 )); [ "$LEFT" -gt 0 ] || LEFT=0\n'
        "${DISTRAIN_EC2_HARD_STOP:-shutdown -h} +$LEFT || true"
    )
    job_uri = f"s3://{bucket}/{job_prefix}/job.json"
    return f"""#!/bin/bash
# distrain-cloud job {job}, attempt {attempt}: one node's start, rendered by the launcher.
# User data is readable by whoever may describe the instance: it holds references only.
# Rehearsal switches (unset on EC2; docs/ec2.md): {", ".join(EC2_REHEARSAL_SWITCHES)}.
{hard_stop}
set -euo pipefail
export AWS_DEFAULT_REGION={q(region)} AWS_REGION={q(region)} HOME="${{HOME:-/root}}"
PY="${{DISTRAIN_EC2_PYTHON:-{python}}}"
export WORK="${{DISTRAIN_EC2_WORK:-/opt/distrain}}"
POWEROFF="${{DISTRAIN_EC2_POWEROFF:-shutdown -h now}}"
mkdir -p "$WORK"
cat > "$WORK/boot.py" <<'DISTRAIN_BOOT_PY'
{boot}DISTRAIN_BOOT_PY
fail() {{ "$PY" "$WORK/boot.py" fail "$1" || true; $POWEROFF; exit 1; }}
trap 'fail "node bootstrap failed at line $LINENO of its user data (see its cloud-init output log)"' ERR
# User data runs once, and a reboot (maintenance, a kernel panic) loses the pending hard stop: a
# per-boot hook re-arms it with the minutes left, or powers off once the deadline has passed.
echo "$HARD_STOP_AT" > "$WORK/hard-stop-at"
HOOK="${{DISTRAIN_EC2_PER_BOOT:-/var/lib/cloud/scripts/per-boot}}/{HARD_STOP_HOOK}"
HARD_STOP="${{DISTRAIN_EC2_HARD_STOP:-shutdown -h}}"
mkdir -p "$(dirname "$HOOK")"
{{ echo '#!/bin/bash'
  printf 'AT_FILE=%q HARD_STOP=%q POWEROFF=%q' "$WORK/hard-stop-at" "$HARD_STOP" "$POWEROFF"; echo
  cat <<'DISTRAIN_HOOK'
# distrain-cloud job {job}: user data runs once; after a reboot this re-arms its hard stop.
at=$(cat "$AT_FILE" 2>/dev/null) || true
[[ $at =~ ^[0-9]+$ ]] || at=0  # no deadline it can read is no reason to stay up
left=$(( (at - $(date +%s) + 59) / 60 ))
if [ "$left" -gt 0 ]; then eval "$HARD_STOP +$left"; else eval "$POWEROFF"; fi
DISTRAIN_HOOK
}} > "$HOOK"
chmod 755 "$HOOK"
{venv}"$PY" -c 'import boto3' 2>/dev/null || {pip} boto3
rc=0; "$PY" "$WORK/boot.py" fetch || rc=$?
if [ "$rc" -ne 0 ]; then fail "could not fetch the code bundle (exit $rc)"; fi
cd "$WORK/code"
"$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$WORK/constraints.txt"
{pip} -c "$WORK/constraints.txt" -r requirements.txt {extra}
export PYTHONPATH="$WORK/code"
trap - ERR
# The agent powers off on every path it controls; these cover one that could not even start.
"$PY" -m {NODE_AGENT} --job {q(job_uri)} --job-sha256 {q(job_sha256)} || fail "the node agent exited with code $?"
$POWEROFF
"""
