"""The node agent: what runs on every EC2 instance of a job, once the user data has verified the bundle.

    python -m distrain_cloud.launcher.backends.ec2.agent --job s3://B/P/jobs/<job>/job.json --job-sha256 <hex>

On each node, in order: read who it is from the instance metadata (IMDSv2), meet the other nodes
through S3 (no ec2:Describe* rights, no SSH, no dependence on boot order), restore the lineage's
newest complete checkpoint, run the node launcher with the container contract, and watch: the
spot notice, the max-run deadline, the stop marker and the other nodes' records. Any of them
stops every node the same way (a stop marker every agent polls; each agent sends SIGTERM to its
own launcher), so no node reports "failed" because only another one was told to stop. While the
job runs and at its end the agent syncs checkpoints to S3, writes heartbeats and a final record,
tags its instance, and powers the instance off on every path.

The S3 layout and the records are the contract with the launcher (docs/ec2.md). Stdlib and boto3
only (through infra.aws), so it runs before the training requirements matter; of the launcher it
imports only this folder and ../layout.py, the key layout both sides share.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distrain_cloud.training.contract import STOP_EXIT_CODE, Contract

from .. import layout
from .checkpoints import CheckpointSync, files_in, keep_checkpoints, restore_checkpoint, restore_compile_cache
from .imds import Imds
from .job import (
    ALIVE_STATES,
    JOB_TAG,
    STATUS_TAG,
    STOP_STATUS,
    BadObject,
    Job,
    NodeFailure,
    NodeIdentity,
    Periodic,
    Settings,
    StopRequested,
    one_line,
    parse_s3_uri,
    short,
)
from .logs import LogSink
from .rendezvous import rank_of, rendezvous
from .store import Store

# ----------------------------------------------------------------------------- the agent


@dataclass
class Stop:
    reason: str  # a STOP_STATUS key
    detail: str  # one line for the record


@dataclass
class Outcome:
    status: str
    exit_code: int
    reason: str
    step: int | None = None
    gave_up: bool = False  # failed before every node met: no node trains, the job's instances were ended


def outcome(code: int, stop: Stop | None, failure_line: str | None, unexplained: str) -> Outcome:
    """What this node's launcher exit means. `failure_line` is the job's own one-line explanation
    (the contract's failure file); `unexplained` the reason to give when there is none.

    Once a stop was asked for, a non-zero exit that explained no failure is a clean stop: a node
    whose trainer stopped because a peer's did (they agree collectively) may exit before its own
    agent has signalled its launcher, and torchrun then reports the 143 of its worker as 1.
    """
    if code == 0:
        return Outcome("Completed", 0, "")
    if stop is not None and (code == STOP_EXIT_CODE or not failure_line):
        return Outcome(STOP_STATUS.get(stop.reason, "Stopped"), STOP_EXIT_CODE, stop.detail)
    if stop is not None and stop.reason == "peer-failed" and _LOST_PEER.search(failure_line or ""):
        # This node's training died of the failed peer (its collective lost the connection) before
        # its agent stopped it: the peer's failure is the one line worth reading.
        return Outcome(STOP_STATUS[stop.reason], STOP_EXIT_CODE, stop.detail)
    return Outcome("Failed", code, failure_line or unexplained)


# What a collective says when the process at the other end died (gloo, NCCL, the TCP store).
_LOST_PEER = re.compile(
    r"connection reset by peer|connection closed by peer|broken pipe|remote worker|"
    r"NCCL communicator was aborted|ProcessGroup\w* .*(timed out|aborted)",
    re.IGNORECASE,
)


# A worker's exception line ("RuntimeError: CUDA out of memory ..."), not torchrun's own report of it.
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception)\b[^:]*: ")
_LAUNCHER_REPORTS = ("ChildFailedError", "SignalException")


def unexplained_failure(code: int, lines: Sequence[str]) -> str:
    """One line for a launcher that failed without a failure file: the worker's exception, else the
    signal torchrun saw kill it, else the last line with words in it."""
    text = [line.strip() for line in lines if line.strip()]
    exception = next(
        (t for t in reversed(text) if _EXCEPTION.match(t) and not any(r in t for r in _LAUNCHER_REPORTS)), None
    )
    killed = next((t.split(":", 1)[1].strip() for t in reversed(text) if re.match(r"^traceback\s*: Signal", t)), None)
    last = next((t for t in reversed(text) if re.search(r"[A-Za-z]{3}", t)), None)
    detail = exception or killed or last
    return f"training exited with code {code}" + (f": {detail[:200]}" if detail else "")


class Agent:
    """One node's agent. `command` replaces the launcher in unit tests."""

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
        command: Sequence[str] | None = None,
    ) -> None:
        self.job, self.me, self.settings = job, me, settings
        self.store, self.imds, self.sink, self.ec2 = store, imds, sink, ec2
        self.rank = me.launch_index
        self.command = list(command) if command is not None else None
        self.ckpt_prefix = parse_s3_uri(job.checkpoint_uri)[1].rstrip("/") + "/"
        self.work = settings.work
        self.contract = Contract(
            model_dir=self.work / "model",
            output_dir=self.work / "output",
            checkpoint_dir=self.work / "checkpoints",
            num_nodes=job.nodes,
            node_rank=self.rank,
            main_addr="127.0.0.1",
            main_port=job.main_port,
        )
        self.stop: Stop | None = None
        self.step: int | None = None
        self.met = False  # every node of the launch joined the rendezvous
        self._last_heartbeat = 0.0
        self._peer_etags: dict[str, str] = {}
        self._peer_records: dict[str, dict[str, Any]] = {}
        self._ignored: set[tuple[str, str]] = set()  # (key, ETag) of records named once as ignored
        self.tail: deque[str] = deque(maxlen=200)
        self.signalled = threading.Event()  # SIGTERM to the agent itself (the hard stop, an operator)

    # -- records

    def record_key(self, rank: int) -> str:
        # Through job.key, which an attempt of a spot lineage re-roots under attempts/<k>/ (elastic.py).
        return self.job.key(layout.NODES, f"{rank}.json")

    def heartbeat(self, phase: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_heartbeat < self.settings.heartbeat_s:
            return
        self._last_heartbeat = now
        record = {"status": "InProgress", "phase": phase, "step": self.step, "instance_id": self.me.instance_id}
        try:
            self.store.put_json(self.record_key(self.rank), {**record, "time": time.time()})
        except Exception as e:  # a missed heartbeat is not worth stopping the job for
            self.sink.agent(f"heartbeat not written ({short(e)})")

    def write_final(self, result: Outcome) -> None:
        record = {
            "status": result.status,
            "exit_code": result.exit_code,
            "reason": result.reason,
            "step": result.step,
            "instance_id": self.me.instance_id,
            "time": time.time(),
        }
        if result.gave_up:  # `status` reads it: the job is over, whatever instance may still run
            record["gave_up"] = True
        self.store.put_json(self.record_key(self.rank), record)

    def stop_marker(self) -> Stop | None:
        """The stop the job's marker asks for, or None when there is none. Whoever may write the
        marker may stop the job anyway, so one that is no JSON object still stops it, as a cancel."""
        key = self.job.key(layout.STOP)
        try:
            marker = self.store.get_json(key)
            malformed = marker is not None and not isinstance(marker, dict)
        except BadObject:
            marker, malformed = None, True
        if malformed:
            detail = f"the stop marker {self.store.uri(key)} is not a JSON object: stopped as if cancelled"
            return Stop("cancel", detail)
        if marker is None:
            return None
        reason = marker.get("reason")
        return Stop(reason if isinstance(reason, str) and reason in STOP_STATUS else "cancel", _marker_detail(marker))

    def request_stop(self, reason: str, detail: str) -> None:
        """Stop every node: the marker for the others (unless one is there), SIGTERM for ours."""
        if self.stop is not None:
            return
        if self.write_stop_marker(reason, detail):
            self.stop = Stop(reason, detail)
        else:  # another node, or the launcher, asked first: its word is the job's
            self.stop = self.stop_marker() or Stop(reason, detail)
        self.sink.agent(f"stopping every node: {self.stop.reason} ({self.stop.detail})")
        # At once, not at the next heartbeat: a graceful `cancel` terminates nodes whose record stays still.
        self.heartbeat(f"stopping ({self.stop.reason})", force=True)

    def write_stop_marker(self, reason: str, detail: str) -> bool:
        """The marker every node watches, unless one is there already (False then)."""
        marker = {"reason": reason, "by": self.me.instance_id, "rank": self.rank, "detail": detail}
        return self.store.put_json_once(self.job.key(layout.STOP), {**marker, "time": time.time()})

    # -- watching

    def check_stop(self, training: bool) -> None:
        """One look at everything that stops the job; `request_stop` when something does."""
        if self.signalled.is_set():
            self.request_stop("shutdown", f"node {self.rank}'s instance is shutting down")
        notice = self._spot_notice()
        if notice is not None:
            when = notice.get("time", "soon")
            self.request_stop("spot-interruption", f"spot interruption notice on node {self.rank} ({when})")
        if time.time() >= self.job.deadline:
            self.request_stop("deadline", "max-run reached: the job ran until its deadline")
        marker = self.stop_marker()
        if marker is not None:
            self.request_stop(marker.reason, marker.detail)
        failed = self.failed_peer(training)
        if failed:
            self.request_stop("peer-failed", failed)

    def _spot_notice(self) -> dict[str, Any] | None:
        try:
            return self.imds.spot_notice()
        except Exception as e:
            self.sink.agent(f"spot notice not readable ({short(e)})")
            return None

    def failed_peer(self, training: bool) -> str | None:
        """One line about a peer that failed or went silent, else None. Reads only records that changed;
        only ranks 0..N-1 other than this one are peers, and a record that is not one is ignored."""
        folder = self.job.key(layout.NODES) + "/"
        now = time.time()
        for key, item in sorted(self.store.list(folder).items()):
            rank = rank_of(key[len(folder) :], self.job.nodes)
            if rank == self.rank:
                continue
            if rank is None:
                self._ignore(key, item, f"not a record of node 0..{self.job.nodes - 1}")
                continue
            if self._peer_etags.get(key) != item["ETag"]:
                self._peer_etags[key] = item["ETag"]
                self._peer_records[key] = self._read_record(key, item)
            record = self._peer_records[key]
            if record.get("status") == "Failed":
                return f"node {rank} failed: {record.get('reason') or 'no reason given'}"
            age = now - item["LastModified"].timestamp()
            if training and record.get("status") == "InProgress" and age > self.settings.peer_timeout_s:
                return f"node {rank} stopped reporting ({int(age)} s since its last heartbeat)"
        return None

    def _read_record(self, key: str, item: dict[str, Any] | None = None) -> dict[str, Any]:
        """Node record `key` as {status, phase, reason} of strings, or {} (named once) when it is not one."""
        try:
            record, why = node_record(self.store.get_json(key)), "not a node record"
        except BadObject as e:
            record, why = None, str(e).removeprefix(self.store.uri(key) + " ")
        if record is None:
            self._ignore(key, item, why)
            return {}
        return record

    def _ignore(self, key: str, item: dict[str, Any] | None, why: str) -> None:
        seen = (key, str((item or {}).get("ETag")))
        if seen not in self._ignored:
            self._ignored.add(seen)
            # repr: one line whatever the key holds (a newline, an escape sequence)
            self.sink.agent(f"ignored the node record {self.store.uri(key)!r}: {why}")

    def _stop_check_during_rendezvous(self) -> None:
        self.check_stop(training=False)
        if self.stop is not None:
            raise StopRequested(self.stop.reason, self.stop.detail)

    # -- the run

    def run(self) -> Outcome:
        """Everything between the identity and the final record; never raises for expected failures."""
        try:
            return self._run()
        except NodeFailure as e:
            self.sink.agent(f"failed: {e}")
            self._stop_others_after_failure(str(e))
            return Outcome("Failed", 1, str(e), self.step, gave_up=self._end_unmet_job())
        except StopRequested as e:
            self._end_unmet_job()
            return Outcome(STOP_STATUS.get(e.reason, "Stopped"), STOP_EXIT_CODE, str(e), self.step)
        except Exception as e:  # a bug or an AWS outage: the record and the power-off still happen
            self.sink.write(traceback.format_exc())
            self._stop_others_after_failure(f"node agent error: {short(e)}")
            gave_up = self._end_unmet_job()
            return Outcome("Failed", 1, f"node agent error: {short(e)}", self.step, gave_up=gave_up)

    def _end_unmet_job(self) -> bool:
        """Before every node has met, no node trains: ending the job's instances loses nothing, and a
        node that never ran its user data (no agent, no hard stop) would otherwise run until someone
        notices. -> whether this node left the rendezvous unmet (and so tried)."""
        if self.met:
            return False
        self.end_job_instances()
        return True

    def end_job_instances(self) -> None:
        """Terminate the other live instances tagged with this job (found by tag: the silent ones
        wrote nothing to find them by). One line whatever happens: the job role may not allow it."""
        if self.ec2 is None:
            return
        try:
            filters = [
                {"Name": f"tag:{JOB_TAG}", "Values": [self.job.job]},
                {"Name": "instance-state-name", "Values": list(ALIVE_STATES)},
            ]
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            others = sorted(
                i["InstanceId"]
                for page in pages
                for reservation in page.get("Reservations", [])
                for i in reservation.get("Instances", [])
                if i["InstanceId"] != self.me.instance_id
            )
            if others:
                self.sink.agent(f"no node trains: terminating the job's other instance(s): {', '.join(others)}")
                self.ec2.terminate_instances(InstanceIds=others)
        except Exception as e:
            self.sink.agent(
                f"could not end the job's other instances ({short(e)}); "
                f"`distrain-cloud cancel {self.job.job} --now` ends them"
            )

    def _stop_others_after_failure(self, reason: str) -> None:
        """This node failed: the others stop (and checkpoint) rather than hang in a collective."""
        try:
            self.write_stop_marker("peer-failed", f"node {self.rank} failed: {reason}")
        except Exception as e:
            self.sink.agent(f"could not write the stop marker ({short(e)})")

    def _run(self) -> Outcome:
        job = self.job
        self.sink.agent(
            f"job {job.job} (lineage {job.lineage}, attempt {job.attempt}) node {self.rank} of {job.nodes} "
            f"instance {self.me.instance_id} reservation {self.me.reservation_id} ip {self.me.ip}"
        )
        self.tag("InProgress")
        self.heartbeat(f"rendezvous 0/{job.nodes}", force=True)
        peers = rendezvous(
            self.store,
            job,
            self.me,
            poll_s=self.settings.poll_s,
            progress=lambda n: self.heartbeat(f"rendezvous {n}/{job.nodes}"),
            stop_check=self._stop_check_during_rendezvous,
            log=self.sink.agent,
        )
        self.met = True
        main_addr = str(peers[0]["ip"])
        self.sink.agent(f"rendezvous complete: {job.nodes} node(s), main node {main_addr}:{job.main_port}")
        self.contract = dataclasses.replace(self.contract, main_addr=main_addr)
        self.contract.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        root, log = self.contract.checkpoint_dir, self.sink.agent
        restored = restore_checkpoint(self.store, self.ckpt_prefix, root, log)
        self.sink.agent(f"restored {restored} from {job.checkpoint_uri}" if restored else "no checkpoint to restore")
        if restored and restore_compile_cache(self.store, self.ckpt_prefix, root, log):
            self.sink.agent("restored the compiler's cache beside the checkpoints")
        sync = CheckpointSync(
            self.store,
            self.ckpt_prefix,
            self.contract.checkpoint_dir,
            rank=self.rank,
            nodes=job.nodes,
            job=job.sync_id(),
            keep=keep_checkpoints(job.train_argv),
            log=self.sink.agent,
        )
        if restored:
            sync.adopt(restored)
        self.check_stop(training=False)  # a cancel or a failed peer during the restore
        if self.stop is not None:
            return Outcome(STOP_STATUS.get(self.stop.reason, "Stopped"), STOP_EXIT_CODE, self.stop.detail)
        code = self.supervise(sync)
        self.final_sync(sync)
        result = outcome(code, self.stop, self._failure_line(), unexplained_failure(code, self.tail))
        result.step = self.step
        if self.rank == 0:
            self.upload_results(model=result.status == "Completed")
        return result

    def launch_command(self) -> list[str]:
        if self.command is not None:
            return self.command
        py = sys.executable
        return [
            py, "-m", "distrain_cloud.infra.secret_env", "--",
            py, "-m", "distrain_cloud.training.node_launch", "--processes", str(self.job.processes_per_node),
            "--", *self.job.train_argv,
        ]  # fmt: skip

    def launch_env(self) -> dict[str, str]:
        env = {**os.environ, **self.job.env, **self.contract.to_env(), "PYTHONUNBUFFERED": "1"}
        env["DISTRAIN_SECRETS"] = json.dumps(self.job.secrets)  # references: secret_env resolves them in the job
        env["DISTRAIN_JOB_NAME"] = self.job.job  # for the resume command in a failure's line
        return env

    def supervise(self, sync: CheckpointSync) -> int:
        """Run the launcher until it exits, watching for stops and syncing checkpoints beside it.

        A stop sends SIGTERM to the launcher (node_launch bounds the trainers' stop by their
        --stop-grace); whatever still runs `stop_grace_s` later is killed, the whole process tree,
        wherever its processes moved (torchrun's workers lead sessions of their own). The launcher
        gets SIGTERM too when this agent dies, so no training process outlives it."""
        from distrain_cloud.training.stopping import ProcessTree, child_dies_with_us

        self.contract.output_dir.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            self.launch_command(),
            env=self.launch_env(),
            cwd=self.work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=child_dies_with_us(signal.SIGTERM),
        )
        tree, killed = ProcessTree(proc.pid), False
        reader = threading.Thread(target=self._read_output, args=(proc,), daemon=True)
        reader.start()
        syncing = Periodic(self.settings.poll_s, lambda: sync.tick(), self.sink.agent, "checkpoint sync")
        syncing.start()
        signalled_at: float | None = None
        self.heartbeat("training", force=True)
        try:
            while proc.poll() is None:
                if self.stop is None:
                    self.check_stop(training=True)
                if self.stop is not None and signalled_at is None:
                    tree.refresh()
                    proc.send_signal(signal.SIGTERM)  # node_launch forwards it to every training process
                    signalled_at = time.monotonic()
                elif signalled_at is not None:
                    tree.refresh()  # processes that lost their parent meanwhile stay in sight
                    if time.monotonic() - signalled_at > self.settings.stop_grace_s and not killed:
                        grace = self.settings.stop_grace_s
                        self.sink.agent(f"the launcher did not stop within {grace:.0f} s: killing its processes")
                        tree.kill()
                        killed = True
                self.heartbeat("training")
                _wait(proc, self.settings.poll_s)
            if signalled_at is not None and tree.alive():  # left behind by a launcher that exited
                tree.kill()
        finally:
            reader.join(timeout=30)
            syncing.stop()
        code = proc.returncode
        self.sink.agent(f"launcher exited with code {code}")
        if code != 0 and self.stop is None:
            self._blame(code)
        return code

    def _blame(self, code: int) -> None:
        """After a failed exit with no stop asked for: was it this node, or a peer that went first?

        When one node's training dies, the others' die too, of a broken connection. Whoever reports
        first writes the stop marker, so a node whose output shows a lost peer gives the peers a
        few polls to say they failed before it takes the blame.
        """
        lost_peer = not self._failure_line() and any(_PEER_LOST.search(line) for line in self.tail)
        patience = max(3 * self.settings.poll_s, 10.0) if lost_peer else 0.0
        until = time.monotonic() + patience
        while True:
            self.check_stop(training=False)
            if self.stop is not None or time.monotonic() >= until:
                break
            time.sleep(min(self.settings.poll_s, 1.0))
        if self.stop is None:
            self._stop_others_after_failure(self._failure_line() or unexplained_failure(code, self.tail))

    def _read_output(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.sink.write(line)
            self.tail.append(line)
            m = re.match(r"^step=(\d+) ", line)
            if m:
                self.step = int(m.group(1))

    def _failure_line(self) -> str | None:
        """The one line the job left in the contract's failure file (bad input, a full disk), if any."""
        f = self.contract.failure_file
        text = f.read_text().strip() if f.is_file() else ""
        return text.splitlines()[0].removeprefix("error: ") if text else None

    def final_sync(self, sync: CheckpointSync) -> None:
        """Bring the last checkpoint to S3 from every node before the instances go away.

        Rank 0 uploads its part of everything first, then says so in its heartbeat ("final-sync");
        another node waits for rank 0's part only until then. Rank 0 waits for the others' parts
        until their final records say they have nothing more to send. No two nodes wait on each
        other, and a checkpoint some node lacks is left without COMPLETE, never marked complete.
        """
        deadline = time.monotonic() + self.settings.final_sync_s
        try:
            waiting = sync.tick()
            self.heartbeat("final-sync", force=True)
            while waiting:
                if self._peers_done():
                    sync.tick()  # their last markers came before their records
                    break
                if time.monotonic() > deadline:
                    self.sink.agent(f"gave up waiting for the other nodes' part of {', '.join(waiting)}")
                    break
                time.sleep(min(self.settings.poll_s, 1.0))
                waiting = sync.tick()
        except Exception as e:
            self.sink.agent(f"checkpoint sync failed ({short(e)})")

    def _peers_done(self) -> bool:
        if self.rank != 0:
            record = self._read_record(self.record_key(0))
            return record.get("status") not in (None, "InProgress") or record.get("phase") == "final-sync"
        return all(
            self._read_record(self.record_key(r)).get("status") not in (None, "InProgress")
            for r in range(1, self.job.nodes)
        )

    def upload_results(self, model: bool) -> None:
        """Rank 0: the model (when training completed) and the output folder (metrics, failure)."""
        targets = [(self.contract.output_dir, self.job.output_uri)]
        if model:
            targets.insert(0, (self.contract.model_dir, self.job.model_uri))
        for folder, uri in targets:
            bucket, prefix = parse_s3_uri(uri)
            store = self.store if bucket == self.store.bucket else Store(bucket, self.job.region)
            for f in files_in(folder):
                store.upload(f, f"{prefix.rstrip('/')}/{f.relative_to(folder).as_posix()}")
            self.sink.agent(f"uploaded {folder.name} to {uri}")

    def upload_log(self) -> None:
        """This node's whole log beside the output, whatever happened to CloudWatch."""
        bucket, prefix = parse_s3_uri(self.job.output_uri)
        store = self.store if bucket == self.store.bucket else Store(bucket, self.job.region)
        store.upload(self.sink.path, f"{prefix.rstrip('/')}/logs/node-{self.rank}.log")

    def tag(self, status: str) -> None:
        if self.ec2 is None:
            return
        try:
            self.ec2.create_tags(Resources=[self.me.instance_id], Tags=[{"Key": STATUS_TAG, "Value": status}])
        except Exception as e:  # the records in S3 are what status reads; a tag is a convenience
            self.sink.agent(f"could not tag {self.me.instance_id} ({short(e)})")

    def finish(self, result: Outcome) -> bool:
        """The final record, the tag and the log copy; each failure here is logged, never raised.
        -> whether the final record was written."""
        self.sink.agent(f"final status {result.status} (exit {result.exit_code}) {result.reason}".rstrip())
        written = []
        for what, action in (
            ("final record", lambda: self.write_final(result)),
            ("status tag", lambda: self.tag(result.status)),
            ("log copy", self.upload_log),
        ):
            try:
                action()
                written.append(what)
            except Exception as e:
                self.sink.agent(f"{what} not written ({short(e)})")
        return "final record" in written


# What a training process prints when another node's process went away in a collective.
_PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|DistNetworkError|NCCL (error|communicator was aborted)"
    r"|ProcessGroupNCCL.*(timeout|Watchdog)|gloo.*(Timed out|connect)",
    re.IGNORECASE,
)


def _marker_detail(marker: dict[str, Any]) -> str:
    reason = marker.get("reason")
    reason = reason if isinstance(reason, str) else "cancel"
    if marker.get("detail"):
        return one_line(marker["detail"])
    return {"cancel": "cancelled", "deadline": "max-run reached"}.get(reason, one_line(reason))


NODE_STATUSES = ("InProgress", "Completed", "Failed", "Stopped", "Interrupted")


def node_record(body: Any) -> dict[str, Any] | None:
    """What the agent uses of a node record read from S3 (status, phase, reason), or None when
    `body` is not a record a node agent or the user data writes."""
    if not isinstance(body, dict) or body.get("status") not in NODE_STATUSES:
        return None
    phase, reason = body.get("phase"), body.get("reason")
    if not isinstance(phase, (str, type(None))) or not isinstance(reason, (str, type(None))):
        return None
    return {"status": body["status"], "phase": phase, "reason": one_line(reason) if reason else reason}


def _wait(proc: subprocess.Popen, seconds: float) -> None:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass
