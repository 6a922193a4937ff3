"""A node of a spot lineage (launcher/backends/ec2/agent/elastic.py) against moto's S3 and Auto Scaling group.

The bounds a node applies before it starts an attempt (--max-restarts, --on-demand-after, an
ended or cancelled lineage) and the rank claims, in seconds; the attempts themselves are the node
agent's (tests/launcher/backends/ec2/agent/test_node_agent.py), and tests/e2e/test_ec2_two_nodes.py runs a whole
lineage with real nodes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # tests/ is not a package
from imds import FakeImds  # noqa: E402

from distrain_cloud.launcher.backends.ec2.agent.elastic import Lineage  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.imds import Imds  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.job import Job, NodeIdentity, Settings  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.logs import LogSink  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.store import Store  # noqa: E402

REGION = "us-east-1"
BUCKET = "lineage-bucket"
GROUP = "job-l1"


def make_job(nodes: int = 2, **recovery) -> Job:
    return Job.from_dict(
        {
            "job": GROUP,
            "lineage": GROUP,
            "attempt": 1,
            "nodes": nodes,
            "processes_per_node": 1,
            "train_argv": [],
            "region": REGION,
            "bucket": BUCKET,
            "prefix": "distrain",
            "code_sha256": "0" * 64,
            "deadline": time.time() + 3600,
            "log_group": "/distrain/test",
            "checkpoint_uri": f"s3://{BUCKET}/distrain/checkpoints/{GROUP}/",
            "model_uri": f"s3://{BUCKET}/distrain/jobs/{GROUP}/model/",
            "output_uri": f"s3://{BUCKET}/distrain/jobs/{GROUP}/output/",
            "recovery": {"group": GROUP, "nodes": nodes, "max_restarts": 2, "replacement_wait_s": 60, **recovery},
        }
    )


class AwsLikeGroups:
    """moto's Auto Scaling client, except for one behaviour moto lacks (a documented double): moto's
    UpdateAutoScalingGroup needs a LaunchTemplate in every MixedInstancesPolicy (a KeyError otherwise),
    where AWS's API model makes it optional and the nodes send only the InstancesDistribution (so
    their role needs no right to the launch template). The double merges that distribution into the
    group's policy and sends moto the whole, as AWS would apply it."""

    def __init__(self, client) -> None:
        self.client = client

    def __getattr__(self, name: str):
        return getattr(self.client, name)

    def update_auto_scaling_group(self, **request):
        policy = request.get("MixedInstancesPolicy")
        if policy and "LaunchTemplate" not in policy:
            (found,) = self.client.describe_auto_scaling_groups(
                AutoScalingGroupNames=[request["AutoScalingGroupName"]]
            )["AutoScalingGroups"]
            whole = found["MixedInstancesPolicy"]
            spec = whole["LaunchTemplate"]["LaunchTemplateSpecification"]  # moto answers with its id and name
            whole["LaunchTemplate"] = {
                "LaunchTemplateSpecification": {k: spec[k] for k in ("LaunchTemplateName", "Version")}
            }
            distribution = {**whole.get("InstancesDistribution", {}), **policy.get("InstancesDistribution", {})}
            request["MixedInstancesPolicy"] = {**whole, "InstancesDistribution": distribution}
        return self.client.update_auto_scaling_group(**request)


