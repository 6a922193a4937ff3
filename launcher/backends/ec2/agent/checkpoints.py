"""Checkpoints and the compile cache between this node's disk and the lineage's S3 folder."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from distrain_cloud.training.checkpoint import MARKER

from .job import UPLOADED, BadObject, short
from .store import Store

# ----------------------------------------------------------------------------- checkpoints


_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")  # fullmatch: "checkpoint-5\n" is no checkpoint


def checkpoint_folders(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every local checkpoint folder, complete or not, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.fullmatch(p.name))]
    return sorted(found)


def files_in(folder: Path) -> list[Path]:
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
        log(f"could not restore {key!r} ({short(e)}); skipped")
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
    for f in files_in(folder) if folder.is_dir() else []:
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
            for f in files_in(folder):
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
