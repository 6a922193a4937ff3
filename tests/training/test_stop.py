"""The trainer's stop handler: Ctrl-C and SIGTERM ask for a checkpointed stop; copies of the first
signal relayed within milliseconds (by launchers, or a terminal signalling the whole process group)
are one signal; a second Ctrl-C a second later ends the process at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import os, signal, time
from distrain_cloud.training.stopping import StopRequest

stop = StopRequest(grace_s=60)
stop.install(lambda line: print(line, flush=True))
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.05)
os.kill(os.getpid(), signal.SIGINT)  # a relayed copy
time.sleep(0.05)
os.kill(os.getpid(), signal.SIGTERM)  # a backend's stop on top: still the same stop
time.sleep(0.05)
print("requested", stop.received, stop.signal.name, flush=True)
time.sleep(1.1)
os.kill(os.getpid(), signal.SIGINT)  # the user's second Ctrl-C
time.sleep(5)
print("still running", flush=True)
"""

# The main thread inside a C call that never returns (a collective waiting for a dead peer):
# Python never runs a signal handler there, so the stop's watchdog must not depend on one.
STUCK = """
import ctypes, os, signal, sys
from distrain_cloud.training.stopping import StopRequest

stop = StopRequest(grace_s=float(sys.argv[1]))
stop.install(lambda line: print(line, flush=True))
print("training", flush=True)
ctypes.CDLL(None).pause()  # returns only when a handler ran in C; Python's runs after, if ever
while True:
    ctypes.CDLL(None).sleep(3600)
"""


def test_copies_are_one_stop_and_a_second_ctrl_c_ends_at_once():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 130, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "stopping: saving a checkpoint at the end of this step (Ctrl-C again ends at once)",
        "requested True SIGINT",
    ]
    assert r.stderr.strip().splitlines() == ["stopped at once (second interrupt): this step is not saved"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_whose_step_never_ends_exits_after_the_grace_saying_nothing_was_saved(sig):
    from distrain_cloud.training.stopping import STOP_UNSAVED_EXIT_CODE

    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK, "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "training\n"
        time.sleep(0.2)  # inside pause()
        proc.send_signal(sig)
        started = time.monotonic()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    # threading.Timer's wait may return a millisecond early (a CI-sized machine saw 0.4992 s)
    assert 0.45 <= time.monotonic() - started < 5
    assert proc.returncode == STOP_UNSAVED_EXIT_CODE, out + err
    assert err.splitlines() == [
        f"stopped={sig.name} checkpoint_saved=0: the run did not reach a step boundary and save within 0.5 s "
        "of the stop (--stop-grace); a resume starts from the checkpoint saved before"
    ]


def _tree(root: int) -> list[int]:
    """`root` and every process below it, from /proc (torchrun's workers lead sessions of their own)."""
    from distrain_cloud.training.stopping import ProcessTree

    tree = ProcessTree(root)
    tree.refresh()
    return tree.alive()


def _running(pids: list[int]) -> list[int]:
    from distrain_cloud.training.stopping import _start_time, _zombie

    return [pid for pid in pids if _start_time(pid) is not None and not _zombie(pid)]


GRACE_S = 3.0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_stop_ends_every_process_of_a_run_whose_step_never_ends(train):
    """Rank 1 never finishes step 4 (a peer gone silent, a long compile); rank 0 waits for it inside
    the all-reduce of step 4, where Python runs no signal handler. A SIGTERM to node_launch still
    ends every process within the bound, with one line saying no checkpoint was saved."""
    from distrain_cloud.training.stopping import LAUNCHER_MARGIN_S, STOP_UNSAVED_EXIT_CODE

    flags = ["--max-steps", "100000", "--save-every", "1000", "--log-every", "1", "--report-to", "none"]
    flags += ["--stop-grace", str(GRACE_S)]
    env = {"DISTRAIN_TEST_HANG_AT_STEP": "3:1"}
    proc, c, argv = train.popen(*flags, name="stuck", processes=2, env=env)
    metrics = c.output_dir / "metrics.jsonl"
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while (not metrics.is_file() or metrics.read_text().count("\n") < 3) and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it was signalled"
            time.sleep(0.1)
        time.sleep(1.0)  # rank 0 is inside step 4's all-reduce, rank 1 asleep after step 3
        tree = _tree(proc.pid)  # node_launch, accelerate's launcher, both training processes
        assert len(tree) >= 4, tree
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=GRACE_S + LAUNCHER_MARGIN_S + 10)
        took = time.monotonic() - started
        time.sleep(0.5)  # node_launch has exited; what it killed is being reaped
        left = _running(tree)
    finally:
        for pid in _running(tree):  # today's code left the training processes running, orphaned
            os.kill(pid, signal.SIGKILL)
    run = train.finish(proc, c, argv, timeout=30)
    assert left == [], f"still running: {left}\n" + run.describe()
    assert took < GRACE_S + LAUNCHER_MARGIN_S, run.describe()
    assert run.returncode == STOP_UNSAVED_EXIT_CODE, run.describe()
    stopped = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("stopped=")]
    assert stopped == [
        f"stopped=SIGTERM checkpoint_saved=0: the run did not reach a step boundary and save within {GRACE_S:g} s "
        "of the stop (--stop-grace); a resume starts from the checkpoint saved before"
    ], run.describe()
    assert c.complete_checkpoints() == [] and "Traceback" not in run.stderr, run.describe()


