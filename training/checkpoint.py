"""Checkpoints in the contract's checkpoint folder: complete, verified ones only, the last K kept.

A checkpoint is `checkpoint-<step>/` holding Accelerate's saved state plus our
`trainer_state.json`. After every process has finished writing, the main process writes
`MANIFEST.json` (size and sha256 of every file) and then the `COMPLETE` marker, so a save
killed half-way is never mistaken for a checkpoint, and a complete one whose files changed
afterwards (truncated by a full disk, damaged in a copy or a sync) is noticed on resume,
skipped with one line, and the previous one is used.

Checkpoints written before manifests existed have none: they are still loaded, unverified
(one line says so), so jobs started with an older version resume as before.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import faults
from .strategies import Strategy, parse_strategy

MARKER = "COMPLETE"
STATE = "trainer_state.json"
MANIFEST = "MANIFEST.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 1 << 20
# A write that failed with less than this free was the disk filling up: torch.save reports a
# full disk as a RuntimeError ("basic_ios::clear: iostream error"), with no errno to read.
LOW_SPACE_BYTES = 64 << 20


class CheckpointError(Exception):
    """A checkpoint this job cannot resume as started; str() is the one line users see."""

    exit_code = 2
    every_process = False  # every process finds the same problem; the main one reports it


class SaveError(CheckpointError):
    """Saving failed on the disk (full, read-only, ...); str() is the one line users see."""

    exit_code = 1
    # The process whose write failed reports it: the others may be waiting at a barrier.
    every_process = True


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"checkpoint-{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of checkpoints marked complete, oldest first (not yet verified)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / MARKER).is_file() and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def latest(root: Path, warn: Callable[[str], None] = _warn) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint whose files match its manifest, and its trainer state.

    Each newer one that fails verification costs one `warn` line naming it and the file.
    """
    skipped: list[str] = []
    chosen: tuple[Path, dict[str, Any]] | None = None
    for _, path in reversed(complete_checkpoints(root)):
        problem = verify(path)
        if problem is None:
            try:
                chosen = path, json.loads((path / STATE).read_text())
                break
            except (OSError, ValueError) as e:  # only possible without a manifest
                problem = f"{STATE} is unreadable ({e})"
        skipped.append(f"warning: skipping {path.name} in {root}: {problem}")
    instead = f"resuming from {chosen[0].name} instead" if chosen else "no earlier checkpoint: starting from step 0"
    for line in skipped:
        warn(f"{line}; {instead}")
    if chosen and not (chosen[0] / MANIFEST).is_file():
        warn(f"note: {chosen[0].name} has no {MANIFEST} (saved before checksums existed): loading it unverified")
    return chosen


def newest_state(root: Path) -> dict[str, Any] | None:
    """The trainer state of the newest complete checkpoint, unverified (what it was trained with,
    which every checkpoint of a lineage shares), or None; cheap enough for every process."""
    for _, path in reversed(complete_checkpoints(root)):
        try:
            return json.loads((path / STATE).read_text())
        except (OSError, ValueError):
            continue
    return None


