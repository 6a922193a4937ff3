"""The node agent: what runs on every EC2 instance of a job, once the user data has verified the bundle.

    python -m distrain_cloud.training.node_agent --job s3://B/P/jobs/<job>/job.json --job-sha256 <hex>

On each node, in order: read who it is from the instance metadata (IMDSv2), meet the other nodes
through S3 (no ec2:Describe* rights, no SSH, no dependence on boot order), restore the lineage's
newest complete checkpoint, run the node launcher with the container contract, and watch: the
spot notice, the max-run deadline, the stop marker and the other nodes' records. Any of them
stops every node the same way (a stop marker every agent polls; each agent sends SIGTERM to its
own launcher), so no node reports "failed" because only another one was told to stop. While the
job runs and at its end the agent syncs checkpoints to S3, writes heartbeats and a final record,
tags its instance, and powers the instance off on every path.

The S3 layout and the records are the contract with the launcher (docs/ec2.md). Stdlib and boto3
only (through infra.aws), so it runs before the training requirements matter; it never imports
the launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import ipaddress
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .checkpoint import MARKER
from .contract import STOP_EXIT_CODE, Contract

IMDS_DEFAULT = "http://169.254.169.254"
STATUS_TAG = "distrain-cloud:status"
JOB_TAG = "distrain-cloud:job"  # the launcher tags every instance of a job with the job's name
ALIVE_STATES = ("pending", "running", "stopping", "stopped")
UPLOADED = "uploaded-"  # per-node marker inside an S3 checkpoint folder: "this node's files are there"

# Stop reasons in the stop marker, and what each makes of a node that stopped cleanly.
STOP_STATUS = {
    "spot-interruption": "Interrupted",
    "deadline": "Stopped",
    "cancel": "Stopped",
    "peer-failed": "Stopped",
    "shutdown": "Stopped",
}
# CloudWatch Logs PutLogEvents limits: bytes count each message plus 26 per event.
MAX_BATCH_BYTES = 1_048_576
MAX_BATCH_EVENTS = 10_000
EVENT_OVERHEAD = 26
MAX_MESSAGE_BYTES = 256 * 1024 - EVENT_OVERHEAD
# The most the agent reads of a record (a node's, the stop marker, a rendezvous entry) or of job.json:
# anything in the job's folder may be planted, and a planted 5 GB "record" must not fill the memory.
MAX_RECORD_BYTES = 1 << 20
MAX_JOB_BYTES = 4 << 20


class NodeFailure(Exception):
    """Ends this node with status Failed; str() is the one-line reason its record carries."""


class BadObject(ValueError):
    """An S3 object that is not what the agent expects (no JSON, too large, the wrong shape); str()
    names it and says why in one line."""


class StopRequested(Exception):
    """A stop (cancel, a failed peer, ...) came before training started."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# ----------------------------------------------------------------------------- settings and job


@dataclass(frozen=True)
class Settings:
    """How this agent behaves; the defaults are real EC2's, the variables are rehearsal switches."""

    work: Path = Path("/opt/distrain")
    poweroff: str = "shutdown -h now"
    imds_endpoint: str = IMDS_DEFAULT
    poll_s: float = 5.0  # AWS's advice for the spot notice
    heartbeat_s: float = 30.0
    stop_grace_s: float = 110.0  # a spot notice gives 120 s: after this the launcher is killed
    final_sync_s: float = 600.0  # how long the last checkpoint may take to reach S3 from every node
    peer_timeout_s: float = 600.0  # a peer whose record is this old while training is lost
    log_flush_s: float = 2.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        d = cls()

        def number(name: str, default: float) -> float:
            try:  # test knobs: a value that is no number must not keep the node from powering off
                return float(env.get(name) or default)
            except ValueError:
                return default

        return cls(
            work=Path(env.get("DISTRAIN_EC2_WORK") or d.work),
            poweroff=env.get("DISTRAIN_EC2_POWEROFF") or d.poweroff,
            imds_endpoint=env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or d.imds_endpoint,
            poll_s=number("DISTRAIN_EC2_POLL_S", d.poll_s),
            heartbeat_s=number("DISTRAIN_EC2_HEARTBEAT_S", d.heartbeat_s),
            stop_grace_s=number("DISTRAIN_EC2_STOP_GRACE_S", d.stop_grace_s),
            final_sync_s=number("DISTRAIN_EC2_FINAL_SYNC_S", d.final_sync_s),
            peer_timeout_s=number("DISTRAIN_EC2_PEER_TIMEOUT_S", d.peer_timeout_s),
        )


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/key' -> ('bucket', 'some/key')."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise NodeFailure(f"not an S3 URI: {uri!r} (expected s3://bucket/key)")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


