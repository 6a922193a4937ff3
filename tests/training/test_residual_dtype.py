"""--residual-dtype bf16: the hidden states between the transformer blocks in bf16 under autocast
over fp32 weights (ddp, single), as the sharded engines' 16-bit weights already make them; auto
(the default) picks it for Llama-style causal LMs."""

from __future__ import annotations

import re

import pytest
import torch
from tinylm import LLAMA as NARROW_LLAMA

from distrain_cloud.training.args import ArgumentError, parse_args, residual_stream_bf16
from distrain_cloud.training.engines.base import residual_in_bf16

LM = ["--task", "causal-lm", "--preset", "tiny-gpt2"]
LLAMA = [*NARROW_LLAMA, "--block-size", "64"]


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "applies to --precision bf16 or fp8 (bf16 autocast), not the default precision: add --precision bf16"),
        (["--precision", "fp16"], "applies to --precision bf16 or fp8 (bf16 autocast), not fp16"),
        (["--precision", "no"], "applies to --precision bf16 or fp8 (bf16 autocast), not no"),
        (
            ["--precision", "bf16", "--strategy", "zero2"],
            "applies to --strategy ddp or single: zero2 already runs the residual stream in bf16",
        ),
        (
            ["--precision", "bf16", "--strategy", "fsdp"],
            "applies to --strategy ddp or single: fsdp already runs the residual stream in bf16",
        ),
    ],
)
def test_the_flag_is_refused_where_it_changes_nothing_or_cannot_apply(flags, message):
    with pytest.raises(ArgumentError, match=f"^--residual-dtype bf16 {re.escape(message)}"):
        parse_args([*LM, "--residual-dtype", "bf16", *flags])


@pytest.mark.parametrize("flags", [["--precision", "bf16"], ["--precision", "fp8", "--strategy", "ddp"]])
def test_the_flag_is_taken_with_bf16_autocast(flags):
    assert parse_args([*LM, "--residual-dtype", "bf16", *flags]).residual_dtype == "bf16"
    assert parse_args([*LM, *flags]).residual_dtype == "auto"


@pytest.mark.parametrize(
    "flags, strategy, model_type, cast",
    [
        # auto: Llama-style causal LMs under bf16 autocast (bf16, or fp8's) over fp32 weights
        (["--precision", "bf16"], "ddp", "llama", True),
        (["--precision", "fp8"], "single", "qwen2", True),
        (["--precision", "bf16"], "ddp", "gpt2", False),  # its loss with the cast not measured
        (["--precision", "bf16", "--task", "classification"], "ddp", "llama", False),
        (["--precision", "fp16"], "ddp", "llama", False),
        (["--precision", "no"], "ddp", "llama", False),
        (["--precision", "bf16"], "zero3", "llama", False),  # 16-bit weights: bf16 with no cast
        (["--precision", "bf16"], "fsdp", "llama", False),
        (["--precision", "bf16", "--residual-dtype", "fp32"], "ddp", "llama", False),
        # asked for: any model with block classes
        (["--precision", "bf16", "--residual-dtype", "bf16"], "ddp", "gpt2", True),
    ],
)
def test_which_runs_cast_the_stream(flags, strategy, model_type, cast):
    args = parse_args([*LM, *flags])
    assert residual_stream_bf16(args, strategy, model_type) is cast


def _stream_dtypes(model) -> list[torch.dtype]:
    """The dtypes of the hidden states entering each block and the final norm, in a bf16-autocast
    forward and backward of `model`."""
    from distrain_cloud.training.engines.base import transformer_blocks

    seen: list[torch.dtype] = []

    def record(_module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).dtype)

    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in transformer_blocks(model)]
    hooks.append(model.model.norm.register_forward_pre_hook(record, with_kwargs=True))
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.slow  # two narrow llamas
def test_the_stream_between_blocks_is_bf16_with_the_flag_and_fp32_without(narrow_llama):
    torch.manual_seed(0)
    plain = narrow_llama(layers=3)
    assert _stream_dtypes(plain)[1:] == [torch.float32] * 3  # blocks 2, 3 and the final norm

    torch.manual_seed(0)
    cast = narrow_llama(layers=3)
    assert residual_in_bf16(cast) == (
        "residual_dtype=bf16 (--residual-dtype: each of the 3 blocks' inputs cast to bf16)"
    )
    assert _stream_dtypes(cast) == [torch.bfloat16] * 4
    # the weights stay fp32 (autocast's masters), and their gradients too
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in cast.parameters())


