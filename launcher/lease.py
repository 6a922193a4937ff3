"""One live attempt per lineage: the lease every start of a lineage takes before it writes anything.

A lineage is a chain of jobs sharing one checkpoint folder; two live attempts on it would both
pay, and each one's checkpoint sync would clear and prune the other's files. So every start of
a lineage (the first submit, `resume`, `submit --resume-from`, a `--spot --wait` relaunch) takes
the lineage's lease in `api.submit_job`, and a start that finds it held by a live attempt is
refused in one line naming that attempt.

Where the lease lives (docs/decisions.md says why):
- cloud lineages: `s3://<bucket>/<prefix>/leases/<lineage>.json`, beside the lineage's
  `<prefix>/checkpoints/<lineage>/`, not inside it: only launchers write there (a job's own
  credentials reach its lineage's checkpoints, and SageMaker syncs that whole folder into the job);
- local lineages: `$DISTRAIN_HOME/leases/<lineage>.json`, beside the job records (not in the runs
  folder, whose every entry people and scripts take for a job's folder).

How it is taken, as one compare-and-swap on either store: create it if absent (S3: PutObject
with If-None-Match "*"); else read it with its ETag, ask the holder's backend whether the
holder has ended, and only then overwrite exactly what was read (If-Match on that ETag). Two
starters that both judge the holder ended cannot both win: the second overwrite finds another
ETag, reads the winner, and is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from distrain_cloud.infra.errors import UserError

from .backends import BACKENDS, get_backend

if TYPE_CHECKING:
    from .plan import Plan

ATTEMPTS = 5  # rounds of read-judge-overwrite before giving up on a lease that keeps changing hands
# A holder that cannot be found this long after it took the lease never launched (its submit
# failed before the job existed); younger, it may still be launching. EC2's launch grace too.
LAUNCH_GRACE_S = 600
MAX_BODY = 64 * 1024  # a lease is a few hundred bytes; anything longer is not ours
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/-]{0,512}")


class LineageBusy(UserError):
    """Another attempt of the lineage is live: nothing was started."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class Store(Protocol):
    """One lease's place, with three atomic operations; an etag names one version of the body."""

    @property
    def where(self) -> str:
        """The lease's place, as a person finds it (an S3 URI or a path)."""

    def create(self, body: bytes) -> str | None:
        """Write `body` if there is no lease yet: its etag, or None when there is one."""

    def read(self) -> tuple[bytes, str, float] | None:
        """(body, etag, age in seconds) of the lease, or None when there is none."""

    def replace(self, body: bytes, etag: str) -> str | None:
        """Write `body` only over the version `etag`: the new etag, or None when it changed."""


@dataclasses.dataclass
class Lease:
    """A lease this process holds, for one start of the lineage."""

    store: Store
    body: dict[str, Any]
    etag: str
    launched: bool = False  # set by the backend once its job exists: from then on the job's status rules

    def release(self) -> None:
        """Mark the lease free (nothing was launched); a lease taken over meanwhile stays as it is."""
        with contextlib.suppress(Exception):  # best effort: the error that led here is the one to show
            self.store.replace(_encode({**self.body, "released": True, "time": time.time()}), self.etag)


@contextlib.contextmanager
def lineage_lease(plan: Plan) -> Iterator[Lease | None]:
    """Hold the lineage's lease while `plan` is started. A UserError before the backend marks the
    job launched (a refused upload or launch: nothing runs) frees it again; any other failure
    keeps it, since the job may exist, and its status then decides."""
    found = _place(plan)
    if found is None:  # not placed (an unchecked plan): the backend refuses it itself
        yield None
        return
    store, me = found
    lease = take(store, me)
    plan.held = lease
    try:
        yield lease
    except UserError:
        if not lease.launched:
            lease.release()
        raise


def launched(plan: Plan) -> None:
    """Called by a backend once its job exists (instances, a training job, a process)."""
    if plan.held is not None:
        plan.held.launched = True


