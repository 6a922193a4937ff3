"""`distrain-cloud rehearse spot` (launcher/backends/ec2/rehearse.py) on moto and AWS's rules (tests/awsrules.py).

The rehearsal runs on a real account only; here its library function runs as the command runs it,
against moto in-process with the simulator's clock: the launcher's real plan, submit, status,
cancel and clean-up; the group's nodes are the node agent's real entry (`run_node`, the lineage
loop, rendezvous, checkpoint sync, records, CloudWatch logs) on threads, each with its own metadata
service, training with the agent tests' stand-in trainer (tests/launcher/backends/ec2/agent/test_node_agent.py) in
place of the real one. The clock moves POLL_S each time the rehearsal waits.

What AWS does that moto does not, played here (beside tests/awsrules.py's rules):
- FIS's aws:ec2:send-spot-instance-interruptions sends the targeted spot instance its interruption
  notice and reclaims it after durationBeforeInterruption (AWS FIS User Guide, "Amazon EC2 actions",
  aws:ec2:send-spot-instance-interruptions); moto's FIS only records the experiment, so its start
  here calls the simulator's `reclaim` (the 2-minute notice, then the termination).
- A terminated instance shuts its operating system down, which stops its services with SIGTERM
  (EC2 User Guide, "Terminate Amazon EC2 instances", "What happens when you terminate an instance");
  here a node whose instance leaves the running state gets its agent's `signalled` event, as the
  agent's SIGTERM handler sets it.
- A node boots (BOOT_S on the simulator's clock) before its agent starts.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from awsrules import AwsRules
from test_ec2_lifecycle import REGION, hand_made_stack

sys.path.insert(0, str(Path(__file__).resolve().parent / "agent"))  # the agent tests' stand-in trainer
from test_node_agent import FAKE_TRAINER  # noqa: E402

from distrain_cloud.infra.errors import UserError  # noqa: E402
from distrain_cloud.launcher.backends.ec2 import rehearse  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent import run as node_run  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.elastic import AttemptAgent  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.job import Settings  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.logs import LogSink  # noqa: E402
from distrain_cloud.launcher.backends.ec2.rehearse import Options, plan_rehearsal, run_rehearsal  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

BOOT_S = 60  # from launch to the node agent, on the simulator's clock
FAKE_STEPS = 60  # the stand-in trainer's steps (50 ms each): the interruption lands in attempt 1
REAL_POLL_S = 0.05  # real time the nodes get each time the rehearsal waits


class World:
    """moto, AWS's rules and the group's nodes; `sleep` is the rehearsal's clock."""

    def __init__(self, aws: AwsRules, tmp_path: Path) -> None:
        self.aws, self.tmp_path = aws, tmp_path
        self.threads: dict[str, threading.Thread] = {}
        self.signals: dict[str, threading.Event] = {}
        self.job: str | None = None
        self.interrupt_on_sleep: int | None = None  # raise KeyboardInterrupt at this sleep
        self.on_sleep: list[Any] = []  # called at each sleep, before the clock moves
        self.sleeps = 0

    # -- the rehearsal's clock

    def time(self) -> float:
        return self.aws.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps == self.interrupt_on_sleep:
            raise KeyboardInterrupt
        for act in self.on_sleep:
            act()
        time.sleep(REAL_POLL_S)
        self.aws.advance(seconds)
        self.nodes()

    # -- the group's nodes

    def nodes(self) -> None:
        if self.job is None:
            return
        live = set(self.aws.live(self.job))
        for instance_id in self.aws.group_instances(self.job):
            booted = self.aws.launched[instance_id] + BOOT_S <= self.aws.now
            if booted and instance_id not in self.threads:
                self.start(instance_id)
        for instance_id, thread in self.threads.items():
            if instance_id not in live:
                self.signals[instance_id].set()  # its operating system shuts down: SIGTERM
            elif not thread.is_alive():
                self.aws.power_off(instance_id)  # the user data's last act

    def start(self, instance_id: str) -> None:
        import boto3

        key = f"distrain-cloud/jobs/{self.job}/job.json"
        body = boto3.client("s3", region_name=REGION).get_object(Bucket="stack-bucket", Key=key)["Body"].read()
        settings = Settings(
            work=self.tmp_path / instance_id,
            imds_endpoint=self.aws.imds(instance_id).endpoint,
            poll_s=0.05,
            heartbeat_s=0.1,
            stop_grace_s=5,
            final_sync_s=5,
            log_flush_s=0.1,
        )
        sink = LogSink(settings.work / "node-agent.log")
        signalled = self.signals.setdefault(instance_id, threading.Event())

        def run() -> None:
            try:
                node_run.run_node(
                    f"s3://stack-bucket/{key}", hashlib.sha256(body).hexdigest(), settings, sink, signalled
                )
            finally:
                sink.close()  # its last log lines reach CloudWatch

        self.threads[instance_id] = threading.Thread(target=run, daemon=True)
        self.threads[instance_id].start()

    def close(self) -> None:
        for event in self.signals.values():
            event.set()
        for thread in self.threads.values():
            thread.join(timeout=30)