class Node:
    """One instance of the group, with its metadata server, running the lineage loop. Each attempt
    it would start is recorded instead (the attempt is the node agent's, tested on its own)."""

    def __init__(self, tmp_path: Path, job: Job, instance_id: str, *, ends_attempt: str | None = None) -> None:
        import boto3

        self.fake = FakeImds(instance_id=instance_id, region=REGION).start()
        self.attempts: list[tuple[int, int]] = []
        store = Store(BUCKET, REGION, boto3.client("s3", region_name=REGION))
        settings = Settings(work=tmp_path / instance_id, poll_s=0.05)
        self.sink = LogSink(settings.work / "node-agent.log")
        ends = ends_attempt

        class Recording(Lineage):
            def attempt(self, k: int, rank: int) -> int | None:
                outer.attempts.append((k, rank))
                if ends is None:  # interrupted elsewhere: on to the next attempt
                    self.store.put_json(self.key("attempts", str(k), "stop"), {"reason": "spot-interruption"})
                    return None
                self.end(ends, "", k)
                return 0

        outer = self
        me = NodeIdentity(instance_id, 0, "r-1", "127.0.0.1", REGION)
        self.lineage = Recording(
            job,
            me,
            settings,
            store=store,
            imds=Imds(self.fake.endpoint),
            sink=self.sink,
            autoscaling=AwsLikeGroups(boto3.client("autoscaling", region_name=REGION)),
        )

    def run(self) -> int:
        try:
            return self.lineage.run()
        finally:
            self.sink.close()
            self.fake.stop()

    @property
    def log(self) -> str:
        return self.sink.path.read_text()


@pytest.fixture
def group(mocked_aws):
    """The lineage's bucket and a group of two nodes, as the launcher makes them."""
    import base64

    import boto3

    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    ec2 = boto3.client("ec2", region_name=REGION)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    data = {"ImageId": ami, "InstanceType": "c5.large", "UserData": base64.b64encode(b"#!/bin/bash").decode()}
    ec2.create_launch_template(LaunchTemplateName=GROUP, LaunchTemplateData=data)
    asg = boto3.client("autoscaling", region_name=REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        MinSize=0,
        MaxSize=2,
        DesiredCapacity=2,
        VPCZoneIdentifier=subnet,
        MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": GROUP, "Version": "$Latest"}},
            "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 0},
        },
    )
    return asg


def instances(asg) -> list[str]:
    return [i["InstanceId"] for i in asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]]


def lineage_record(s3_key: str = f"distrain/jobs/{GROUP}/lineage.json") -> dict:
    import boto3

    return json.loads(boto3.client("s3", region_name=REGION).get_object(Bucket=BUCKET, Key=s3_key)["Body"].read())


def test_two_nodes_claim_ranks_0_and_1_and_a_third_waits_for_the_next_attempt(group, tmp_path):
    job = make_job()
    first, second = instances(group)
    nodes = [Node(tmp_path, job, first, ends_attempt="Completed"), Node(tmp_path, job, second)]
    # The second node's attempts are all "interrupted elsewhere", until the first ends the lineage.
    assert nodes[0].lineage.claim(1) == 0 and nodes[1].lineage.claim(1) == 1
    assert nodes[1].lineage.claim(1) is None  # every rank of attempt 1 is taken
    body = lineage_record(f"distrain/jobs/{GROUP}/attempts/1/claims/1.json")
    assert (body["instance_id"], body["zone"], body["market"]) == (second, "us-east-1a", "spot")
    for n in nodes:
        n.fake.stop()
        n.sink.close()


@pytest.mark.parametrize("start", [1, 4])
def test_restarts_exhausted_end_the_lineage_and_every_node_leaves_the_group(group, tmp_path, start):
    """--max-restarts 2: three attempts run; the node that would start a fourth ends the lineage
    Interrupted, naming the bound and `resume`, and leaves the group so nothing replaces it. A job
    that resumed an ended lineage (its job.json says attempt 4) numbers on from there, with the
    same bound: attempts 4-6, as `status` and the logs name them."""
    job = dataclasses.replace(make_job(), attempt=start)
    first, second = instances(group)
    node = Node(tmp_path, job, first)
    assert node.run() == 0
    assert node.attempts == [(start, 0), (start + 1, 0), (start + 2, 0)]
    end = lineage_record()
    assert end["status"] == "Interrupted" and end["attempt"] == start + 3
    assert end["reason"].startswith("spot capacity was reclaimed 3 times: --max-restarts 2 reached")
    assert f"`distrain-cloud resume {GROUP}`" in end["reason"]
    assert instances(group) == [second]  # left, and not replaced: the desired capacity went down
    assert group.describe_auto_scaling_groups()["AutoScalingGroups"][0]["DesiredCapacity"] == 1
    # A node that boots into the ended lineage (a replacement already on its way) leaves at once.
    late = Node(tmp_path, job, second)
    assert late.run() == 0 and late.attempts == []
    assert "the lineage has ended (Interrupted): leaving" in late.log
    assert instances(group) == []


