"""Spot lineages that recover on AWS's side, with the submitting laptop closed.

A spot EC2 job with `--max-restarts N` > 0 is not launched by RunInstances but as a launch
template (the same user data, role, volume, tags and metadata options as the RunInstances
request the plan holds) and an Auto Scaling group that keeps `--nodes` instances: when AWS
reclaims a spot node, the group launches its replacement, whatever the client does. The node
agents (launcher/backends/ec2/agent/elastic.py) turn the group into a lineage of attempts: the survivors of an
interrupted attempt move to the next one in S3, the replacements join it, and training resumes
from the last complete checkpoint. When every node is reclaimed at once the group replaces them
all. docs/decisions.md weighs this against EC2 Fleet, EventBridge rules and agents that
relaunch themselves.

Bounds, all on AWS's side or the nodes', none needing this process:
- `--max-restarts N`: the node that would start the job's (N + 2)th attempt ends the lineage instead;
- `--on-demand-after K`: once K attempts were interrupted, a node switches the group's
  purchase option to on-demand (the UpdateAutoScalingGroup request is planned and checked here);
- another Availability Zone on InsufficientInstanceCapacity: a single-node group spans a subnet
  of every zone of the stack's VPC; a multi-node one keeps its nodes in one zone, in the job's own
  cluster placement group (network.py), with AZRebalance suspended;
- the hard stop covers the lineage: every node's user data stops at submit + max-run (+ grace)
  whenever it booted, and a scheduled action empties the group then; `--max-cost` compares the
  lineage's worst case, at most N nodes (the group's MaxSize) for max-run at the list price.

The lineage ends for good (Completed, Failed, Stopped, restarts exhausted) by each node leaving
the group with TerminateInstanceInAutoScalingGroup, decrementing its desired capacity: nothing is
replaced, and no node is cut off in the middle of its last upload.

S3, beside the job's usual folder: `jobs/<job>/attempts/<k>/` holds attempt k's claims (k counts
across the lineage, from the job.json's `attempt`),
rendezvous, node records and stop marker (the layout of a plain job's folder); `jobs/<job>/lineage.json`
is the lineage's end; `jobs/<job>/stop` is a cancel of the whole lineage.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

from ...logs import one_line
from . import layout
from . import status as ec2_status
from .layout import FAILURE_BUDGET
from .request import payload_of

if TYPE_CHECKING:
    from ...plan import Plan
    from ...spec import JobSpec
    from .request import Parts

HARD_STOP_ACTION = "lineage-hard-stop"
# After the lineage's end its nodes upload their last records and leave within minutes (the final
# sync allows 10); `status` then deletes the group even with an instance still running.
RETIRE_AFTER_S = 1200
# Which flag or spec key sets each part of the requests, so a refusal names what the user wrote.
SOURCES = (
    ("LaunchTemplateData.ImageId", "ec2.ami_id / ec2.ami_parameter"),
    ("LaunchTemplateData.InstanceType", "--instance"),
    ("LaunchTemplateData.UserData", "the rendered user data"),
    ("LaunchTemplateData.BlockDeviceMappings", "ec2.volume_size_gb"),
    ("LaunchTemplateName", "--name"),
    ("AutoScalingGroupName", "--name"),
    ("MaxSize", "--nodes"),
    ("DesiredCapacity", "--nodes"),
    ("VPCZoneIdentifier", "ec2.subnet_id"),
    ("MixedInstancesPolicy", "--spot / --on-demand-after"),
)


def wanted(spec: JobSpec) -> bool:
    """Whether `spec` runs as a lineage the AWS side keeps going (spot, with restarts allowed):
    asked once, by the plan, which carries the answer (request.Parts.recovering)."""
    return bool(spec.spot and spec.ec2.max_restarts > 0)


def is_lineage(description: dict[str, Any]) -> bool:
    """Whether job.json `description` is that of a recovering lineage."""
    return isinstance(description.get("recovery"), dict)


# ---------------------------------------------------------------------- plan


def description_block(job_name: str, nodes: int, spec: JobSpec) -> dict[str, Any]:
    """job.json's `recovery` (layout.RecoveryBlock): what the node agents need to keep the lineage
    going. The one request a node sends that changes the group is rendered here, so the plan checks
    it against the API model."""
    after = spec.ec2.on_demand_after
    return layout.RecoveryBlock(
        group=job_name,
        nodes=nodes,
        max_restarts=spec.ec2.max_restarts,
        on_demand_after=after,
        on_demand_request=None
        if after is None
        else {
            "AutoScalingGroupName": job_name,
            "MixedInstancesPolicy": {"InstancesDistribution": _distribution(on_demand=True)},
        },
    ).to_json()


def user_data_values(parts: Parts) -> dict[str, Any]:
    """What the user data's boot.py needs of a lineage: its group, where a failed node counts itself."""
    return {"group": parts.job_name, "failure_budget": FAILURE_BUDGET} if parts.recovering else {}