@pytest.mark.slow  # a narrow llama trained twice
def test_training_with_a_bf16_stream_follows_the_fp32_one(narrow_llama, few_steps):
    torch.manual_seed(0)
    plain = narrow_llama(layers=2)
    torch.manual_seed(0)
    cast = narrow_llama(layers=2)
    residual_in_bf16(cast)
    torch.manual_seed(1)
    expected = few_steps(plain, 8, autocast=True)
    torch.manual_seed(1)
    got = few_steps(cast, 8, autocast=True)
    assert got[-1] < got[0] - 0.5  # it trains
    assert got == pytest.approx(expected, rel=0.03)


def test_a_model_without_block_classes_is_refused():
    with pytest.raises(ArgumentError, match="^--residual-dtype bf16: Sequential names no transformer block class"):
        residual_in_bf16(torch.nn.Sequential(torch.nn.Linear(4, 4)))


@pytest.mark.slow  # an entry-point run
def test_the_trainer_says_it_and_trains(train):
    run = train(*LM, "--precision", "bf16", "--residual-dtype", "bf16", "--max-steps", "3", "--report-to", "none")
    assert run.returncode == 0, run.describe()
    assert run.lines("residual_dtype=") == [
        "residual_dtype=bf16 (--residual-dtype: each of the 2 blocks' inputs cast to bf16)"
    ]
    assert len(run.train_losses) >= 1


@pytest.mark.slow  # two entry-point runs
def test_a_llama_casts_the_stream_by_default_and_not_when_told(train):
    auto = train(*LLAMA, "--precision", "bf16", "--max-steps", "2", "--report-to", "none")
    assert auto.returncode == 0, auto.describe()
    assert auto.lines("residual_dtype=") == [
        "residual_dtype=bf16 (--residual-dtype auto: a Llama-style causal LM under bf16 autocast: "
        "each of the 2 blocks' inputs cast to bf16)"
    ]
    kept = train(*LLAMA, "--precision", "bf16", "--residual-dtype", "fp32", "--max-steps", "2", "--report-to", "none")
    assert kept.returncode == 0, kept.describe()
    assert kept.lines("residual_dtype=") == []
    assert len(auto.train_losses) == len(kept.train_losses) >= 1


@pytest.mark.parametrize(
    "flags, line",
    [
        (
            ["--strategy", "zero3", "--", "--residual-dtype", "bf16"],
            "--residual-dtype bf16 applies to --strategy ddp or single: zero3 already runs the residual stream "
            "in bf16 (its weights are 16-bit); drop --residual-dtype",
        ),
        (
            ["--residual-dtype", "bf"],
            "argument --residual-dtype: invalid choice: 'bf' (choose from 'auto', 'fp32', 'bf16')",
        ),
    ],
)
def test_submit_refuses_a_misplaced_flag_in_one_line_before_anything_is_sent(flags, line, capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    cut = flags.index("--") if "--" in flags else -1  # the launcher's flags, then the training's
    launcher, training = flags[: max(cut, 0)], flags[cut + 1 :]
    argv = ["submit", "--instance", "p5.48xlarge", "--precision", "bf16", "--dry-run", *launcher, "--"]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--task", "causal-lm", "--preset", "llama-1b", *training])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == f"error: training arguments: {line}"


def test_submit_plans_a_job_with_the_flag(capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["submit", "--instance", "p5.48xlarge", "--precision", "bf16", "--dry-run", "--",
                  "--task", "causal-lm", "--preset", "llama-1b", "--residual-dtype", "bf16"])  # fmt: skip
    assert exit_.value.code == 0 and '"--residual-dtype",\n      "bf16"' in capsys.readouterr().out
