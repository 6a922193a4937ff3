"""A node of a spot lineage that recovers on AWS's side (launcher/backends/ec2/recovery.py): the node agent's
loop over the lineage's attempts.

The launcher made an Auto Scaling group that keeps N nodes from one launch template, so every node,
the first ones and every replacement, boots the same user data and reaches this loop with the same
job.json. Its instances come from many launches (no shared reservation id, every launch index 0),
so an attempt's ranks are claimed in S3 instead: `attempts/<k>/claims/<rank>.json`, each created
only if absent (a conditional PutObject), the lowest free rank first. Attempt k is then an ordinary
job of the node agent, rooted at `jobs/<job>/attempts/<k>/` (rendezvous, records, stop marker),
restoring the lineage's newest complete checkpoint.

When attempt k ends:
- interrupted (a spot notice, or a node shutting down): a node that got the notice itself powers
  off (AWS reclaims it; the group launches its replacement); a survivor moves to attempt k + 1 and
  waits there for the replacements;
- anything else (completed, failed, cancelled, the deadline) ends the lineage: the node records it
  in `jobs/<job>/lineage.json`, suspends the group's launches and leaves the group, lowering its
  desired capacity, so nothing is replaced (a leave AWS refuses still leaves the launches
  suspended). A node that boots into an ended lineage leaves at once, and one still waiting in
  an attempt's rendezvous stops once the lineage has ended.
A node that cannot go on (its agent crashed; boot.py counts the user data's failures and reboots
in the same slots) is one of the lineage's `failure_budget` failures, `jobs/<job>/failures/<n>.json`:
below the budget it powers off and the group replaces it; the one that uses it up ends the
lineage Failed with its own reason.
Attempts are numbered across the lineage: a job's group starts at its job.json's `attempt` (1 for
a submit, the next number for a `resume` of an ended lineage), so `status`, the logs and the
folders name one number. Before an attempt starts the node applies the lineage's bounds:
`--max-restarts N` (the job's (N + 2)th attempt is never started), `--on-demand-after` (the
group's replacements become on-demand), the deadline and a cancel of the whole lineage
(`jobs/<job>/stop`).

Stdlib and boto3 only, like the node agent; it never imports the launcher.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .. import layout
from .checkpoints import files_in
from .costclock import lineage_stop_words
from .imds import Imds
from .job import BadObject, Job, NodeFailure, NodeIdentity, Settings, one_line, parse_s3_uri, short
from .logs import LogSink
from .node import Agent
from .store import Store

# Stop reasons after which the lineage goes on: capacity was reclaimed, not the job's own doing.
CONTINUES = ("spot-interruption", "shutdown")
ENDED = ("Completed", "Failed", "Stopped", "Interrupted")


@dataclass(frozen=True)
class AttemptJob(Job):
    """Attempt `number` of the lineage: the node agent's job, rooted in `attempts/<number>/`."""

    number: int = 1

    def key(self, *parts: str) -> str:
        return super().key(layout.ATTEMPTS, str(self.number), *parts)

    def sync_id(self) -> str:
        # Checkpoint markers name the attempt: an interrupted one's are never taken for this one's.
        return layout.attempt_job(self.job, self.number)


class AttemptAgent(Agent):
    """The node agent for one attempt. Leaving a rendezvous unmet does not end the other instances:
    they belong to the group, which would only replace them; the lineage's end decides instead,
    and it stops a node still waiting for the others (node failures used the budget up meanwhile)."""

    lineage_ended: Callable[[], dict[str, Any] | None] = staticmethod(lambda: None)

    def _end_unmet_job(self) -> bool:
        return False

    def check_stop(self, training: bool) -> None:
        super().check_stop(training)
        # Only while the nodes meet: once they train, a peer that ends the lineage (it completed
        # first) must not stop this node's last steps; the attempt's own stop marker covers failures.
        if self.stop is not None or self.met:
            return
        try:
            end = self.lineage_ended()
        except Exception as e:  # one missed look; the next poll looks again
            self.sink.agent(f"the lineage's end not readable ({short(e)})")
            return
        if end is not None:
            status, reason = one_line(end.get("status", "?")), one_line(end.get("reason", ""))
            self.request_stop("peer-failed", f"the lineage ended ({status}): {reason}".rstrip(": "))


