"""A spot lineage that recovers on AWS's side (launcher/backends/ec2/recovery.py), through the real CLI on moto.

What the user does is submit (with its bounds), status, ls, cancel and resume; the nodes' part of
the lineage (launcher/backends/ec2/agent/elastic.py) writes claims, records and stop markers in S3, which these tests
write as the nodes would. tests/e2e/test_ec2_two_nodes.py runs the whole lineage with real nodes.
"""

from __future__ import annotations

import base64
import json
import re
import time

import pytest
from clirun import run_cli
from test_ec2_lifecycle import REGION, hand_made_stack

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

BUCKET = "stack-bucket"
SPOT = ["submit", "--instance", "g4dn.12xlarge", "--spot", "--max-run", "2h", "--region", REGION, "--yes"]


@pytest.fixture
def stack(mocked_aws, monkeypatch, tmp_path):
    monkeypatch.setenv("DISTRAIN_HOME", str(tmp_path / "home"))
    return hand_made_stack(monkeypatch)


def submitted(capsys, *flags: str) -> str:
    code, _, err = run_cli(capsys, *SPOT, *flags)
    assert code == 0, err
    return re.search(r"^submitted (\S+):", err, re.M).group(1)  # type: ignore[union-attr]


def s3():
    import boto3

    return boto3.client("s3", region_name=REGION)


def put(key: str, body: dict) -> None:
    s3().put_object(Bucket=BUCKET, Key=f"distrain-cloud/{key}", Body=json.dumps(body).encode())


def group(name: str) -> dict:
    import boto3

    (found,) = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[name]
    )["AutoScalingGroups"]
    return found


@pytest.mark.parametrize(
    "overrides, recovering",
    [({"spot": True}, True), ({"spot": True, "ec2": {"max_restarts": 0}}, False), ({}, False)],
    ids=["spot", "spot-no-restarts", "on-demand"],
)
def test_whether_a_job_recovers_is_decided_once_and_carried(no_aws_config, monkeypatch, overrides, recovering):
    """recovery.wanted is asked once, by the plan; job.json's block, the user data, the role, the
    requests, the worst case, the limits line and submit's relaunch read the plan's Parts.recovering."""
    from distrain_cloud.launcher.api import plan_job
    from distrain_cloud.launcher.backends.ec2 import backend, recovery
    from distrain_cloud.launcher.backends.ec2.request import payload_of
    from distrain_cloud.launcher.spec import load_spec

    asked = []
    wanted = recovery.wanted
    monkeypatch.setattr(recovery, "wanted", lambda spec: asked.append(spec) or wanted(spec))
    spec = load_spec(None, {"instance": "g4dn.12xlarge", "region": REGION, **overrides})
    plan = plan_job(spec, dry_run=True)
    assert len(asked) == 1
    payload = payload_of(plan)
    assert payload.parts.recovering is recovering
    assert ("recovery" in payload.description) is recovering and (payload.recovery is not None) is recovering
    assert ("every attempt" in plan.summary["limits"]) is recovering
    assert backend.BACKEND.relaunches_interrupted(plan) is (spec.spot and not recovering)