def _distribution(*, on_demand: bool) -> dict[str, Any]:
    return {
        "OnDemandBaseCapacity": 0,
        "OnDemandPercentageAboveBaseCapacity": 100 if on_demand else 0,
        # AWS's advice for interruptible work: the pools least likely to be reclaimed, at a low price.
        "SpotAllocationStrategy": "price-capacity-optimized",
    }


def requests(
    run: dict[str, Any], *, name: str, nodes: int, subnets: tuple[str, ...], deadline: float, tags: list[dict[str, str]]
) -> dict[str, Any]:
    """The requests that replace RunInstances `run` (the plan's, already checked): the launch
    template, the group, the scheduled action that empties it at the lineage's hard stop, and
    the suspension of the group's AZRebalance.

    A single-node group spans every zone's subnet in `subnets`, so AWS launches in another zone
    when one has no capacity (InsufficientInstanceCapacity). A multi-node group keeps its nodes in
    the first (the zone preflight chose where EC2 offers the type): gradients cross no zone (paid
    transfer, slower), EFA reaches no other subnet, and the job's cluster placement group is one
    zone's. AZRebalance is suspended on every group: it terminates an instance to even out zones
    without a spot notice (EC2 Auto Scaling User Guide, "Suspend and resume processes"), which a
    training node cannot checkpoint before."""
    import base64

    data: dict[str, Any] = {
        key: run[key]
        for key in (
            "ImageId",
            "InstanceType",
            "IamInstanceProfile",
            "InstanceInitiatedShutdownBehavior",
            "MetadataOptions",
            "BlockDeviceMappings",
            "TagSpecifications",
            "SecurityGroupIds",
        )
        if key in run
    }
    # A launch template holds user data base64-encoded (RunInstances' botocore encodes it itself).
    data["UserData"] = base64.b64encode(run["UserData"].encode()).decode()
    if "NetworkInterfaces" in run:  # the group picks the subnet: the interface names none
        data["NetworkInterfaces"] = [{k: v for k, v in i.items() if k != "SubnetId"} for i in run["NetworkInterfaces"]]
    placement = run.get("Placement", {}).get("GroupName")
    template = {
        "LaunchTemplateName": name,
        "ClientToken": run["ClientToken"],
        "LaunchTemplateData": data,
        "TagSpecifications": [{"ResourceType": "launch-template", "Tags": tags}],
    }
    group: dict[str, Any] = {
        "AutoScalingGroupName": name,
        "MinSize": 0,  # so that a node leaving at the lineage's end lowers the desired capacity
        "MaxSize": nodes,  # never more than the job's nodes at once: the lineage's worst case
        "DesiredCapacity": nodes,
        "MixedInstancesPolicy": {
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": name, "Version": "$Latest"}},
            "InstancesDistribution": _distribution(on_demand=False),
        },
        "VPCZoneIdentifier": ",".join(subnets[:1] if nodes > 1 else subnets),
        "HealthCheckType": "EC2",
        "Tags": [
            {"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": False, "ResourceId": name}
            | {"ResourceType": "auto-scaling-group"}
            for t in tags
        ],
    }
    if placement:
        group["PlacementGroup"] = placement
    stop = {
        "AutoScalingGroupName": name,
        "ScheduledActionName": HARD_STOP_ACTION,
        "StartTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline)),
        "MinSize": 0,
        "MaxSize": 0,
        "DesiredCapacity": 0,
    }
    rebalance = {"AutoScalingGroupName": name, "ScalingProcesses": ["AZRebalance"]}
    return {
        "CreateLaunchTemplate": template,
        "CreateAutoScalingGroup": group,
        "PutScheduledUpdateGroupAction": stop,
        "SuspendProcesses": rebalance,
    }


