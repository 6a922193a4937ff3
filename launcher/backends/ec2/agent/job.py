"""The job as the node sees it: the agent's settings, job.json's shape and this node's identity;
the constants, errors and small helpers (one_line, Periodic) every other part of the agent shares."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import layout

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
    "max-cost": "Stopped",  # the job's cost clock reached --max-cost (costclock.py)
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
    recovery: dict[str, Any] = field(default_factory=dict)  # a lineage AWS keeps going (elastic.py)
    cost: dict[str, Any] = field(default_factory=dict)  # --max-cost and the prices its clock counts (costclock.py)

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
        """The S3 key of jobs/<job>/<parts...> under the job's prefix (../layout.py)."""
        return layout.job_key(self.prefix, self.job, *parts)

    def stream(self, rank: int) -> str:
        return f"{self.job}/node-{rank}"

    def sync_id(self) -> str:
        """What this job's checkpoint markers name (an attempt of a lineage names itself: elastic.py)."""
        return self.job


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Job's field annotations (strings: `from __future__ import annotations`) -> (check, words for the error).
_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (is_int, "an integer"),
    "float": (lambda v: (is_int(v) or isinstance(v, float)) and math.isfinite(v), "a finite number"),
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


def short(e: BaseException) -> str:
    """An exception in one line of at most 300 characters, for a log line or a record."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def one_line(value: Any, limit: int = 300) -> str:
    """`value` (read from S3, so anything) as one printable line of at most `limit` characters: it
    goes into this node's record and the stop marker, which `status` prints. The launcher's
    `logs.one_line` is the same rule; the agent keeps its own copy because it ships in the bundle
    alone (tests/launcher/test_bundle.py: the agent imports nothing of the launcher outside
    its folder and layout.py)."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Periodic:
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
                self.log(f"{self.what} failed ({short(e)}); retrying")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
