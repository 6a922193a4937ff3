"""decide() as a table: the flags and the launch in, the run's decisions out. One row per rule
that turns a decision (each rule's own tests, with its measurements, are in test_strategies.py,
test_compile_default.py and test_graph_fsdp.py); the table shows they meet in one value."""

from __future__ import annotations

import pytest

from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.decisions import decide
from distrain_cloud.training.engines.facts import DDP, DEEPSPEED, FSDP2, GRAPH_FSDP, SINGLE

LM = ["--task", "causal-lm"]
SMALL, XL = 124_000_000, 1_500_000_000
NVLINK4 = {"world": 4, "cuda": True}

# flags, launch -> strategy (as decided), engine, compiled, compile unit, head loss, DDP buckets (MB), why
TABLE = [
    # one process: auto is ddp; the compile follows the GPUs and the run's length
    ([], {"world": 1, "cuda": True}, ("ddp", DDP, True, "model", False, 1000, "auto: one process")),
    ([], {"world": 1, "cuda": False}, ("ddp", DDP, False, "model", False, 25, "auto: one process")),
    (["--max-steps", "100"], {"world": 1, "cuda": True}, ("ddp", DDP, False, "model", False, 25, "auto: one")),
    # auto on one node's GPUs: in the graph for long runs of small models, else ddp
    (
        [*LM, "--max-steps", "40000"],
        {**NVLINK4, "params": SMALL},
        ("fsdp", GRAPH_FSDP, True, "model", True, 1000, "auto: sharded"),
    ),
    ([*LM, "--max-steps", "40000"], {**NVLINK4, "params": None}, ("auto", DDP, True, "model", True, 1000, None)),
    ([*LM, "--max-steps", "40000"], {**NVLINK4, "params": XL}, ("ddp", DDP, True, "model", True, 1000, "auto: 1,500M")),
    (
        [*LM, "--epochs", "1"],
        {**NVLINK4, "params": SMALL, "steps": 500},
        ("ddp", DDP, False, "model", True, 1000, "auto: 500 steps"),
    ),
    # a slow link: ddp, with small buckets that overlap the backward
    (
        [*LM, "--max-steps", "40000"],
        {"world": 8, "cuda": True, "slow_link": "processes on 2 nodes", "params": SMALL},
        ("ddp", DDP, True, "model", True, 25, "auto: processes on 2 nodes"),
    ),
    ([*LM, "--strategy", "ddp"], {**NVLINK4, "slow_link": "A10G GPUs"}, ("ddp", DDP, True, "model", True, 25, None)),
    ([*LM, "--strategy", "ddp", "--compile-unit", "block"], NVLINK4, ("ddp", DDP, True, "block", True, 25, None)),
    # DeepSpeed: ZeRO-1 eager, ZeRO-2 whole, ZeRO-3 by blocks (eager without a block class)
    (["--strategy", "zero1"], NVLINK4, ("zero1", DEEPSPEED, False, "model", False, 25, None)),
    ([*LM, "--strategy", "zero2"], NVLINK4, ("zero2", DEEPSPEED, True, "model", False, 1000, None)),
    ([*LM, "--strategy", "zero3"], NVLINK4, ("zero3", DEEPSPEED, True, "block", False, 1000, None)),
    (
        [*LM, "--strategy", "zero3"],
        {**NVLINK4, "has_blocks": False},
        ("zero3", DEEPSPEED, False, "block", False, 1000, None),
    ),
    # fsdp: FSDP2 by blocks, or in the graph for --max-steps 5,000+ compiled on GPUs
    ([*LM, "--strategy", "fsdp"], NVLINK4, ("fsdp", FSDP2, True, "block", False, 1000, None)),
    (
        [*LM, "--strategy", "fsdp", "--max-steps", "9000"],
        NVLINK4,
        ("fsdp", GRAPH_FSDP, True, "model", True, 1000, None),
    ),
    (
        [*LM, "--strategy", "fsdp", "--max-steps", "9000"],
        {"world": 4, "cuda": False},
        ("fsdp", FSDP2, False, "block", False, 25, None),
    ),
    # fp8 pins auto to ddp; fp16 keeps the model's own loss
    (
        [*LM, "--precision", "fp8"],
        {**NVLINK4, "params": SMALL, "steps": 40000},
        ("ddp", DDP, True, "model", True, 1000, "auto: --precision fp8"),
    ),
    (
        [*LM, "--precision", "fp16", "--strategy", "single"],
        {"world": 1, "cuda": True},
        ("single", SINGLE, True, "model", False, 1000, None),
    ),
    # a resumed run keeps its checkpoint's engine
    (
        LM,
        {**NVLINK4, "saved": {"strategy": "fsdp", "sharding": "in-graph"}},
        ("fsdp", GRAPH_FSDP, True, "model", True, 1000, "auto: sharded in the compiled graph, as the checkpoint"),
    ),
]


@pytest.mark.parametrize("flags, launch, expected", TABLE)
def test_decide(flags, launch, expected):
    d = decide(parse_args(flags), **launch)
    strategy, engine, compiled, unit, head_loss, buckets, why = expected
    got = (d.args.strategy, d.engine, d.compiled, d.compile_unit, d.head_loss_why_not is None, d.ddp_bucket_mb)
    assert got == (strategy, engine, compiled, unit, head_loss, buckets), d
    assert d.decided is (strategy != "auto")
    assert (d.strategy_why or "").startswith(why or "") and (why is None) is (d.strategy_why is None), d.strategy_why


def test_fp8_on_a_checkpoint_trained_sharded_is_refused():
    """auto follows the checkpoint it resumes, before fp8's pin: a sharded one cannot run fp8."""
    with pytest.raises(ArgumentError, match="--precision fp8 runs under --strategy ddp or single"):
        decide(parse_args([*LM, "--precision", "fp8"]), **NVLINK4, saved={"strategy": "fsdp", "sharding": "in-graph"})