def refuse_problems(found: dict[str, Any], block: dict[str, Any]) -> None:
    """Every request of the lineage (the nodes' too) checked against the AWS API model."""
    from .. import cloud

    cloud.refuse_api_problems("ec2", "CreateLaunchTemplate", found["CreateLaunchTemplate"], SOURCES, "EC2")
    for operation in ("CreateAutoScalingGroup", "PutScheduledUpdateGroupAction", "SuspendProcesses"):
        cloud.refuse_api_problems("autoscaling", operation, found[operation], SOURCES, "EC2 Auto Scaling")
    if "on_demand_request" in block:
        request = block["on_demand_request"]
        cloud.refuse_api_problems("autoscaling", "UpdateAutoScalingGroup", request, SOURCES, "EC2 Auto Scaling")
    leave = {"InstanceId": "i-0123456789abcdef0", "ShouldDecrementDesiredCapacity": True}
    cloud.refuse_api_problems("autoscaling", "TerminateInstanceInAutoScalingGroup", leave, SOURCES, "EC2 Auto Scaling")


def summary(spec: JobSpec) -> str:
    after = spec.ec2.on_demand_after
    fallback = f", on-demand after {after} interruption(s)" if after else ""
    return (
        f"on AWS's side: an Auto Scaling group keeps {spec.nodes} node(s), up to {spec.ec2.max_restarts} "
        f"restart(s){fallback}; {FAILURE_BUDGET} node failures (a boot, a crash, a reboot) end it Failed; "
        "nothing on this machine needs to run"
    )


# ---------------------------------------------------------------------- submit


def launch(found: dict[str, Any], region: str, name: str) -> list[str]:
    """Create the launch template, the group and its hard stop (`found`: the plan's `requests`
    for lineage `name`); -> the instances the group has started so far (AWS starts them
    asynchronously: often none yet)."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws, job_role

    with aws.translate_errors():
        ec2 = aws.client("ec2", region)
        try:
            ec2.create_launch_template(**found["CreateLaunchTemplate"])
        except ClientError as e:  # a retried submit of the same plan: the template is this one
            if aws.error_code(e) != "InvalidLaunchTemplateName.AlreadyExistsException":
                raise
        asg = aws.client("autoscaling", region)
        try:
            job_role.retry_while_propagating(
                lambda: asg.create_auto_scaling_group(**found["CreateAutoScalingGroup"]), _profile_not_yet_seen
            )
        except BaseException:
            with contextlib.suppress(Exception):  # nothing runs from it: it goes too
                # unless the group was made and only its answer lost: the group launches from it
                if not asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]:
                    ec2.delete_launch_template(LaunchTemplateName=found["CreateLaunchTemplate"]["LaunchTemplateName"])
            raise
        asg.put_scheduled_update_group_action(**found["PutScheduledUpdateGroupAction"])
        asg.suspend_processes(**found["SuspendProcesses"])
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return [i["InstanceId"] for g in group for i in g.get("Instances", [])]


def finish_group(plan: Plan) -> bool:
    """Put what `launch` does after the group exists again, for a submit that lost its answer
    after the group was made: its hard stop (the same named action) and the suspension of
    AZRebalance (suspending a suspended process changes nothing); both idempotent. -> whether
    AWS took both. Without the hard stop the group would keep replacing nodes that stop at once
    past the deadline; without the suspension, a rebalance would split a multi-node job's zone."""
    from distrain_cloud.infra import aws

    found = payload_of(plan).recovery or {}
    try:
        asg = aws.client("autoscaling", payload_of(plan).parts.region, max_attempts=3)
        asg.put_scheduled_update_group_action(**found["PutScheduledUpdateGroupAction"])
        asg.suspend_processes(**found["SuspendProcesses"])
    except Exception:
        return False
    return True