def take(store: Store, me: dict[str, Any]) -> Lease:
    """The lease for `me` (lineage, job, attempt, backend and where to find the job): created,
    or taken over from a holder that has ended; LineageBusy when the holder is live."""
    body = _encode(me)
    for _ in range(ATTEMPTS):
        etag = store.create(body)
        if etag is not None:
            return Lease(store, me, etag)
        found = store.read()
        if found is None:
            continue  # deleted meanwhile: create it again
        raw, etag, age = found
        holder = _holder(raw)
        if holder is None:
            raise UserError(
                f"the lease of lineage {me['lineage']} at {store.where} is not one distrain-cloud wrote; "
                "nothing was launched: delete it once no attempt of the lineage runs, then resume again"
            )
        if holder["job"] != me["job"] and not holder.get("released"):
            status = _holder_status(holder, age, store.where)
            if status is not None:
                attempt = f"attempt {holder['attempt']}, " if holder.get("attempt") is not None else ""
                job = holder["job"]
                raise LineageBusy(
                    f"lineage {me['lineage']} has a live attempt: {job} ({attempt}{status}); one attempt runs at a "
                    f"time: `distrain-cloud status {job}`, or stop it (`distrain-cloud cancel {job}`) and resume again",
                    holder=job,
                )
        new = store.replace(body, etag)
        if new is not None:
            return Lease(store, me, new)
    raise UserError(
        f"the lease of lineage {me['lineage']} at {store.where} changed hands {ATTEMPTS} times while it was "
        "being taken; nothing was launched: `distrain-cloud ls` shows the attempts, then resume again"
    )


# ---------------------------------------------------------------------- the holder


# Each field a lease's body may carry beyond job, backend and attempt, and what a well-formed one
# looks like; a backend's `lease_fields` names those its holder_state reads.
_FIELDS = {
    "lineage": lambda v: True,
    "region": lambda v: bool(_REGION.fullmatch(v)),
    "bucket": lambda v: bool(_BUCKET.fullmatch(v)),
    "prefix": lambda v: bool(_PREFIX.fullmatch(v)),
    "workdir": os.path.isabs,
}


def _holder(raw: bytes) -> dict[str, Any] | None:
    """The lease's body, if it is one we wrote (its bytes are checked like any S3 object's): its
    backend is one of ours, and every field that backend's holder_state reads is there and well
    formed (any other field present is checked too)."""
    from .spec import JOB_NAME

    try:
        body = json.loads(raw[:MAX_BODY])
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        return None
    if not isinstance(body, dict) or not isinstance(body.get("job"), str) or not JOB_NAME.fullmatch(body["job"]):
        return None
    if body.get("backend") not in BACKENDS or not isinstance(body.get("attempt", 0), (int, type(None))):
        return None
    needed = get_backend(body["backend"]).lease_fields
    if any(name not in body for name in needed):
        return None
    for name, ok in _FIELDS.items():
        if name in body and not (isinstance(body[name], str) and ok(body[name])):
            return None
    return body


def _holder_status(holder: dict[str, Any], age: float, where: str) -> str | None:
    """The holder's status while it is live, None once it has ended (or never launched): its
    backend answers (`holder_state`), from what the lease's body says of where the job lives."""
    try:
        state = get_backend(holder["backend"]).holder_state(holder)
    except UserError as e:
        raise UserError(
            f"the lineage's lease is held by {holder['job']}, whose status could not be read ({e}); "
            "nothing was launched: retry, or look with `distrain-cloud status " + holder["job"] + "`",
            exit_code=e.exit_code,
        ) from None
    if state is None:  # no such job (yet)
        return "launching" if age < LAUNCH_GRACE_S else None
    terminal, status = state
    return None if terminal else re.sub(r"[^\w -]", "", status)[:40]


# ---------------------------------------------------------------------- where the plan's lineage keeps it


def _place(plan: Plan) -> tuple[Store, dict[str, Any]] | None:
    """(store, body) of the lease `plan` takes, from where its backend placed it (`plan.lease`);
    None for a plan not yet checked against AWS."""
    target = plan.lease
    if target is None:
        return None
    me: dict[str, Any] = {"job": plan.job_name, "backend": plan.backend, "time": time.time()}
    me |= {"lineage": target.lineage, "attempt": target.attempt, **dict(target.extra)}
    if target.checkpoint_uri is None:  # a lineage of this machine
        from .jobs import records_dir

        return FileStore(records_dir().parent / "leases" / f"{target.lineage}.json"), me
    if target.region is None:
        raise ValueError(f"{plan.job_name}: a lease beside S3 checkpoints needs their region")
    me["region"] = target.region
    store = s3_store(target.checkpoint_uri, target.lineage, target.region, creates=target.submit_creates)
    return store, me