@pytest.fixture
def world(mocked_aws, monkeypatch, tmp_path):
    from moto.fis.models import FISBackend

    hand_made_stack(monkeypatch)
    with AwsRules(REGION) as aws:
        found = World(aws, tmp_path)
        start = FISBackend.start_experiment

        def start_experiment(backend: Any, *args: Any, **kwargs: Any) -> Any:
            answer = start(backend, *args, **kwargs)
            for action in answer["actions"].values():
                if action["actionId"] == rehearse.FIS_ACTION:
                    for target in action["targets"].values():
                        arns = answer["targets"][target]["resourceArns"]
                        aws.reclaim(*(arn.rsplit("/", 1)[1] for arn in arns))
            return answer

        monkeypatch.setattr(FISBackend, "start_experiment", start_experiment)

        def stand_in(agent: AttemptAgent) -> list[str]:
            shared = tmp_path / "shared" / str(agent.job.attempt)  # the trainers' stop agreement, per attempt
            shared.mkdir(parents=True, exist_ok=True)
            return ["env", f"FAKE_STEPS={FAKE_STEPS}", f"FAKE_SHARED={shared}", sys.executable, "-c", FAKE_TRAINER]

        monkeypatch.setattr(AttemptAgent, "launch_command", stand_in)
        yield found
        found.close()


def rehearsal(world: World, **options: Any) -> rehearse.Rehearsal:
    planned = plan_rehearsal(Options(region=REGION, **{"fis_role": "fis-rehearse", **options}))
    world.job = planned.plan.job_name
    return planned


@pytest.mark.slow
@pytest.mark.parametrize("interrupt", ["fis"])  # "terminate" passes too (about 15 s more: left out of the suite)
def test_the_rehearsal_interrupts_a_node_sees_it_recover_and_leaves_nothing(world, interrupt, monkeypatch):
    monkeypatch.setattr(rehearse, "POLL_S", 30.0)  # fewer looks on the simulated clock; the same waits
    planned = rehearsal(world, interrupt=interrupt)
    said: list[str] = []
    outcome = run_rehearsal(planned, clock=world, say=said.append)
    assert outcome.ok, outcome.render() + "\n" + "\n".join(world.aws.events)
    names = [c.name for c in outcome.checks]
    assert names[0] == "both nodes train (attempt 1)" and names[2:] == [
        "a new attempt starts",
        "the job completes",
        "training resumed from the checkpoint",
        "nothing of the job is left",
    ]
    assert "restored checkpoint-" in outcome.checks[4].detail
    job = planned.plan.job_name
    assert len(world.aws.tagged(job)) == 3  # two nodes, one replacement
    if interrupt == "fis":
        assert any(e.split(" ", 1)[1].startswith("spot notice for") for e in world.aws.events)
    # The bill is the simulator's: every instance with the job's tag, launch to termination.
    assert outcome.instance_hours == pytest.approx(world.aws.billed_seconds(job) / 3600, abs=1e-3)
    assert outcome.instance_hours <= planned.plan.cost["max_run_hours"] * rehearse.NODES
    assert rehearse.leftovers(planned.job) == [] and outcome.left == []
    assert "PASS the job completes" in outcome.render() and outcome.render().endswith("rehearsal passed")