@dataclass(frozen=True)
class Job:
    """job.json, written by the launcher before RunInstances (references only, never a secret)."""

    job: str
    lineage: str
    attempt: int
    nodes: int
    processes_per_node: int
    train_argv: list[str]
    region: str
    bucket: str
    prefix: str
    code_sha256: str
    deadline: float
    log_group: str
    checkpoint_uri: str
    model_uri: str
    output_uri: str
    secrets: dict[str, str] = field(default_factory=dict)
    main_port: int = 29500
    rendezvous_timeout_s: int = 600
    stack_tag: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for training: its W&B lineage, instance, run id
    recovery: dict[str, Any] = field(default_factory=dict)  # a lineage AWS keeps going (training/elastic.py)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        if not isinstance(data, dict):
            raise NodeFailure("job.json is not a JSON object: the launcher and the bundle disagree")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise NodeFailure(f"job.json lacks {', '.join(missing)}: the launcher and the bundle disagree")
        known = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}  # newer launchers add keys
        for f in fields(cls):  # a wrong type is one line here, not a traceback where it is first used
            if f.name in known and not _has_shape(f.name, str(f.type), known[f.name]):
                what = "an integer >= 1" if f.name in _AT_LEAST_ONE else _SHAPES.get(str(f.type), (None, f.type))[1]
                raise NodeFailure(f"job.json's {f.name} is not {what}: the launcher and the bundle disagree")
        return cls(**known)

    def key(self, *parts: str) -> str:
        """The S3 key of jobs/<job>/<parts...> under the job's prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, "jobs", self.job, *parts) if p.strip("/"))

    def stream(self, rank: int) -> str:
        return f"{self.job}/node-{rank}"

    def sync_id(self) -> str:
        """What this job's checkpoint markers name (an attempt of a lineage names itself: elastic.py)."""
        return self.job


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Job's field annotations (strings: `from __future__ import annotations`) -> (check, words for the error).
_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (_is_int, "an integer"),
    "float": (lambda v: (_is_int(v) or isinstance(v, float)) and math.isfinite(v), "a finite number"),
    "list[str]": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "dict[str, str]": (
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for kv in v.items() for x in kv),
        "an object of strings",
    ),
    "dict[str, Any]": (lambda v: isinstance(v, dict), "an object"),
}
_AT_LEAST_ONE = {"nodes", "processes_per_node"}


def _has_shape(name: str, annotation: str, value: Any) -> bool:
    check = _SHAPES.get(annotation)
    if check is None or not check[0](value):
        return False
    return name not in _AT_LEAST_ONE or value >= 1


@dataclass(frozen=True)
class NodeIdentity:
    instance_id: str
    launch_index: int
    reservation_id: str
    ip: str
    region: str | None = None


# ----------------------------------------------------------------------------- IMDSv2


