"""Checkpoints in the contract's checkpoint folder: complete ones only, the last K kept.

A checkpoint is `checkpoint-<step>/` holding Accelerate's saved state plus our
`trainer_state.json`; the `COMPLETE` marker is written last, after every process has
finished writing, so a save killed half-way is never mistaken for a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"
STATE = "trainer_state.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"checkpoint-{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / MARKER).is_file() and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(root: Path) -> tuple[Path, dict[str, Any]] | None:
    done = complete_checkpoints(root)
    if not done:
        return None
    path = done[-1][1]
    return path, json.loads((path / STATE).read_text())


def save(accelerator, root: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Collective: every process calls it. Returns the checkpoint folder."""
    path = checkpoint_path(root, step)
    if accelerator.is_main_process:
        if path.exists():  # a half-written save of this step from a killed run
            shutil.rmtree(path)
        path.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(path))
    _crash_point("save")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_atomic(path / STATE, json.dumps(state, indent=2))
        _write_atomic(path / MARKER, str(step))
        for _, old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _crash_point(where: str) -> None:
    # Test hook: die like a `kill -9` at a chosen point, to prove partial saves are ignored.
    if os.environ.get("DISTRAIN_TEST_CRASH_IN") == where:
        os.kill(os.getpid(), 9)
