"""--strategy fsdp with PyTorch FSDP2 through Accelerate (shard units of consecutive transformer
blocks) on CPU processes over gloo: it trains like eager DDP, saves a loadable model, resumes exactly
after kill -9 (changing its units), and its sharded checkpoints refuse another world size in
one line. fsdp's other engine, sharding inside the compiled graph, is in test_graph_fsdp.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from distrain_cloud.training import checkpoint
from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.decisions import decide, plan_configs
from distrain_cloud.training.strategies import (
    ClusterShape,
    Strategy,
    accelerate_config,
    fsdp_blocks_per_unit,
    fsdp_plugin_settings,
)

# Checkpoints every 2 steps, a loss per step, evaluations at steps 5 and 8 (the end): the kill after
# step 5 leaves checkpoint 4, and the rerun trains 4 steps and both evaluations after it. (12 steps,
# as test_resume, proved no more: each step and save here is one more FSDP2 round on two processes.)
RESUME_FLAGS = [
    "--strategy",
    "fsdp",
    "--max-steps",
    "8",
    "--save-every",
    "2",
    "--log-every",
    "1",
    "--eval-every",
    "5",
    "--batch-size",
    "8",
    "--report-to",
    "none",
]


def lm_flags(no_dropout_config) -> list[str]:
    return [
        "--task",
        "causal-lm",
        "--model-config",
        str(no_dropout_config),
        "--block-size",
        "64",
        "--batch-size",
        "8",
        "--max-steps",
        "8",
        "--log-every",
        "2",
        "--lr",
        "2e-3",
        "--max-grad-norm",
        "1.0",
        "--report-to",
        "none",
        "--generate-tokens",
        "4",
        "--max-eval-samples",
        "32",
    ]


def compared_lm_flags(no_dropout_config) -> list[str]:
    """The job each fsdp engine runs to be compared with eager DDP's (conftest's sharded_lm_baseline):
    2 micro-batches a step, so the shards' gradients add up over both."""
    return [*lm_flags(no_dropout_config), "--grad-accum", "2"]


@pytest.mark.slow  # about 4 s: the first import of torch's FSDP and Accelerate's plugin
def test_fsdp_plugin_is_accelerates_fsdp2_around_our_block_units():
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**fsdp_plugin_settings())
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    # The trainer shards the blocks (shard_block_units); accelerate wraps no class of its own.
    assert plugin.auto_wrap_policy is None
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"


@pytest.mark.parametrize(
    ("requested", "n_blocks", "block_params", "expected"),
    [
        (None, 12, 7_087_872, 12),  # GPT-2 small: its 85M of blocks are one unit
        (None, 48, 30_740_800, 4),  # GPT-2 XL: 1.48B in 15 units of ~100M, so 12 units of 4 blocks
        (None, 32, 218_112_000, 1),  # a 7B Llama: a block is already a unit's worth
        (None, 1, 7_087_872, 1),
        (3, 12, 7_087_872, 3),
        (50, 12, 7_087_872, 12),  # more than there are: all of them
        (0, 12, 7_087_872, 0),  # none: the model is one unit
    ],
)
def test_blocks_per_unit_makes_units_of_about_100m_parameters(requested, n_blocks, block_params, expected):
    assert fsdp_blocks_per_unit(requested, n_blocks, block_params) == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--strategy", "ddp", "--fsdp-blocks-per-unit", "2"], "--fsdp-blocks-per-unit applies to --strategy fsdp"),
        (["--strategy", "fsdp", "--fsdp-blocks-per-unit", "-1"], "--fsdp-blocks-per-unit must be 0 or more, got -1"),
        (
            ["--strategy", "fsdp", "--fsdp-blocks-per-unit", "0", "--compile-unit", "block"],
            "makes the whole model one FSDP2 unit, compiled whole: drop --compile-unit block",
        ),
        (
            ["--strategy", "fsdp", "--fsdp-blocks-per-unit", "0", "--compile-unit", "model"],
            "--fsdp-blocks-per-unit applies to fsdp's FSDP2 units",
        ),
    ],
)
def test_blocks_per_unit_refuses_other_strategies_and_negatives(flags, message):
    with pytest.raises(ArgumentError, match=message):
        parse_args(flags)


@pytest.mark.parametrize("max_steps", ["100", "50000"])
def test_no_units_of_blocks_is_fsdp2_compiled_whole_however_long_the_run(max_steps):
    """--fsdp-blocks-per-unit 0: FSDP2 (not the in-graph engine, which long compiled runs get by
    default), with the whole model one compiled graph, and the plan says so."""
    flags = ["--strategy", "fsdp", "--fsdp-blocks-per-unit", "0", "--compile", "--max-steps", max_steps]
    decided = decide(parse_args(flags), world=2, cuda=True)
    assert (decided.in_graph, decided.compile_unit) == (False, "model")
    assert plan_configs(decided, 2)["fsdp_blocks_per_unit"] == "0 (none: the whole model one unit)"
    default = decide(parse_args(flags[:2] + flags[4:]), world=2, cuda=True)
    assert default.compile_unit == ("block" if max_steps == "100" else "model")