def bounds_of(job: Job) -> layout.RecoveryBlock:
    """The lineage's bounds, as job.json's `recovery` gives them (layout.RecoveryBlock: its
    defaults are the launcher's); one NodeFailure line when the block is not what the launcher writes."""
    try:
        return layout.RecoveryBlock.from_json(job.recovery)
    except (KeyError, TypeError, ValueError) as e:
        raise NodeFailure(f"job.json's recovery is not what the launcher writes ({short(e)})") from None


class Lineage:
    """This node's part in the lineage: which attempt to join, the bounds, the end."""

    def __init__(
        self,
        job: Job,
        me: NodeIdentity,
        settings: Settings,
        *,
        store: Store,
        imds: Imds,
        sink: LogSink,
        ec2: Any = None,
        autoscaling: Any = None,
        signalled: threading.Event | None = None,
    ) -> None:
        self.job, self.me, self.settings = job, me, settings
        self.store, self.imds, self.sink, self.ec2, self.autoscaling = store, imds, sink, ec2, autoscaling
        self.signalled = signalled or threading.Event()
        self.bounds = bounds_of(job)
        # Attempts are numbered across the lineage: a `resume` of an ended lineage is a new job
        # whose job.json names the attempt it starts at; its group's attempts count on from there.
        self.first = max(1, job.attempt)

    # -- S3

    def key(self, *parts: str) -> str:
        return self.job.key(*parts)

    def _get(self, key: str) -> Any:
        try:
            return self.store.get_json(key)
        except BadObject:
            return {}  # something is there that no node wrote: it counts as there

    def _create(self, key: str, body: dict[str, Any]) -> bool:
        """Write `body` at `key` only if nothing is there (S3 decides, once); -> whether we did."""
        return self.store.put_json_once(key, body)

    def newest_attempt(self) -> int:
        """The highest attempt number with anything in S3 (the job's first when none): folders only."""
        folder = self.key(layout.ATTEMPTS) + "/"
        numbers = [self.first]
        pages = self.store.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.store.bucket, Prefix=folder, Delimiter="/"
        )
        for page in pages:
            for found in page.get("CommonPrefixes", []):
                head = found["Prefix"][len(folder) :].rstrip("/")
                if head.isdigit() and len(head) < 5:
                    numbers.append(int(head))
        return max(numbers)

    def closed(self, k: int) -> bool:
        """Attempt k has ended (every stop of an attempt leaves its marker)."""
        return self._get(self.key(layout.ATTEMPTS, str(k), layout.STOP)) is not None

    def claim(self, k: int) -> int | None:
        """The lowest free rank of attempt k, now this node's; None when every rank is taken."""
        zone = market = "?"
        try:
            zone = (self.imds.get("meta-data/placement/availability-zone") or "?").strip()
            market = (self.imds.get("meta-data/instance-life-cycle") or "?").strip()
        except Exception as e:  # only shown by `status`
            self.sink.agent(f"zone or market not readable ({short(e)})")
        body = {"instance_id": self.me.instance_id, "zone": zone, "market": market, "time": time.time()}
        for rank in range(self.job.nodes):
            if self._create(self.key(layout.ATTEMPTS, str(k), layout.CLAIMS, f"{rank}.json"), body):
                return rank
        return None

    # -- the end

    def ended(self) -> dict[str, Any] | None:
        """The lineage's end record, if a node wrote it."""
        found = self._get(self.key(layout.LINEAGE_RECORD))
        return found if isinstance(found, dict) else ({} if found is not None else None)

    def end(self, status: str, reason: str, k: int | None) -> None:
        """Record the lineage's end (the first node's word stays) and leave the group."""
        body = {"status": status, "reason": one_line(reason), "by": self.me.instance_id}
        try:
            if self._create(
                self.key(layout.LINEAGE_RECORD), {**body, **({"attempt": k} if k else {}), "time": time.time()}
            ):
                self.sink.agent(f"lineage ended: {status} {one_line(reason)}".rstrip())
        except Exception as e:
            self.sink.agent(f"the lineage's end was not recorded ({short(e)})")
        self.leave()

    def leave(self) -> bool:
        """Leave the group, lowering its desired capacity: this node is not replaced. Its last act
        (it terminates the instance), after the records and the log copy. The lineage has ended
        whenever a node leaves, so the group's launches are suspended first: a node whose leave AWS
        refuses (no longer in service, a refused right), or that dies before it, is not replaced
        either. -> whether AWS took the leave."""
        if self.autoscaling is None:
            return False
        group = self.bounds.group
        try:
            self.autoscaling.suspend_processes(AutoScalingGroupName=group, ScalingProcesses=["Launch"])
        except Exception as e:
            self.sink.agent(f"could not suspend the launches of the Auto Scaling group {group} ({short(e)})")
        try:
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=self.me.instance_id, ShouldDecrementDesiredCapacity=True
            )
            self.sink.agent(f"left the Auto Scaling group {group}: it replaces this node no more")
            return True
        except Exception as e:
            self.sink.agent(f"could not leave the Auto Scaling group {group} ({short(e)}); its launches are suspended")
            return False

    def failed(self, reason: str) -> None:
        """This node cannot go on (its agent crashed): one of the lineage's `failure_budget` node
        failures, counted in the first free slot of `failures/` (boot.py counts a boot's there too).
        Below the budget the node only powers off, and the group replaces it: a retry. The failure
        that uses the budget up ends the lineage Failed with `reason`; past it, or once the lineage
        ended, the node leaves."""
        budget = self.bounds.failure_budget
        body = {"instance_id": self.me.instance_id, "reason": one_line(reason), "by": "agent", "time": time.time()}
        slot = next(
            (n for n in range(1, budget + 1) if self._create(self.key(layout.FAILURES, f"{n}.json"), body)), None
        )
        if slot == budget:
            self.end("Failed", f"{budget} node failures, the last: {reason}", None)
        elif slot is not None and self.ended() is None:
            self.sink.agent(f"node failure {slot} of {budget}: the Auto Scaling group replaces this node")
        else:
            self.leave()

    def on_demand(self, k: int) -> None:
        """From attempt on_demand_after + 1 on, the group launches on-demand (once per lineage)."""
        request = self.bounds.on_demand_request
        if not request or self.autoscaling is None:
            return
        try:
            if not self._create(self.key(layout.FALLBACK_RECORD), {"attempt": k, "time": time.time()}):
                return  # another node did it
            self.autoscaling.update_auto_scaling_group(**request)
            self.sink.agent(
                f"{k - self.first} interruption(s): the group's replacements are on-demand from now on "
                "(--on-demand-after)"
            )
        except Exception as e:
            self.sink.agent(f"could not switch the group to on-demand ({short(e)}); it stays on spot")

    @staticmethod
    def _stopped_by(marker: Any) -> tuple[str, str]:
        """The lineage's end for its stop marker: a node's failure there (`peer-failed`: a node
        whose job.json did not verify writes one) is Failed with its words, never the user's
        cancel; any other marker (the launcher's cancel, one no node wrote) stops the lineage."""
        if isinstance(marker, dict) and marker.get("reason") == "peer-failed":
            return "Failed", one_line(marker.get("detail") or "a node failed")
        return "Stopped", lineage_stop_words(marker)  # a cancel, or the cost clock's stop (its words)

    def _noticed(self) -> bool:
        try:
            return self.signalled.is_set() or self.imds.spot_notice() is not None
        except Exception:
            return False

    # -- the loop

    def run(self) -> int:
        """Attempts until the lineage ends for this node; -> the agent's exit code (0: records written)."""
        k = self.newest_attempt()
        while True:
            end = self.ended()
            if end is not None:
                self.sink.agent(f"the lineage has ended ({one_line(end.get('status', '?'))}): leaving")
                self.leave()
                return 0
            marker = self._get(self.key(layout.STOP))
            if marker is not None:
                self.end(*self._stopped_by(marker), k)
                return 0
            if time.time() >= self.job.deadline:
                self.end("Stopped", "max-run reached: the lineage ran until its deadline", k)
                return 0
            if self.closed(k):
                k += 1
                continue
            if k - self.first > self.bounds.max_restarts:
                self.end(
                    "Interrupted",
                    f"spot capacity was reclaimed {k - self.first} times: --max-restarts {self.bounds.max_restarts} "
                    "reached; "
                    f"`distrain-cloud resume {self.job.job}` continues from the last checkpoint",
                    k,
                )
                return 0
            if self.bounds.on_demand_after and k - self.first >= self.bounds.on_demand_after:
                self.on_demand(k)
            rank = self.claim(k)
            if rank is None:  # the attempt has every node: wait for its end, then join the next
                self.sink.agent(f"attempt {k} has all {self.job.nodes} node(s): waiting for the next")
                # ... or for the lineage's end, a cancel or the deadline (the loop's top acts on them)
                while not self.closed(k) and self.ended() is None and not self._noticed():
                    if self._get(self.key(layout.STOP)) is not None or time.time() >= self.job.deadline:
                        break
                    time.sleep(self.settings.poll_s)
                if self._noticed():
                    return 0
                continue
            code = self.attempt(k, rank)
            if code is not None:
                return code
            k += 1

    def attempt(self, k: int, rank: int) -> int | None:
        """Attempt k as node `rank`; -> the exit code when this node is done, None to go on to k + 1."""
        values = {f.name: getattr(self.job, f.name) for f in fields(Job)}
        base_output = self.job.output_uri
        values["output_uri"] = layout.attempt_output_uri(base_output, k)
        values["attempt"] = k
        if k > self.first:  # survivors wait for the group's replacements, which spot capacity may delay
            values["rendezvous_timeout_s"] = max(self.job.rendezvous_timeout_s, self.bounds.replacement_wait_s)
        job = AttemptJob(**values, number=k)
        me = dataclasses.replace(self.me, launch_index=rank, reservation_id=f"{layout.ATTEMPTS}-{k}")
        settings = dataclasses.replace(self.settings, work=self.settings.work / f"attempt-{k}")
        self.sink.agent(f"attempt {k}: node {rank} of {self.job.nodes}")
        agent = AttemptAgent(job, me, settings, store=self.store, imds=self.imds, sink=self.sink, ec2=self.ec2)
        agent.signalled = self.signalled
        agent.lineage_ended = self.ended
        result = agent.run()
        written = agent.finish(result)
        reason = agent.stop.reason if agent.stop is not None else None
        if reason in CONTINUES and result.status in ("Interrupted", "Stopped") and time.time() < self.job.deadline:
            if self._noticed():
                self.sink.agent(f"attempt {k} interrupted here: AWS replaces this node")
                return 0 if written else 1
            self.sink.agent(f"attempt {k} interrupted on another node: joining attempt {k + 1}")
            return None
        if result.status == "Completed" and rank == 0:
            self._publish_output(agent, base_output)
        reason = result.reason
        if result.status == "Failed" and not agent.met:  # a peer never came: perhaps it failed its boot
            last = self.last_failure()
            reason += f"; the last node failure: {last}" if last else ""
        self.end(result.status, reason, k)
        return 0 if written else 1

    def last_failure(self) -> str | None:
        """The reason of the lineage's newest node failure, if any (a failed look is none)."""
        try:
            for n in range(self.bounds.failure_budget, 0, -1):
                found = self._get(self.key(layout.FAILURES, f"{n}.json"))
                if isinstance(found, dict) and found.get("reason"):
                    return one_line(found["reason"])
        except Exception as e:  # the end is recorded without it
            self.sink.agent(f"the node failures not readable ({short(e)})")
        return None

    def _publish_output(self, agent: Agent, uri: str) -> None:
        """The completing attempt's output also where a plain job's is (`report`, `fetch`)."""
        try:
            prefix = parse_s3_uri(uri)[1].rstrip("/")
            folder = agent.contract.output_dir
            for f in files_in(folder):
                self.store.upload(f, f"{prefix}/{f.relative_to(folder).as_posix()}")
        except Exception as e:
            self.sink.agent(f"could not copy the output to {uri} ({short(e)})")