@pytest.mark.slow
def test_a_ctrl_c_while_waiting_cleans_up_and_fails(world):
    """No node ever boots (the clock is stopped at the first wait by Ctrl-C): the rehearsal
    cancels the lineage, `status` retires it, nothing is left, and the FAIL says why."""
    planned = rehearsal(world, interrupt="terminate")
    world.interrupt_on_sleep = 1
    outcome = run_rehearsal(planned, clock=world, say=lambda line: None)
    assert not outcome.ok
    assert [(c.name, c.ok) for c in outcome.checks] == [
        ("the rehearsal ran to its end", False),
        ("nothing of the job is left", True),
    ]
    assert outcome.checks[0].detail == "stopped by Ctrl-C"
    assert rehearse.leftovers(planned.job) == []
    assert world.threads == {}


@pytest.mark.slow
def test_a_node_that_never_trains_fails_within_the_bound_and_is_cleaned_up(world, monkeypatch):
    monkeypatch.setattr(rehearse, "WAITS_S", {**rehearse.WAITS_S, "training": 60.0})
    world.job = None  # the group's nodes never start their agents
    planned = plan_rehearsal(Options(region=REGION, interrupt="terminate"))
    started = world.aws.now
    outcome = run_rehearsal(planned, clock=world, say=lambda line: None)
    assert [(c.name, c.ok) for c in outcome.checks] == [
        ("both nodes train (attempt ?)", False),
        ("nothing of the job is left", True),
    ]
    assert world.aws.now - started <= 60 + rehearse.WAITS_S["clean-up"] + rehearse.POLL_S
    assert outcome.instance_hours == pytest.approx(world.aws.billed_seconds(planned.plan.job_name) / 3600, abs=1e-3)


@pytest.mark.slow
def test_a_lineage_that_ends_before_its_nodes_train_fails_at_once(world, capsys, monkeypatch):
    """A boot that fails on every node ends the lineage Failed (its failure budget): the command
    says so at its next look, not after its 25-minute bound, cleans up, prints the bill and exits 1."""
    import functools

    import boto3
    from clirun import run_cli

    end = {"status": "Failed", "reason": "3 node failures, the last: pip install failed", "time": time.time()}

    def boot_failed_everywhere() -> None:
        """The budget's last node writes the lineage's end, and every node leaves (Lineage.leave)."""
        asg = boto3.client("autoscaling", region_name=REGION)
        if world.sleeps > 1:
            return
        (group,) = asg.describe_auto_scaling_groups()["AutoScalingGroups"]
        job = group["AutoScalingGroupName"]
        boto3.client("s3", region_name=REGION).put_object(
            Bucket="stack-bucket", Key=f"distrain-cloud/jobs/{job}/lineage.json", Body=json.dumps(end).encode()
        )
        asg.suspend_processes(AutoScalingGroupName=job, ScalingProcesses=["Launch"])
        for instance_id in world.aws.group_instances(job):
            asg.terminate_instance_in_auto_scaling_group(InstanceId=instance_id, ShouldDecrementDesiredCapacity=True)

    world.on_sleep.append(boot_failed_everywhere)  # and no agent starts (world.job is None)
    said: list[str] = []
    monkeypatch.setattr(rehearse, "run_rehearsal", functools.partial(run_rehearsal, clock=world, say=said.append))
    started = world.aws.now
    code, out, err = run_cli(capsys, "rehearse", "spot", "--region", REGION, "--interrupt", "terminate", "--yes")
    assert code == 1, err
    results = out.split("\nrehearsal:\n", 1)[1].splitlines()[2:]  # after the plan and the bound
    assert results[:2] == [
        f"FAIL both nodes train (attempt ?): the job ended first (Failed: {end['reason']})",
        "PASS nothing of the job is left: by tag and name",
    ], out
    assert results[2].startswith("billed: ") and results[3:] == ["rehearsal FAILED"], out
    assert world.aws.now - started <= 3 * rehearse.POLL_S + rehearse.WAITS_S["clean-up"]
    assert any(line.startswith("status: Failed") for line in said), said