class Imds:
    """The instance metadata service, IMDSv2 only (the plan requires tokens)."""

    def __init__(self, endpoint: str = IMDS_DEFAULT, timeout_s: float = 2.0) -> None:
        self.base = endpoint.rstrip("/") + "/latest/"
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _request(self, method: str, path: str, headers: dict[str, str]) -> urllib.request.Request:
        return urllib.request.Request(self.base + path, method=method, headers=headers)

    def token(self) -> str:
        if self._token is None:
            req = self._request("PUT", "api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                self._token = r.read().decode()
        return self._token

    def get(self, path: str) -> str | None:
        """The text at latest/<path>, or None where it does not exist (404)."""
        for attempt in range(2):
            req = self._request("GET", path, {"X-aws-ec2-metadata-token": self.token()})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    return r.read().decode()
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 0:  # the token expired: take a new one once
                    self._token = None
                    continue
                raise
        return None

    def identity(self) -> NodeIdentity:
        def need(path: str) -> str:
            value = self.get(f"meta-data/{path}")
            if not value:
                raise NodeFailure(f"the instance metadata has no {path}")
            return value.strip()

        return NodeIdentity(
            instance_id=need("instance-id"),
            launch_index=int(need("ami-launch-index")),
            reservation_id=need("reservation-id"),
            ip=need("local-ipv4"),
            region=(self.get("meta-data/placement/region") or "").strip() or None,
        )

    def spot_notice(self) -> dict[str, Any] | None:
        """The spot instance-action document once AWS has set one (404 until then)."""
        text = self.get("meta-data/spot/instance-action")
        if not text:
            return None
        try:
            return dict(json.loads(text))
        except ValueError:
            return {"action": text.strip()}


# ----------------------------------------------------------------------------- S3


class Store:
    """The few S3 operations the agent needs, on one bucket.

    One client for the agent's life: the instance role's credentials come from IMDS and botocore
    refreshes them itself, and a poll every few seconds should not rebuild a client each time.
    """

    def __init__(self, bucket: str, region: str | None, s3: Any = None) -> None:
        from distrain_cloud.infra.aws import client

        self.bucket = bucket
        self.s3 = s3 if s3 is not None else client("s3", region)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put_json(self, key: str, value: Any) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(value).encode())

    def get_bytes(self, key: str, limit: int = MAX_RECORD_BYTES) -> bytes | None:
        """The first `limit` + 1 bytes at `key` (so that a caller can tell "too large"), or None when
        there is no such object."""
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        except self.s3.exceptions.NoSuchKey:
            return None
        try:
            return bytes(body.read(limit + 1))
        finally:
            body.close()

    def get_json(self, key: str) -> Any:
        """The JSON at `key`, or None when there is none; BadObject, naming it, for anything that is
        not JSON of at most MAX_RECORD_BYTES (every object the agent reads may have been planted)."""
        data = self.get_bytes(key)
        if data is None:
            return None
        if len(data) > MAX_RECORD_BYTES:
            raise BadObject(f"{self.uri(key)} is larger than {MAX_RECORD_BYTES} bytes")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise BadObject(f"{self.uri(key)} is not JSON ({type(e).__name__})") from None

    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        """key -> its listing entry (Size, LastModified, ETag), for every key under `prefix`."""
        found: dict[str, dict[str, Any]] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                found[item["Key"]] = item
        return found

    def upload(self, path: Path, key: str) -> None:
        self.s3.upload_file(str(path), self.bucket, key)

    def download(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.s3.download_file(self.bucket, key, str(path))

    def delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})


# ----------------------------------------------------------------------------- rendezvous


def rendezvous(
    store: Store,
    job: Job,
    me: NodeIdentity,
    *,
    poll_s: float,
    progress: Callable[[int], None] = lambda joined: None,
    stop_check: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda message: None,
) -> list[dict[str, Any]]:
    """Meet the other nodes of this launch; -> their records, ordered by rank (= launch index).

    One RunInstances call gives every node the same reservation id and launch indices 0..N-1, so
    the folder and the ranks need no coordination and no ec2:Describe* rights; a relaunch gets a
    new reservation id, so records of an earlier launch are never read. `stop_check` raises to
    give up early (a cancel, a peer that failed to boot). Only `<i>.json` for i in 0..N-1 with a
    valid body counts; anything else in the folder is named once through `log` and ignored.
    """
    folder = job.key("rendezvous", me.reservation_id) + "/"
    mine = {"ip": me.ip, "instance_id": me.instance_id, "launch_index": me.launch_index, "time": time.time()}
    store.put_json(f"{folder}{me.launch_index}.json", mine)
    start = clock()
    judged: dict[str, str] = {}  # key -> the ETag read: a body is read (and an odd one named) once
    found: dict[int, dict[str, Any]] = {}
    while True:
        for key, item in store.list(folder).items():
            if judged.get(key) == item.get("ETag"):
                continue
            judged[key] = str(item.get("ETag"))
            index = _rank_of(key[len(folder) :], job.nodes)
            entry, why = None, f"not a record of node 0..{job.nodes - 1}"
            if index is not None:
                found.pop(index, None)  # what it says now is what counts
                try:
                    entry, why = _rendezvous_entry(store.get_json(key), index), f"not a valid entry of node {index}"
                except BadObject as e:
                    why = str(e).removeprefix(store.uri(key) + " ")
            if entry is None or index is None:
                log(f"ignored {key!r} in the rendezvous folder: {why}")
            else:
                found[index] = entry
        joined = sorted(found)
        progress(len(joined))
        if len(joined) >= job.nodes:
            return [found[i] for i in range(job.nodes)]
        stop_check()
        if clock() - start >= job.rendezvous_timeout_s:
            missing = [i for i in range(job.nodes) if i not in joined]
            which = ", ".join(map(str, missing))
            raise NodeFailure(
                f"node{'s' if len(missing) > 1 else ''} {which} of {job.nodes} never joined the rendezvous "
                f"within {job.rendezvous_timeout_s} s (ranks count from 0; see that instance's console output)"
            )
        sleep(poll_s)


