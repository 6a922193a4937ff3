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
"""

from __future__ import annotations

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
