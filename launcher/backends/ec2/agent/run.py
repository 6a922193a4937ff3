"""The node agent's entry: `python -m distrain_cloud.launcher.backends.ec2.agent` (agent/__main__.py)
runs `main`, which reads the job description and runs this node's part of it: a plain job's Agent
(node.py), or a recovering lineage's attempts (elastic.py); either way with the cost clock
(costclock.py) when the job has a --max-cost, and the instance powered off at the end. Kept apart
from node.py so that the agent's parts import downwards only: elastic.py builds on node.py's Agent,
and this file chooses between them."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence

from .. import layout
from .imds import Imds
from .job import MAX_JOB_BYTES, Job, NodeFailure, Settings, parse_s3_uri, short
from .logs import LogSink
from .node import Agent
from .store import Store


def power_off(command: str) -> None:
    """The instance's last act (terminate-on-shutdown makes it an end, not a pause)."""
    print(f"node_agent: powering off: {command}", flush=True)
    subprocess.run(["bash", "-c", command], check=False)


def read_job(store: Store, job_uri: str, sha256: str) -> Job:
    """job.json, trusted only once its bytes are the ones the plan hashed (the user data pins their
    sha256, as it pins the bundle's): the bytes hashed are the bytes parsed, from one read."""
    key = parse_s3_uri(job_uri)[1]
    data = store.get_bytes(key, MAX_JOB_BYTES)
    if data is None:
        raise NodeFailure(f"{job_uri} does not exist")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise NodeFailure(
            f"job.json hash mismatch: {job_uri} has sha256 {digest[:12]}..., the plan hashed {sha256[:12]}..."
        )
    return Job.from_dict(json.loads(data))


def run_node(job_uri: str, job_sha256: str, settings: Settings, sink: LogSink, signalled: threading.Event) -> int:
    """This node's whole job; -> the agent's exit code: 0 once this node's final record is written,
    whatever its status (the record says how the job went; the user data's fallback, which records
    "the node agent exited with code N", is for an agent that could not say it). Failures before the
    job description is read are recorded beside job.json when the bucket can be reached at all, with
    the stop marker the other nodes watch (as the user data does when the bundle is not the planned one)."""
    from distrain_cloud.infra.aws import client

    try:
        imds = Imds(settings.imds_endpoint)
        me = imds.identity()
    except Exception as e:
        sink.agent(f"failed: the instance metadata is unreadable ({short(e)})")
        return 1
    region = me.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    bucket, key = parse_s3_uri(job_uri)
    store = Store(bucket, region)
    try:
        job = read_job(store, job_uri, job_sha256)
    except Exception as e:
        reason = str(e) if isinstance(e, NodeFailure) else f"cannot read {job_uri}: {short(e)}"
        sink.agent(f"failed: {reason}")
        folder, now = key.rpartition("/")[0], time.time()
        record = {"status": "Failed", "exit_code": 1, "reason": reason, "step": None, "instance_id": me.instance_id}
        store.put_json(f"{folder}/{layout.NODES}/{me.launch_index}.json", {**record, "time": now})
        try:
            detail = f"node {me.launch_index} failed: {reason}"
            stop = {"reason": "peer-failed", "by": me.instance_id, "rank": me.launch_index, "detail": detail}
            store.put_json_once(f"{folder}/{layout.STOP}", {**stop, "time": now})  # the first, specific word stays
        except Exception as e:  # the record says it all; the peers also see it through failed_peer
            sink.agent(f"could not write the stop marker ({short(e)})")
        return 0
    from .costclock import start as start_cost_clock  # --max-cost, kept by the nodes

    clock = start_cost_clock(job, me, settings, store, imds, sink)
    try:
        if job.recovery:  # a spot lineage AWS keeps going: its attempts, in elastic.py
            from .elastic import run_lineage

            return run_lineage(job, me, settings, store, imds, sink, signalled)
        sink.to_cloudwatch(client("logs", job.region), job.log_group, job.stream(me.launch_index), settings.log_flush_s)
        agent = Agent(job, me, settings, store=store, imds=imds, sink=sink, ec2=client("ec2", job.region))
        agent.signalled = signalled
        result = agent.run()
        return 0 if agent.finish(result) else 1
    finally:
        # The clock's thread ends with the agent's work, not with the process: an agent run in a
        # process that lives on (tests run nodes on threads) must not keep writing records.
        if clock is not None:
            clock.close()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="distrain-node-agent", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--job", required=True, metavar="S3_URI", help="the job description, s3://B/P/jobs/<job>/job.json")
    p.add_argument("--job-sha256", required=True, metavar="HEX", help="the sha256 the plan gave job.json's bytes")
    ns = p.parse_args(argv)
    settings = Settings.from_env()
    sink = LogSink(settings.work / "node-agent.log")
    signalled = threading.Event()
    # The hard stop (shutdown -h) and operators send SIGTERM: stop the job as a spot notice would.
    signal.signal(signal.SIGTERM, lambda signum, frame: signalled.set())
    code = 1
    try:
        code = run_node(ns.job, ns.job_sha256, settings, sink, signalled)
    except BaseException:  # whatever happens, the instance must not outlive the job
        sink.write(traceback.format_exc())
    finally:
        sink.close()
        power_off(settings.poweroff)
    sys.exit(code)
