"""Two faults of issue 38 rehearsed end to end on AWS's rules (tests/awsrules.py) over moto: the cost
cap reached, and the stack deleted mid-run.

The launcher is the real CLI (plan, submit, status, `infra down`); the group is the one submit
makes, on a simulated clock that replaces what terminates, delivers spot notices and counts the
seconds each instance is billed. The nodes are played at the level that decides money: each
booted node keeps its part of the cost clock (agent/costclock.py, as the agent's hook starts it,
on the simulated clock), and once a stop is asked for it runs the lineage's own end
(agent/elastic.py: the lineage record, suspending the group's launches, leaving the group). What
a node trains in between is the node agent's and is tested on its own (agent/test_node_agent.py,
agent/test_cost_clock.py beside this file: a node stops training with a checkpoint on the cap's marker).

Each rehearsal asserts what issue 38 asks: instance-hours billed <= the plan's worst case, a
named terminal state within the stated bound, and nothing left (instances, groups, templates,
roles, security groups).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from awsrules import AwsRules
from clirun import run_cli
from test_spot_price import _entry, _spot_history

from distrain_cloud.infra import stack
from distrain_cloud.launcher.backends.ec2 import budget, layout
from distrain_cloud.launcher.backends.ec2 import preflight as ec2_preflight
from distrain_cloud.launcher.backends.ec2.agent.costclock import TICK_S, CostClock, Prices, reserve_s
from distrain_cloud.launcher.backends.ec2.agent.elastic import Lineage
from distrain_cloud.launcher.backends.ec2.agent.imds import Imds
from distrain_cloud.launcher.backends.ec2.agent.job import Job, NodeIdentity, Settings
from distrain_cloud.launcher.backends.ec2.agent.logs import LogSink
from distrain_cloud.launcher.backends.ec2.agent.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

REGION = "us-east-1"
INSTANCE = "g4dn.xlarge"
SPOT_NOW = "0.2500"  # what DescribeSpotPriceHistory answers (moto's 0.00001 is no price)
BOOT_S = 300  # from launch to the node agent: the user data's installs
STOP_S = 240  # a node's stop: the launcher's grace to checkpoint, the last sync (under the clock's reserve)
STEP_S = 5 * TICK_S  # the simulated clock's step, and the nodes' clock ticks (the agent's tick is a minute)
SUBMIT = ["submit", "--instance", INSTANCE, "--spot", "--nodes", "2", "--max-run", "4h", "--region", REGION]


class Rehearsal:
    """A lineage submitted through the CLI, its nodes played on the simulated clock."""

    def __init__(self, aws: AwsRules, capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str]) -> None:
        import boto3

        self.aws, self.capsys, self.tmp_path = aws, capsys, tmp_path
        code, out, err = run_cli(capsys, *SUBMIT, *flags, "--yes", "--json")  # the plan submitted, as JSON
        assert code == 0, err
        self.plan = json.loads(out)
        self.job = self.plan["job_name"]
        self.start = aws.now
        self.s3 = boto3.client("s3", region_name=REGION)
        self.bucket = self.plan["configs"]["job.json"]["bucket"]
        self.prefix = self.plan["configs"]["job.json"]["prefix"]
        self.clocks: dict[str, CostClock] = {}
        self.stopping: dict[str, float] = {}  # instance -> when its stop is done
        self.done: set[str] = set()
        self.marker_at: float | None = None

    # -- S3 as the nodes see it

    def key(self, *parts: str) -> str:
        return layout.job_key(self.prefix, self.job, *parts)

    def read(self, *parts: str) -> dict | None:
        try:
            return json.loads(self.s3.get_object(Bucket=self.bucket, Key=self.key(*parts))["Body"].read())
        except self.s3.exceptions.NoSuchKey:
            return None

    def description(self) -> Job:
        """job.json as the nodes read it: the bytes submit uploaded."""
        return Job.from_dict(self.read(layout.JOB_JSON))

    # -- the nodes

    def node_parts(self, instance_id: str) -> tuple[Job, NodeIdentity, Store, Imds, LogSink]:
        import boto3

        job = self.description()
        me = NodeIdentity(instance_id, 0, "r-0", "127.0.0.1", REGION)
        store = Store(self.bucket, REGION, boto3.client("s3", region_name=REGION))
        sink = LogSink(self.tmp_path / instance_id / "node-agent.log")
        return job, me, store, Imds(self.aws.imds(instance_id).endpoint), sink

    def boot(self, instance_id: str) -> None:
        """The agent starts: its cost clock, as the hook starts it, on the simulated clock."""
        job, me, store, imds, sink = self.node_parts(instance_id)
        prices = Prices.from_job(job)
        if prices is None:
            return
        market = (imds.get("meta-data/instance-life-cycle") or "").strip()
        self.clocks[instance_id] = CostClock(
            job,
            me,
            prices,
            store,
            sink,
            market=market,
            started=self.aws.launched[instance_id],
            reserve_s=reserve_s(Settings()),
            tick_s=STEP_S,
            now=lambda: self.aws.now,
        )

    def end(self, instance_id: str) -> None:
        """The node's lineage loop after its attempt stopped: the real end and leave."""
        import boto3

        job, me, store, imds, sink = self.node_parts(instance_id)
        settings = Settings(work=self.tmp_path / instance_id, poll_s=0.01)
        lineage = Lineage(
            job, me, settings, store=store, imds=imds, sink=sink, autoscaling=boto3.client("autoscaling", REGION)
        )
        assert lineage.run() == 0
        sink.close()
        if instance_id in self.aws.live():
            self.aws.power_off(instance_id)  # the agent's last act
        self.done.add(instance_id)

    def step(self) -> None:
        self.aws.advance(STEP_S)
        now = self.aws.now
        stop = self.read(layout.STOP)
        if stop is not None and self.marker_at is None:
            self.marker_at = now
        for instance_id in self.aws.live(self.job):
            if instance_id in self.done or now < self.aws.launched[instance_id] + BOOT_S:
                continue
            if instance_id not in self.clocks:
                self.boot(instance_id)
            if stop is not None:
                self.stopping.setdefault(instance_id, now + (STOP_S if instance_id in self.clocks else 0))
            if instance_id in self.clocks:
                self.clocks[instance_id].tick()
            if instance_id in self.stopping and now >= self.stopping[instance_id]:
                self.end(instance_id)

    def run(self, *, limit_s: float, at: dict[float, object] | None = None) -> None:
        faults = dict(at or {})
        while self.aws.now - self.start < limit_s:
            for when in [w for w in faults if self.start + w <= self.aws.now]:
                faults.pop(when)(self)  # type: ignore[operator]
            if self.read(layout.LINEAGE_RECORD) is not None and not self.aws.live(self.job):
                return
            self.step()

    # -- what the user sees

    def status(self) -> dict:
        code, out, err = run_cli(self.capsys, "status", self.job, "--json")
        assert code == 0, err
        return json.loads(out)

    def billed_hours(self) -> float:
        return self.aws.billed_seconds(self.job) / 3600

    def worst_case_hours(self) -> float:
        """The plan's worst case in instance-hours: its dollars at the per-node price it counted
        (the spot price now, read to the cent for both nodes: budget.worst_case)."""
        per_node = (self.plan["cost"]["hourly_usd"] + 0.005) / 2
        return self.plan["cost"]["worst_case_usd"] / per_node


