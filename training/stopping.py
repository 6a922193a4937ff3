"""Ending a training job within a stated bound, however stuck it is. Torch-free.

A stop (SIGTERM from a backend or a spot notice, Ctrl-C) asks for a checkpoint at the next step
boundary. A step may never end: a peer died and a collective waits for it, a compile runs long.
So every layer bounds its part of the stop:

- the trainer (`StopRequest`): a watchdog thread, woken by the signal itself and not by the main
  thread (which may sit inside a C++ collective that never returns to Python), ends the process
  `--stop-grace` seconds after the stop unless the checkpoint was saved by then, with one line
  saying none was, and exit code STOP_UNSAVED_EXIT_CODE;
- node_launch, the local backend, the node agent and the bench end the whole process tree they
  started (`ProcessTree`) when it outlives their own bound, wherever its processes moved
  (torchrun's workers lead sessions of their own, data loader workers process groups of their
  own: a signal to the launcher's group misses both);
- a process they start dies with them (`child_dies_with_us`, `die_with_parent`), so killing a
  launcher never leaves a training process holding a GPU.
- collectives time out (`collective_timeout_handler`) instead of waiting forever.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from .contract import INTERRUPT_EXIT_CODE, SECOND_INTERRUPT_S, STOP_EXIT_CODE

# The exit code of a stop that saved nothing: the run did not reach a step boundary (or did not
# finish saving) within the grace. 124, as timeout(1) reports a command it had to end.
STOP_UNSAVED_EXIT_CODE = 124
# --stop-grace: the time a stopped trainer gives its step to end and its checkpoint to be written.
# Below the 120 s that a spot notice and SageMaker's StopTrainingJob give before their SIGKILL (and
# the node agent's 110 s), so the job ends saying what happened rather than killed silently.
DEFAULT_STOP_GRACE_S = 60.0
# What the launchers above the trainers add to the grace before they kill what is left: time for
# torchrun's agent and accelerate's launcher to see their workers exit and exit themselves.
LAUNCHER_MARGIN_S = 10.0
# --collective-timeout: how long a collective (all-reduce, barrier, broadcast) may wait for a
# peer before it fails. NCCL's own default; gloo's and DeepSpeed's are 30 minutes of silence.
# It also bounds a phase one process runs while the others wait (rank 0 preparing the data).
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def unsaved_line(sig: signal.Signals, grace_s: float) -> str:
    """The one line a stop that saved nothing ends with (the trainer's; node_launch's matches it)."""
    return (
        f"stopped={sig.name} checkpoint_saved=0: the run did not reach a step boundary and save within "
        f"{grace_s:g} s of the stop (--stop-grace); a resume starts from the checkpoint saved before"
    )


def is_unsaved_line(line: str) -> bool:
    return line.startswith("stopped=") and " checkpoint_saved=0" in line


class StopRequest:
    """The trainer's stop: SIGTERM and SIGINT ask for a checkpointed stop at the next step boundary
    (the training loop reads `signal`); a second Ctrl-C a second or more later ends the process at
    once (copies of the first, relayed within milliseconds by each launcher in between or sent to
    the whole process group by a terminal, are the same stop).

    The signal is handled on a thread of its own, woken through `signal.set_wakeup_fd`: Python runs
    a signal handler only on the main thread between bytecodes, never while it waits inside a
    collective. That thread starts the grace clock; when it runs out before `saved()`, the process
    exits with `unsaved_line` and STOP_UNSAVED_EXIT_CODE (after `saved()`: with the stop's own code).
    """

    def __init__(self, grace_s: float = DEFAULT_STOP_GRACE_S):
        self.grace_s = grace_s
        self.signal: signal.Signals | None = None  # the first stop signal, which names the stop
        self._at = 0.0
        self._saved = False
        self._say: Callable[[str], None] = print
        self._speaks = True

    @property
    def received(self) -> bool:
        return self.signal is not None

    def install(self, say: Callable[[str], None], speaks: bool = True) -> None:
        """From the main thread. `say` prints the main process's notes; `speaks`: this process
        prints the stop's last line (one process of a node, not each)."""
        self._say, self._speaks = say, speaks
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C-level handler must never block
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Only a Python-level handler makes Python write the signal to the wakeup fd; this one
            # has nothing to do (and keeps Ctrl-C from raising KeyboardInterrupt mid-step).
            signal.signal(sig, _noted)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        # A fork (a data loader worker) would otherwise write its own signals into this pipe.
        os.register_at_fork(after_in_child=_forget_wakeup_fd)
        threading.Thread(target=self._watch, args=(read,), name="distrain-stop", daemon=True).start()

    def saved(self) -> None:
        """The stop's checkpoint is written: the grace running out now exits with the stop's code."""
        self._saved = True

    def _watch(self, fd: int) -> None:
        while True:
            for signum in os.read(fd, 512):  # one byte per signal; SIGCHLD (data loaders) too
                if signum in (signal.SIGTERM, signal.SIGINT):
                    self.on_signal(signal.Signals(signum))

    def on_signal(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if self.signal is None:
            self.signal, self._at = sig, now
            if sig == signal.SIGINT:
                self._say("stopping: saving a checkpoint at the end of this step (Ctrl-C again ends at once)")
            timer = threading.Timer(self.grace_s, self._expire)
            timer.daemon = True
            timer.start()
        elif sig == signal.SIGINT and now - self._at >= SECOND_INTERRUPT_S:
            exit_now("stopped at once (second interrupt): this step is not saved", INTERRUPT_EXIT_CODE)

    def _expire(self) -> None:
        sig = self.signal or signal.SIGTERM
        if self._saved:  # saved, but stuck on the way out (a tracker, the group's teardown)
            exit_now(None, INTERRUPT_EXIT_CODE if sig == signal.SIGINT else STOP_EXIT_CODE)
        exit_now(unsaved_line(sig, self.grace_s) if self._speaks else None, STOP_UNSAVED_EXIT_CODE)


def _noted(signum: int, frame: Any) -> None:
    pass


def _forget_wakeup_fd() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread other than the main one: it has no main thread
        pass


def exit_now(line: str | None, code: int) -> None:
    """Flush what the process printed, write `line` to stderr and end the process with `code` at
    once, whatever its other threads are doing. The flush gets two seconds: the main thread may
    hold a stream's lock, blocked on a full pipe."""

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    flusher.join(2.0)
    if line:
        try:
            os.write(2, (line + "\n").encode())
        except OSError:
            pass
    os._exit(code)


# ----------------------------------------------------------------------------- dying with a parent


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int) -> None:
    """Have Linux send this process `sig` when its parent ends (nothing elsewhere). For a process
    started by a launcher we do not control (accelerate's, torchrun's): its workers would outlive it."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def child_dies_with_us(sig: int, then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A `preexec_fn` for a child that must not outlive this process: Linux sends it `sig` when the
    thread that started it ends (call Popen from the main thread), and a child whose parent ended
    before it asked gets `sig` at once. `then` runs after, in the child."""
    prctl, parent = _prctl(), os.getpid()  # looked up here: the child only calls

    def preexec() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), sig)
        if then is not None:
            then()

    return preexec