@pytest.mark.slow  # two plans, one with its preflight on moto: 3-6 s on a loaded machine
def test_the_command_shows_the_bound_and_asks_before_anything_is_made(world, capsys, monkeypatch):
    import boto3
    from clirun import run_cli

    made: list[rehearse.Rehearsal] = []
    monkeypatch.setattr(rehearse, "plan_rehearsal", lambda *a, **k: made.append(plan_rehearsal(*a, **k)) or made[-1])
    code, out, err = run_cli(capsys, "rehearse", "spot", "--region", REGION, "--fis-role", "fis-rehearse")
    assert code == 2 and "add --yes" in err, err  # no terminal to ask: nothing is made
    assert boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()["AutoScalingGroups"] == []
    (planned,) = made
    spec = planned.plan.spec
    assert (spec.instance, spec.nodes, spec.spot, spec.ec2.max_restarts) == ("g4dn.xlarge", 2, True, 1)
    assert spec.max_cost == rehearse.MAX_COST_USD and spec.max_run == 45 * 60
    request = planned.fis_request or {}
    assert request["roleArn"] == "arn:aws:iam::123456789012:role/fis-rehearse"
    assert request["actions"]["Interrupt"]["actionId"] == "aws:ec2:send-spot-instance-interruptions"
    assert f"rehearsal:\n  interrupts one node once both train, with AWS FIS ({rehearse.FIS_ACTION}" in out
    assert f"costs at most ${planned.plan.cost['worst_case_usd']:.2f}" in out and "\nrequest:" not in out
    with pytest.raises(UserError, match="--interrupt fis needs --fis-role ROLE"):
        plan_rehearsal(Options(region=REGION))
    with pytest.raises(UserError, match="--interrupt reboot: expected one of fis, terminate"):
        plan_rehearsal(Options(region=REGION, interrupt="reboot"))
    with pytest.raises(UserError, match="AWS FIS would refuse .*--fis-role: roleArn"):
        plan_rehearsal(Options(region=REGION, fis_role="arn:aws:iam::" + "x" * 2100), dry_run=True)


def test_the_bill_counts_each_instance_from_launch_to_termination_even_once_ec2_forgets_it(monkeypatch):
    from distrain_cloud.launcher.backends.ec2 import status
    from distrain_cloud.launcher.plan import JobRef

    listed = [
        {"id": "i-1", "state": "terminated", "launched": 1000.0, "ended": 1600.0},
        {"id": "i-2", "state": "running", "launched": 1500.0, "ended": None},
        {"id": "i-3", "state": "shutting-down", "launched": 1500.0, "ended": None},  # no end said yet: until now
    ]
    monkeypatch.setattr(status, "tagged_instances", lambda region, name: {name: list(listed)})
    job, seen = JobRef("job", "ec2", REGION), {}
    assert rehearse.billed_seconds(job, 2000.0, seen) == 600 + 500 + 500
    del listed[0]  # an hour after its termination EC2 lists it no more; the rehearsal still bills it
    assert rehearse.billed_seconds(job, 2000.0, seen) == 600 + 500 + 500
    assert rehearse.billed_seconds(job, 2000.0) == 500 + 500


@pytest.mark.slow
def test_a_submit_that_fails_is_a_fail_line_and_the_clean_up_still_looks(world, monkeypatch):
    """AWS refuses the job's role (IAM says no): nothing was launched, so the clean-up finds
    nothing by tag, and the one FAIL names the refusal."""
    from distrain_cloud.infra import job_role

    planned = rehearsal(world, interrupt="terminate")

    def refused(role: Any) -> None:
        raise UserError("IAM refused CreateRole: AccessDenied")

    monkeypatch.setattr(job_role, "create", refused)
    outcome = run_rehearsal(planned, clock=world, say=lambda line: None)
    assert [(c.name, c.ok, c.detail) for c in outcome.checks] == [
        ("the rehearsal ran to its end", False, "stopped by IAM refused CreateRole: AccessDenied"),
        ("nothing of the job is left", True, "by tag and name"),
    ]
    assert outcome.instance_hours == 0 and world.aws.tagged(planned.plan.job_name) == []