_RECORD_NAME = re.compile(r"(0|[1-9][0-9]{0,8})\.json")


def _rank_of(name: str, nodes: int) -> int | None:
    """The rank a record's file name (`<rank>.json`, no leading zeros) gives, if it is one of 0..nodes-1."""
    m = _RECORD_NAME.fullmatch(name)
    return int(m.group(1)) if m and int(m.group(1)) < nodes else None


def _rendezvous_entry(body: Any, index: int) -> dict[str, Any] | None:
    """The entry node `index` wrote (its address, instance id, launch index), or None when `body` is
    not one: the address becomes the main node's address of every launcher, so it must be an IP."""
    if not isinstance(body, dict) or not _is_int(body.get("launch_index")) or body["launch_index"] != index:
        return None
    ip, instance_id = body.get("ip"), body.get("instance_id")
    if not isinstance(ip, str) or not isinstance(instance_id, str):
        return None
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return None
    return {"ip": ip, "instance_id": instance_id, "launch_index": index}


# ----------------------------------------------------------------------------- checkpoints


_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")  # fullmatch: "checkpoint-5\n" is no checkpoint


def checkpoint_folders(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every local checkpoint folder, complete or not, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.fullmatch(p.name))]
    return sorted(found)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))


def remote_checkpoints(store: Store, prefix: str) -> dict[str, set[str]]:
    """checkpoint folder name -> the relative paths of its files in S3."""
    out: dict[str, set[str]] = {}
    for key in store.list(prefix):
        name, _, rel = key[len(prefix) :].partition("/")
        if _CHECKPOINT.fullmatch(name) and rel:
            out.setdefault(name, set()).add(rel)
    return out


def local_path(folder: Path, rel: str) -> Path | None:
    """Where the file `rel` (the rest of an S3 key) goes under `folder`, or None where it would go
    anywhere else. The string rules refuse what no trainer writes (an absolute path, "." or ".."
    parts, empty parts as in "a//b" or a folder marker "a/", a backslash, a NUL); the resolved path
    must then still lie inside the resolved folder, which also catches a link already on disk."""
    parts = rel.split("/")
    if not rel or "\x00" in rel or "\\" in rel or any(part in ("", ".", "..") for part in parts):
        return None
    base = folder.resolve()
    target = (base / rel).resolve()
    return target if target != base and target.is_relative_to(base) else None


def _download_within(store: Store, key: str, folder: Path, rel: str, log: Callable[[str], None]) -> bool:
    """Download `key` to `rel` under `folder` unless that leaves the folder: then one line naming
    the key, and the key is skipped (no trainer wrote it; the restore goes on without it). The
    trainer checks a checkpoint's files against its manifest before loading it, so a real file
    that went missing here makes it resume from an earlier checkpoint, never from a partial one."""
    target = local_path(folder, rel)
    if target is None:
        log(f"refused {key!r}: its file would not be inside {folder}; skipped")
        return False
    try:
        store.download(key, target)
    except OSError as e:  # "a" and "a/b" both in S3: one cannot be both a file and a folder here
        log(f"could not restore {key!r} ({_short(e)}); skipped")
        return False
    return True


