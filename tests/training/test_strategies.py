"""choose_precision (one rule for every backend) and the DDP bucket default, torch-free."""

from __future__ import annotations

import pytest

from distrain_cloud.training.strategies import choose_precision, ddp_bucket_mb

V100, A100 = (7, 0), (8, 0)


@pytest.mark.parametrize(
    "requested, gpus, capability, chosen",
    [
        (None, 0, None, "no"),
        ("no", 0, None, "no"),
        (None, 4, V100, "fp16"),
        (None, 4, A100, "bf16"),
        (None, 1, None, "fp16"),  # unknown GPU: the safe one
        ("fp16", 4, A100, "fp16"),
        ("bf16", 1, None, "bf16"),
        ("no", 4, V100, "no"),
    ],
)
def test_the_requested_or_the_best_the_hardware_has(requested, gpus, capability, chosen):
    assert choose_precision(requested, gpus, capability, "here") == chosen


def test_impossible_requests_name_the_flag_the_hardware_and_the_fix():
    with pytest.raises(
        ValueError, match=r"--precision bf16 needs compute capability >= 8.0; a V100: use --precision fp16"
    ):
        choose_precision("bf16", 4, V100, "a V100")
    with pytest.raises(ValueError, match=r"--precision fp16 needs a GPU; this machine has none: use --precision no"):
        choose_precision("fp16", 0, None, "this machine")


@pytest.mark.parametrize(
    "requested, compiled, unit, mb",
    [
        (None, False, None, 25),
        (None, True, None, 1000),
        (None, True, "model", 1000),
        (None, True, "block", 25),  # no graph to split: the eager size
        (100, True, None, 100),
        (100, False, None, 100),
        (100, True, "block", 100),
    ],
)
def test_ddp_buckets_are_large_under_a_whole_model_compile_unless_asked_otherwise(requested, compiled, unit, mb):
    assert ddp_bucket_mb(requested, compiled, unit) == mb


def test_compiled_autograd_keeps_eager_buckets_so_all_reduces_can_start_before_the_last_gradient():
    assert ddp_bucket_mb(None, True, None, compiled_autograd=True) == 25
    assert ddp_bucket_mb(250, True, None, compiled_autograd=True) == 250