@pytest.mark.parametrize(
    ("params", "flags", "per_unit", "compile_unit"),
    [
        (124_439_808, [], 0, "model"),  # GPT-2 small: the whole model one unit, compiled whole
        (150_000_000, [], 0, "model"),
        (150_000_001, [], None, "block"),  # larger: units of about 100M parameters, a graph a block
        (None, [], None, "block"),  # the trainer's first decision, before the model is loaded
        (124_439_808, ["--fsdp-blocks-per-unit", "2"], 2, "block"),  # asked for
        (124_439_808, ["--compile-unit", "block"], None, "block"),  # FSDP2's graphs a block, asked for
    ],
)
def test_a_small_compiled_model_is_one_fsdp2_unit_by_default(params, flags, per_unit, compile_unit):
    args = parse_args(["--strategy", "fsdp", "--compile", "--max-steps", "100", *flags])
    decided = decide(args, world=2, cuda=True, params=params)
    layout = (decided.in_graph, decided.args.fsdp_blocks_per_unit, decided.compile_unit)
    assert layout == (False, per_unit, compile_unit)
    assert (decided.fsdp_units_why is not None) == (params is not None and not flags)
    shown = plan_configs(decided, 2)["fsdp_blocks_per_unit"]
    if per_unit == 0:
        assert shown.startswith("0 (auto: the whole model one unit, compiled whole, for a compiled model of at most")
    elif params is None:
        assert "compiled, a model of at most 150M is one unit, the job decides once it knows the model's size" in shown
    elif not flags:
        assert shown == "auto: units of about 100M parameters, for a model above 150M parameters (this one: 150M)"


@pytest.mark.parametrize("flags", [["--no-compile"], ["--compile", "--max-steps", "50000"]])
def test_eager_fsdp2_and_the_in_graph_engine_keep_their_layouts(flags):
    """Eager, the one unit buys no graph, and long compiled runs on GPUs shard inside the graph."""
    decided = decide(parse_args(["--strategy", "fsdp", *flags]), world=2, cuda=True, params=124_439_808)
    assert decided.args.fsdp_blocks_per_unit is None and decided.fsdp_units_why is None
    assert decided.in_graph == ("50000" in flags)


def test_fsdp_launches_under_torchrun_even_with_one_process():
    # Like DeepSpeed: FSDP needs a process group, which accelerate's plain one-process launch lacks.
    one = accelerate_config(Strategy.fsdp, ClusterShape(use_cpu=True), precision="no")
    assert one["distributed_type"] == "MULTI_GPU" and one["use_cpu"] is True
    assert accelerate_config(Strategy.ddp, ClusterShape(), precision="no")["distributed_type"] == "NO"