def _profile_not_yet_seen(e: Exception) -> bool:
    from distrain_cloud.infra import aws

    message = aws.error_message(e).lower().replace(" ", "")
    return aws.error_code(e) == "ValidationError" and "instanceprofile" in message


# ---------------------------------------------------------------------- status


def attempt_numbers(s3: Any, bucket: str, root: str) -> list[int]:
    """The numbers of the attempts with a folder under job folder `root`, in order."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{root}/{layout.ATTEMPTS}/", Delimiter="/"
    )
    found = set()
    for page in pages:
        for folder in page.get("CommonPrefixes", []):
            m = re.fullmatch(r"([1-9][0-9]{0,3})/", folder["Prefix"][len(root) + len(layout.ATTEMPTS) + 2 :])
            if m:
                found.add(int(m.group(1)))
    return sorted(found)


def _claims(s3: Any, bucket: str, root: str, attempt: int) -> list[dict[str, Any]]:
    """The claims of attempt `attempt` (who took which rank, where, when), checked field by field."""
    out = []
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{root}/{layout.ATTEMPTS}/{attempt}/{layout.CLAIMS}/"
    )
    for page in pages:
        for item in page.get("Contents", []):
            m = re.search("/" + layout.CLAIMS + r"/([0-9]{1,4})\.json$", item["Key"])
            if not m:
                continue
            with contextlib.suppress(UserError):  # a broken claim is not a reason to hide the lineage
                body = ec2_status.read_json(s3, bucket, item["Key"]) or {}
                out.append(
                    {
                        "rank": int(m.group(1)),
                        "instance_id": _text(body.get("instance_id")),
                        "zone": _text(body.get("zone")),
                        "market": _text(body.get("market")),
                        "time": _number(body.get("time")),
                    }
                )
    return sorted(out, key=lambda c: c["rank"])


def _text(value: Any) -> str:
    return re.sub(r"[^\w.:-]", "", value)[:40] if isinstance(value, str) else "?"


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e11
    return float(value) if ok else None


def lineage_status(
    name: str, region: str, bucket: str, prefix: str, description: dict[str, Any], *, now: float | None = None
) -> dict[str, Any]:
    """The lineage's status: each attempt (when, where, how it ended), the cost so far, and the
    lineage's own end once a node recorded it."""
    from distrain_cloud.infra import aws

    now = time.time() if now is None else now
    root = layout.job_key(prefix, name)
    with aws.translate_errors():
        s3 = aws.client("s3", region)
        numbers = attempt_numbers(s3, bucket, root)
        attempts = []
        for k in numbers:
            files = ec2_status.job_files(s3, bucket, prefix, layout.attempt_job(name, k))
            attempts.append((k, _claims(s3, bucket, root, k), files))
        end = ec2_status.read_json(s3, bucket, f"{root}/{layout.LINEAGE_RECORD}")
        stop = ec2_status.read_json(s3, bucket, f"{root}/{layout.STOP}")
        failures = _failures(s3, bucket, root)
    # Only the launcher's cancel writes the lineage's stop as a cancel. A node's failure there
    # (`peer-failed`: a bundle older than the failure budget, a job.json that did not verify) is
    # that node's failure, never the user's cancel; the nodes' cost clock stops the lineage at
    # --max-cost (agent/costclock.py): a stop, not a failure.
    capped = stop if isinstance(stop, dict) and stop.get("reason") == "max-cost" else None
    node_stop = stop if isinstance(stop, dict) and stop.get("reason") == "peer-failed" else None
    cancelled = stop if stop is not None and node_stop is None and capped is None else None
    instances = ec2_status.tagged_instances(region, name).get(name, [])
    by_id = {i["id"]: i for i in instances}
    rows: list[dict[str, Any]] = []
    seen: dict[str, tuple[float, float]] = {}
    nodes: dict[str, Any] = {}  # the newest attempt's node records, by rank, as a plain job's status has them
    for k, claims, files in attempts:
        ids = {c["instance_id"] for c in claims}
        inst = [by_id[i] for i in ids if i in by_id]
        info = ec2_status.job_status({**description, "job": name}, files, inst, now=now)
        nodes = info["nodes"]
        times = [c["time"] for c in claims if c["time"]]
        ended = [float(r["time"]) for r in files["nodes"].values() if r.get("status") != "InProgress" and r.get("time")]
        for c in claims:
            first, last = seen.get(c["instance_id"], (c["time"] or now, c["time"] or now))
            record: dict[str, Any] = next(
                (r for r in files["nodes"].values() if r.get("instance_id") == c["instance_id"]), {}
            )
            last = max(last, float(record.get("time") or 0), c["time"] or 0)
            seen[c["instance_id"]] = (min(first, c["time"] or first), last)
        rows.append(
            {
                "attempt": k,
                "status": info["status"],
                "started": _when(min(times)) if times else "",
                "ended": _when(max(ended)) if info["terminal"] and ended else "",
                "where": ", ".join(f"{c['instance_id']} ({c['zone']}, {c['market']})" for c in claims),
                "why": _why(info, files.get("stop")),
            }
        )
    alive = {i["id"] for i in instances if i["state"] in ("pending", "running")}
    for f in failures:  # a node that failed before it claimed a rank was there, and billed, too
        first, last = seen.get(f["instance_id"], (f["time"], f["time"]))
        seen[f["instance_id"]] = (min(first, f["time"]), max(last, f["time"]))
    node_seconds = instance_seconds(instances, seen, now)
    status, detail, terminal = "InProgress", "", False
    if isinstance(end, dict) and end.get("status") in ("Completed", "Failed", "Stopped", "Interrupted"):
        status, terminal = str(end["status"]), True
        detail = str(end.get("reason") or "")[:300]
    elif capped is not None:  # the nodes save a checkpoint and leave; Stopped once none runs
        status, terminal = ("InProgress", False) if alive else ("Stopped", True)
        detail = ("" if terminal else "stopping: ") + one_line(capped.get("detail") or "max-cost reached")
    elif node_stop is not None:
        status, terminal = "Failed", True
        detail = one_line(node_stop.get("detail") or node_stop.get("reason") or "a node failed")
    elif rows:
        current = rows[-1]
        if current["status"] == "InProgress":
            detail = (
                f"attempt {current['attempt']}: "
                + ec2_status.job_status({**description, "job": name}, attempts[-1][2], instances, now=now)["detail"]
            )
        elif current["status"] == "Interrupted":
            detail = f"attempt {current['attempt']} was interrupted; AWS replaces the capacity and the nodes resume"
        else:
            detail = f"attempt {current['attempt']}: {current['status']}, {current['why']}"
        if cancelled and not alive:
            status, terminal, detail = "Stopped", True, "cancelled"
    elif cancelled and not alive:
        status, terminal, detail = "Stopped", True, "cancelled before any node started"
    else:
        detail = _waiting(region, name, len(instances))
    if not terminal and not alive and _group_gone(region, name):  # e.g. `infra down --force` mid-run
        status, terminal = "Lost", True
        detail = (
            "its Auto Scaling group was deleted (`infra down --force`, or by hand) and none of its instances "
            f"runs: `distrain-cloud resume {name}` continues from the last checkpoint"
        )
    if failures and not terminal:
        budget = (description.get("recovery") or {}).get("failure_budget", FAILURE_BUDGET)
        detail += (
            f"; {len(failures)} of {budget} node failure(s) so far, the last: {failures[-1]['reason']} "
            "(the group replaces a failed node; the last failure the budget allows ends the lineage)"
        )
    cost = _cost(description, node_seconds)
    return {
        "job_name": name,
        "status": status,
        "terminal": terminal,
        "instance": f"{description['nodes']} x {description.get('instance_type', '?')} (spot, recovered by AWS)",
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(description.get("submitted", 0)))),
        "detail": detail,
        "lineage": description["lineage"],
        "attempt": rows[-1]["attempt"] if rows else description["attempt"],  # the one that starts first
        "attempts": rows,
        "cost_so_far": cost,
        "nodes": nodes,
        "instances": {i["id"]: i["state"] for i in instances},
        "checkpoints": description["checkpoint_uri"],
        "model_artifacts": description["model_uri"] if status == "Completed" else None,
        "ended_at": _number(end.get("time")) if isinstance(end, dict) else None,
    }


