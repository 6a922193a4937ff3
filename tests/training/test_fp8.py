"""--precision fp8 is refused in one line where it cannot run (no GPU, GPUs without float8
matrix units, a sharded strategy, no torchao), through the entry point a user runs; where
torchao is installed, its conversion of a narrow llama-1b trains on the CPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from distrain_cloud.training import fp8
from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.precision import resolve_precision

A100, L4, H100 = (8, 0), (8, 9), (9, 0)


@pytest.fixture
def gpus(monkeypatch):
    """gpus(cap, ...): CUDA devices of those compute capabilities (torch's query replaced)."""
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)

    def fake(*caps: tuple[int, int]) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(caps))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])

    return fake


@pytest.mark.parametrize(
    "caps, message",
    [
        ((A100,), "--precision fp8 needs compute capability >= 8.9 (H100, H200, L4, L40S); these GPUs are 8.0: "
         "use --precision bf16"),
        ((H100, A100), "these GPUs are 8.0: use --precision bf16"),  # the lowest decides
        ((), "--precision fp8 needs a CUDA GPU with float8 matrix units (H100, L4); this machine has none: "
         "use --precision no"),
    ],
)  # fmt: skip
def test_fp8_is_refused_in_one_line_where_it_cannot_run(gpus, caps, message):
    gpus(*caps)
    args = parse_args(["--precision", "fp8", "--strategy", "ddp"])
    with pytest.raises(ValueError) as e:
        resolve_precision(args)
    assert message in str(e.value) and str(e.value).startswith("--precision fp8 ") and "\n" not in str(e.value)


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_fp8_is_refused_under_strategies_that_hold_weights_their_own_way(strategy):
    """Checked with the other flags, so the launcher refuses it while planning too."""
    with pytest.raises(ArgumentError, match=rf"^--precision fp8 runs under --strategy ddp or single, not {strategy}: "):
        parse_args(["--precision", "fp8", "--strategy", strategy])


@pytest.mark.parametrize("world", [1, 4])
def test_fp8_under_the_default_strategy_runs_as_ddp_however_long_the_run(world):
    """auto with fp8 is ddp (fp8 pins it, like the flags only ddp reads), even where a long compiled
    run on NVLinked GPUs would otherwise pick fsdp: the same rule the job and its plan decide by."""
    from distrain_cloud.training.decisions import decide

    args = parse_args(["--precision", "fp8", "--task", "causal-lm", "--max-steps", "40000"])
    decided = decide(args, world=world, cuda=True, params=10**8)
    assert (decided.args.strategy, decided.strategy_why) == ("ddp", "auto: --precision fp8 applies to ddp")


def test_fp8_resuming_a_checkpoint_sharded_in_the_graph_is_refused_in_one_line():
    from distrain_cloud.training.decisions import decide

    args = parse_args(["--precision", "fp8", "--task", "causal-lm"])
    saved = {"strategy": "fsdp", "sharding": "in-graph", "step": 10}
    with pytest.raises(ArgumentError, match=r"^--precision fp8 runs under --strategy ddp or single; this run resumes "):
        decide(args, world=4, cuda=True, saved=saved)
    assert decide(args, world=4, cuda=True, saved={"strategy": "ddp"}).args.strategy == "ddp"


def test_the_launchers_rule_refuses_fp8_below_compute_capability_8_9():
    from distrain_cloud.training.strategies import choose_precision

    assert choose_precision("fp8", 8, H100, "ml.p5.48xlarge") == "fp8"
    with pytest.raises(ValueError, match=r"^--precision fp8 needs compute capability >= 8.9 \(H100, L4\); a100: "):
        choose_precision("fp8", 8, A100, "a100")
    with pytest.raises(ValueError, match=r"^--precision fp8 needs a GPU"):
        choose_precision("fp8", 0, None, "this machine")


@pytest.mark.parametrize("flags", [["--fp8-linear", "torchao"], ["--fp8-recipe", "rowwise"]])
def test_torchaos_layers_need_torchao_and_say_which(gpus, monkeypatch, flags):
    """torchao's layers, asked for or by one of its rowwise recipes, need torchao; the default
    (auto: the native layers, tensorwise) does not."""
    gpus(H100)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ValueError, match=r"^--precision fp8 needs torchao, which is not installed: pip install "):
        resolve_precision(parse_args(["--precision", "fp8", "--strategy", "ddp", *flags]))
    assert resolve_precision(parse_args(["--precision", "fp8", "--strategy", "ddp"])).startswith("precision=fp8 ")