def run_lineage(
    job: Job, me: NodeIdentity, settings: Settings, store: Store, imds: Imds, sink: LogSink, signalled: threading.Event
) -> int:
    """The node agent's entry for a recovering lineage (its job.json has `recovery`)."""
    from distrain_cloud.infra.aws import client

    # One stream per instance: ranks change hands between attempts.
    sink.to_cloudwatch(client("logs", job.region), job.log_group, f"{job.job}/{me.instance_id}", settings.log_flush_s)
    lineage = Lineage(
        job,
        me,
        settings,
        store=store,
        imds=imds,
        sink=sink,
        ec2=client("ec2", job.region),
        autoscaling=client("autoscaling", job.region),
        signalled=signalled,
    )
    return run_counted(lineage)


def run_counted(lineage: Lineage) -> int:
    """The lineage's loop, with a crash counted as a node failure (`Lineage.failed`) rather than a
    power-off the group would replace forever. -> 0 whenever this node's part is accounted for, so
    that the user data does not count it again (it counts an agent that exits non-zero)."""
    try:
        lineage.run()
    except Exception as e:  # a bug or an AWS outage: counted, and bounded by the budget
        lineage.sink.write(traceback.format_exc())
        reason = f"node agent error: {short(e)}"
        lineage.sink.agent(f"failed: {reason}")
        try:
            lineage.failed(reason)
        except Exception as again:  # not even S3: the user data's fallback counts it
            lineage.sink.agent(f"the failure was not counted ({short(again)})")
            return 1
    return 0