def _failures(s3: Any, bucket: str, root: str) -> list[dict[str, Any]]:
    """The lineage's node failures (boot.py, agent/elastic.py write them), in slot order, checked."""
    out = []
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{root}/{layout.FAILURES}/", MaxKeys=50).get("Contents", [])
    for item in listing:
        m = re.search(r"/([1-9][0-9]?)\.json$", item["Key"])
        if not m:
            continue
        with contextlib.suppress(UserError):  # a broken record is not a reason to hide the lineage
            body = ec2_status.read_json(s3, bucket, item["Key"]) or {}
            when = _number(body.get("time"))
            out.append(
                {
                    "slot": int(m.group(1)),
                    "instance_id": _text(body.get("instance_id")),
                    "reason": one_line(body.get("reason") or "no reason given"),
                    "time": when if when is not None else item["LastModified"].timestamp(),
                }
            )
    return sorted(out, key=lambda f: f["slot"])


def instance_seconds(instances: list[dict[str, Any]], seen: dict[str, tuple[float, float]], now: float) -> float:
    """What the job's instances ran, each from its launch to its end (to `now` while it runs): every
    instance EC2 lists with the job's tag, terminated ones too, whether or not it ever claimed a
    rank; `seen` (first and last time the nodes wrote of each) fills in what EC2 no longer lists
    (it forgets terminated instances after about an hour) or does not date."""
    total, listed = 0.0, set()
    for i in instances:
        listed.add(i["id"])
        first, last = seen.get(i["id"], (None, None))
        start = min(t for t in (i.get("launched"), first, now) if t is not None)  # nothing writes before its launch
        if i["state"] in ("pending", "running", "shutting-down", "stopping"):
            end = now
        else:
            end = i.get("ended") or last or start
        total += max(0.0, min(end, now) - start)
    total += sum(max(0.0, last - first) for i, (first, last) in seen.items() if i not in listed)
    return total