# Two processes as node_launch starts them on CPU (gloo, through accelerate); rank 1 never joins
# the all-reduce.
COLLECTIVE = """
import os, sys, time
from accelerate import Accelerator
from distrain_cloud.training.stopping import collective_timeout_handler

acc = Accelerator(cpu=True, kwargs_handlers=[collective_timeout_handler(float(sys.argv[1]))])
import torch

if acc.process_index == 1:
    time.sleep(120)
started = time.monotonic()
try:
    acc.reduce(torch.ones(1), "sum")
except Exception as e:
    print(f"failed after {time.monotonic() - started:.0f} s: {type(e).__name__}", flush=True)
    os._exit(3)
"""


@pytest.mark.slow  # two processes importing torch and accelerate: about 5 s
def test_a_collective_whose_peer_never_comes_fails_after_the_collective_timeout():
    """Not gloo's 30 minutes of silence (nor DeepSpeed's); accelerate drops an InitProcessGroupKwargs
    timeout equal to its class default (600 s), so the handler always passes it on."""
    import datetime

    from distrain_cloud.training.contract import free_port
    from distrain_cloud.training.stopping import DEFAULT_COLLECTIVE_TIMEOUT_S, collective_timeout_handler

    assert collective_timeout_handler(DEFAULT_COLLECTIVE_TIMEOUT_S).to_kwargs() == {
        "timeout": datetime.timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_S)
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "DISTRAIN_"))}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COLLECTIVE, "2"],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        out, err = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 3, out + err
    assert out.strip() in ("failed after 2 s: RuntimeError", "failed after 3 s: RuntimeError"), out + err


# node_launch's own bound, when a training process does not end itself (its watchdog cannot run:
# a process in uninterruptible sleep, say): a stand-in launcher that ignores SIGTERM (as node_launch
# starts it) with a deaf "training process" in a session of its own, as torchrun starts them.
NODE_LAUNCH_BOUND = """
import os, sys
from pathlib import Path
from distrain_cloud.training.node_launch import _run_forwarding_signals

deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
launcher = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen([sys.executable, '-c', {deaf!r}], start_new_session=True); "
    "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)"
)
code = _run_forwarding_signals([sys.executable, "-c", launcher, sys.argv[1]], dict(os.environ), Path("none"), 1.0)
sys.exit(code)
"""


def test_node_launch_kills_the_whole_tree_that_outlives_its_bound(tmp_path):
    from distrain_cloud.training.stopping import STOP_UNSAVED_EXIT_CODE

    pid_file = tmp_path / "worker.pid"
    proc = subprocess.Popen([sys.executable, "-c", NODE_LAUNCH_BOUND, str(pid_file)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        time.sleep(0.2)
        left = _running([worker])
    finally:
        proc.kill()
        if pid_file.is_file():
            for pid in _running([int(pid_file.read_text())]):
                os.kill(pid, signal.SIGKILL)
    assert left == [], err
    assert proc.returncode == STOP_UNSAVED_EXIT_CODE, err
    assert err.splitlines() == [
        "node_launch: training processes still running 1 s after the stop: killing them (no checkpoint saved)"
    ]