@pytest.mark.parametrize("caps", [(L4,), (H100, H100)])
def test_fp8_is_accepted_on_float8_gpus(gpus, caps):
    gpus(*caps)
    args = parse_args(["--precision", "fp8", "--strategy", "ddp"])
    assert resolve_precision(args).startswith("precision=fp8 (--precision")
    assert args.precision == "fp8"


@pytest.mark.slow  # an entry-point start
def test_the_entry_point_refuses_fp8_on_cpu_in_one_line(train):
    run = train("--task", "causal-lm", "--preset", "llama-1b", "--precision", "fp8", "--strategy", "ddp")
    assert run.returncode == 2, run.describe()
    assert run.stderr.strip().splitlines() == [
        "error: --precision fp8 needs a CUDA GPU with float8 matrix units (H100, L4); this machine has none: "
        "use --precision no"
    ]
    assert not run.contract.model_dir.exists() or not any(run.contract.model_dir.iterdir())


@pytest.mark.slow  # loading GPT-2
def test_gpt2_has_nothing_to_convert_and_says_so():
    from distrain_cloud.training import modeling

    args = parse_args(["--task", "causal-lm", "--preset", "tiny-gpt2"])
    with pytest.raises(ArgumentError, match=r"GPT2LMHeadModel has no nn.Linear layer to run in float8 \(GPT-2's"):
        fp8.use_fp8(modeling.load_model(args, modeling.load_tokenizer(args)))


@pytest.mark.slow  # importing torchao and transformers' Llama
def test_fp8_converts_every_block_linear_but_the_head_and_still_trains(narrow_llama, few_steps):
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = narrow_llama()
    line = fp8.use_fp8(model, linear="torchao")
    assert line.startswith(
        "fp8=on linear_layers=14 fast_accum=none head=bf16 (torchao float8"
    )  # 2 layers x q, k, v, o, gate, up, down
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 14
    assert not isinstance(model.get_output_embeddings(), Float8Linear)  # the LM head stays in bf16
    losses = few_steps(model, 3)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