def _why(info: dict[str, Any], stop: Any) -> str:
    """How an attempt ended, in one line: its stop marker's words (the spot notice, a cancel, a
    failed node) rather than the job-level advice `job_status` gives."""
    if not info["terminal"]:
        return ""
    detail = stop.get("detail") if isinstance(stop, dict) and info["status"] != "Failed" else None
    text = detail if isinstance(detail, str) and detail else info["detail"]
    return one_line(text)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def _group_gone(region: str, name: str) -> bool:
    """Whether EC2 Auto Scaling says the lineage's group no longer exists (False when it cannot say)."""
    from distrain_cloud.infra import aws

    try:
        found = aws.client("autoscaling", region, max_attempts=2).describe_auto_scaling_groups(
            AutoScalingGroupNames=[name]
        )["AutoScalingGroups"]
    except Exception:  # advisory: a lineage is never called lost on a failed look
        return False
    return not found


def _waiting(region: str, name: str, instances: int) -> str:
    """What the group says while no node has claimed a rank yet: launching, or why it cannot."""
    from distrain_cloud.infra import aws

    try:
        activities = aws.client("autoscaling", region, max_attempts=2).describe_scaling_activities(
            AutoScalingGroupName=name, MaxRecords=5
        )["Activities"]
    except Exception:  # advisory: the group's own words, where it can be asked
        activities = []
    failed = [a for a in activities if a.get("StatusCode") in ("Failed", "Cancelled")]
    if failed:
        message = one_line(failed[0].get("StatusMessage", ""))[:200]  # to a terminal: printable only
        # A multi-node group has one subnet (its placement group's zone); a single node's has every zone's.
        return f"the Auto Scaling group cannot launch yet ({message}); it keeps trying in its subnet(s)"
    return f"launching: {instances} instance(s) so far"