def verify(path: Path) -> str | None:
    """None if every file the manifest lists has its size and sha256 (or there is no manifest),
    else what is wrong, naming the file. Files the manifest does not list are not checked."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        expected = {rel: (int(e["size"]), str(e["sha256"])) for rel, e in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__}: {e})"
    for rel in expected:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:  # only ever reads inside the checkpoint
            return f"{MANIFEST} names {rel!r}, outside the checkpoint"
    try:
        # Sizes first: a truncated file is found without reading anything.
        for rel, (size, _) in expected.items():
            f = path / rel
            if not f.is_file():
                return f"{rel} is missing"
            if f.stat().st_size != size:
                return f"{rel} has {f.stat().st_size} bytes, its manifest says {size}"
        digests = _sha256_all([path / rel for rel in expected])
    except OSError as e:
        return f"a file could not be read ({e})"
    for (rel, (_, sha256)), digest in zip(expected.items(), digests, strict=True):
        if digest != sha256:
            return f"{rel} does not match its sha256 in {MANIFEST}"
    return None


def write_manifest(path: Path) -> None:
    """MANIFEST.json: size and sha256 of every file under `path` (but itself and the marker).

    Run by the main process after every process finished writing. On one machine per-rank
    files (RNG states, ZeRO shards) share the folder, so all are listed; across nodes without
    a shared disk it lists the files this node can see, and verification checks those.
    Cost: one read of the checkpoint at about 1 GB/s per core (sha256 with SHA extensions),
    files hashed in parallel: GPT-2 small with AdamW (1.5 GB) adds about a second to a save.
    Reading also forces each file to disk (fsync) before the marker says the save is done.
    """
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in (MANIFEST, MARKER))
    digests = _sha256_all(files, fsync=True)
    entries = {
        p.relative_to(path).as_posix(): {"size": p.stat().st_size, "sha256": d}
        for p, d in zip(files, digests, strict=True)
    }
    _write_atomic(path / MANIFEST, json.dumps({"algorithm": "sha256", "files": entries}, indent=1))


def _sha256_all(files: list[Path], fsync: bool = False) -> list[str]:
    # hashlib releases the GIL on large buffers: threads hash ZeRO's per-rank shards in parallel.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda p: _sha256(p, fsync), files))


def _sha256(path: Path, fsync: bool) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
        if fsync:
            os.fsync(f.fileno())
    return h.hexdigest()


def check_resumable(
    path: Path, saved: dict[str, Any], world_size: int, strategy: str, sharding: str | None = None
) -> None:
    """Raise CheckpointError when this run cannot load the checkpoint, before Accelerate and
    DeepSpeed fail on it with a traceback. Checkpoints saved before world size and strategy
    were recorded are not checked. `sharding`: "in-graph" for fsdp sharded in the graph
    (--compile-unit model), whose files are not FSDP2's."""
    if "strategy" not in saved or "world_size" not in saved:
        return
    where = f"{path.name} in {path.parent}"
    old, new, n = parse_strategy(saved["strategy"]), parse_strategy(strategy), saved["world_size"]
    was = saved.get("sharding")
    if _layout(old, was) != _layout(new, sharding):
        then, now = _flags(old, was), _flags(new, sharding)
        raise CheckpointError(
            f"{where} was saved with {then}, which stores its state differently from {now}: "
            f"resume with {then}, or move the checkpoints away to start over"
        )
    if was == "in-graph" and n != world_size:
        # Its shards are cut anew for this many processes (graph_fsdp.reshard), from every
        # process's file: on several nodes without shared storage, each node holds only its own.
        from .graph_fsdp import shard_file  # here: graph_fsdp imports torch, the launcher imports this

        missing = [shard_file(path, k).name for k in range(n) if not shard_file(path, k).exists()]
        if missing:
            raise CheckpointError(
                f"{where} was saved by {_processes(n)} and lacks {', '.join(missing)}: resuming with "
                f"{world_size} instead needs every process's shard file in that folder; run it with "
                f"{_processes(n)} to resume, or move the checkpoints away to start over"
            )
        return
    if old.shards_state and n != world_size:
        not_yet = " (this trainer does not load DeepSpeed's universal checkpoints yet)" if old.uses_deepspeed else ""
        raise CheckpointError(
            f"{where} was saved by {_processes(n)} with --strategy {old.value}, which splits its state across "
            f"processes, but this run has {world_size}: run it with {_processes(n)} to resume{not_yet}, "
            "or move the checkpoints away to start over"
        )


@dataclass(frozen=True)
class Batches:
    """How a resumed run batches its data: micro-batches per optimizer step, and how many loader
    batches of this epoch are already trained on. `note` says what changed, for the log."""

    grad_accum: int
    batch_in_epoch: int
    note: str | None = None
    regrouped: bool = False  # loader batches of another size than the checkpoint's