@pytest.fixture
def aws(mocked_aws, monkeypatch, tmp_path):
    monkeypatch.setenv("DISTRAIN_HOME", str(tmp_path / "home"))
    _spot_history(monkeypatch, [_entry("us-east-1a", SPOT_NOW, instance=INSTANCE)])
    with AwsRules(REGION) as rules:
        yield rules


def _nothing_left(stack_name: str, job: str, aws: AwsRules) -> None:
    assert aws.live(job) == []
    assert stack.leftovers(stack_name, REGION) == stack.Leftovers()  # groups, templates, roles, security groups


@pytest.mark.slow  # a submitted lineage played for about two simulated hours
def test_the_cost_cap_stops_a_lineage_before_it_is_passed_every_restart_counted(aws, capsys, tmp_path, monkeypatch):
    from test_ec2_lifecycle import hand_made_stack

    hand_made_stack(monkeypatch)
    cap = 1.2
    r = Rehearsal(aws, capsys, tmp_path, ["--max-cost", str(cap)])
    check = next(c for c in r.plan["checks"] if c["name"].startswith("cost <= --max-cost"))
    assert check["ok"] and "the nodes stop the job with a checkpoint before $1.2" in check["detail"]
    price = r.plan["configs"]["job.json"]["cost"]["usd_per_hour"]["spot"]  # the maximum price, counted
    group = r.plan["configs"]["recovery"]["CreateAutoScalingGroup"]
    assert float(group["MixedInstancesPolicy"]["InstancesDistribution"]["SpotMaxPrice"]) == price

    def reclaim_one(rehearsal: Rehearsal) -> None:  # a restart: the clock must count both instances
        rehearsal.aws.reclaim(rehearsal.aws.group_instances(rehearsal.job)[0])

    r.run(limit_s=4 * 3600, at={20 * 60: reclaim_one})

    stop = r.read(layout.STOP)
    assert stop is not None and stop["reason"] == "max-cost", stop
    assert len(aws.tagged(r.job)) == 3  # two nodes and the reclaimed one's replacement
    # Money: what AWS bills (at most the maximum price) stays under the cap, and under the worst case.
    assert r.billed_hours() * price <= cap
    assert r.billed_hours() <= r.worst_case_hours()
    # The stated bound: every instance ended within the clock's reserve of the stop (a tick to see it).
    assert r.marker_at is not None
    assert max(aws.ended.values()) - r.marker_at <= reserve_s(Settings()) + STEP_S
    # A named terminal state, `status` says why; then status retires the group, template and role.
    shown = r.status()
    assert (shown["status"], shown["terminal"]) == ("Stopped", True)
    assert shown["detail"].startswith("max-cost reached: $") and "--max-cost $1.2 would be passed" in shown["detail"]
    assert "of --max-cost $1.2 counted by the nodes (3 instance(s), spot at its maximum price)" in shown["max_cost"]
    # What the nodes counted, as `status` reads it at the end, is what AWS billed at the maximum
    # price within one step of one instance (this clock terminates the reclaimed node a step after
    # its last word, where `status` allows the agent's two one-minute ticks), and under the cap.
    line = budget.clock_status(REGION, r.bucket, r.prefix, r.job, r.plan["configs"]["job.json"], now=aws.now)
    counted = float(re.match(r"\$([0-9.]+) of", line).group(1))  # type: ignore[arg-type,union-attr]
    assert abs(r.billed_hours() * price - counted) <= price * STEP_S / 3600 and counted <= cap
    _nothing_left("distrain-cloud", r.job, aws)


