"""Measured training throughput per GPU, for `instances --fit`'s cost per token.

Data only (the runs are in bench/measurements/): launcher/memory.py reads it; nothing here reads
the estimate, so the launcher and the calibration (bench/memory_runs.py) import no loop.
"""

from __future__ import annotations

from dataclasses import dataclass

H1 = "2026-11-26-h100x1"
S15_H100 = "2026-11-27-h100x1-session15"
OURS_1 = "ours-gpt2-small-ddp-g1-b16-k1"
OURS_C1 = "ours-gpt2-small-ddp-compile-g1-b16-k1"


@dataclass(frozen=True)
class Throughput:
    """Measured tokens/s per GPU of one configuration on one card, for `instances --fit`."""

    card: str  # the catalog's GPU model
    model: str  # a training preset
    compiled: bool
    tokens_per_sec: tuple[float, ...]  # per GPU, one per run
    runs: tuple[tuple[str, str], ...]  # (source, run id) of each
    note: str = ""
    batch_size: int = 16
    seq_len: int = 1024
    task: str = "causal-lm"


# Only cards the catalog has (the H200 figures in bench/ have no instance type here yet).
THROUGHPUT: tuple[Throughput, ...] = (
    Throughput("H100", "gpt2-small", True, (422663.9, 423765.4, 424810.5),
               ((f"{H1}-session4-loss-only-run1", OURS_C1), (f"{H1}-session4-loss-only-run2", OURS_C1),
                (f"{S15_H100}-single", OURS_C1))),
    Throughput("H100", "gpt2-small", False, (157376.7,), ((f"{H1}-session2-single-liger-varlen", OURS_1),),
               note="before the loss-only training forwards"),
)  # fmt: skip
