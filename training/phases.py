"""Setup phases that say so when they are slow, and durations as log lines show them. Torch-free:
the entry point uses them before it imports the trainer (the data check, __main__.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

# A setup step silent for this long gets a line saying what it is doing.
SLOW_PHASE_S = 10.0


@contextlib.contextmanager
def slow_phase(what: str, say: Callable[[str], None], after_s: float | None = None) -> Iterator[None]:
    """A line when a setup step has run for SLOW_PHASE_S with nothing to show (a download, an op
    build), and one when it ends: a quiet minute then reads as work, not a hang. Quick ones say
    nothing."""
    started, said = time.perf_counter(), []

    def say_once() -> None:
        said.append(True)
        say(f"setup: {what}...")

    timer = threading.Timer(SLOW_PHASE_S if after_s is None else after_s, say_once)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if said:
            say(f"setup: {what.split(' (')[0]}: done in {hms(time.perf_counter() - started)}")


def hms(seconds: float) -> str:
    """7.2 -> '7s', 62 -> '1m02s', 3725 -> '1h02m05s': readable in a log line, one token for key=value
    parsers."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m{s % 60:02d}s" if h else f"{m}m{s % 60:02d}s"