def resume_batches(path: Path, saved: dict[str, Any], world: int, batch: int, accum: int) -> Batches:
    """Resume `saved` (a trainer_state.json) on `world` processes with `--batch-size batch
    --grad-accum accum`, keeping what the checkpoint was trained with: its global batch (samples
    per optimizer step: batch x accum x processes) and its place in the epoch.

    On another number of processes (a spot job back on another instance count) with the job's own
    flags, the accumulation changes so the global batch stays: 2 processes' checkpoint on 1 runs
    twice the micro-batches a step. Where no accumulation gives it with this micro-batch, the resume
    is refused with flags that do. The place in the epoch is counted in samples, whose order does
    not depend on the batch size (data.EpochBatchSampler), so it converts to this run's batches.
    Checkpoints saved before these were recorded are taken to have used this run's flags."""
    was_world = saved.get("world_size", world)
    was_batch, was_accum = saved.get("batch_size", batch), saved.get("grad_accum", accum)
    done = saved.get("batch_in_epoch", 0) * was_batch * was_world  # samples of this epoch
    now = batch * world  # samples per loader batch
    target = was_batch * was_accum * was_world
    note = None
    if world != was_world and (batch, accum) == (was_batch, was_accum):
        if target % now == 0:
            accum = target // now
            note = (
                f"resumed on {_processes(world)} from a checkpoint of {was_world}: --grad-accum {accum} keeps its "
                f"global batch of {target} ({batch} x {accum} x {world})"
            )
        else:
            raise CheckpointError(
                f"{path.name} in {path.parent} was trained with a global batch of {target} (--batch-size "
                f"{was_batch} x --grad-accum {was_accum} x {_processes(was_world)}), which no --grad-accum "
                f"gives with --batch-size {batch} on {_processes(world)}: {_keep_flags(target, world, batch)}"
                ", or move the checkpoints away to start over"
            )
    return Batches(accum, done // now, note, regrouped=now != was_batch * was_world)


def _keep_flags(target: int, world: int, batch: int) -> str:
    """The flags that give `target` samples a step on `world` processes, the micro-batch at most
    `batch` (what fitted before), or why none do."""
    if target % world:
        return f"resume on a number of processes that divides {target}"
    per = target // world
    micro = max(b for b in range(1, min(batch, per) + 1) if per % b == 0)
    return f"resume with --batch-size {micro} --grad-accum {per // micro}"


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _flags(strategy: Strategy, sharding: str | None) -> str:
    return f"--strategy {strategy.value}" + (" --compile-unit model" if sharding == "in-graph" else "")


def _layout(strategy: Strategy, sharding: str | None = None) -> str:
    # single and ddp save the same files at any world size; ZeRO-1/2, ZeRO-3 and both fsdp engines
    # (FSDP2, and sharded inside the graph: `sharding` "in-graph") save their own.
    if strategy is Strategy.fsdp:
        return "fsdp-in-graph" if sharding == "in-graph" else "fsdp"
    if not strategy.uses_deepspeed:
        return "accelerate"
    return "zero3" if strategy.zero_stage == 3 else "zero1-2"


def save(
    accelerator, root: Path, step: int, state: dict[str, Any], keep: int, own: Callable[[Path], None] | None = None
) -> Path:
    """Collective: every process calls it. Returns the checkpoint folder. `own(folder)`, where
    given, writes what each process keeps beside Accelerate's state (in-graph fsdp's shards).

    A write that fails on the disk (full, read-only, ...) raises SaveError with one line that
    names the folder; the checkpoint is then left without its marker, so it is never loaded.
    """
    path = checkpoint_path(root, step)
    try:
        if accelerator.is_main_process:
            if path.exists():  # a half-written save of this step from a killed run
                shutil.rmtree(path)
            path.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(path))
        if own is not None:
            own(path)
        faults.in_save("save")  # a test's kill or full disk half-way (training/faults.py)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _write_atomic(path / STATE, json.dumps(state, indent=2))
            write_manifest(path)
            _write_atomic(path / MARKER, str(step))
            for _, old in complete_checkpoints(root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    except Exception as e:
        line = disk_failure(
            e,
            root,
            path.name,
            f"{path.name} is not marked complete and will not be loaded",
            f" or keep fewer checkpoints (--keep-checkpoints, now {keep})",
        )
        if line is None:
            raise
        raise SaveError(line) from e
    accelerator.wait_for_everyone()
    return path


def disk_failure(error: BaseException, folder: Path, what: str, note: str, more_space: str = "") -> str | None:
    """The one line for a write of `what` into `folder` that failed on the disk, or None when
    `error` is not about the disk (the caller then lets it through, traceback and all).
    `note` says what became of the write; `more_space` is a way to need less room."""
    os_error = _os_error(error)
    free, inodes_left, mount = _disk_space(folder)
    full = os_error is not None and os_error.errno in (errno.ENOSPC, errno.EDQUOT)
    if full or (free is not None and free < LOW_SPACE_BYTES) or inodes_left == 0:
        room = "free space unknown" if free is None else f"{_size(free)} free"
        if inodes_left == 0:
            room = "no free inodes"
        return (
            f"no space left on device while saving {what} to {folder} ({room} on the disk mounted at {mount}); "
            f"{note}: free space there{more_space}"
        )
    if os_error is not None:
        reason = os_error.strerror or str(os_error)
        return f"could not save {what} to {folder}: {reason} ({os_error.filename or folder}); {note}"
    return None


def _os_error(error: BaseException | None) -> OSError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _disk_space(folder: Path) -> tuple[int | None, int | None, Path]:
    """(free bytes, free inodes or None if the filesystem does not count them, mount point)."""
    at = folder.absolute()
    while not at.exists() and at != at.parent:
        at = at.parent
    mount = at
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        st = os.statvfs(at)
    except OSError:
        return None, None, mount
    return st.f_bavail * st.f_frsize, (st.f_favail if st.f_files else None), mount


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]}"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
