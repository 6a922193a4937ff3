"""The cost clock (launcher/backends/ec2/agent/costclock.py): the nodes keep what their job has cost in
its S3 folder and stop it, with a checkpoint, before `--max-cost` would be passed.

Against moto's S3 with a clock the test moves: every instance's part, the sum, the stop marker
with reason max-cost (a lineage's newest attempt too), a node agent that stops its training on it,
and a lineage that ends Stopped with the cap's words.
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
from test_elastic import BUCKET as LINEAGE_BUCKET  # noqa: E402
from test_elastic import GROUP, Node, instances, lineage_record  # noqa: E402
from test_elastic import group as group  # noqa: E402,F401 -- the fixture
from test_elastic import make_job as make_lineage_job  # noqa: E402
from test_node_agent import BUCKET, REGION, Cluster, make_job  # noqa: E402

from distrain_cloud.launcher.backends.ec2.agent import costclock  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.costclock import (  # noqa: E402
    MIN_BILLED_S,
    CostClock,
    Part,
    Prices,
    spend,
)
from distrain_cloud.launcher.backends.ec2.agent.imds import Imds  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.job import NodeFailure, NodeIdentity, Settings  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.logs import LogSink  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.store import Store  # noqa: E402

ON_DEMAND, SPOT = 3.0, 1.2  # USD per instance-hour
COST = {"max_usd": 10.0, "usd_per_hour": {"on-demand": ON_DEMAND, "spot": SPOT}}
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.t = now

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def s3(mocked_aws):
    import boto3

    client = boto3.client("s3", region_name=REGION)
    client.create_bucket(Bucket=BUCKET)
    return client


def make_clock(s3, tmp_path, job, instance: str, clock: Clock, market: str = "spot", **kw) -> CostClock:
    prices = Prices.from_job(job)
    assert prices is not None
    sink = LogSink(tmp_path / f"{instance}.log")
    me = NodeIdentity(instance, 0, "r-1", "127.0.0.1", REGION)
    kw = {"reserve_s": 600.0, **kw}
    store = Store(job.bucket, REGION, s3)
    return CostClock(job, me, prices, store, sink, market=market, started=clock(), now=clock, **kw)


def stop_marker(s3, key: str = "distrain/jobs/job-a1/stop", bucket: str = BUCKET) -> dict | None:
    try:
        return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


# ----------------------------------------------------------------------------- the sum


def test_an_instance_counts_from_its_boot_at_least_a_minute_and_not_past_its_last_word():
    running = Part("i-a", 3.6, started=T0, seen=T0 + 600)
    brief = Part("i-b", 3.6, started=T0, seen=T0 + 5)
    # At T0 + 700: i-a reported 100 s ago (stale after 120 s): it counts to now, 700 s;
    # i-b spoke once, 695 s ago: it counts to its last word plus the stale allowance, and at least a minute.
    found = spend([running, brief], T0 + 700, stale_s=120)
    assert running.billed_s(T0 + 700, 120) == 700 and brief.billed_s(T0 + 700, 120) == 125
    assert found.usd == pytest.approx(3.6 * (700 + 125) / 3600)
    assert (found.instances, found.reporting, found.usd_per_hour) == (2, 1, 3.6)
    assert Part("i-c", 3.6, T0, T0).billed_s(T0 + 1, 120) == MIN_BILLED_S  # EC2's one-minute minimum


def test_job_jsons_cost_block_is_checked_and_the_market_picks_the_price():
    job = make_job(cost=COST)
    prices = Prices.from_job(job)
    assert prices is not None and (prices.price("spot"), prices.price("on-demand")) == (SPOT, ON_DEMAND)
    assert prices.price(None) == prices.price("scheduled") == ON_DEMAND  # unknown: the highest
    assert Prices.from_job(make_job()) is None  # no --max-cost: no clock
    for bad in ({"max_usd": "ten"}, {"max_usd": 10, "usd_per_hour": {"spot": -1}}, {"usd_per_hour": {}}):
        with pytest.raises(NodeFailure, match="job.json's cost"):
            Prices.from_job(make_job(cost=bad))


# ----------------------------------------------------------------------------- the stop


def test_two_nodes_stop_the_job_before_the_cap_and_the_stop_fits_under_it(s3, tmp_path):
    """Two spot nodes at $1.20/h each, a $3 cap, a stop that takes 10 minutes: the clock stops the
    job at the tick where another tick plus a stop would reach the cap, and a stop begun then ends
    under it (the instances billed to their power-off)."""
    job = make_job(cost={**COST, "max_usd": 3.0})
    clock = Clock()
    nodes = [make_clock(s3, tmp_path, job, f"i-{n}", clock) for n in (0, 1)]
    stopped_at = None
    while stopped_at is None and clock.t < T0 + 10 * 3600:
        clock.t += 60
        said = [n.tick() for n in nodes]
        if any(said):
            stopped_at = clock.t
    assert stopped_at is not None
    marker = stop_marker(s3)
    assert marker["reason"] == "max-cost" and marker["detail"].startswith("max-cost reached: $")
    assert "--max-cost $3 would be passed before the next check" in marker["detail"]
    # What both instances cost through the stop (a tick to notice, the 10-minute reserve): <= $3.
    through_stop = 2 * SPOT * (stopped_at - T0 + 60 + 600) / 3600
    assert through_stop <= 3.0
    # And not a tick early: the clock reserves for the job's nodes at the highest price it may pay
    # (a lineage's replacements may be on-demand), which the tick before did not yet reach.
    reserve = 2 * ON_DEMAND * (60 + 600) / 3600
    assert 2 * SPOT * (stopped_at - 60 - T0) / 3600 + reserve < 3.0 <= 2 * SPOT * (stopped_at - T0) / 3600 + reserve
    # Each instance wrote its own part: no two nodes ever write one key.
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="distrain/jobs/job-a1/cost/")["Contents"]
    assert sorted(o["Key"] for o in listed) == [f"distrain/jobs/job-a1/cost/i-{n}.json" for n in (0, 1)]


def test_the_clock_reserves_for_every_node_of_the_job_whoever_reports(s3, tmp_path):
    """One node reports while its peer (a replacement still booting) does not yet: the clock
    reserves for both nodes, so the peer's unreported minutes cannot carry the job past the cap."""
    job = make_job(cost={"max_usd": 1.0, "usd_per_hour": {"spot": SPOT, "on-demand": SPOT}})
    clock = Clock()
    alone = make_clock(s3, tmp_path, job, "i-0", clock)
    # One node for 10 minutes = $0.20 spent; ahead: 2 nodes x $1.20 x 11 min = $0.44: under $1.
    clock.t += 600
    assert alone.tick() is None
    clock.t += 840  # $0.48 spent; ahead $0.44: $0.92 < $1
    assert alone.tick() is None
    clock.t += 300  # $0.58 + $0.44 >= $1, though one node alone would need 40 more minutes
    assert alone.tick() is not None