@pytest.mark.slow  # an entry-point run with torchao
@pytest.mark.parametrize(
    "flags, fp8_line",
    [
        (
            ["--fp8-linear", "torchao"],
            "fp8=on linear_layers=14 fast_accum=none head=bf16 (torchao float8, tensorwise scaling; the LM head "
            "(auto: torchao's float8 layers: the recipe was measured on the native ones) stays bf16)",
        ),
        (
            ["--fp8-linear", "torchao", "--fp8-head", "--fp8-head-backward", "fp8", "--fp8-fast-accum", "grad-input"],
            "fp8=on linear_layers=14 fast_accum=grad-input head=fp8 (torchao float8, tensorwise scaling, fast "
            "accumulation in the input gradients too; the LM head in float8 inside the fast loss)",
        ),
    ],
    ids=["torchao", "torchao-head"],
)
def test_the_trainer_converts_the_model_and_trains_in_fp8(train, flags, fp8_line):
    """The trainer's fp8 path on CPU processes told they are on an H100 (fp8_shim): the model's
    block linears become Float8Linear before prepare, under bf16 autocast, and the loss is finite;
    with --fp8-head the LM head multiplies in float8 inside the fast loss too."""
    import os
    from pathlib import Path

    pytest.importorskip("torchao")
    shim = str(Path(__file__).parent / "fp8_shim")
    narrow = (
        "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
        "num_key_value_heads=2,vocab_size=1024"
    )
    run = train(
        "--task", "causal-lm", "--preset", "llama-1b", "--config-overrides", narrow, "--precision", "fp8",
        "--strategy", "ddp", "--dataset", "builtin:corpus", "--block-size", "32", "--batch-size", "4",
        "--max-steps", "4", "--log-every", "2", "--report-to", "none", "--no-save-model",
        "--max-eval-samples", "8", "--generate-tokens", "2", *flags,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    assert run.returncode == 0, run.describe()
    assert run.lines("precision=") == [
        "precision=fp8 (--precision: bf16 autocast, the linear layers' matmuls in float8)"
    ]
    assert run.lines("fp8=") == [fp8_line], run.describe()
    assert len(run.train_losses) == 2 and all(0 < v < 20 for v in run.train_losses.values()), run.train_losses


def test_fp8_keeps_the_edge_blocks_in_bf16_where_asked(narrow_llama):
    # torch-only: which linears would convert (no torchao needed to choose them)
    model = narrow_llama(layers=4)
    every = fp8.fp8_layer_names(model)
    assert len(every) == 28 and not any("lm_head" in n for n in every)  # 4 layers x 7 linears
    middle = fp8.fp8_layer_names(model, bf16_edge_blocks=1)
    assert sorted({n.split(".")[2] for n in middle}) == ["1", "2"] and len(middle) == 14
    assert fp8.fp8_layer_names(model, bf16_edge_blocks=2) == set()  # every block kept: nothing to convert


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--fp8-recipe", "rowwise"], "--fp8-recipe applies to --precision fp8, not bf16"),
        (["--fp8-bf16-edge-blocks", "1"], "--fp8-bf16-edge-blocks applies to --precision fp8, not the default"),
        (["--precision", "fp8", "--strategy", "ddp", "--fp8-bf16-edge-blocks", "-1"], "must be 0 or more, got -1"),
        (["--fp8-fast-accum", "--precision", "bf16"], "--fp8-fast-accum applies to --precision fp8, not bf16"),
        (["--fp8-head", "--precision", "bf16"], "--fp8-head applies to --precision fp8, not bf16"),
        (["--fp8-head-grad-input", "bf16", "--precision", "bf16"], "--fp8-head-grad-input applies to --precision fp8"),
        (
            ["--precision", "fp8", "--strategy", "ddp", "--no-fp8-head", "--fp8-head-grad-input", "bf16"],
            "--fp8-head-grad-input applies to the LM head in float8, which --no-fp8-head turns off: "
            "drop --fp8-head-grad-input",
        ),
        (["--fp8-head-forward", "bf16", "--precision", "bf16"], "--fp8-head-forward applies to --precision fp8"),
        (
            ["--precision", "fp8", "--strategy", "ddp", "--no-fp8-head", "--fp8-head-forward", "bf16"],
            "--fp8-head-forward applies to the LM head in float8, which --no-fp8-head turns off: "
            "drop --fp8-head-forward",
        ),
        (["--fp8-head-backward", "bf16", "--precision", "bf16"], "--fp8-head-backward applies to --precision fp8"),
        (
            ["--precision", "fp8", "--strategy", "ddp", "--no-fp8-head", "--fp8-head-backward", "bf16"],
            "--fp8-head-backward applies to the LM head in float8, which --no-fp8-head turns off: "
            "drop --fp8-head-backward",
        ),
        (
            ["--precision", "fp8", "--fp8-head", "--fp8-head-backward", "bf16", "--fp8-head-forward", "bf16"],
            "leaves none of the LM head's matmuls in float8: drop --fp8-head and both",
        ),
        (
            ["--precision", "fp8", "--fp8-head", "--fp8-head-backward", "bf16", "--fp8-head-grad-input", "bf16"],
            "already makes the head's input gradient bf16: drop --fp8-head-grad-input",
        ),
    ],
)
def test_fp8_flags_without_fp8_are_refused(flags, message):
    extra = [] if "fp8" in flags else (["--precision", "bf16"] if "--fp8-recipe" in flags else [])
    with pytest.raises(ArgumentError, match=message):
        parse_args([*flags, *extra])


def test_fp8_recipes_name_torchaos():
    from distrain_cloud.training.args import FP8_RECIPES

    assert set(fp8.TORCHAO_RECIPES) == set(FP8_RECIPES)
    args = parse_args(["--precision", "fp8", "--strategy", "ddp", "--fp8-recipe", "rowwise-gw-hp"])
    assert (args.fp8_recipe, args.fp8_bf16_edge_blocks) == ("rowwise-gw-hp", 0)


@pytest.mark.slow  # importing torchao and transformers' Llama
def test_fp8_converts_with_the_recipe_and_edge_blocks_asked_for(narrow_llama):
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = narrow_llama(layers=4)
    line = fp8.use_fp8(model, "rowwise", bf16_edge_blocks=1, linear="torchao")
    assert line == (
        "fp8=on linear_layers=14 fast_accum=none head=bf16 (torchao float8, rowwise scaling; the LM head and the "
        "first and last 1 blocks stay bf16)"
    )
    converted = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 14  # the middle two blocks' seven linears each
    assert all(m.config.cast_config_input.scaling_granularity.value == "axiswise" for m in converted)  # rowwise