def test_a_spot_submit_is_a_group_over_every_zone_that_stops_at_the_lineages_deadline(stack, capsys):
    """Bounds set at submit: the group never holds more than --nodes (the lineage's worst case),
    spans a subnet of every zone (AWS goes to another on InsufficientInstanceCapacity), and the
    lineage's hard stop is one moment for every node, whenever the group started it."""
    import boto3

    before = time.time()
    job = submitted(capsys, "--max-restarts", "2", "--on-demand-after", "1")
    found = group(job)
    assert (found["MinSize"], found["MaxSize"], found["DesiredCapacity"]) == (0, 1, 1)
    # A subnet of every zone where EC2 offers the type (moto: us-east-1e has no g4dn.12xlarge).
    offered = boto3.client("ec2", region_name=REGION).describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["g4dn.12xlarge"]}]
    )["InstanceTypeOfferings"]
    subnets = boto3.client("ec2", region_name=REGION).describe_subnets(SubnetIds=found["VPCZoneIdentifier"].split(","))
    assert sorted(s["AvailabilityZone"] for s in subnets["Subnets"]) == sorted(o["Location"] for o in offered)
    assert len(offered) > 1
    distribution = found["MixedInstancesPolicy"]["InstancesDistribution"]
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0  # spot until --on-demand-after
    # The hard stop: max-run + 10 minutes after submit, for the first nodes and every replacement.
    asg = boto3.client("autoscaling", region_name=REGION)
    (action,) = asg.describe_scheduled_actions(AutoScalingGroupName=job)["ScheduledUpdateGroupActions"]
    assert (action["MinSize"], action["MaxSize"], action["DesiredCapacity"]) == (0, 0, 0)
    stop_at = action["StartTime"].timestamp()
    assert before + 7200 + 600 <= stop_at <= time.time() + 7200 + 601
    template = boto3.client("ec2", region_name=REGION).describe_launch_template_versions(LaunchTemplateName=job)
    user_data = base64.b64decode(template["LaunchTemplateVersions"][0]["LaunchTemplateData"]["UserData"]).decode()
    assert f"HARD_STOP_AT={int(stop_at)}\n" in user_data
    # What the nodes need for the other bounds, in the job description they verify.
    description = json.loads(s3().get_object(Bucket=BUCKET, Key=f"distrain-cloud/jobs/{job}/job.json")["Body"].read())
    assert description["recovery"] | {"on_demand_request": None} == {
        "group": job,
        "nodes": 1,
        "max_restarts": 2,
        "replacement_wait_s": 1800,
        "failure_budget": 3,
        "on_demand_after": 1,
        "on_demand_request": None,
    }
    assert description["recovery"]["on_demand_request"]["MixedInstancesPolicy"] == {
        "InstancesDistribution": {
            "OnDemandBaseCapacity": 0,
            "OnDemandPercentageAboveBaseCapacity": 100,
            "SpotAllocationStrategy": "price-capacity-optimized",
        }
    }


def test_max_restarts_0_is_the_plain_launch_and_bad_bounds_are_one_line(stack, capsys):
    import boto3

    job = submitted(capsys, "--max-restarts", "0")
    assert boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()["AutoScalingGroups"] == []
    reservations = boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
    assert [i["InstanceLifecycle"] for r in reservations for i in r["Instances"]] == ["spot"]
    assert "recovery" not in json.loads(
        s3().get_object(Bucket=BUCKET, Key=f"distrain-cloud/jobs/{job}/job.json")["Body"].read()
    )
    for flags, message in (
        (["--on-demand-after", "5"], "--on-demand-after) 5 is never reached with --max-restarts 3"),
        (["--max-restarts", "-1"], "--max-restarts"),
    ):
        code, _, err = run_cli(capsys, *SPOT, *flags)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    for flag in (["--on-demand-after", "1"], ["--max-restarts", "2"]):  # not silently ignored on-demand
        code, _, err = run_cli(capsys, *[a for a in SPOT if a != "--spot"], *flag)
        assert code == 2 and f"({flag[0]}) applies to spot jobs only" in err, err


@pytest.mark.slow
def test_the_worst_case_and_max_cost_cover_the_whole_lineage(stack, capsys, monkeypatch):
    """At most --nodes instances at once (MaxSize) until one hard stop: the lineage's worst case is
    the plan's, however many attempts it takes; a --max-cost that cannot pay for a short run and its
    stop refuses before anything is made (a larger one is enforced by the nodes: test_cost_cap.py)."""
    import boto3
    from test_spot_price import _entry, _spot_history

    _spot_history(monkeypatch, [_entry("us-east-1a", "1.5000")])  # the spot price now (moto says 0.00001)
    code, out, _ = run_cli(capsys, *SPOT, "--nodes", "2", "--dry-run", "--check", "--json")
    assert code == 0
    plan = json.loads(out)  # stdout is the plan alone: one JSON document
    worst = plan["cost"]["worst_case_usd"]
    # 2 nodes x (2 h + the hard stop's 10 min + a minute for each of 4 launches) at the spot price now
    assert worst == pytest.approx(2 * 1.5 * (7200 + 600 + 4 * 60) / 3600, abs=0.01)
    assert plan["configs"]["recovery"]["CreateAutoScalingGroup"]["MaxSize"] == 2
    code, _, err = run_cli(capsys, *SPOT, "--nodes", "2", "--max-cost", "1")
    assert code == 2 and "cost <= --max-cost 1.0 ($1 cannot pay for 2 node(s) to boot, train 15 min" in err, err
    assert boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()["AutoScalingGroups"] == []


