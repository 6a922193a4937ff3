"""--compile-optimizer (training/optim.py): the clip and AdamW's update in one step give what
torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW give, eager to the bit and compiled to
fp32's rounding, with AdamW's state_dict both ways; the trainer runs it where it applies."""

from __future__ import annotations

import pytest
from tinylm import LLAMA

LRS = (1e-2, 8e-3, 5e-3, 2e-3)  # a schedule: each step's lr differs, as the trainer's does


def _model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def _groups(model) -> list[dict]:
    """Two groups as the trainer makes them: decay on matrices, none on biases."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def _train(torch, model, optimizer, lrs, clip: float | None, seed: int = 1) -> None:
    """Steps with large gradients (the clip scales them), the lr set per step as the trainer sets it."""
    torch.manual_seed(seed)
    for lr in lrs:
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = torch.randn(32, 8), torch.randn(32, 3)
        model.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).sum().backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()


def _reference(torch, lrs=LRS, max_norm: float = 0.5):
    """torch's clip then torch's AdamW: the model and its optimizer."""
    model = _model(torch)
    optimizer = torch.optim.AdamW(_groups(model), lr=lrs[0])
    _train(torch, model, optimizer, lrs, clip=max_norm)
    return model, optimizer


def _assert_same(torch, expected, got, close: bool = False) -> None:
    """The weights and AdamW's moments of two (model, optimizer) pairs agree: to the bit, or
    (`close`) to fp32's rounding of the same arithmetic in another order. The moments carry the
    clip's coefficient as it was (a max norm of 0.4 instead of 0.5 moves them 20%); the weights
    hardly do, as Adam's update divides the gradient's scale out (up to its eps)."""
    (expected_model, expected_opt), (got_model, got_opt) = expected, got

    def same(a, b) -> bool:
        if not close:
            return torch.equal(a, b)
        return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.detach().abs().max()))

    for p, q in zip(expected_model.parameters(), got_model.parameters(), strict=True):
        assert same(p, q)
        for key in ("exp_avg", "exp_avg_sq"):
            assert same(expected_opt.state[p][key], got_opt.state[q][key]), key
        assert float(expected_opt.state[p]["step"]) == float(got_opt.state[q]["step"])


@pytest.mark.parametrize("max_norm", [0.5, 0.0])  # clipped; 0 turns clipping off, as --max-grad-norm 0
def test_the_eager_step_is_clip_then_adamw_to_the_bit(max_norm):
    import torch

    from distrain_cloud.training.optim import ClippedAdamW

    expected = _reference(torch, max_norm=max_norm)
    model = _model(torch)
    optimizer = ClippedAdamW(_groups(model), lr=LRS[0], max_norm=max_norm, fused=False)
    _train(torch, model, optimizer, LRS, clip=None)
    _assert_same(torch, expected, (model, optimizer))


def test_the_gradients_are_read_not_scaled():
    """The clip's coefficient is applied as the update reads each gradient: what the backward left
    is still there after the step (the trainer then sets them to None)."""
    import torch

    from distrain_cloud.training.optim import ClippedAdamW

    model = _model(torch)
    optimizer = ClippedAdamW(_groups(model), lr=1e-2, max_norm=0.5, fused=False)
    x, y = torch.randn(32, 8), torch.randn(32, 3)
    ((model(x) - y) ** 2).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    assert float(torch.linalg.vector_norm(torch.stack([g.norm() for g in before]))) > 0.5  # would be clipped
    optimizer.step()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before, strict=True))


@pytest.mark.slow  # Dynamo traces torch's AdamW: about 3 s
def test_the_compiled_step_matches_and_compiles_once_across_learning_rates():
    """Compiled (a counting backend running the captured graph): torch's numbers to fp32's rounding
    (compiled, the bias corrections are tensor arithmetic, AdamW's capturable form), one graph for
    every step although the lr changes each step (it travels as a tensor, not a constant)."""
    import torch

    from distrain_cloud.training.optim import ClippedAdamW

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    expected = _reference(torch)
    model = _model(torch)
    optimizer = ClippedAdamW(_groups(model), lr=LRS[0], max_norm=0.5, fused=False)
    optimizer.compile(backend)
    _train(torch, model, optimizer, LRS, clip=None)
    assert len(graphs) == 1
    _assert_same(torch, expected, (model, optimizer), close=True)


@pytest.mark.slow  # Inductor's C++ build: about 30 s on CPU
def test_inductor_fuses_the_scale_into_the_update_without_a_copy_of_the_gradients():
    import torch
    from torch._inductor.utils import run_and_get_code

    from distrain_cloud.training.optim import ClippedAdamW

    torch._dynamo.reset()
    expected = _reference(torch)
    model = _model(torch)
    optimizer = ClippedAdamW(_groups(model), lr=LRS[0], max_norm=0.5, fused=False)
    optimizer.compile("inductor")
    _, code = run_and_get_code(_train, torch, model, optimizer, LRS, None)
    _assert_same(torch, expected, (model, optimizer), close=True)
    # The only buffers the step allocates are the norms: the scaled gradients are never materialised.
    allocations = [line for source in code for line in source.splitlines() if "= empty_strided" in line]
    assert allocations and all("(4, )" in line or "((), ()" in line for line in allocations), allocations


@pytest.mark.parametrize("direction", ["clipped to plain", "plain to clipped"])
def test_a_checkpoint_moves_between_adamw_and_the_clipped_step(direction):
    """Its state_dict is AdamW's: a run resumes with or without --compile-optimizer, and trains on
    as it would have."""
    import torch

    from distrain_cloud.training.optim import ClippedAdamW

    def clipped(model):
        return ClippedAdamW(_groups(model), lr=LRS[0], max_norm=0.5, fused=False)

    def plain(model):
        return torch.optim.AdamW(_groups(model), lr=LRS[0])

    first, second = (clipped, plain) if direction == "clipped to plain" else (plain, clipped)
    model = _model(torch)
    optimizer = first(model)
    _train(torch, model, optimizer, LRS, clip=None if first is clipped else 0.5)
    resumed = second(model)
    resumed.load_state_dict(optimizer.state_dict())
    _train(torch, model, resumed, LRS, clip=None if second is clipped else 0.5, seed=2)

    reference = _model(torch)  # AdamW through both halves
    adamw = torch.optim.AdamW(_groups(reference), lr=LRS[0])
    _train(torch, reference, adamw, LRS, clip=0.5)
    _train(torch, reference, adamw, LRS, clip=0.5, seed=2)
    _assert_same(torch, (reference, adamw), (model, resumed), close=True)


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--no-compile"], "--compile-optimizer contradicts --no-compile"),
        (["--precision", "fp16"], "--compile-optimizer: not with --precision fp16"),
        (["--strategy", "fsdp"], "--compile-optimizer applies to --strategy ddp or single"),
        (["--strategy", "zero2"], "--compile-optimizer applies to --strategy ddp or single"),
    ],
)
def test_the_flag_is_refused_where_it_cannot_apply(flags, error):
    from distrain_cloud.training.args import ArgumentError, parse_args

    with pytest.raises(ArgumentError, match=error.replace("+", r"\+")):
        parse_args(["--task", "causal-lm", "--compile-optimizer", *flags])


@pytest.mark.slow  # two entry-point runs, compiled plumbing (about 30 s on CPU)
def test_an_entry_point_run_compiles_the_step_and_trains_as_without_it(train, aot_eager):
    flags = ("--compile", "--precision", "bf16", "--block-size", "64", "--max-steps", "4", "--report-to", "none")
    base = train(*LLAMA, *flags, name="base", env=aot_eager)
    run = train(*LLAMA, *flags, "--compile-optimizer", name="clipped", env=aot_eager)
    assert base.returncode == 0, base.describe()
    assert run.returncode == 0, run.describe()
    assert run.lines("compile_optimizer=") == [
        "compile_optimizer=on (the gradient clip and AdamW's update as one compiled step)"
    ]
    assert base.lines("compile_optimizer=") == []
    assert run.train_losses == pytest.approx(base.train_losses, rel=1e-4)
    assert run.final_eval["eval_loss"] == pytest.approx(base.final_eval["eval_loss"], rel=1e-4)


# The job of test_a_run_resumes_across_the_flag_both_ways: stopped at step 2's checkpoint, it comes back.
RESUMED = (
    *LLAMA,
    "--block-size",
    "64",
    "--max-steps",
    "4",
    "--save-every",
    "2",
    "--log-every",
    "1",
    "--report-to",
    "none",
)


@pytest.fixture(scope="module")
def eager_with_the_flag(module_train):
    """RESUMED's job with --compile-optimizer, eager: the run test_an_eager_run_says_the_step_runs_eagerly
    reads, and the first the resume test comes back from (the eager one was a run of its own)."""
    run = module_train(*RESUMED, "--compile-optimizer", name="with-whole")
    assert run.returncode == 0, run.describe()
    return run


@pytest.mark.slow  # reads eager_with_the_flag: an entry-point run, eager, shared with the resume test
def test_an_eager_run_says_the_step_runs_eagerly(eager_with_the_flag):
    assert eager_with_the_flag.lines("compile_optimizer=") == [
        "compile_optimizer=off (the model is not compiled: the clip and AdamW's update run eagerly)"
    ]


@pytest.mark.slow  # two processes, compiled plumbing (about 40 s on CPU)
def test_where_auto_picks_in_graph_fsdp_the_flag_steps_aside(train, aot_eager, auto_as_on_gpus, no_dropout_config):
    """--strategy auto may pick fsdp sharded in the compiled graph, whose clip needs every
    process's shards: the flag is then said to be off, and fsdp clips as it does."""
    from test_fsdp import lm_flags

    env = {**aot_eager, **auto_as_on_gpus(min_steps=4, max_params=10**6)}
    run = train(*lm_flags(no_dropout_config), "--compile", "--compile-optimizer", processes=2, env=env)
    assert run.returncode == 0, run.describe()
    assert run.lines("strategy=")[0].startswith("strategy=fsdp (auto: sharded in the compiled graph")
    assert run.lines("compile_optimizer=") == ["compile_optimizer=off (--compile-optimizer: not under fsdp)"]


def test_submit_plans_a_job_with_the_flag(capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    job = ["--task", "causal-lm", "--preset", "llama-1b", "--compile-optimizer"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["submit", "--instance", "p5.48xlarge", "--precision", "bf16", "--dry-run", "--", *job])
    assert exit_.value.code == 0 and '"--compile-optimizer"' in capsys.readouterr().out


def test_submit_refuses_it_with_a_sharded_strategy_before_anything_is_sent(capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    job = ["--task", "causal-lm", "--preset", "llama-1b", "--compile-optimizer"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["submit", "--instance", "p5.48xlarge", "--strategy", "zero3", "--dry-run", "--", *job])
    assert exit_.value.code == 2
    assert "--compile-optimizer applies to --strategy ddp or single" in capsys.readouterr().err


@pytest.mark.slow  # four entry-point runs, eager (about 40 s on CPU), one of them eager_with_the_flag
def test_a_run_resumes_across_the_flag_both_ways(train, eager_with_the_flag):
    """A job stopped at a checkpoint comes back with the flag added or dropped (its optimizer state
    is AdamW's either way) and trains on as the job it resumes would have."""
    without = train(*RESUMED, name="without-whole")
    for name, whole, then in (("with", eager_with_the_flag, ()), ("without", without, ("--compile-optimizer",))):
        assert whole.returncode == 0, whole.describe()
        train.with_checkpoint(f"{name}-resumed", whole, 2)
        resumed = train(*RESUMED, *then, name=f"{name}-resumed")
        assert resumed.returncode == 0, resumed.describe()
        assert resumed.lines("resumed_from=") == ["resumed_from=checkpoint-00000002 step=2"]
        assert sorted(resumed.train_losses) == [3, 4]
        for step, loss in resumed.train_losses.items():
            assert loss == pytest.approx(whole.train_losses[step], rel=1e-5), (step, name)
