"""Every test hook of the training process, in one place: faults a test injects through an
environment variable, since the process it tests is a subprocess (torchrun's, the node launcher's,
a simulated node's) that no monkeypatch reaches.

Each is off unless its `DISTRAIN_TEST_*` variable is set, and no behaviour a user sees depends on
one: a cloud job's environment is what its request or job.json names (never one of these), and a
local job inherits the shell that submits it, where only tests set them.
tests/training/test_faults.py keeps every `DISTRAIN_TEST_` read of the product in this module.

The hooks (variable: where, what, which tests set it):
- `DISTRAIN_TEST_KILL_AT_STEP=N`: after optimizer step N, a `kill -9` of the process (test_resume,
  test_distributed, test_fsdp, test_local_backend, e2e/test_ec2_two_nodes);
- `DISTRAIN_TEST_RAISE_AT_STEP=N`: after step N, a RuntimeError no check foresaw (test_local_backend);
- `DISTRAIN_TEST_HANG_AT_STEP=N[:RANK]`: after step N, on RANK (0), a next step that never ends
  (test_stop);
- `DISTRAIN_TEST_STEP_SLEEP_S=S`: S seconds more each step (e2e/test_ec2_two_nodes);
- `DISTRAIN_TEST_CRASH_IN=save|model`: a `kill -9` half-way through a checkpoint or the model's
  save (test_resume);
- `DISTRAIN_TEST_NO_SPACE_IN=save|model`: there, an OSError ENOSPC as a full disk (test_checkpoint);
- `DISTRAIN_TEST_COMPILE_FAIL=1`: each graph Inductor compiles fails (test_compile_default);
- `DISTRAIN_TEST_COMPILED_BACKWARD_FAIL=1`: the first compiled backward fails part-way, once
  (test_compile_default, test_distributed).
"""

from __future__ import annotations

import errno
import os
import time


def after_step(step: int) -> None:
    """The step hooks, called after each optimizer step."""
    # A `kill -9` right after this optimizer step, to prove exact resume.
    if os.environ.get("DISTRAIN_TEST_KILL_AT_STEP") == str(step):
        os.kill(os.getpid(), 9)
    # And a failure no check foresaw (a library's error, a bug), to prove it is still one line.
    if os.environ.get("DISTRAIN_TEST_RAISE_AT_STEP") == str(step):
        raise RuntimeError(f"injected failure at step {step}")
    # And a process whose next step never ends (a peer gone silent, a stuck collective): the others
    # wait for it inside their next collective.
    hang = os.environ.get("DISTRAIN_TEST_HANG_AT_STEP", "").split(":")  # STEP[:RANK]
    if hang[0] == str(step) and os.environ.get("RANK", "0") == (hang[1:] or ["0"])[0]:
        while True:
            time.sleep(3600)
    # And steps slower than this machine's: a run long enough, in seconds, for something that polls
    # (a node agent's look at its spot notice) to act before the last step, whatever the load.
    slow = os.environ.get("DISTRAIN_TEST_STEP_SLEEP_S")
    if slow:
        time.sleep(float(slow))


def in_save(where: str) -> None:
    """Die like a `kill -9` at a chosen point of a save, to prove partial saves are ignored; or
    fail like a full disk there, to prove the job says so in one line."""
    if os.environ.get("DISTRAIN_TEST_CRASH_IN") == where:
        os.kill(os.getpid(), 9)
    if os.environ.get("DISTRAIN_TEST_NO_SPACE_IN") == where:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)


def compile_fails() -> bool:
    """Whether Inductor's compile of a graph fails here (compiling.inductor_or_eager's guard)."""
    return bool(os.environ.get("DISTRAIN_TEST_COMPILE_FAIL"))


def compiled_backward_fails_once() -> bool:
    """Whether this first compiled backward fails part-way (Trainer._backward's guard); true once."""
    return bool(os.environ.pop("DISTRAIN_TEST_COMPILED_BACKWARD_FAIL", ""))