def test_on_demand_after_k_interruptions_switches_the_group_once(group, tmp_path):
    job = make_job(
        on_demand_after=1,
        on_demand_request={
            "AutoScalingGroupName": GROUP,
            "MixedInstancesPolicy": {"InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 100}},
        },
    )
    first, second = instances(group)
    node = Node(tmp_path, job, first)
    assert node.run() == 0 and len(node.attempts) == 3
    policy = group.describe_auto_scaling_groups()["AutoScalingGroups"][0]["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 100
    assert node.log.count("the group's replacements are on-demand from now on") == 1  # once, at attempt 2
    assert "1 interruption(s): the group's replacements are on-demand" in node.log


def test_a_cancelled_lineage_starts_no_attempt_and_a_completed_one_ends_for_every_node(group, tmp_path):
    import boto3

    job = make_job()
    first, second = instances(group)
    s3 = boto3.client("s3", region_name=REGION)
    s3.put_object(Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/stop", Body=b'{"reason": "cancel"}')
    node = Node(tmp_path, job, first)
    assert node.run() == 0 and node.attempts == []
    assert lineage_record()["status"] == "Stopped" and "cancelled" in lineage_record()["reason"]
    s3.delete_object(Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/stop")
    s3.delete_object(Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/lineage.json")
    done = Node(tmp_path, job, second, ends_attempt="Completed")
    assert done.run() == 0
    assert done.attempts == [(1, 0)] and lineage_record()["status"] == "Completed"
    assert instances(group) == []


def test_when_every_node_was_reclaimed_the_replacements_start_the_next_attempt(group, tmp_path):
    """No survivor is left to say attempt 1 ended: its stop marker (written by the noticed nodes)
    closes it, and the group's replacements meet as attempt 2."""
    import boto3

    job = make_job()
    s3 = boto3.client("s3", region_name=REGION)
    root = f"distrain/jobs/{GROUP}/attempts/1"
    for rank in (0, 1):
        s3.put_object(Bucket=BUCKET, Key=f"{root}/claims/{rank}.json", Body=b'{"instance_id": "i-gone"}')
    s3.put_object(Bucket=BUCKET, Key=f"{root}/stop", Body=b'{"reason": "spot-interruption"}')
    first, second = instances(group)
    replacement = Node(tmp_path, job, first, ends_attempt="Completed")
    assert replacement.run() == 0 and replacement.attempts == [(2, 0)]


@pytest.mark.parametrize("what", ["cancel", "deadline"])
def test_a_node_that_finds_every_rank_taken_watches_the_cancel_and_the_deadline(group, tmp_path, what):
    """Attempt 1 has all its nodes (an extra instance came, say from a zone rebalance): the extra
    node waits for the next attempt, and while it waits a cancel or the deadline ends the lineage
    for it at once (it waited for the attempt's end alone before, on a group that may never end it)."""
    import threading

    import boto3

    job = make_job()
    if what == "deadline":
        job = dataclasses.replace(job, deadline=time.time() + 0.5)
    s3 = boto3.client("s3", region_name=REGION)
    for rank in (0, 1):
        s3.put_object(Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/attempts/1/claims/{rank}.json", Body=b"{}")
    first, second = instances(group)
    node = Node(tmp_path, job, first)
    if what == "cancel":
        cancel = threading.Timer(
            0.5, lambda: s3.put_object(Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/stop", Body=b'{"reason": "cancel"}')
        )
        cancel.start()
    started = time.monotonic()
    assert node.run() == 0 and node.attempts == []
    assert time.monotonic() - started < 5
    end = lineage_record()
    assert end["status"] == "Stopped"
    assert ("cancelled" if what == "cancel" else "max-run reached") in end["reason"]
    assert instances(group) == [second]  # it left the group: nothing replaces it
    assert [
        p["ProcessName"] for p in group.describe_auto_scaling_groups()["AutoScalingGroups"][0]["SuspendedProcesses"]
    ] == ["Launch"]


def test_a_node_waiting_in_the_rendezvous_stops_when_the_lineage_ends(group, tmp_path):
    """The real attempt (AttemptAgent): this node waits in attempt 1's rendezvous for a peer whose
    boots keep failing; the failure that uses the budget up ends the lineage, and the waiting node
    stops at its next poll (it waited for the rendezvous timeout before), with the lineage's reason."""
    import threading

    import boto3

    job = make_job()
    first, second = instances(group)
    s3 = boto3.client("s3", region_name=REGION)
    end = {"status": "Failed", "reason": "3 node failures, the last: pip failed", "time": time.time()}
    ending = threading.Timer(
        0.5,
        lambda: s3.put_object(Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/lineage.json", Body=json.dumps(end).encode()),
    )
    fake = FakeImds(instance_id=first, region=REGION).start()
    settings = Settings(work=tmp_path / first, poll_s=0.05)
    sink = LogSink(settings.work / "node-agent.log")
    lineage = Lineage(
        job,
        NodeIdentity(first, 0, "r-1", "127.0.0.1", REGION),
        settings,
        store=Store(BUCKET, REGION, boto3.client("s3", region_name=REGION)),
        imds=Imds(fake.endpoint),
        sink=sink,
        autoscaling=AwsLikeGroups(boto3.client("autoscaling", region_name=REGION)),
    )
    ending.start()
    started = time.monotonic()
    try:
        assert lineage.run() == 0
    finally:
        sink.close()
        fake.stop()
    assert time.monotonic() - started < 10
    assert lineage_record()["status"] == "Failed"  # the first word stays
    record = lineage_record(f"distrain/jobs/{GROUP}/attempts/1/nodes/0.json")
    assert record["status"] == "Stopped" and "the lineage ended (Failed): 3 node failures" in record["reason"]
    assert instances(group) == [second]


def test_a_nodes_marker_in_the_lineages_stop_ends_it_failed_not_cancelled(group, tmp_path):
    """A node whose job.json did not verify writes its failure where the job's stop is (it cannot
    tell a lineage from a plain job then): the lineage ends Failed with its words, not "cancelled"."""
    import boto3

    marker = {"reason": "peer-failed", "detail": "node 0 failed: job.json hash mismatch: ..."}
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/stop", Body=json.dumps(marker).encode()
    )
    first, _ = instances(group)
    node = Node(tmp_path, make_job(), first)
    assert node.run() == 0 and node.attempts == []
    assert (lineage_record()["status"], lineage_record()["reason"]) == ("Failed", marker["detail"])


def test_a_rendezvous_that_times_out_names_the_last_node_failure(group, tmp_path):
    """The peer failed its boot once and its replacement was still booting when the rendezvous
    gave up: the lineage's end names that failure, not only "never joined"."""
    import boto3

    job = dataclasses.replace(make_job(), rendezvous_timeout_s=1)
    failure = {"instance_id": "i-gone", "reason": "node bootstrap failed at line 9 (pip)", "by": "boot"}
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key=f"distrain/jobs/{GROUP}/failures/1.json", Body=json.dumps(failure).encode()
    )
    first, _ = instances(group)
    fake = FakeImds(instance_id=first, region=REGION).start()
    settings = Settings(work=tmp_path / first, poll_s=0.05)
    sink = LogSink(settings.work / "node-agent.log")
    lineage = Lineage(
        job,
        NodeIdentity(first, 0, "r-1", "127.0.0.1", REGION),
        settings,
        store=Store(BUCKET, REGION, boto3.client("s3", region_name=REGION)),
        imds=Imds(fake.endpoint),
        sink=sink,
        autoscaling=AwsLikeGroups(boto3.client("autoscaling", region_name=REGION)),
    )
    try:
        assert lineage.run() == 0
    finally:
        sink.close()
        fake.stop()
    end = lineage_record()
    assert end["status"] == "Failed" and "never joined the rendezvous" in end["reason"]
    assert end["reason"].endswith("; the last node failure: node bootstrap failed at line 9 (pip)")
