"""Library messages that tell a user of this tool nothing, dropped in one place.

Each says something about the libraries' own defaults or future APIs (accelerate's and torchrun's
thread-count notes, DeepSpeed finding no GPU on a CPU run, the deprecated collectives ZeRO-3 calls
every step, tied embeddings dropped on save as they should be): about half of a CPU ZeRO-3 log.
`install()` filters them in this process (the training entry point calls it first);
`is_noise()` drops the lines the launchers print themselves (node_launch relays their stderr).
Torch-free.
"""

from __future__ import annotations

import logging
import re
import warnings

# In-process: (logger name, message start) and (warning category, message regex).
_LOG_NOISE = (
    ("DeepSpeed", "Setting accelerator to CPU"),
    ("accelerate.utils.other", "Removed shared tensor"),
)
_WARNING_NOISE = (
    (FutureWarning, r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"),
)

# Lines the launchers (accelerate launch, torchrun) print before any of our code runs.
_LINE_NOISE = re.compile(
    "|".join(
        [
            r"The following values were not passed to `accelerate launch`",
            r"`--num_cpu_threads_per_process` was set to",
            r"To avoid this warning pass in values for each of the problematic parameters",
            r"Setting OMP_NUM_THREADS environment variable for each process",
            r"^\s*\*{10,}\s*$",  # torchrun's box around that note
            r"torch/distributed/run\.py:\d+\]\s*$",  # the note's logger prefix, on a line of its own
        ]
    )
)


class _DropMessages(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def install() -> None:
    """Drop the in-process noise; idempotent."""
    for name, start in _LOG_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.start == start for f in logger.filters):
            logger.addFilter(_DropMessages(start))
    for category, message in _WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)


def is_noise(line: str) -> bool:
    """Whether a launcher's output line is one of the notes above."""
    return bool(_LINE_NOISE.search(line))
