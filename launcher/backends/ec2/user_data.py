"""An EC2 node's user data: the bash every node runs at first boot, rendered by the launcher.

It arms the hard stop, writes boot.py (this folder's real file, read as package data) to fetch
and verify the bundle, installs the training requirements, then runs the node agent from the
bundle. Limits: EC2 takes 16 KiB of user data (request.py checks the rendered size).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from importlib import resources

# Switches that let a test run the very same user data on one machine (docs/ec2.md); on EC2
# none is set and the defaults are the real behaviour.
EC2_REHEARSAL_SWITCHES = {
    "DISTRAIN_EC2_HARD_STOP": "shutdown -h",  # gets "+<minutes>"
    "DISTRAIN_EC2_PYTHON": "the AMI family's python",
    "DISTRAIN_EC2_WORK": "/opt/distrain",
    "DISTRAIN_EC2_POWEROFF": "shutdown -h now",
    "DISTRAIN_EC2_PER_BOOT": "/var/lib/cloud/scripts/per-boot",  # cloud-init runs its scripts at every boot
}
HARD_STOP_HOOK = "distrain-hard-stop"  # the per-boot script that powers a rebooted node off
NODE_AGENT = "distrain_cloud.launcher.backends.ec2.agent"  # what the user data runs: agent/__main__.py
BOOTSTRAP_FAILED_EXIT = 3  # boot.py's exit when the bundle is not the planned one
# The one line of boot.py the launcher rewrites with the job's values.
_BOOT_VALUES = (
    "BUCKET, CODE_KEY, CODE_SHA256, JOB_PREFIX, FAILED_EXIT, GROUP, BUDGET = "
    '"", "", "", "", 3, "", 0  # the job\'s values'
)


def boot_script(
    bucket: str, code_key: str, code_sha256: str, job_prefix: str, group: str = "", failure_budget: int = 0
) -> str:
    """boot.py as the node gets it: its code without docstrings or comments (user data is small:
    the readable file is the package's) with the job's values in place of its placeholder line.
    `group`: a spot lineage's Auto Scaling group, whose nodes' failures count against
    `failure_budget` (boot.py's docstring)."""
    import ast

    text = resources.files(__name__.rpartition(".")[0]).joinpath("boot.py").read_text(encoding="utf-8")
    if text.count(_BOOT_VALUES) != 1:  # a safety net for whoever edits boot.py
        raise RuntimeError("boot.py must hold its placeholder line exactly once")
    values = repr((bucket, code_key, code_sha256, job_prefix, BOOTSTRAP_FAILED_EXIT, group, int(failure_budget)))[1:-1]
    line = f"BUCKET, CODE_KEY, CODE_SHA256, JOB_PREFIX, FAILED_EXIT, GROUP, BUDGET = {values}"
    tree = ast.parse(text.replace(_BOOT_VALUES, line))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.unparse(tree) + "\n"


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
    group: str = "",
    failure_budget: int = 0,
) -> str:
    """The user data of every node of an EC2 job (bash, small, references only), in order: the
    hard stop (with shutdown behaviour terminate it ends the instance whatever else happens) and
    the per-boot hook that re-arms it after a reboot, the bundle fetched and its sha256 checked,
    the training requirements installed against the AMI's torch, then the node agent from the
    bundle, given job.json's sha256 to check before it trusts a byte of it. A node that cannot
    get that far says so (boot.py: a plain job's Failed record and stop marker, or one of a spot
    lineage's `failure_budget` failures in `group`) and powers off; so does a node that rebooted,
    since no agent runs after a reboot. `job_prefix` is `<prefix>/jobs/<job>` in `bucket`."""
    q = shlex.quote
    boot = boot_script(bucket, code_key, code_sha256, job_prefix, group, failure_budget)
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
        f"${{DISTRAIN_EC2_HARD_STOP:-shutdown -h}} +{hard_stop_minutes} || true"
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
# User data runs once, so no agent runs after a reboot: a per-boot hook says so and powers off.
HOOK="${{DISTRAIN_EC2_PER_BOOT:-/var/lib/cloud/scripts/per-boot}}/{HARD_STOP_HOOK}"
mkdir -p "$(dirname "$HOOK")"
{{ echo '#!/bin/bash'
  printf 'PY=%q BOOT=%q POWEROFF=%q; export AWS_DEFAULT_REGION=%q AWS_REGION=%q' \
    "$PY" "$WORK/boot.py" "$POWEROFF" "$AWS_REGION" "$AWS_REGION"; echo
  cat <<'DISTRAIN_HOOK'
timeout 300 "$PY" "$BOOT" fail "the instance rebooted: its node agent does not survive a reboot" || true
eval "$POWEROFF"
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