# ----------------------------------------------------------------------------- process trees


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), which tells it from a later process given
    the same pid; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])  # the name in (...) may hold spaces
        children.setdefault(parent, []).append(int(entry.name))
    return children


class ProcessTree:
    """A process we started and every process below it, remembered as seen: one that leaves its
    parent's session or process group, or is orphaned when its parent dies, is still found and
    ended. Needs /proc (Linux); elsewhere it holds the root alone."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, int | None] = {root: _start_time(root)}  # pid -> start time

    def refresh(self) -> None:
        """Add the processes now below the root or below any seen one (an orphan's children)."""
        if not Path("/proc/self").is_dir():
            return
        children = _children()
        todo = self.alive()
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in self.seen:
                    self.seen[child] = _start_time(child)
                    todo.append(child)

    def alive(self) -> list[int]:
        """The seen processes still running (not a later process with a reused pid, not a zombie)."""
        out = []
        for pid, start in self.seen.items():
            now = _start_time(pid)
            if now is not None and (start is None or now == start) and not _zombie(pid):
                out.append(pid)
        if not Path("/proc/self").is_dir() and _exists(self.root):  # no /proc: the root alone
            out.append(self.root)
        return out

    def kill(self) -> None:
        """SIGKILL the whole tree. Each process is stopped first (SIGSTOP) and the tree read again
        until it holds no new one: a stopped process neither forks nor, while its parent is only
        stopped, is orphaned out of sight."""
        frozen: set[int] = set()
        while True:
            self.refresh()
            new = [pid for pid in self.alive() if pid not in frozen]
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
            frozen.update(new)
        for pid in frozen:
            _signal(pid, signal.SIGKILL)

    def wait_gone(self, timeout_s: float, poll_s: float = 0.2) -> bool:
        """Wait until no seen process runs (refreshing, so processes started meanwhile count)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.refresh()
            if not self.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- collectives


def collective_timeout_handler(seconds: float, backend: str | None = None) -> Any:
    """accelerate's InitProcessGroupKwargs with this timeout for every collective, always passed on.

    (accelerate hands init_process_group only the fields that differ from the class's defaults,
    which put 600 s for NCCL: a --collective-timeout 600 would be dropped and gloo would wait its
    own 30 minutes.) On NCCL, a collective past its timeout makes the process group's watchdog
    tear the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, torch's default, set unless the
    environment says otherwise); blocking wait (TORCH_NCCL_BLOCKING_WAIT) is not used: it would
    make the host wait for every collective.
    """
    from accelerate.utils import InitProcessGroupKwargs

    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    timeout = timedelta(seconds=seconds)
    handler = InitProcessGroupKwargs(timeout=timeout, **({"backend": backend} if backend else {}))
    kwargs = {"timeout": timeout, **({"backend": backend} if backend else {})}
    object.__setattr__(handler, "to_kwargs", lambda: dict(kwargs))
    return handler
