"""Trainer.setup refuses flags this machine or launch cannot serve, before building anything
(through the entry point, one line and exit 2: test_bad_input.py)."""

from __future__ import annotations

import pytest

from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.contract import Contract
from distrain_cloud.training.trainer import Trainer


def trainer(tmp_path, *flags: str) -> Trainer:
    contract = Contract(model_dir=tmp_path / "m", output_dir=tmp_path / "o", checkpoint_dir=tmp_path / "c")
    return Trainer(parse_args(["--report-to", "none", *flags]), contract)


@pytest.mark.parametrize(
    "flags, world, message",
    [
        (
            ["--ddp-reduce-dtype", "bf16"],
            1,
            "--ddp-reduce-dtype bf16 needs GPUs (NCCL); gloo on CPU reduces fp32 or fp16",
        ),
        (["--strategy", "single"], 2, "--strategy single runs one process, but 2 were started; use --strategy ddp"),
        (["--lr", "-1e-4"], 1, "--lr -0.0001: the learning rate must be positive, e.g. --lr 3e-4"),
        (["--lr", "nan"], 1, "--lr nan: the learning rate must be positive, e.g. --lr 3e-4"),
    ],
    ids=["bf16-reduce-on-cpu", "single-with-two-processes", "negative-lr", "nan-lr"],
)
def test_flags_the_environment_cannot_serve_are_argument_errors(tmp_path, flags, world, message):
    # Argument errors, not data errors: the data is fine, the flag does not fit this machine.
    with pytest.raises(ArgumentError) as e:
        trainer(tmp_path, *flags)._check_environment(world, cuda=False)
    assert str(e.value) == message
