"""Library messages that tell a user of this tool nothing, turned off in one place, each by the
library's own means: a filter on the one logger that says it, a warnings filter by category and
message. Nothing here reads output lines, so no line a user's code prints is ever dropped.

What is off: DeepSpeed finding no GPU on a CPU run, and the deprecated collectives ZeRO-3 calls
every step. Elsewhere, by the same rule: the launchers' thread-count notes are answered by
passing the value they note (node_launch), and tied weights are saved the way transformers
saves them, so Accelerate has nothing to warn about at each checkpoint (trainer._drop_tied_copies).
`install()` runs first in the training entry point. Torch-free.
"""

from __future__ import annotations

import logging
import warnings

# (logger name, message start) and (warning category, message regex).
_LOG_NOISE = (("DeepSpeed", "Setting accelerator to CPU"),)
_WARNING_NOISE = (
    (FutureWarning, r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"),
)


class _DropMessages(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def install() -> None:
    """Turn the noise off in this process; idempotent."""
    for name, start in _LOG_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.start == start for f in logger.filters):
            logger.addFilter(_DropMessages(start))
    for category, message in _WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
