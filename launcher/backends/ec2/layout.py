"""Where an EC2 job's objects live in its bucket: the one key layout the launcher writes and reads
and the node agent uses. It ships in the code bundle beside agent/ (stdlib only: it runs on the node).

    <prefix>/code/<sha256>.tar.gz                       the bundle (launcher/bundle.py: bundle_key)
    <prefix>/submitted/<job>.json                       the launcher's copy of job.json
    <prefix>/jobs/<job>/job.json                        what every node reads (its sha256 is pinned)
    <prefix>/jobs/<job>/launch.json                     a launch that failed after the upload
    <prefix>/jobs/<job>/rendezvous/<reservation>/<i>.json   how the nodes meet
    <prefix>/jobs/<job>/nodes/<rank>.json               each node's heartbeat, then its final record
    <prefix>/jobs/<job>/stop                            the stop marker every node polls
    <prefix>/jobs/<job>/cost/<instance-id>.json         each instance's part of the cost clock (--max-cost)
    <prefix>/jobs/<job>/attempts/<k>/                   attempt k of a lineage AWS keeps going (its own
                                                        rendezvous, nodes/, stop; agent/elastic.py)
    <prefix>/jobs/<job>/attempts/<k>/claims/<rank>.json who took rank r of attempt k (created once)
    <prefix>/jobs/<job>/attempts/<k>/output/            attempt k's rank 0 uploads its output here
    <prefix>/jobs/<job>/lineage.json                    the lineage's end, written once by the node
                                                        that ends it (recovery.py reads it)
    <prefix>/jobs/<job>/failures/<n>.json               the lineage's node failures, one slot each of
                                                        its failure budget (boot.py and the agent)
    <prefix>/jobs/<job>/on-demand.json                  the lineage's switch to on-demand, once
                                                        (--on-demand-after)
    <prefix>/jobs/<job>/model/, output/                 what training leaves (job.json names them)
    <prefix>/checkpoints/<lineage>/                     shared by every attempt of a lineage
    <prefix>/leases/<lineage>.json                      the lineage's lease: launchers only
                                                        (launcher/lease.py, lease_key)

boot.py runs before the bundle is unpacked, so it cannot import this module: it spells nodes/,
stop, failures/ and lineage.json itself, and tests/launcher/backends/ec2/test_layout.py holds it to these names.

`prefix` is the spec's key prefix with no slash at either end ("" for the bucket's root).

Beside the keys, one record whose fields both sides read: job.json's `recovery` (RecoveryBlock),
which recovery.py writes and agent/elastic.py reads back, so its defaults exist once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JOB_JSON = "job.json"
LAUNCH = "launch.json"
NODES = "nodes"
STOP = "stop"
RENDEZVOUS = "rendezvous"
COST = "cost"
ATTEMPTS = "attempts"
CLAIMS = "claims"
LINEAGE_RECORD = "lineage.json"
FAILURES = "failures"
FALLBACK_RECORD = "on-demand.json"


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def jobs_folder(prefix: str) -> str:
    """The folder that holds one folder per job, with its trailing slash."""
    return _join(prefix, "jobs") + "/"


def job_key(prefix: str, job: str, *parts: str) -> str:
    """The key of jobs/<job>/<parts...> under `prefix` (the job's folder itself without parts)."""
    return _join(prefix, "jobs", job, *parts)


def node_record(prefix: str, job: str, rank: int) -> str:
    return job_key(prefix, job, NODES, f"{rank}.json")


def submitted_key(prefix: str, job: str) -> str:
    """The launcher's copy of job `job`'s job.json: outside `jobs/<job>/`, which the job's own
    role may write, so a job cannot rewrite what status, ls and resume trust."""
    return _join(prefix, "submitted", f"{job}.json")


def checkpoint_folder(prefix: str, lineage: str) -> str:
    """A lineage's checkpoints, with its trailing slash: resumed attempts read what earlier ones wrote."""
    return _join(prefix, "checkpoints", lineage) + "/"


def cost_record(prefix: str, job: str, instance_id: str) -> str:
    """One instance's part of job `job`'s cost clock (agent/costclock.py): every instance the job
    launched, in every attempt, writes its own, so no two nodes ever write one key."""
    return job_key(prefix, job, COST, f"{instance_id}.json")


def attempt_job(job: str, k: int) -> str:
    """Attempt k's folder, named as a job under jobs/ (`<job>/attempts/<k>`): an attempt's folder is
    laid out as a plain job's, so what reads a job's folder (status.job_files) reads it by this name."""
    return f"{job}/{ATTEMPTS}/{k}"


def attempt_key(prefix: str, job: str, k: int, *parts: str) -> str:
    """The key of jobs/<job>/attempts/<k>/<parts...> under `prefix` (the folder itself without parts)."""
    return job_key(prefix, attempt_job(job, k), *parts)


def attempt_output_uri(output_uri: str, k: int) -> str:
    """Where attempt k's rank 0 uploads its output: `.../jobs/<job>/attempts/<k>/output/`, beside the
    job's own `output/` (`output_uri`, as job.json names it)."""
    return f"{output_uri.rstrip('/').rsplit('/', 1)[0]}/{ATTEMPTS}/{k}/output/"


# How long the survivors of an interrupted attempt wait for the group's replacements to join
# (spot capacity may take a while to come back); then the lineage ends, naming the missing nodes.
REPLACEMENT_WAIT_S = 1800
# How many node failures (a boot that cannot reach its agent, an agent that crashed, a reboot) a
# lineage takes: below it the group replaces the node, a retry; the one that uses it up ends the
# lineage Failed with its reason (boot.py, agent/elastic.py). Kept in S3, where the nodes count it.
FAILURE_BUDGET = 3


@dataclass(frozen=True)
class RecoveryBlock:
    """job.json's `recovery`: what the nodes of a spot lineage AWS keeps going need to keep it going
    (recovery.description_block writes it, agent/elastic.py reads it back)."""

    group: str  # the lineage's Auto Scaling group (named as the job)
    nodes: int  # the nodes of each attempt (a record: the agent counts job.json's own `nodes`)
    max_restarts: int  # new attempts after spot interruptions (--max-restarts)
    replacement_wait_s: int = REPLACEMENT_WAIT_S  # an attempt's wait for the group's replacements
    failure_budget: int = FAILURE_BUDGET  # node failures the lineage takes; the last one ends it
    on_demand_after: int | None = None  # attempts on spot before the group turns on-demand (--on-demand-after)
    # The one request a node sends that changes the group (UpdateAutoScalingGroup, to on-demand):
    # rendered by the launcher, so the plan checks it against the API model.
    on_demand_request: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        block: dict[str, Any] = {
            "group": self.group,
            "nodes": self.nodes,
            "max_restarts": self.max_restarts,
            "replacement_wait_s": self.replacement_wait_s,
            "failure_budget": self.failure_budget,
        }
        if self.on_demand_after is not None:
            block["on_demand_after"] = self.on_demand_after
            block["on_demand_request"] = self.on_demand_request
        return block

    @classmethod
    def from_json(cls, block: Any) -> RecoveryBlock:
        """The block as a node reads it back from S3, where any byte may be hostile: KeyError,
        TypeError or ValueError when it is not what to_json writes. A value left out takes its
        default; a falsy on_demand_after or on_demand_request means none; the failure budget is at
        least 1."""
        return cls(
            group=str(block["group"]),
            nodes=int(block.get("nodes", 0)),
            max_restarts=int(block["max_restarts"]),
            replacement_wait_s=int(block.get("replacement_wait_s", REPLACEMENT_WAIT_S)),
            failure_budget=max(1, int(block.get("failure_budget", FAILURE_BUDGET))),
            on_demand_after=int(block["on_demand_after"]) if block.get("on_demand_after") else None,
            on_demand_request=dict(block["on_demand_request"]) if block.get("on_demand_request") else None,
        )