def restore_checkpoint(store: Store, prefix: str, root: Path, log: Callable[[str], None] = print) -> str | None:
    """Download the newest complete checkpoint of the lineage (every node's files) into `root`.

    Each node needs the union: the model and optimizer state were written on rank 0's disk, the
    RNG states on every node's. Incomplete folders (no COMPLETE: a save or an upload cut short)
    are ignored. -> the folder's name, or None when the lineage has no complete checkpoint yet.
    A key whose file would land outside the checkpoint's folder is refused with one line (`log`).
    """
    complete = sorted(name for name, files in remote_checkpoints(store, prefix).items() if MARKER in files)
    if not complete:
        return None
    name = complete[-1]
    files = remote_checkpoints(store, prefix)[name]
    # The marker last, as the trainer wrote it: a download cut short is never taken for complete.
    for rel in sorted(files - {MARKER}) + [MARKER]:
        if not rel.startswith(UPLOADED):
            _download_within(store, f"{prefix}{name}/{rel}", root / name, rel, log)
    return name


# The trainer keeps the compiler's cache beside the checkpoints (trainer.Trainer.setup); carried
# with them, a resumed job loads its kernels instead of compiling again (bench/README.md: 25% of
# the first compile on an H100).
COMPILE_CACHE = "compile-cache"


def upload_compile_cache(store: Store, prefix: str, root: Path) -> int:
    """Upload the files of `root`/compile-cache that S3 does not hold yet; -> how many."""
    folder, remote = root / COMPILE_CACHE, store.list(f"{prefix}{COMPILE_CACHE}/")
    sent = 0
    for f in _files(folder) if folder.is_dir() else []:
        key = f"{prefix}{COMPILE_CACHE}/{f.relative_to(folder).as_posix()}"
        if key not in remote or remote[key].get("Size") != f.stat().st_size:
            store.upload(f, key)
            sent += 1
    return sent


def restore_compile_cache(store: Store, prefix: str, root: Path, log: Callable[[str], None] = print) -> int:
    """Download the lineage's compiler cache into `root`/compile-cache; -> how many files. A key
    whose file would land outside that folder is refused with one line (`log`)."""
    folder = f"{prefix}{COMPILE_CACHE}/"
    target = root / COMPILE_CACHE
    return sum(_download_within(store, key, target, key[len(folder) :], log) for key in store.list(folder))


