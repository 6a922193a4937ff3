"""The trainer's stop handler: Ctrl-C and SIGTERM ask for a checkpointed stop; copies of the first
signal relayed within milliseconds (by launchers, or a terminal signalling the whole process group)
are one signal; a second Ctrl-C a second later ends the process at once."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, time
from distrain_cloud.training.trainer import Trainer

t = Trainer.__new__(Trainer)  # only the stop state: no model, no Accelerator
t.stop_signal, t._stop_signal_at, t.signal_received = None, 0.0, False
t._print = lambda line: print(line, flush=True)
t._install_signal_handler()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.05)
os.kill(os.getpid(), signal.SIGINT)  # a relayed copy
time.sleep(0.05)
os.kill(os.getpid(), signal.SIGTERM)  # a backend's stop on top: still the same stop
time.sleep(0.05)
print("requested", t.signal_received, t.stop_signal.name, flush=True)
time.sleep(1.1)
os.kill(os.getpid(), signal.SIGINT)  # the user's second Ctrl-C
time.sleep(5)
print("still running", flush=True)
"""


def test_copies_are_one_stop_and_a_second_ctrl_c_ends_at_once():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 130, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "stopping: saving a checkpoint at the end of this step (Ctrl-C again ends at once)",
        "requested True SIGINT",
    ]
    assert r.stderr.strip().splitlines() == ["stopped at once (second interrupt): this step is not saved"]