def test_fp8_fast_accum_is_auto_by_default_and_parsed():
    fp8_ddp = ["--precision", "fp8", "--strategy", "ddp"]
    assert parse_args(fp8_ddp).fp8_fast_accum == "auto"  # fp8_auto_recipe: tests/training/test_fp8_auto.py
    assert parse_args([*fp8_ddp, "--fp8-fast-accum"]).fp8_fast_accum == "all"  # the flag alone: as before
    assert parse_args(["--fp8-fast-accum", "grad-input", *fp8_ddp]).fp8_fast_accum == "grad-input"
    with pytest.raises(ArgumentError, match="--fp8-fast-accum: invalid choice: 'grad-weight'"):
        parse_args([*fp8_ddp, "--fp8-fast-accum", "grad-weight"])


@pytest.mark.slow  # importing torchao and transformers' Llama
def test_fp8_fast_accum_reaches_the_backward_matmuls_and_still_trains(narrow_llama):
    """--fp8-fast-accum: every converted layer's two backward matmuls accumulate fast, as the
    forward's do in torchao's own recipe; the scaling stays the recipe's, and the model trains."""
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    default = fp8.fp8_config("tensorwise")
    assert default.gemm_config_output.use_fast_accum  # torchao's forward: fast already
    assert not default.gemm_config_grad_input.use_fast_accum and not default.gemm_config_grad_weight.use_fast_accum
    rowwise = fp8.fp8_config("rowwise", fast_accum="all")
    assert rowwise.gemm_config_grad_input.use_fast_accum and rowwise.gemm_config_grad_weight.use_fast_accum
    half = fp8.fp8_config("tensorwise", fast_accum="grad-input")  # the short sums only
    assert half.gemm_config_grad_input.use_fast_accum and not half.gemm_config_grad_weight.use_fast_accum
    assert rowwise.round_scales_to_power_of_2  # the rest of the recipe is kept
    assert rowwise.cast_config_grad_output.scaling_granularity.value == "axiswise"

    torch.manual_seed(0)
    model = narrow_llama()
    line = fp8.use_fp8(model, fast_accum="all", linear="torchao")
    assert line == (
        "fp8=on linear_layers=14 fast_accum=all head=bf16 (torchao float8, tensorwise scaling, fast accumulation in "
        "the backward too; the LM head stays bf16)"
    )
    converted = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 14
    assert all(m.config.gemm_config_grad_weight.use_fast_accum for m in converted)
    assert all(m.linear_mm_config.grad_weight.use_fast_accum for m in converted)  # what the matmul reads
    ids = torch.randint(0, 256, (2, 32))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "training, line",
    [
        (
            ["--no-fp8-head", "--fp8-head-grad-input", "bf16"],
            "--fp8-head-grad-input applies to the LM head in float8, which --no-fp8-head turns off: "
            "drop --fp8-head-grad-input",
        ),
        (
            ["--fp8-head", "--fp8-head-grad-input", "bf8"],
            "argument --fp8-head-grad-input: invalid choice: 'bf8' (choose from 'fp8', 'bf16')",
        ),
        (
            ["--fp8-head", "--fp8-head-backward", "bf16", "--fp8-head-forward", "bf16"],
            "--fp8-head-forward bf16 with --fp8-head-backward bf16 leaves none of the LM head's matmuls in float8: "
            "drop --fp8-head and both",
        ),
        (
            ["--fp8-head", "--fp8-head-bacward", "bf16"],
            "unrecognized arguments: --fp8-head-bacward bf16 (did you mean --fp8-head-backward?)",
        ),
    ],
)
def test_submit_refuses_a_misplaced_head_grad_input_in_one_line_before_anything_is_sent(
    training, line, capsys, no_aws_config
):
    from distrain_cloud.launcher import cli

    argv = ["submit", "--instance", "p5.48xlarge", "--precision", "fp8", "--strategy", "ddp", "--dry-run", "--"]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--task", "causal-lm", "--preset", "llama-1b", *training])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == f"error: training arguments: {line}"


@pytest.mark.parametrize("flag", ["--fp8-head-grad-input", "--fp8-head-forward", "--fp8-head-backward"])
def test_submit_plans_a_job_with_the_heads_bf16_matmuls(flag, capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    argv = ["submit", "--instance", "p5.48xlarge", "--precision", "fp8", "--strategy", "ddp", "--dry-run", "--"]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--task", "causal-lm", "--preset", "llama-1b", "--fp8-head", flag, "bf16"])
    assert exit_.value.code == 0 and f'"{flag}",\n      "bf16"' in capsys.readouterr().out