class CheckpointSync:
    """Brings every node's part of each checkpoint to S3 and marks it complete once all are there.

    Rank 0's trainer writes COMPLETE only after every process has finished its files, so rank 0's
    local marker is the moment a checkpoint is whole on every node. Rank 0 uploads its files and an
    `uploaded-0` marker; each other node, on seeing it, uploads its own files and `uploaded-<rank>`;
    rank 0 uploads COMPLETE last, once every node's marker is there. Markers name the job, so
    those left by an earlier attempt of the lineage are never taken for this one's.
    """

    def __init__(
        self, store: Store, prefix: str, root: Path, *, rank: int, nodes: int, job: str, keep: int, log: Callable
    ) -> None:
        self.store, self.prefix, self.root = store, prefix, root
        self.rank, self.nodes, self.job, self.keep, self.log = rank, nodes, job, keep, log
        self.uploaded: set[str] = set()  # this node's files are in S3
        self.completed: set[str] = set()  # rank 0: COMPLETE is in S3

    def adopt(self, name: str) -> None:
        """A checkpoint restored from S3: already there, nothing to upload."""
        self.uploaded.add(name)
        self.completed.add(name)

    def _marker(self, name: str, rank: int) -> str:
        return f"{self.prefix}{name}/{UPLOADED}{rank}"

    def _ours(self, name: str, rank: int) -> bool:
        """Whether node `rank` uploaded its part of `name` for this job."""
        try:
            body = self.store.get_json(self._marker(name, rank))
        except BadObject:  # no marker an agent wrote: that node's part is not known to be there
            return False
        return isinstance(body, dict) and body.get("job") == self.job

    def _upload_own(self, name: str, folder: Path) -> bool:
        try:
            for f in _files(folder):
                rel = f.relative_to(folder).as_posix()
                if rel != MARKER:
                    self.store.upload(f, f"{self.prefix}{name}/{rel}")
        except FileNotFoundError:  # the trainer pruned it meanwhile: a newer one exists
            self.log(f"checkpoint {name} was removed locally before its upload finished; skipped")
            return False
        self.store.put_json(self._marker(name, self.rank), {"job": self.job, "rank": self.rank, "time": time.time()})
        self.uploaded.add(name)
        return True

    def tick(self) -> list[str]:
        """One pass; -> the checkpoints this node still waits on (for the final sync)."""
        waiting = []
        for step, folder in checkpoint_folders(self.root):
            name = folder.name
            if self.rank == 0:
                if name not in self.uploaded and (folder / MARKER).is_file():
                    self._clear_stale(name)
                    if not self._upload_own(name, folder):
                        continue
                if name in self.uploaded and name not in self.completed:
                    if all(self._ours(name, r) for r in range(1, self.nodes)):
                        self.store.upload(folder / MARKER, f"{self.prefix}{name}/{MARKER}")
                        self.completed.add(name)
                        self.log(f"checkpoint {name} complete in S3 ({self.nodes} node(s))")
                        # Compiled by now (a checkpoint follows training steps): ranks compile the same graphs.
                        upload_compile_cache(self.store, self.prefix, self.root)
                        self._prune_remote()
                    else:
                        waiting.append(name)
            elif name not in self.uploaded:
                if self._ours(name, 0):
                    self._upload_own(name, folder)
                elif step > max((int(n.split("-")[1]) for n in self.uploaded), default=-1):
                    waiting.append(name)  # rank 0 may still complete it
        if self.rank != 0:
            self._prune_local()
        return waiting

    def _clear_stale(self, name: str) -> None:
        # An earlier attempt may have left this step half-uploaded: its files must not mix with ours.
        stale = [k for k in self.store.list(f"{self.prefix}{name}/")]
        if stale:
            self.store.delete(stale)

    def _prune_remote(self) -> None:
        """Keep the newest `keep` complete checkpoints in S3 (rank 0's trainer keeps as many on disk)."""
        remote = remote_checkpoints(self.store, self.prefix)
        complete = sorted(n for n, files in remote.items() if MARKER in files)
        if len(complete) <= self.keep:
            return
        oldest_kept = complete[-self.keep]
        doomed = [n for n in remote if n < oldest_kept]  # names sort by step (zero-padded)
        self.store.delete([f"{self.prefix}{n}/{rel}" for n in doomed for rel in remote[n]])

    def _prune_local(self) -> None:
        # Other nodes hold no COMPLETE marker, so their trainers never prune: the agent does, keeping
        # one more than rank 0 keeps in case the newest is still being written.
        import shutil

        for _, folder in checkpoint_folders(self.root)[: -(self.keep + 1)]:
            shutil.rmtree(folder, ignore_errors=True)


def keep_checkpoints(train_argv: Sequence[str]) -> int:
    """--keep-checkpoints of the training flags (the trainer's default 2)."""
    for i, arg in enumerate(train_argv):
        if arg == "--keep-checkpoints" and i + 1 < len(train_argv):
            return max(1, int(train_argv[i + 1]))
        if arg.startswith("--keep-checkpoints="):
            return max(1, int(arg.split("=", 1)[1]))
    return 2


# ----------------------------------------------------------------------------- logs


def log_batches(
    events: Sequence[dict[str, Any]], max_bytes: int = MAX_BATCH_BYTES, max_events: int = MAX_BATCH_EVENTS
) -> Iterator[list[dict[str, Any]]]:
    """PutLogEvents batches: in time order, each within the byte and event limits."""
    batch: list[dict[str, Any]] = []
    size = 0
    for event in sorted(events, key=lambda e: e["timestamp"]):  # stable: lines of one ms keep their order
        cost = len(event["message"].encode()) + EVENT_OVERHEAD
        if batch and (size + cost > max_bytes or len(batch) >= max_events):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += cost
    if batch:
        yield batch


