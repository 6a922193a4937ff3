"""Every exit of a spot lineage bounded, rehearsed on AWS's rules (tests/awsrules.py) over moto.

A lineage is a launch template and an Auto Scaling group (launcher/backends/ec2/recovery.py, its
real requests and launch) whose nodes run the lineage loop of agent/elastic.py, the user data's
boot.py (rendered as the node gets it) and the per-boot hook's failure, on a simulated clock: a
group that replaces whatever powers off, a scheduled hard stop, spot notices. Each rehearsal
plays one fault and asserts what the user was promised: the instance-hours billed stay within
the plan's worst case (`--nodes` x max-run) and within the fault's own bound (docs/reliability.md),
the job ends in a named terminal state, `status` counts every instance the job launched, and once
`status` retires the lineage nothing is left (instances, group, launch template).

What a node trains is played (`Played.attempt`): the node agent's attempt is tested on its own in
agent/test_node_agent.py beside this file; what matters here is who leaves, who is replaced and what it costs.
"""

from __future__ import annotations

import json
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from awsrules import AwsRules

from distrain_cloud.launcher.backends.ec2 import recovery
from distrain_cloud.launcher.backends.ec2.agent import elastic
from distrain_cloud.launcher.backends.ec2.agent.elastic import CONTINUES, Lineage, run_counted
from distrain_cloud.launcher.backends.ec2.agent.imds import Imds
from distrain_cloud.launcher.backends.ec2.agent.job import Job, NodeIdentity, Settings
from distrain_cloud.launcher.backends.ec2.agent.logs import LogSink
from distrain_cloud.launcher.backends.ec2.agent.store import Store
from distrain_cloud.launcher.backends.ec2.user_data import boot_script

REGION = "us-east-1"
BUCKET = "lineage-bucket"
PREFIX = "distrain"
JOB = "job-faults"
INSTANCE_TYPE = "g4dn.xlarge"
AMI = "ami-0123456789abcdef0"
MAX_RUN_S = 4 * 3600
BOOT_S = 300  # from launch to the agent (or to the user data's failure)
STEP_S = 60  # the simulated clock's step, and the nodes' poll
WORK_S = 1800  # the training the job needs, across attempts (checkpoints keep it)
BUDGET = recovery.FAILURE_BUDGET


class Halted(Exception):
    """The rehearsal is over: a node thread still waiting on the clock ends."""