@pytest.mark.slow  # a CloudFormation stack up, a lineage submitted into it, the stack deleted under it
def test_the_stack_deleted_mid_run_refuses_then_ends_the_lineage_in_order(aws, capsys, tmp_path, monkeypatch):
    from test_ec2_lifecycle import AMI
    from typer.testing import CliRunner

    from distrain_cloud.infra.errors import UserError
    from distrain_cloud.launcher import infra_cli

    stack.execute(stack.plan_up(region=REGION))
    monkeypatch.setattr(ec2_preflight, "resolve_ami", lambda parameter, region: AMI)
    r = Rehearsal(aws, capsys, tmp_path, ["--max-cost", "50"])
    r.run(limit_s=30 * 60)
    assert len(aws.live(r.job)) == 2 and r.read(layout.STOP) is None  # training, within its cap

    refused = CliRunner().invoke(infra_cli.app, ["down", "--yes"])
    message = str(refused.exception)
    assert isinstance(refused.exception, UserError) and "\n" not in message
    for words in ("2 instance(s)", f"1 Auto Scaling group(s) ({r.job})", f"1 launch template(s) ({r.job})"):
        assert words in message, message
    assert f"1 job role(s) ({r.job})" in message and "--force" in message
    assert len(aws.live(r.job)) == 2  # nothing changed

    deleted_at = aws.now
    forced = CliRunner().invoke(infra_cli.app, ["down", "--force", "--yes"])
    assert forced.exit_code == 0, forced.output
    # Within the stated bound: at once on this clock (AWS takes minutes: down waits for each).
    assert aws.live(r.job) == [] and max(aws.ended.values()) <= deleted_at
    assert r.billed_hours() <= r.worst_case_hours()
    aws.advance(STEP_S)
    assert aws.live(r.job) == []  # nothing relaunches: the group went first
    # A named terminal state: the description stays in the kept bucket, `status` says what happened.
    shown = r.status()
    assert (shown["status"], shown["terminal"]) == ("Lost", True)
    assert "Auto Scaling group was deleted (`infra down --force`" in shown["detail"]
    with pytest.raises(UserError):
        stack.resources(region=REGION)
    _nothing_left(stack.DEFAULT_STACK, r.job, aws)