def _cost(description: dict[str, Any], node_seconds: float) -> str:
    from ...catalog import hourly_price, lookup

    try:
        price = hourly_price(lookup(str(description.get("instance_type"))), str(description.get("region")))
    except UserError:
        price = None
    hours = node_seconds / 3600
    if price is None:
        return f"{hours:.2f} node-hours (no list price known)"
    return f"at most ${hours * price:.2f}: {hours:.2f} node-hours at the on-demand list price (spot costs less)"


def one_row_per_lineage(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ls`: the newest job of each lineage, with how many jobs it has had (a recovering lineage is
    one job however many attempts; a resumed one, one job per `resume`). Rows come roughly newest
    first, but a job name only tells the second: a `resume` within the second of its submit ties,
    so then the later attempt decides."""
    kept: dict[str, dict[str, Any]] = {}
    for row in rows:
        lineage = str(row.get("lineage") or row["job_name"])
        seen = kept.get(lineage)
        if seen is None:
            kept[lineage] = {**row, "jobs_in_lineage": 1}
        elif _newness(row) > _newness(seen):  # the dict keeps the lineage's place in the list
            kept[lineage] = {**row, "jobs_in_lineage": seen["jobs_in_lineage"] + 1}
        else:
            seen["jobs_in_lineage"] += 1
    return list(kept.values())


def _newness(row: dict[str, Any]) -> tuple[str, int]:
    attempt = row.get("attempt")
    return str(row.get("created") or ""), attempt if isinstance(attempt, int) else -1


# ---------------------------------------------------------------------- cancel and clean-up


def retire_when_done(region: str, name: str, info: dict[str, Any], *, now: float | None = None) -> None:
    """Delete the lineage's group (with whatever instance it still has) and template once it ended
    and none of its instances runs, or RETIRE_AFTER_S after its end whatever runs (an empty group
    costs nothing, but it is litter; `infra down` needs it gone)."""
    from distrain_cloud.infra import aws

    # Its instances may still be shutting down (terminating takes minutes): the group goes anyway,
    # as nothing of it launches again. A running one may still be uploading its last records, for
    # at most RETIRE_AFTER_S after the lineage's end: one still up then has no agent that ends it.
    if not info["terminal"]:
        return
    running = any(s in ("pending", "running") for s in info["instances"].values())
    ended_at = info.get("ended_at")
    if running and (ended_at is None or (time.time() if now is None else now) - ended_at < RETIRE_AFTER_S):
        return
    try:
        aws.client("autoscaling", region).delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
    except Exception as e:
        if "not found" not in str(e).lower():
            print(f"note: the Auto Scaling group {name} was not deleted: {e}", file=sys.stderr)
    with contextlib.suppress(Exception):  # gone already, or the next look deletes it
        aws.client("ec2", region).delete_launch_template(LaunchTemplateName=name)