class Rehearsal:
    """One lineage on the simulated clock: the launcher's requests, then nodes as the group starts
    them, each `program(instance_id)` on a thread of its own at launch + BOOT_S. The clock moves
    only while every node thread waits on it, so a rehearsal is the same every run."""

    def __init__(self, aws: AwsRules, tmp_path: Path, nodes: int) -> None:
        import boto3

        self.aws, self.tmp_path, self.nodes = aws, tmp_path, nodes
        self.start = aws.now
        self.progress = 0.0  # seconds of training done, kept by checkpoints across attempts
        self.rebooting: set[str] = set()
        self._cond = threading.Condition()
        self._busy = 0
        self._sleepers: dict[int, float] = {}  # thread -> when it wakes
        self._halted = False
        self._threads: list[threading.Thread] = []
        self._off: list[str] = []  # instances whose node powered itself off (the main thread acts)
        self._env = threading.Lock()
        self.s3 = boto3.client("s3", region_name=REGION)
        self.s3.create_bucket(Bucket=BUCKET)
        self.job = {
            "job": JOB,
            "lineage": JOB,
            "attempt": 1,
            "nodes": nodes,
            "processes_per_node": 1,
            "train_argv": [],
            "region": REGION,
            "bucket": BUCKET,
            "prefix": PREFIX,
            "code_sha256": "0" * 64,
            "deadline": self.start + MAX_RUN_S,
            "log_group": "/distrain/test",
            "checkpoint_uri": f"s3://{BUCKET}/{PREFIX}/checkpoints/{JOB}/",
            "model_uri": f"s3://{BUCKET}/{PREFIX}/jobs/{JOB}/model/",
            "output_uri": f"s3://{BUCKET}/{PREFIX}/jobs/{JOB}/output/",
            "recovery": {
                "group": JOB,
                "nodes": nodes,
                "max_restarts": 3,
                "replacement_wait_s": 1800,
                "failure_budget": BUDGET,
            },
        }
        self.description = {**self.job, "instance_type": INSTANCE_TYPE, "submitted": self.start, "spot": True}
        ec2 = boto3.client("ec2", region_name=REGION)
        subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
        tags = [{"Key": "distrain-cloud:stack", "Value": "test"}, {"Key": "distrain-cloud:job", "Value": JOB}]
        run = {
            "ImageId": AMI,
            "InstanceType": INSTANCE_TYPE,
            "UserData": "#!/bin/bash\n",
            "ClientToken": f"{JOB}-1",
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        # The launcher's requests and launch, as a submit sends them (the hard stop at max-run + 10 min).
        found = recovery.requests(
            run, name=JOB, nodes=nodes, subnets=(subnet,), deadline=self.start + MAX_RUN_S + 600, tags=tags
        )
        recovery.launch(found, REGION, JOB)

    # -- the clock, as the nodes see it

    def sleep(self, seconds: float) -> None:
        me = threading.get_ident()
        with self._cond:
            self._sleepers[me] = self.aws.now + seconds
            self._busy -= 1
            self._cond.notify_all()
            while self.aws.now < self._sleepers[me] and not self._halted:
                self._cond.wait()
            del self._sleepers[me]
            self._busy += 1
            if self._halted:
                raise Halted

    def _quiet(self) -> bool:
        """Every node thread waits on the clock, none of them due (so none is about to run)."""
        return not self._busy and all(until > self.aws.now for until in self._sleepers.values())

    def clock(self) -> types.SimpleNamespace:
        """What agent/elastic.py and boot.py get for the `time` module: this clock."""
        return types.SimpleNamespace(
            time=lambda: self.aws.now, monotonic=lambda: self.aws.now, sleep=self.sleep, strftime=time.strftime
        )

    # -- nodes

    def identity(self, instance_id: str) -> NodeIdentity:
        return NodeIdentity(instance_id, 0, "r-0", "127.0.0.1", REGION)

    def lineage(self, instance_id: str, cls: type[Lineage] | None = None, autoscaling: Any = None) -> Lineage:
        import boto3

        settings = Settings(work=self.tmp_path / instance_id, poll_s=STEP_S)
        return (cls or Played)(
            Job.from_dict(self.job),
            self.identity(instance_id),
            settings,
            store=Store(BUCKET, REGION, boto3.client("s3", region_name=REGION)),
            imds=Imds(self.aws.imds(instance_id).endpoint),
            sink=LogSink(settings.work / "node-agent.log"),
            autoscaling=autoscaling or boto3.client("autoscaling", region_name=REGION),
            harness=self,
        )

    def boot_fail(self, instance_id: str, reason: str) -> None:
        """The user data's `fail REASON` (its boot.py, rendered as the node gets it), on this node."""
        namespace: dict[str, Any] = {"__name__": "boot"}
        text = boot_script(BUCKET, "code/x.tar.gz", "0" * 64, f"{PREFIX}/jobs/{JOB}", JOB, BUDGET)
        exec(compile(text, "boot.py", "exec"), namespace)
        namespace["time"] = self.clock()
        import os

        with self._env:  # boot.py finds its metadata service as botocore would, in the environment
            os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = self.aws.imds(instance_id).endpoint
            try:
                namespace["fail"](reason)
            finally:
                del os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"]

    def _node(self, program: Any, instance_id: str) -> None:
        try:
            program(instance_id)
            if instance_id in self.rebooting:  # after the reboot: the per-boot hook (user_data.py)
                self.boot_fail(instance_id, "the instance rebooted: its node agent does not survive a reboot")
        except Halted:
            return
        finally:
            with self._cond:
                self._off.append(instance_id)  # the agent's last act, and the user data's: power off
                self._busy -= 1
                self._cond.notify_all()

    def run(self, program: Any, *, limit_s: float, at: dict[float, Any] | None = None) -> float:
        """Play until the lineage has ended and no instance of the job is left, or `limit_s` on the
        clock; `at`: {seconds after the start: fault(rehearsal)}. -> when everything had ended."""
        started: dict[str, float] = {}
        faults = dict(at or {})
        over: float | None = None
        while self.aws.now - self.start < limit_s:
            with self._cond:
                while not self._quiet():
                    self._cond.wait()
                for instance_id in self._off:
                    if instance_id in self.aws.live():
                        self.aws.power_off(instance_id)
                self._off.clear()
                for when in [w for w in faults if self.start + w <= self.aws.now]:
                    faults.pop(when)(self)
                for instance_id in self.aws.group_instances(JOB):
                    started.setdefault(instance_id, self.aws.now + BOOT_S)
                for instance_id, when in started.items():
                    if when <= self.aws.now:
                        started[instance_id] = float("inf")
                        if instance_id in self.aws.live():
                            self._busy += 1
                            thread = threading.Thread(target=self._node, args=(program, instance_id), daemon=True)
                            self._threads.append(thread)
                            thread.start()
                if self._quiet() and self.ended() and not self.aws.live(JOB):
                    # over, unless the group launches again at the next health check: one more tick
                    over = self.aws.now - self.start if over is None else over
                    if self.aws.now - self.start >= over + STEP_S:
                        return over
                else:
                    over = None
                self.aws.advance(STEP_S)
                self._cond.notify_all()
        raise AssertionError(f"not over after {limit_s} s:\n" + "\n".join(self.aws.events[-20:]))

    def close(self) -> None:
        with self._cond:
            self._halted = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    # -- what the user sees

    def ended(self) -> dict[str, Any] | None:
        try:
            body = self.s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/{JOB}/lineage.json")["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return dict(json.loads(body))

    def status(self) -> dict[str, Any]:
        return recovery.lineage_status(JOB, REGION, BUCKET, PREFIX, self.description, now=self.aws.now)

    def worst_case_s(self) -> float:
        """The plan's worst case: `--nodes` instances for max-run (docs/reliability.md)."""
        return self.nodes * MAX_RUN_S

    def finish(self) -> dict[str, Any]:
        """`status` (which retires an ended lineage), then nothing of the job may be left."""
        import boto3

        info = self.status()
        recovery.retire_when_done(REGION, JOB, info, now=self.aws.now)
        assert self.aws.live(JOB) == []
        groups = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()["AutoScalingGroups"]
        assert groups == []
        templates = boto3.client("ec2", region_name=REGION).describe_launch_templates()["LaunchTemplates"]
        assert templates == []
        # status counted every instance the job launched, from launch to termination
        hours = float(info["cost_so_far"].split(" node-hours")[0].rsplit(" ", 1)[-1])
        assert hours == pytest.approx(self.aws.billed_seconds(JOB) / 3600, abs=0.01), info["cost_so_far"]
        return info


class Played(Lineage):
    """The lineage loop of agent/elastic.py for real; the attempt played on the rehearsal's clock:
    the nodes meet once every rank is claimed, rank 0 trains while they all do, and the attempt ends
    as the node agent's would (a spot notice or a reboot's SIGTERM here, a peer's stop marker, the
    lineage's end, the work done)."""

    def __init__(self, *args: Any, harness: Rehearsal, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.harness = harness

    def attempt(self, k: int, rank: int) -> int | None:
        h, me = self.harness, self.me.instance_id
        stop_key, waited = self.key("attempts", str(k), "stop"), 0.0
        while True:
            if self._noticed() or me in h.rebooting:  # its own agent writes the attempt's stop
                reason = "shutdown" if me in h.rebooting else "spot-interruption"
                self.store.put_json_once(stop_key, {"reason": reason, "by": me})
                return 0  # interrupted here: AWS replaces this node
            marker = self._get(stop_key)
            if marker is not None:
                if marker.get("reason") in CONTINUES:
                    return None  # on to attempt k + 1
                self.end("Stopped", f"stopped ({marker.get('reason')})", k)
                return 0
            claims = self.store.list(self.key("attempts", str(k), "claims") + "/")
            met = len(claims) >= self.job.nodes
            if not met and self.ended() is not None:  # AttemptAgent.check_stop, while the nodes meet
                self.store.put_json_once(stop_key, {"reason": "peer-failed", "by": me})
                self.end("Stopped", "the lineage ended", k)
                return 0
            if met:
                if rank == 0:
                    h.progress += STEP_S
                if h.progress >= WORK_S:
                    self.end("Completed", "", k)
                    return 0
            else:
                waited += STEP_S
                if waited > self.bounds.replacement_wait_s:
                    self.end("Failed", f"attempt {k}: a node never joined", k)
                    return 0
            h.sleep(STEP_S)


@pytest.fixture
def rehearsal(mocked_aws, tmp_path, monkeypatch):
    made: list[Rehearsal] = []
    with AwsRules(REGION) as aws:

        def make(nodes: int) -> Rehearsal:
            found = Rehearsal(aws, tmp_path, nodes)
            monkeypatch.setattr(elastic, "time", found.clock())
            made.append(found)
            return found

        yield make
        for found in made:
            found.close()


def failures() -> list[dict[str, Any]]:
    import boto3

    s3 = boto3.client("s3", region_name=REGION)
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/jobs/{JOB}/failures/").get("Contents", [])
    return [json.loads(s3.get_object(Bucket=BUCKET, Key=i["Key"])["Body"].read()) for i in listing]


@pytest.mark.slow
def test_a_boot_that_fails_every_time_ends_the_lineage_failed_after_its_budget(rehearsal):
    """pip fails on every node: each failure is counted in S3; the third ends the lineage Failed
    with pip's own words, and every node after it leaves the group. Bound: the budget's boots plus
    the nodes already booting then (BUDGET + nodes - 1), each BOOT_S and a health check."""
    r = rehearsal(2)
    why = "node bootstrap failed at line 42 of its user data (pip install: no matching distribution)"
    took = r.run(lambda i: r.boot_fail(i, why), limit_s=3600)
    end = r.ended()
    assert end is not None and end["status"] == "Failed" and end["reason"] == f"{BUDGET} node failures, the last: {why}"
    assert [f["by"] for f in failures()] == ["boot"] * BUDGET
    assert len(r.aws.tagged(JOB)) == BUDGET + 2 - 1
    assert r.aws.billed_seconds(JOB) <= (BUDGET + 1) * (BOOT_S + 2 * STEP_S) <= r.worst_case_s()
    assert took <= 2 * (BOOT_S + 2 * STEP_S)  # two rounds of boots, then nothing more
    info = r.finish()
    assert (info["status"], info["terminal"]) == ("Failed", True)  # never a user's cancel
    assert why in info["detail"]


@pytest.mark.slow
def test_an_agent_that_crashes_every_time_is_bounded_by_the_same_budget(rehearsal):
    """A bug in the agent's loop: the crash is counted as a node failure (run_counted), not a
    power-off the group would replace until the hard stop."""
    r = rehearsal(2)

    class Crashing(Played):
        def claim(self, k: int) -> int | None:
            raise RuntimeError("a bug in the lineage loop")

    took = r.run(lambda i: run_counted(r.lineage(i, Crashing)), limit_s=3600)
    end = r.ended()
    assert end is not None and end["status"] == "Failed"
    assert (
        end["reason"] == f"{BUDGET} node failures, the last: node agent error: RuntimeError: a bug in the lineage loop"
    )
    assert [f["by"] for f in failures()] == ["agent"] * BUDGET
    assert r.aws.billed_seconds(JOB) <= (BUDGET + 1) * (BOOT_S + 2 * STEP_S) <= r.worst_case_s()
    assert took <= 2 * (BOOT_S + 2 * STEP_S)
    assert r.finish()["status"] == "Failed"


@pytest.mark.slow
def test_a_leave_refused_after_completion_is_not_replaced(rehearsal):
    """The job completed; AWS refuses the node's TerminateInstanceInAutoScalingGroup (AccessDenied,
    as IAM answers a right the role lacks). The node powers off anyway, and the group, its launches
    suspended by the lineage's end, replaces it no more (before, each replacement booted into the
    ended lineage, was refused too and powered off, until the hard stop)."""
    from botocore.exceptions import ClientError

    r = rehearsal(1)

    class Refused:
        def __init__(self, client: Any) -> None:
            self.client = client

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def terminate_instance_in_auto_scaling_group(self, **request: Any) -> Any:
            error = {"Error": {"Code": "AccessDenied", "Message": "not authorized"}}
            raise ClientError(error, "TerminateInstanceInAutoScalingGroup")  # type: ignore[arg-type]

    import boto3

    def node(instance_id: str) -> None:
        run_counted(r.lineage(instance_id, autoscaling=Refused(boto3.client("autoscaling", region_name=REGION))))

    took = r.run(node, limit_s=3 * 3600)
    assert r.ended() == {**(r.ended() or {}), "status": "Completed"}
    (instance,) = r.aws.tagged(JOB)  # one node, never replaced
    assert r.aws.billed_seconds(JOB) <= BOOT_S + WORK_S + 2 * STEP_S <= r.worst_case_s()
    assert took <= BOOT_S + WORK_S + 2 * STEP_S
    assert "its launches are suspended" in (r.tmp_path / instance / "node-agent.log").read_text()
    assert r.finish()["status"] == "Completed"


@pytest.mark.slow
def test_a_reboot_mid_run_powers_the_node_off_and_its_replacement_rejoins(rehearsal):
    """Node 0 reboots 10 minutes into training: its agent's SIGTERM ends the attempt (shutdown), its
    per-boot hook counts one node failure and powers it off at once (before, it idled until the
    deadline); the group's replacement joins the survivor in attempt 2, which completes."""
    r = rehearsal(2)
    reboot_at = BOOT_S + 600

    def reboot(rehearsal: Rehearsal) -> None:
        (first, _) = sorted(r.aws.group_instances(JOB))
        rehearsal.rebooting.add(first)

    took = r.run(lambda i: run_counted(r.lineage(i)), limit_s=3 * 3600, at={reboot_at: reboot})
    end = r.ended()
    assert end is not None and end["status"] == "Completed" and end["attempt"] == 2
    (failure,) = failures()
    assert failure["reason"].startswith("the instance rebooted")
    assert len(r.aws.tagged(JOB)) == 3
    # two nodes for the training and the boots, one more boot, a step of slack per event
    bound = 2 * (BOOT_S + WORK_S) + 2 * BOOT_S + 10 * STEP_S
    assert r.aws.billed_seconds(JOB) <= bound <= r.worst_case_s()
    assert took <= BOOT_S + WORK_S + BOOT_S + 10 * STEP_S
    info = r.finish()
    assert info["status"] == "Completed" and [a["attempt"] for a in info["attempts"]] == [1, 2]


@pytest.mark.slow
def test_every_node_reclaimed_at_once_resumes_on_the_replacements(rehearsal):
    """Both spot nodes get their 2-minute notice at once: each ends attempt 1 and stays until AWS
    terminates it; the group replaces both, the replacements start attempt 2 from the checkpoint."""
    r = rehearsal(2)

    def reclaim(rehearsal: Rehearsal) -> None:
        rehearsal.aws.reclaim(*rehearsal.aws.group_instances(JOB))

    took = r.run(lambda i: run_counted(r.lineage(i)), limit_s=3 * 3600, at={BOOT_S + 600: reclaim})
    end = r.ended()
    assert end is not None and end["status"] == "Completed" and end["attempt"] == 2
    assert failures() == [] and len(r.aws.tagged(JOB)) == 4
    bound = 2 * (BOOT_S + WORK_S) + 2 * (BOOT_S + 120) + 10 * STEP_S
    assert r.aws.billed_seconds(JOB) <= bound <= r.worst_case_s()
    assert took <= 2 * BOOT_S + WORK_S + 120 + 10 * STEP_S
    assert r.finish()["status"] == "Completed"


@pytest.mark.slow
def test_the_rehearsal_fails_a_node_that_only_powers_off(rehearsal):
    """The rehearsal can fail: a node that fails and only powers off (the user data before the
    failure budget) is replaced by the group again and again, until the scheduled hard stop."""
    r = rehearsal(1)
    with pytest.raises(AssertionError, match="not over after 1800 s"):
        r.run(lambda instance_id: None, limit_s=1800)
    assert len(r.aws.tagged(JOB)) >= 1800 // (BOOT_S + 2 * STEP_S)


def test_status_counts_failed_boots_and_never_calls_a_nodes_stop_a_cancel(rehearsal):
    """Below the budget the lineage goes on, and `status` says how many node failures it took and
    counts the failed instance's cost from launch to termination (it never claimed a rank: before,
    `status` said "launching, $0"). A node's marker in the lineage's stop (a bundle older than the
    budget wrote one there) is a Failed lineage at once, never the user's cancel."""
    r = rehearsal(2)
    first, _ = r.aws.group_instances(JOB)
    r.aws.advance(BOOT_S)
    r.boot_fail(first, "could not fetch the code bundle (exit 1)")
    r.aws.power_off(first)
    r.aws.advance(STEP_S)
    info = r.status()
    assert (info["status"], info["terminal"]) == ("InProgress", False)
    assert "1 of 3 node failure(s) so far, the last: could not fetch the code bundle (exit 1)" in info["detail"]
    hours = float(info["cost_so_far"].split(" node-hours")[0].rsplit(" ", 1)[-1])
    assert hours == pytest.approx(r.aws.billed_seconds(JOB) / 3600, abs=0.01)
    assert r.aws.seconds_of(first) == BOOT_S  # counted, though it never claimed a rank
    r.s3.put_object(
        Bucket=BUCKET,
        Key=f"{PREFIX}/jobs/{JOB}/stop",
        Body=b'{"reason": "peer-failed", "detail": "node 0 failed: bundle hash mismatch"}',
    )
    info = r.status()
    assert (info["status"], info["detail"]) == ("Failed", "node 0 failed: bundle hash mismatch")


def test_status_retires_an_ended_lineage_whose_node_never_left(rehearsal):
    """The lineage ended, but a node's agent died before it left: `status` deletes the group (and
    with it that instance) once the nodes had time to upload their last records."""
    r = rehearsal(1)
    (node,) = r.aws.group_instances(JOB)
    body = {"status": "Completed", "reason": "", "time": r.aws.now}
    r.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/{JOB}/lineage.json", Body=json.dumps(body).encode())
    info = r.status()
    recovery.retire_when_done(REGION, JOB, info, now=r.aws.now)
    assert r.aws.group_instances(JOB) == [node]  # it may still be uploading
    r.aws.advance(recovery.RETIRE_AFTER_S)
    recovery.retire_when_done(REGION, JOB, r.status(), now=r.aws.now)
    assert r.aws.live(JOB) == []
    import boto3

    assert boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()["AutoScalingGroups"] == []


def test_boot_waits_out_iam_propagation_and_no_longer():
    """A new role's rights reach S3 within a minute or two: boot.py retries what IAM refuses for
    IAM_PATIENCE_S (on the node's clock), and raises at once anything else."""
    from botocore.exceptions import ClientError

    namespace: dict[str, Any] = {"__name__": "boot"}
    exec(compile(boot_script(BUCKET, "k", "0" * 64, f"{PREFIX}/jobs/{JOB}", JOB, BUDGET), "boot.py", "exec"), namespace)
    now = [0.0]
    namespace["time"] = types.SimpleNamespace(
        monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), time=lambda: now[0]
    )
    calls: list[float] = []

    def refused(code: str, until: float) -> Any:
        def call() -> str:
            calls.append(now[0])
            if now[0] < until:
                raise ClientError({"Error": {"Code": code, "Message": "no"}}, "GetObject")  # type: ignore[arg-type]
            return "done"

        return call

    assert namespace["patiently"](refused("AccessDenied", 60)) == "done" and calls == [0, 10, 20, 30, 40, 50, 60]
    calls.clear()
    with pytest.raises(ClientError, match="AccessDenied"):
        namespace["patiently"](refused("AccessDenied", 10_000))
    assert calls[-1] - calls[0] <= namespace["IAM_PATIENCE_S"] + 10
    calls.clear()
    with pytest.raises(ClientError, match="NoSuchBucket"):
        namespace["patiently"](refused("NoSuchBucket", 10_000))
    assert len(calls) == 1