def test_plans_show_the_plugin_the_training_process_builds(cli, tmp_path):
    args = parse_args(["--strategy", "fsdp"])
    auto = "auto (units of about 100M parameters)"  # eager, as on CPU
    on_gpus = (  # compiled, the model's size not known to a plan: the job decides
        "auto (units of about 100M parameters; compiled, a model of at most 150M is one unit, the job decides "
        "once it knows the model's size)"
    )
    expected = {"fsdp_plugin": fsdp_plugin_settings(), "fsdp_blocks_per_unit": on_gpus}
    assert plan_configs(decide(args, world=2, cuda=True), 2) == expected
    two = parse_args(["--strategy", "fsdp", "--fsdp-blocks-per-unit", "2"])
    assert plan_configs(decide(two, world=2, cuda=True), 2)["fsdp_blocks_per_unit"] == 2
    assert plan_configs(decide(replace(args, strategy="ddp"), world=2, cuda=True), 2) == {}
    r = cli(
        "submit", "--instance", "local", "--processes", "2", "--strategy", "fsdp", "--dry-run", "--json", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    configs = json.loads(r.stdout)["configs"]
    assert configs["fsdp_plugin"] == fsdp_plugin_settings()
    assert configs["fsdp_blocks_per_unit"] == auto
    assert configs["accelerate_config"]["distributed_type"] == "MULTI_GPU"
    # compiled, a preset whose size the plan knows: the layout the job will take, and why
    r = cli(
        *("submit", "--instance", "local", "--processes", "2", "--strategy", "fsdp", "--dry-run", "--json", "--"),
        *("--task", "causal-lm", "--preset", "gpt2-small", "--compile", "--max-steps", "100"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["configs"]["fsdp_blocks_per_unit"] == (
        "0 (auto: the whole model one unit, compiled whole, for a compiled model of at most 150M parameters "
        "(this one: 124M))"
    )


def test_the_cli_shows_the_units_asked_for_and_refuses_them_for_another_strategy(cli, tmp_path):
    base = ("submit", "--instance", "local", "--processes", "2", "--dry-run", "--json")
    r = cli(*base, "--strategy", "fsdp", "--", "--fsdp-blocks-per-unit", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["configs"]["fsdp_blocks_per_unit"] == 3
    none = cli(*base, "--strategy", "fsdp", "--", "--fsdp-blocks-per-unit", "0", cwd=tmp_path)
    assert none.returncode == 0, none.stderr
    assert json.loads(none.stdout)["configs"]["fsdp_blocks_per_unit"] == "0 (none: the whole model one unit)"
    negative = cli(*base, "--strategy", "fsdp", "--", "--fsdp-blocks-per-unit", "-1", cwd=tmp_path)
    assert negative.returncode == 2 and "--fsdp-blocks-per-unit must be 0 or more, got -1" in negative.stderr
    wrong = cli(*base, "--strategy", "ddp", "--", "--fsdp-blocks-per-unit", "3", cwd=tmp_path)
    assert wrong.returncode == 2 and json.loads(wrong.stdout)["result"]["status"] == "NotSubmitted"
    assert "--fsdp-blocks-per-unit applies to --strategy fsdp, not ddp" in wrong.stderr


def test_fsdp_checkpoints_refuse_another_world_size_and_other_layouts(tmp_path):
    path = tmp_path / "checkpoint-00000004"
    saved = {"strategy": "fsdp", "world_size": 2}
    checkpoint.check_resumable(path, saved, 2, "fsdp")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.check_resumable(path, saved, 1, "fsdp")
    assert str(e.value) == (
        f"checkpoint-00000004 in {tmp_path} was saved by 2 processes with --strategy fsdp, which splits its state "
        "across processes, but this run has 1: run it with 2 processes to resume, or move the checkpoints away "
        "to start over"
    )
    for other in ("ddp", "zero3"):
        with pytest.raises(checkpoint.CheckpointError, match="stores its state differently"):
            checkpoint.check_resumable(path, saved, 2, other)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp_trains_like_eager_ddp_and_saves_a_loadable_model(
    train, sharded_lm_baseline, no_dropout_config, aot_eager
):
    """The same causal-LM job (gradient clipping, 2 micro-batches a step, a generated sample at the
    end) under eager DDP (the baseline test_graph_fsdp.py's engine is compared with too) and under
    compiled FSDP (each block compiled, as the default does on GPUs) on 2 processes: the same losses
    and evaluation within rounding, and a full model saved from the shards. (The resume test below
    runs FSDP eagerly.) A model this small is one unit of its own by default (the next test): its
    two blocks are made one unit here, as models above 150M parameters get units of blocks."""
    ddp = sharded_lm_baseline
    flags = [*compared_lm_flags(no_dropout_config), "--strategy", "fsdp", "--fsdp-blocks-per-unit", "2", "--compile"]
    fsdp = train(*flags, name="lm-fsdp", processes=2, env=aot_eager)
    units = ["fsdp_shard_unit=GPT2Block blocks=2 blocks_per_unit=2 units=1"]
    assert fsdp.lines("fsdp_shard_unit=") == units, fsdp.describe()
    assert fsdp.lines("compile_unit=") == ["compile_unit=block blocks=2 loss=compiled"], fsdp.describe()
    assert_trains_like(ddp, fsdp, rel=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp_with_the_model_one_unit_compiles_it_whole_and_trains_like_eager_ddp(
    train, sharded_lm_baseline, no_dropout_config, aot_eager
):
    """FSDP2 compiled on 2 processes, the model small (as --fsdp-blocks-per-unit 0 asks of any):
    no unit of blocks, the model's forward compiled as one graph beneath the root unit's hooks,
    with eager DDP's losses, evaluation, sample and saved weights, and no recompiling as the weights
    move between their shards and the gathered copy. The default, so run as a user runs it: no flag."""
    flags = [*compared_lm_flags(no_dropout_config), "--strategy", "fsdp", "--compile"]
    fsdp = train(*flags, name="lm-fsdp-one-unit", processes=2, env=aot_eager)
    assert fsdp.lines("fsdp_shard_unit=") == ["fsdp_shard_unit=model blocks=2 blocks_per_unit=0 units=1"]
    (why,) = fsdp.lines("fsdp: FSDP2 (auto: the whole model one unit")
    assert "for a compiled model of at most 150M parameters (this one: " in why, why
    assert fsdp.lines("compile_unit=") == ["compile_unit=model (inside FSDP2's one unit)"], fsdp.describe()
    assert fsdp.lines("compiled_graphs=") == ["compiled_graphs=1"], fsdp.describe()
    assert "recompile" not in (fsdp.stdout + fsdp.stderr).lower(), fsdp.describe()
    assert_trains_like(sharded_lm_baseline, fsdp, rel=1e-3, atol=1e-4)


def assert_trains_like(ddp, sharded, rel: float, atol: float):
    """Both jobs ran; the sharded one's losses, evaluation and sample are DDP's, and so (within
    `rel`/`atol`) are the weights it saved from its shards. Returns the saved model."""
    assert ddp.returncode == 0, ddp.describe()
    assert sharded.returncode == 0, sharded.describe()
    assert "torch.compile failed" not in sharded.stdout + sharded.stderr, sharded.describe()
    losses = sharded.train_losses
    assert ddp.train_losses.keys() == losses.keys() == {2, 4, 6, 8}
    for step, loss in ddp.train_losses.items():
        assert losses[step] == pytest.approx(loss, rel=rel), (step, ddp.train_losses, losses)
    assert sharded.final_eval["eval_loss"] == pytest.approx(ddp.final_eval["eval_loss"], rel=rel)
    assert math.isfinite(sharded.final_eval["eval_perplexity"])
    # Generation runs on both processes (each forward gathers shards); only the main one prints.
    (sample,) = sharded.lines("sample=")
    assert json.loads(sample[len("sample=") :]) == json.loads(ddp.lines("sample=")[0][len("sample=") :])

    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(sharded.contract.model_dir)
    reference = AutoModelForCausalLM.from_pretrained(ddp.contract.model_dir)
    for (name, p), (_, q) in zip(saved.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.allclose(p, q, rtol=rel, atol=atol), name
    return saved


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp_killed_and_resumed_matches_the_uninterrupted_one(train):
    """kill -9 after step 5; the rerun resumes from the sharded checkpoint of step 4 (one
    torch.distributed.checkpoint file per process for the model and for the optimizer) and
    ends bit for bit where the uninterrupted run does. Each run shards its own way: the
    uninterrupted one one block per unit, the killed one the default (both blocks in one unit),
    and the rerun the whole model one unit (--fsdp-blocks-per-unit 0): checkpoints are keyed by
    parameter name and FSDP2 shards each parameter alike whatever its unit, so a lineage may
    change its units. (A second rerun, into units of blocks, proved no more: Accelerate loads the
    sharded state the same way whatever the units, and the killed run's steps 1-5 already match
    the per-block run's bit for bit.) Resuming with one process is refused: the trainer's
    check_resumable (test_checkpoint.py's 2-process zero2 checkpoint resumed on 1, through the
    entry point) on fsdp's checkpoints (test_fsdp_checkpoints_refuse_another_world_size_and_other_layouts)."""
    per_block = [*RESUME_FLAGS, "--fsdp-blocks-per-unit", "1"]
    whole = train(*per_block, name="fsdp-whole", processes=2)
    assert whole.returncode == 0, whole.describe()
    assert whole.lines("fsdp_shard_unit=") == ["fsdp_shard_unit=GPT2Block blocks=2 blocks_per_unit=1 units=2"]
    killed = train(*RESUME_FLAGS, name="fsdp-killed", processes=2, env={"DISTRAIN_TEST_KILL_AT_STEP": "5"})
    assert killed.returncode != 0 and max(killed.train_losses) == 5, killed.describe()
    assert killed.lines("fsdp_shard_unit=") == ["fsdp_shard_unit=GPT2Block blocks=2 blocks_per_unit=2 units=1"]
    assert killed.train_losses == {s: whole.train_losses[s] for s in range(1, 6)}  # exact, other units
    (ckpt,) = [p for p in killed.contract.complete_checkpoints() if p.name == "checkpoint-00000004"]
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (ckpt / part).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"], part

    one = train(*RESUME_FLAGS, "--fsdp-blocks-per-unit", "0", name="fsdp-killed", processes=2)
    assert one.returncode == 0, one.describe()
    assert one.lines("fsdp_shard_unit=") == ["fsdp_shard_unit=model blocks=2 blocks_per_unit=0 units=1"]
    assert_resumed_exactly(one, whole)


def assert_resumed_exactly(again, whole):
    """`again` resumed from step 4 (of RESUME_FLAGS' 8) and ended bit for bit where `whole`,
    never interrupted, did: its losses, evaluations and saved weights."""
    assert again.lines("resumed_from=") == ["resumed_from=checkpoint-00000004 step=4"], again.describe()
    assert again.train_losses == whole.train_losses  # exact, not approximate
    assert sorted(again.train_losses) == list(range(1, 9))
    evals = lambda run: {e["step"]: e["eval_loss"] for e in run.evals}  # noqa: E731
    assert evals(again) == evals(whole)
    weights = "model.safetensors"
    assert (again.contract.model_dir / weights).read_bytes() == (whole.contract.model_dir / weights).read_bytes()