def log_event(line: str, when: float | None = None) -> dict[str, Any]:
    message = line.rstrip("\n") or " "  # CloudWatch refuses empty messages
    data = message.encode()
    if len(data) > MAX_MESSAGE_BYTES:
        message = data[: MAX_MESSAGE_BYTES - 32].decode(errors="ignore") + " [line truncated]"
    return {"timestamp": int((time.time() if when is None else when) * 1000), "message": message}


class LogSink:
    """Every line of this node (the agent's and the launcher's): a local file, the console, CloudWatch.

    CloudWatch gets them from a background thread every `flush_s`; if it refuses (no log group, no
    permission), the local file and its copy in S3 at the end still hold everything.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (open for the sink's life; close() ends it)
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self.logs: Any = None  # a CloudWatch Logs client, once to_cloudwatch() found the stream
        self.group = self.stream = ""
        self._warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self, line: str) -> None:
        line = line.rstrip("\n")
        with self._lock:
            self._file.write(line + "\n")
            if self.logs is not None:
                self._pending.append(log_event(line))
        print(line, flush=True)  # the console: EC2's console output and cloud-init's log

    def agent(self, message: str) -> None:
        self.write(f"node_agent: {message}")

    def to_cloudwatch(self, logs: Any, group: str, stream: str, flush_s: float) -> None:
        """Start shipping to `group`/`stream` (created here; the group comes from the stack)."""
        self.logs, self.group, self.stream = logs, group, stream
        try:
            logs.create_log_stream(logGroupName=group, logStreamName=stream)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        except Exception as e:
            self._warn(f"CloudWatch log stream {group}/{stream} unavailable ({_short(e)}); logs stay local")
            self.logs = None
            return
        with self._lock:  # what was written before the stream existed goes first
            self._pending = [log_event(line) for line in self.path.read_text().splitlines()]
        self._thread = threading.Thread(target=self._ship, args=(flush_s,), daemon=True)
        self._thread.start()

    def _ship(self, flush_s: float) -> None:
        while not self._stop.wait(flush_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        if not events or self.logs is None:
            return
        for batch in log_batches(events):
            try:
                self.logs.put_log_events(logGroupName=self.group, logStreamName=self.stream, logEvents=batch)
            except Exception as e:
                self._warn(f"CloudWatch refused {len(batch)} log lines ({_short(e)}); they are in {self.path}")

    def _warn(self, message: str) -> None:
        if not self._warned:  # once: a broken log destination should not flood the log itself
            self._warned = True
            with self._lock:
                self._file.write(f"node_agent: {message}\n")
            print(f"node_agent: {message}", flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()
        self._file.close()


def _short(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


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
        return self.job.key("nodes", f"{rank}.json")

    def heartbeat(self, phase: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_heartbeat < self.settings.heartbeat_s:
            return
        self._last_heartbeat = now
        record = {"status": "InProgress", "phase": phase, "step": self.step, "instance_id": self.me.instance_id}
        try:
            self.store.put_json(self.record_key(self.rank), {**record, "time": time.time()})
        except Exception as e:  # a missed heartbeat is not worth stopping the job for
            self.sink.agent(f"heartbeat not written ({_short(e)})")

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
        key = self.job.key("stop")
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
        existing = self.stop_marker()
        if existing is not None:
            self.stop = existing
        else:
            self.write_stop_marker(reason, detail)
            self.stop = Stop(reason, detail)
        self.sink.agent(f"stopping every node: {self.stop.reason} ({self.stop.detail})")
        # At once, not at the next heartbeat: a graceful `cancel` terminates nodes whose record stays still.
        self.heartbeat(f"stopping ({self.stop.reason})", force=True)

    def write_stop_marker(self, reason: str, detail: str) -> None:
        marker = {"reason": reason, "by": self.me.instance_id, "rank": self.rank, "detail": detail}
        self.store.put_json(self.job.key("stop"), {**marker, "time": time.time()})

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
            self.sink.agent(f"spot notice not readable ({_short(e)})")
            return None

    def failed_peer(self, training: bool) -> str | None:
        """One line about a peer that failed or went silent, else None. Reads only records that changed;
        only ranks 0..N-1 other than this one are peers, and a record that is not one is ignored."""
        folder = self.job.key("nodes") + "/"
        now = time.time()
        for key, item in sorted(self.store.list(folder).items()):
            rank = _rank_of(key[len(folder) :], self.job.nodes)
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
            self._stop_others_after_failure(f"node agent error: {_short(e)}")
            gave_up = self._end_unmet_job()
            return Outcome("Failed", 1, f"node agent error: {_short(e)}", self.step, gave_up=gave_up)

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
                f"could not end the job's other instances ({_short(e)}); "
                f"`distrain-cloud cancel {self.job.job} --now` ends them"
            )

    def _stop_others_after_failure(self, reason: str) -> None:
        """This node failed: the others stop (and checkpoint) rather than hang in a collective."""
        try:
            if self.stop_marker() is None:
                self.write_stop_marker("peer-failed", f"node {self.rank} failed: {reason}")
        except Exception as e:
            self.sink.agent(f"could not write the stop marker ({_short(e)})")

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
        from .stopping import ProcessTree, child_dies_with_us

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
        syncing = _Periodic(self.settings.poll_s, lambda: sync.tick(), self.sink.agent, "checkpoint sync")
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
            self.sink.agent(f"checkpoint sync failed ({_short(e)})")

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
            for f in _files(folder):
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
            self.sink.agent(f"could not tag {self.me.instance_id} ({_short(e)})")

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
                self.sink.agent(f"{what} not written ({_short(e)})")
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


def one_line(value: Any, limit: int = 300) -> str:
    """`value` (read from S3, so anything) as one printable line of at most `limit` characters: it
    goes into this node's record and the stop marker, which `status` prints."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