@pytest.mark.slow
def test_status_shows_each_attempt_and_the_lineages_cost_and_ls_one_row(stack, capsys):
    job = submitted(capsys)
    root = f"jobs/{job}/attempts"
    t0 = time.time() - 3600
    # Attempt 1: two hours ago... one node reclaimed after 30 min; attempt 2 runs on its replacement.
    put(f"{root}/1/claims/0.json", {"instance_id": "i-0aaa", "zone": "us-east-1a", "market": "spot", "time": t0})
    put(
        f"{root}/1/nodes/0.json",
        {"status": "Interrupted", "exit_code": 143, "reason": "spot interruption notice on node 0 (soon)",
         "instance_id": "i-0aaa", "time": t0 + 1800},
    )  # fmt: skip
    put(f"{root}/1/stop", {"reason": "spot-interruption", "detail": "spot interruption notice on node 0 (soon)"})
    (live,) = [i["InstanceId"] for i in group(job)["Instances"]]  # the group's node: attempt 2's
    put(f"{root}/2/claims/0.json", {"instance_id": live, "zone": "us-east-1b", "market": "spot", "time": t0 + 1900})
    put(f"{root}/2/nodes/0.json", {"status": "InProgress", "phase": "training", "step": 40, "instance_id": live})
    code, out, err = run_cli(capsys, "status", job, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert (status["status"], status["terminal"], status["attempt"]) == ("InProgress", False, 2)
    first, second = status["attempts"]
    assert first["status"] == "Interrupted" and first["why"] == "spot interruption notice on node 0 (soon)"
    assert first["where"] == "i-0aaa (us-east-1a, spot)" and first["ended"]
    assert second["status"] == "InProgress" and second["where"] == f"{live} (us-east-1b, spot)"
    assert status["detail"] == "attempt 2: training, step 40"
    # 30 min of attempt 1's node, then attempt 2's from its claim until now (it still runs): ~58 min
    hours = float(re.search(r"([0-9.]+) node-hours", status["cost_so_far"]).group(1))  # type: ignore[union-attr]
    assert 0.95 <= hours <= 0.99, status["cost_so_far"]
    usd = float(re.match(r"at most \$([0-9.]+): ", status["cost_so_far"]).group(1))  # type: ignore[union-attr]
    assert usd == pytest.approx(hours * 3.912, abs=0.03)  # g4dn.12xlarge's list price
    code, out, _ = run_cli(capsys, "status", job)  # for people: one line per attempt
    assert "attempts:\n  attempt: 1, status: Interrupted, started: " in out, out
    assert "  attempt: 2, status: InProgress, started: " in out and "cost_so_far: at most $" in out, out
    # The lineage holds its lease while the group keeps it going: a resume is refused, naming it.
    code, _, err = run_cli(capsys, "resume", job, "--yes")
    assert code == 2 and f"lineage {job} has a live attempt: {job}" in err, err
    code, out, _ = run_cli(capsys, "ls", "--backend", "ec2", "--region", REGION, "--json")
    rows = [r for r in json.loads(out) if r["lineage"] == job]
    assert len(rows) == 1 and rows[0]["attempt"] == 2


@pytest.mark.slow
def test_cancel_stops_the_lineage_not_only_the_live_attempt(stack, capsys, monkeypatch):
    import boto3

    from distrain_cloud.launcher.backends.ec2 import records

    monkeypatch.setattr(records, "CANCEL_ANSWER_S", 1)  # 45 s for real
    job = submitted(capsys)
    (node,) = [i["InstanceId"] for i in group(job)["Instances"]]
    put(f"jobs/{job}/attempts/1/claims/0.json", {"instance_id": node, "time": time.time()})
    put(f"jobs/{job}/attempts/1/nodes/0.json", {"status": "InProgress", "phase": "training", "instance_id": node})
    code, out, err = run_cli(capsys, "cancel", job)
    assert code == 0 and "launches nothing more" in out + err, out + err
    # Launch suspended by the cancel (AZRebalance already at submit: launcher/backends/ec2/network.py).
    assert sorted(p["ProcessName"] for p in group(job)["SuspendedProcesses"]) == ["AZRebalance", "Launch"]
    # Its agent never answered (there is none here): it left the group, so nothing replaces it.
    assert f"no node agent answered the stop within 1 s on {node}: terminated them" in out, out
    assert group(job)["Instances"] == [] and group(job)["DesiredCapacity"] == 0
    for key in (f"jobs/{job}/stop", f"jobs/{job}/attempts/1/stop"):  # the lineage's, the attempt's
        marker = json.loads(s3().get_object(Bucket=BUCKET, Key=f"distrain-cloud/{key}")["Body"].read())
        assert marker["reason"] == "cancel"
    code, out, err = run_cli(capsys, "cancel", job, "--now")
    assert code == 0, err
    asg = boto3.client("autoscaling", region_name=REGION)
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=[job])["AutoScalingGroups"] == []
    reservations = boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
    assert {i["State"]["Name"] for r in reservations for i in r["Instances"]} == {"terminated"}
    code, out, _ = run_cli(capsys, "status", job, "--json")
    assert json.loads(out)["status"] == "Stopped"