def test_a_planted_part_is_named_once_and_a_dead_instance_stops_counting(s3, tmp_path):
    job = make_job(cost={**COST, "max_usd": 100.0})
    clock = Clock()
    node = make_clock(s3, tmp_path, job, "i-0", clock)
    folder = "distrain/jobs/job-a1/cost"
    s3.put_object(Bucket=BUCKET, Key=f"{folder}/i-planted.json", Body=b"\xff not json")
    s3.put_object(Bucket=BUCKET, Key=f"{folder}/i-odd.json", Body=json.dumps({"usd_per_hour": True}).encode())
    dead = {"instance_id": "i-dead", "usd_per_hour": 3.6, "started": T0 - 3600, "seen": T0 - 1800}
    s3.put_object(Bucket=BUCKET, Key=f"{folder}/i-dead.json", Body=json.dumps(dead).encode())
    for _ in range(3):
        clock.t += 60
        assert node.tick() is None
    log = node.sink.path.read_text()
    assert log.count("not a part of the cost clock") == 2  # each planted key named once
    # The dead instance: from its boot to its last word plus the stale allowance (30 min + 2 min).
    assert node.sink is not None
    others, left_out = node._read_parts()
    assert left_out == 0 and spend(others, clock.t, node.stale_s).usd == pytest.approx(3.6 * 1920 / 3600)