class _Periodic:
    """Call `fn` every `interval` seconds on a thread; errors are logged and the next call tried."""

    def __init__(self, interval: float, fn: Callable[[], object], log: Callable[[str], None], what: str) -> None:
        self.interval, self.fn, self.log, self.what = interval, fn, log, what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.fn()
            except Exception as e:
                self.log(f"{self.what} failed ({_short(e)}); retrying")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- entry point


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
        sink.agent(f"failed: the instance metadata is unreadable ({_short(e)})")
        return 1
    region = me.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    bucket, key = parse_s3_uri(job_uri)
    store = Store(bucket, region)
    try:
        job = read_job(store, job_uri, job_sha256)
    except Exception as e:
        reason = str(e) if isinstance(e, NodeFailure) else f"cannot read {job_uri}: {_short(e)}"
        sink.agent(f"failed: {reason}")
        folder, now = key.rpartition("/")[0], time.time()
        record = {"status": "Failed", "exit_code": 1, "reason": reason, "step": None, "instance_id": me.instance_id}
        store.put_json(f"{folder}/nodes/{me.launch_index}.json", {**record, "time": now})
        try:
            if store.get_bytes(f"{folder}/stop", 0) is None:  # the first, specific word stays
                detail = f"node {me.launch_index} failed: {reason}"
                stop = {"reason": "peer-failed", "by": me.instance_id, "rank": me.launch_index, "detail": detail}
                store.put_json(f"{folder}/stop", {**stop, "time": now})
        except Exception as e:  # the record says it all; the peers also see it through failed_peer
            sink.agent(f"could not write the stop marker ({_short(e)})")
        return 0
    if job.recovery:  # a spot lineage AWS keeps going: its attempts, in training/elastic.py
        from .elastic import run_lineage

        return run_lineage(job, me, settings, store, imds, sink, signalled)
    sink.to_cloudwatch(client("logs", job.region), job.log_group, job.stream(me.launch_index), settings.log_flush_s)
    agent = Agent(job, me, settings, store=store, imds=imds, sink=sink, ec2=client("ec2", job.region))
    agent.signalled = signalled
    result = agent.run()
    return 0 if agent.finish(result) else 1


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


if __name__ == "__main__":
    main()