@pytest.mark.parametrize("order", ["resumed job listed first", "resumed job listed last"])
def test_ls_keeps_the_resumed_job_when_it_shares_its_second_with_the_first(order):
    """Job names tell only the second, so a `resume` within the second of its submit ties (CI
    once listed the first job in `ls`); the later attempt is the lineage's row either way."""
    from distrain_cloud.launcher.backends.ec2.recovery import one_row_per_lineage

    first = {"job_name": "distrain-20261128-063634-a97dfa", "lineage": "L", "attempt": 0}
    first["created"] = "2026-11-28 06:36:34"
    resumed = {**first, "job_name": "distrain-20261128-063634-5e1d1f", "attempt": 1}
    other = {"job_name": "distrain-20261128-063630-000000", "lineage": "M", "attempt": 0}
    other["created"] = "2026-11-28 06:36:30"
    rows = [resumed, first, other] if order == "resumed job listed first" else [first, resumed, other]
    kept = one_row_per_lineage(rows)
    assert [(r["job_name"], r["jobs_in_lineage"]) for r in kept] == [(resumed["job_name"], 2), (other["job_name"], 1)]


@pytest.mark.slow
def test_ls_shows_one_row_per_lineage_for_resumed_jobs_too(stack, capsys):
    import boto3

    job = submitted(capsys, "--max-restarts", "0")
    put(
        f"jobs/{job}/nodes/0.json",
        {"status": "Interrupted", "exit_code": 143, "reason": "spot-interruption", "step": 6, "time": time.time()},
    )
    reservations = boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
    boto3.client("ec2", region_name=REGION).terminate_instances(
        InstanceIds=[i["InstanceId"] for r in reservations for i in r["Instances"]]
    )
    code, _, err = run_cli(capsys, "resume", job, "--yes")
    assert code == 0, err
    again = re.search(r"^submitted (\S+):", err, re.M).group(1)  # type: ignore[union-attr]
    code, out, _ = run_cli(capsys, "ls", "--backend", "ec2", "--region", REGION, "--json")
    rows = [r for r in json.loads(out) if r["lineage"] == job]
    assert [(r["job_name"], r["jobs_in_lineage"]) for r in rows] == [(again, 2)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("operation", "flags", "lost"),
    [("RunInstances", ["--max-restarts", "0"], "timeout"), ("CreateAutoScalingGroup", [], "ctrl-c")],
)
def test_a_launch_whose_answer_was_lost_keeps_its_role_and_lease(stack, capsys, monkeypatch, operation, flags, lost):
    """The request reached AWS, its answer did not (a read timeout, a Ctrl-C): the instances or the
    group run, so the job's role, launch template and lineage lease stay, and the user is told."""
    import boto3
    from botocore.exceptions import ReadTimeoutError

    from distrain_cloud.infra import aws

    made = aws.client

    def lose_answer(event_name: str, **_: object) -> None:
        if event_name.endswith(f".{operation}"):
            raise ReadTimeoutError(endpoint_url="https://aws") if lost == "timeout" else KeyboardInterrupt

    def client(*args, **kwargs):
        found = made(*args, **kwargs)
        found.meta.events.register("after-call", lose_answer)
        return found

    monkeypatch.setattr(aws, "client", client)
    code, _, err = run_cli(capsys, *SPOT, *flags)
    monkeypatch.setattr(aws, "client", made)
    assert code != 0 and "Traceback" not in err, err
    job = re.search(r"^note: (\S+) runs on AWS", err, re.M).group(1)  # type: ignore[union-attr]
    assert f"distrain-cloud status {job}" in err and f"distrain-cloud cancel {job}" in err, err
    boto3.client("iam").get_role(RoleName=job)  # its instances still have their role
    if operation == "CreateAutoScalingGroup":  # the group launches from its template: both stay
        assert group(job)["Instances"]
        asg = boto3.client("autoscaling", region_name=REGION)
        (action,) = asg.describe_scheduled_actions(AutoScalingGroupName=job)["ScheduledUpdateGroupActions"]
        assert action["DesiredCapacity"] == 0  # its hard stop, which the lost answer skipped
        suspended = [p["ProcessName"] for p in group(job)["SuspendedProcesses"]]
        assert suspended == ["AZRebalance"]  # and the suspension, skipped too
        boto3.client("ec2", region_name=REGION).describe_launch_templates(LaunchTemplateNames=[job])
    code, _, err = run_cli(capsys, "resume", job, "--yes")  # the lease is the live job's
    assert code == 2 and "has a live attempt" in err, err