def test_a_lineages_clock_stops_the_newest_attempt_and_the_lineage_ends_with_its_words(group, tmp_path):
    """The cap reached while attempt 2 runs: the lineage's stop and attempt 2's are written; a
    node between attempts ends the lineage Stopped with the cap's words (not "cancelled"), and
    leaves the group, so nothing is replaced."""
    import boto3

    s3 = boto3.client("s3", region_name=REGION)
    job = dataclasses.replace(make_lineage_job(), cost={**COST, "max_usd": 0.5})
    root = f"distrain/jobs/{GROUP}"
    for k in (1, 2):
        s3.put_object(Bucket=LINEAGE_BUCKET, Key=f"{root}/attempts/{k}/claims/0.json", Body=b"{}")
    clock = Clock()
    node = make_clock(s3, tmp_path, job, "i-0", clock)
    clock.t += 300
    assert node.tick() is not None
    for key in (f"{root}/stop", f"{root}/attempts/2/stop"):
        assert stop_marker(s3, key, LINEAGE_BUCKET)["reason"] == "max-cost"
    assert stop_marker(s3, f"{root}/attempts/1/stop", LINEAGE_BUCKET) is None
    first, _ = instances(group)
    waiting = Node(tmp_path, job, first, ends_attempt="Completed")
    assert waiting.run() == 0 and waiting.attempts == []
    end = lineage_record()
    assert end["status"] == "Stopped" and end["reason"].startswith("max-cost reached: $")
    assert first not in instances(group)


@pytest.mark.slow
def test_the_cap_stops_training_nodes_with_a_checkpoint_and_a_named_reason(s3, tmp_path):
    """Two node agents train; the clock (driven here) reaches the cap: both stop through the
    marker as for a cancel, every node's part of the checkpoint reaches S3, and each record says
    Stopped with the cap's words, which `status` shows."""
    from distrain_cloud.launcher.backends.ec2.agent.checkpoints import restore_checkpoint

    job = make_job(cost={**COST, "max_usd": 0.2})
    store = Store(BUCKET, REGION, s3)
    c = Cluster(tmp_path / "cluster", store, job, steps=1000)
    try:
        clock = Clock(time.time())
        clocks = [make_clock(s3, tmp_path, job, i["InstanceId"], clock) for i in c.instances]

        def reach_the_cap() -> None:
            clock.t += 120
            for each in clocks:
                each.tick()

        c.once_training(reach_the_cap)
        results = c.run()
    finally:
        c.close()
    assert {o.status for o in results.values()} == {"Stopped"}
    for rank in (0, 1):
        record = c.record(rank)
        assert (record["status"], record["exit_code"]) == ("Stopped", 143)
        assert record["reason"].startswith("max-cost reached: $")
    assert restore_checkpoint(store, "distrain/checkpoints/lin/", tmp_path / "restore") is not None


def test_the_agents_hook_starts_a_clock_only_with_a_cap_and_counts_the_nodes_market(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(costclock, "boot_time", lambda: time.time() - 30)
    store = Store(BUCKET, REGION, s3)
    with FakeImds(instance_id="i-0abc", lifecycle="on-demand") as fake:
        sink = LogSink(tmp_path / "node-agent.log")
        me = NodeIdentity("i-0abc", 0, "r-1", "127.0.0.1", REGION)
        settings = Settings(work=tmp_path)
        assert costclock.start(make_job(), me, settings, store, Imds(fake.endpoint), sink) is None
        clock = costclock.start(make_job(cost=COST), me, settings, store, Imds(fake.endpoint), sink)
        sink.close()
    assert clock is not None and clock.reserve_s == 5 + 110 + 600 + 60
    part = store.get_json("distrain/jobs/job-a1/cost/i-0abc.json")
    assert (part["market"], part["usd_per_hour"]) == ("on-demand", ON_DEMAND)
    assert 25 <= part["seen"] - part["started"] <= 60
    assert "cost clock: on-demand at $3/h; the job stops before --max-cost $10" in sink.path.read_text()
    # After a reboot the kernel's uptime starts again; the instance's part keeps its first boot.
    monkeypatch.setattr(costclock, "boot_time", lambda: time.time() - 5)
    with FakeImds(instance_id="i-0abc", lifecycle="on-demand") as fake:
        sink = LogSink(tmp_path / "after-reboot.log")
        again = costclock.start(make_job(cost=COST), me, settings, store, Imds(fake.endpoint), sink)
        sink.close()
    assert again is not None and again.started == pytest.approx(part["started"])
    clock.close()
    again.close()