def lease_key(checkpoint_uri: str, lineage: str) -> tuple[str, str]:
    """(bucket, key) of the lease of the lineage whose checkpoints are at `checkpoint_uri`:
    `<prefix>/checkpoints/<lineage>/` -> `<prefix>/leases/<lineage>.json` (any other folder: a
    `.lease.json` beside it)."""
    bucket, _, key = checkpoint_uri.removeprefix("s3://").partition("/")
    key = key.rstrip("/")
    folder = f"checkpoints/{lineage}"
    if key == folder or key.endswith(f"/{folder}"):
        return bucket, f"{key[: -len(folder)]}leases/{lineage}.json"
    return bucket, f"{key}.lease.json"


def s3_store(checkpoint_uri: str, lineage: str, region: str, *, creates: str | None = None) -> S3Store:
    bucket, key = lease_key(checkpoint_uri, lineage)
    # A first SageMaker job may be the first use of its default bucket, which its submit creates.
    return S3Store(bucket, key, region, create_bucket=creates == bucket)


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True).encode()


# ---------------------------------------------------------------------- the two stores


@dataclasses.dataclass
class S3Store:
    """A lease in S3, written only with conditional PutObjects (S3 evaluates the condition and
    stores as one step; a concurrent conditional write gets 409 ConditionalRequestConflict)."""

    bucket: str
    key: str
    region: str
    create_bucket: bool = False

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def _put(self, body: bytes, condition: dict[str, str]) -> str | None:
        from botocore.exceptions import ClientError

        from distrain_cloud.infra import aws, resources

        with aws.translate_errors():
            s3 = aws.client("s3", self.region)
            request = {"Bucket": self.bucket, "Key": self.key, "Body": body, "ContentType": "application/json"}
            try:
                return str(s3.put_object(**request, **condition)["ETag"])
            except ClientError as e:
                code = aws.error_code(e)
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"):
                    return None  # someone else's version is there (or it was removed): read again
                if code != "NoSuchBucket" or not self.create_bucket:
                    raise
            resources.ensure_bucket(self.bucket, self.region)
            self.create_bucket = False
            return self._put(body, condition)

    def create(self, body: bytes) -> str | None:
        return self._put(body, {"IfNoneMatch": "*"})

    def replace(self, body: bytes, etag: str) -> str | None:
        return self._put(body, {"IfMatch": etag})

    def read(self) -> tuple[bytes, str, float] | None:
        from botocore.exceptions import ClientError

        from distrain_cloud.infra import aws

        with aws.translate_errors():
            try:
                got = aws.client("s3", self.region).get_object(Bucket=self.bucket, Key=self.key)
            except ClientError as e:
                if aws.error_code(e) in ("NoSuchKey", "404"):
                    return None
                raise
            raw = got["Body"].read(MAX_BODY + 1)
        age = time.time() - got["LastModified"].timestamp()  # S3's clock against ours: minutes of slack
        return raw, str(got["ETag"]), age


@dataclasses.dataclass
class FileStore:
    """A lease in a local file; each operation holds an exclusive flock on a lock file beside it,
    so a read-compare-write is one step, and the body is replaced whole (rename), never torn."""

    path: Path

    @property
    def where(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _write(self, body: bytes) -> str:
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_bytes(body)
        os.replace(tmp, self.path)
        return hashlib.sha256(body).hexdigest()

    def create(self, body: bytes) -> str | None:
        with self._locked():
            return None if self.path.exists() else self._write(body)

    def replace(self, body: bytes, etag: str) -> str | None:
        with self._locked():
            if not self.path.exists() or hashlib.sha256(self.path.read_bytes()).hexdigest() != etag:
                return None
            return self._write(body)

    def read(self) -> tuple[bytes, str, float] | None:
        with self._locked():
            if not self.path.exists():
                return None
            raw = self.path.read_bytes()
            return raw[: MAX_BODY + 1], hashlib.sha256(raw).hexdigest(), time.time() - self.path.stat().st_mtime