@pytest.mark.slow
def test_after_a_lineage_ran_out_of_restarts_logs_report_and_resume_work(stack, capsys, tmp_path):
    """What a user does next: logs (one stream per instance), report (the last attempt's output),
    status, and the `resume` the lineage's end names: a new lineage from the checkpoints."""
    import boto3

    job = submitted(capsys, "--max-restarts", "1")
    (node,) = [i["InstanceId"] for i in group(job)["Instances"]]
    for k in (1, 2):  # two attempts, both reclaimed: --max-restarts 1 is used up
        put(f"jobs/{job}/attempts/{k}/claims/0.json", {"instance_id": node, "market": "spot", "time": time.time()})
        put(
            f"jobs/{job}/attempts/{k}/nodes/0.json", {"status": "Interrupted", "instance_id": node, "time": time.time()}
        )
    s3().put_object(
        Bucket=BUCKET,
        Key=f"distrain-cloud/jobs/{job}/attempts/2/output/metrics.jsonl",
        Body=b'{"step": 7, "loss": 1.5}\n',
    )
    put(
        f"jobs/{job}/lineage.json",
        {"status": "Interrupted", "reason": f"--max-restarts 1 reached; `distrain-cloud resume {job}`"},
    )
    boto3.client("autoscaling", region_name=REGION).terminate_instance_in_auto_scaling_group(
        InstanceId=node, ShouldDecrementDesiredCapacity=True
    )
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_stream(logGroupName=stack.log_group, logStreamName=f"{job}/{node}")
    logs.put_log_events(
        logGroupName=stack.log_group,
        logStreamName=f"{job}/{node}",
        logEvents=[{"timestamp": int(time.time() * 1000), "message": "step 7 loss 1.5"}],
    )
    code, out, err = run_cli(capsys, "logs", job)
    assert code == 0 and node in out and "step 7 loss 1.5" in out, out + err
    code, out, err = run_cli(capsys, "status", job, "--json")
    status = json.loads(out)
    assert (status["status"], status["terminal"], len(status["attempts"])) == ("Interrupted", True, 2), out
    assert status["nodes"] == {"0": "Interrupted"} and status["instances"] == {node: "terminated"}, out
    code, out, err = run_cli(capsys, "report", job, "--workdir", str(tmp_path))
    assert code == 0, err
    code, _, err = run_cli(capsys, "resume", job, "--yes")
    assert code == 0, err
    again = re.search(r"^submitted (\S+):", err, re.M).group(1)  # type: ignore[union-attr]
    description = json.loads(s3().get_object(Bucket=BUCKET, Key=f"distrain-cloud/jobs/{again}/job.json")["Body"].read())
    assert description["lineage"] == job and description["recovery"]["max_restarts"] == 1
    # Attempts are numbered across the lineage: the ended group ran attempts 1 and 2, so the new
    # job's first is 3, in its job.json (where its nodes start counting) and in `status`.
    assert description["attempt"] == 3
    code, out, err = run_cli(capsys, "status", again, "--json")
    assert code == 0 and json.loads(out)["attempt"] == 3, out + err
    assert group(again)["DesiredCapacity"] == 1  # AWS keeps the new lineage going too
    lease = json.loads(s3().get_object(Bucket=BUCKET, Key=f"distrain-cloud/leases/{job}.json")["Body"].read())
    assert lease["job"] == again, lease


def test_a_groups_failed_launch_reaches_the_terminal_printable_and_names_no_other_zone(monkeypatch):
    """The group's StatusMessage is printed by `status`: control bytes in it (an ESC sequence) are
    dropped, and a multi-node group, which has one subnet, is not said to try every zone."""
    from distrain_cloud.infra import aws
    from distrain_cloud.launcher.backends.ec2 import recovery

    class Groups:
        def describe_scaling_activities(self, **_: object) -> dict:
            message = "Launching a new EC2 instance. Status Reason: \x1b[31mInsufficientInstanceCapacity\x1b[0m\n."
            return {"Activities": [{"StatusCode": "Failed", "StatusMessage": message}]}

    monkeypatch.setattr(aws, "client", lambda *a, **k: Groups())
    said = recovery._waiting("us-east-1", "job-a", 0)
    assert "\x1b" not in said and "\n" not in said
    assert said == (
        "the Auto Scaling group cannot launch yet (Launching a new EC2 instance. Status Reason: [31mInsufficient"
        "InstanceCapacity [0m .); it keeps trying in its subnet(s)"
    )
