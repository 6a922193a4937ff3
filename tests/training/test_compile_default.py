"""Compile by default where it pays, and a compiler failure costs speed, not the job."""

from __future__ import annotations

import json

import pytest

from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.decisions import decide
from distrain_cloud.training.strategies import (
    COMPILE_MIN_STEPS,
    EVAL_COMPILE_MIN_BATCHES,
    Strategy,
    compile_decision,
    compile_unit_for,
    eval_compile_decision,
)


@pytest.mark.parametrize(
    "requested, cuda, strategy, steps, expected, says",
    [
        (None, True, Strategy.ddp, 5000, True, "default on CUDA GPUs; --no-compile to opt out"),
        (None, True, Strategy.single, COMPILE_MIN_STEPS, True, "--no-compile to opt out"),
        (None, False, Strategy.ddp, 5000, False, "no CUDA GPU"),
        (None, True, Strategy.zero2, 5000, True, "default on CUDA GPUs; --no-compile to opt out"),
        (None, True, Strategy.zero3, 5000, True, "default on CUDA GPUs; --no-compile to opt out"),
        (None, True, Strategy.fsdp, 5000, True, "default on CUDA GPUs; --no-compile to opt out"),
        (None, True, Strategy.zero3_offload, 5000, False, "not measured compiled"),
        (None, True, Strategy.zero1, 5000, False, "zero1 runs eager: not measured compiled"),
        (None, True, Strategy.zero2_offload, 5000, False, "not measured compiled"),
        (None, True, Strategy.zero2, COMPILE_MIN_STEPS - 1, False, "too few to repay compiling"),
        (None, True, Strategy.zero3, COMPILE_MIN_STEPS - 1, False, "too few to repay compiling"),
        # the measured break-even (ZeRO-2's 1,032 steps, the longest): a 500-step run stays eager
        (None, True, Strategy.ddp, 500, False, "500 steps are too few to repay compiling"),
        (None, True, Strategy.ddp, COMPILE_MIN_STEPS - 1, False, "too few to repay compiling"),
        (True, False, Strategy.ddp, 5, True, "--compile"),
        (False, True, Strategy.ddp, 10**6, False, "--no-compile"),
    ],
)
def test_the_default_compiles_on_cuda_for_ddp_and_long_runs(requested, cuda, strategy, steps, expected, says):
    compiled, why = compile_decision(requested, cuda=cuda, strategy=strategy, max_steps=steps)
    assert compiled is expected and says in why


@pytest.mark.parametrize(("steps", "fp8", "compiled"), [(500, True, True), (499, True, False), (500, False, False)])
def test_fp8_compiles_from_a_shorter_run_where_eager_float8_is_slower_than_bf16(steps, fp8, compiled):
    """Eager fp8 ran 0.74x eager bf16 and repaid its compile after about 255 steps (llama-1b on an
    H200, sessions 34-38): --precision fp8 compiles from 500 steps, bf16 still from 1,000; the
    plan says the length it needs, and a job under it says why it runs eager."""
    assert compile_decision(None, cuda=True, strategy=Strategy.ddp, max_steps=steps, fp8=fp8)[0] is compiled
    precision = ["--precision", "fp8" if fp8 else "bf16"]
    decided = decide(parse_args(["--preset", "llama-1b", *precision, "--max-steps", str(steps)]), world=1, cuda=True)
    assert decided.compiled is compiled
    assert ("float8 runs slower eager than bf16 does" in decided.compile_why) is (fp8 and not compiled)
    unknown = decide(parse_args(["--preset", "llama-1b", *precision, "--epochs", "1"]), world=1, cuda=True)
    assert unknown.compile_words == f", compiled if it runs {500 if fp8 else 1000:,}+ steps"


def test_zero3_compiles_by_default_only_a_model_with_blocks():
    """ZeRO-3 compiles block by block; a model naming no block class would be compiled whole,
    which recompiled at every block's DeepSpeed hooks (session 10), so the default stays eager."""
    decide = lambda **kw: compile_decision(None, cuda=True, max_steps=5000, **kw)  # noqa: E731
    assert decide(strategy=Strategy.zero3, has_blocks=True)[0]
    compiled, why = decide(strategy=Strategy.zero3, has_blocks=False)
    assert not compiled and why == "default: zero3 runs eager: the model names no transformer block class to compile"
    assert decide(strategy=Strategy.ddp, has_blocks=False)[0] and decide(strategy=Strategy.zero2, has_blocks=False)[0]
    assert compile_decision(True, cuda=True, strategy=Strategy.zero3, max_steps=5, has_blocks=False)[0]


@pytest.mark.parametrize(
    "evals, eval_samples, batch_size, expected",
    [
        (1, 13, 4, False),  # the bench's final evaluation of a GPT-2 XL run: a 41 s compile for 13 samples
        (11, 256, 16, False),  # an evaluation every 100 of 1000 steps over 256 samples
        (11, 1024, 16, True),  # ... over 1024: 11,264 samples, past 3 x 200 x 16 = 9,600
        (1, EVAL_COMPILE_MIN_BATCHES * 16, 16, True),
        (1, EVAL_COMPILE_MIN_BATCHES * 16 - 1, 16, False),
    ],
)
def test_evaluation_compiles_only_where_its_forwards_repay_it(evals, eval_samples, batch_size, expected):
    compiled, why = eval_compile_decision(evals=evals, eval_samples=eval_samples, batch_size=batch_size)
    assert compiled is expected
    assert why.startswith(f"{evals * eval_samples} evaluation samples per process over the run")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--no-compile", "--compile-unit", "block"], "--compile-unit block contradicts --no-compile"),
        (
            ["--strategy", "fsdp", "--compile-unit", "model", "--fsdp-blocks-per-unit", "2"],
            "--fsdp-blocks-per-unit applies to fsdp's FSDP2 units",
        ),
        (["--strategy", "fsdp", "--compile-unit", "model", "--no-compile"], "--compile-unit model contradicts"),
        (
            ["--strategy", "zero2", "--compile-unit", "block"],
            "--compile-unit block applies to .* zero3-offload, not zero2",
        ),
        (["--strategy", "zero1", "--compile-unit", "block"], "not zero1 \\(ZeRO-1/2 compile the whole model inside"),
        (["--compile-unit", "layer"], "argument --compile-unit: invalid choice: 'layer'"),
        (["--compiled-autograd", "--strategy", "fsdp"], "--compiled-autograd applies to .* ddp or single, not fsdp"),
        (["--compiled-autograd", "--no-compile"], "--compiled-autograd contradicts --no-compile"),
        (["--compiled-autograd", "--compile-unit", "block"], "drop --compile-unit block"),
        (["--compiled-autograd", "--ddp-reduce-dtype", "bf16"], "drop --ddp-reduce-dtype bf16"),
    ],
)
def test_compile_unit_refuses_what_it_cannot_compile(flags, message):
    with pytest.raises(ArgumentError, match=message):
        parse_args(flags)


def test_compile_unit_is_accepted_where_it_applies():
    assert parse_args(["--compile-unit", "block"]).compile_unit == "block"
    assert parse_args(["--strategy", "fsdp", "--compile-unit", "block"]).compile_unit == "block"
    assert parse_args(["--strategy", "fsdp", "--compile-unit", "model"]).compile_unit == "model"  # in-graph sharding
    assert parse_args(["--strategy", "zero3", "--compile-unit", "block"]).compile_unit == "block"
    assert parse_args(["--strategy", "zero3", "--compile-unit", "model"]).compile_unit == "model"
    assert parse_args([]).compile_unit is None


@pytest.mark.parametrize(
    ("strategy", "requested", "unit"),
    [
        (Strategy.ddp, None, "model"),
        (Strategy.zero2, None, "model"),
        (Strategy.fsdp, None, "block"),
        (Strategy.zero3, None, "block"),
        (Strategy.zero3_offload, None, "block"),
        (Strategy.zero3, "model", "model"),
        (Strategy.ddp, "block", "block"),
    ],
)
def test_blocks_are_compiled_where_sharding_hooks_sit_between_them(strategy, requested, unit):
    assert compile_unit_for(strategy, requested) == unit


FLAGS = (
    "--task",
    "causal-lm",
    "--preset",
    "tiny-gpt2",
    "--max-steps",
    "6",
    "--log-every",
    "2",
    "--report-to",
    "none",
    "--no-save-model",
    "--generate-tokens",
    "0",
    "--max-eval-samples",
    "16",
)


def no_dropout_flags(no_dropout_config) -> tuple[str, ...]:
    """FLAGS without the preset's dropout: a compiled run that fell back to eager takes eager's numbers."""
    return (*FLAGS[:2], "--model-config", str(no_dropout_config), *FLAGS[4:])


@pytest.fixture(scope="module")
def eager(module_train, no_dropout_config):
    """The eager run both fallback tests compare with (one start-up of the entry point, not two)."""
    return module_train(*no_dropout_flags(no_dropout_config), name="eager")


@pytest.mark.slow
def test_a_compile_failure_falls_back_to_eager_with_one_warning(train, eager, no_dropout_config):
    flags = no_dropout_flags(no_dropout_config)
    failing = train(*flags, "--compile", name="failing", env={"DISTRAIN_TEST_COMPILE_FAIL": "1"})
    assert eager.returncode == 0, eager.describe()
    assert failing.returncode == 0, failing.describe()
    assert eager.lines("compile=") == ["compile=off (default: no CUDA GPU)"]
    # the entry point alone, no --precision: the launcher's pick for no GPU (test_precision.py: GPUs)
    assert eager.lines("precision=") == [
        "precision=no (default on no CUDA GPU: fp32, as the launcher picks; --precision to choose)"
    ]
    assert failing.lines("compile=") == ["compile=on (--compile)"]
    # 16 evaluation samples: the evaluation runs eagerly, compiling nothing of its own.
    assert failing.lines("compile_eval=") == [
        "compile_eval=off (16 evaluation samples per process over the run are too few to repay compiling)"
    ]
    (warning,) = [line for line in failing.stdout.splitlines() if "torch.compile failed" in line]
    assert "injected compile failure" in warning and "running that part eagerly" in warning
    assert failing.train_losses == pytest.approx(eager.train_losses, rel=1e-5)


@pytest.mark.slow
def test_a_failing_compiled_backward_goes_on_eagerly_on_one_process(train, eager, no_dropout_config):
    """A compiled backward graph is compiled at its first backward, out of the backend's reach; a
    failure partway through it (trainer._backward's test hook) costs speed, not the job: one
    warning, then the step again and the rest of the job eagerly, to eager's numbers (no dropout,
    so the failed attempt's draws change nothing)."""
    failing = train(
        *no_dropout_flags(no_dropout_config),
        "--compile",
        name="backward-failing",
        env={"DISTRAIN_TEST_COMPILED_BACKWARD_FAIL": "1", "DISTRAIN_COMPILE_BACKEND": "aot_eager"},
    )
    assert eager.returncode == 0, eager.describe()
    assert failing.returncode == 0, failing.describe()
    assert failing.lines("warning:") == [
        "warning: the compiled backward failed (injected failure in the compiled backward); the job runs eagerly "
        "from here (--no-compile avoids it)"
    ]
    assert failing.train_losses == pytest.approx(eager.train_losses, rel=1e-5)


@pytest.mark.slow
def test_a_resumed_compiled_job_loads_its_kernels_from_beside_the_checkpoints(train, tmp_path):
    """The compiler's cache lives in the checkpoint folder, which a lineage keeps (S3 for cloud
    jobs): a resume on another machine (here: a fresh process with its own temp dirs) hits it."""
    flags = (*FLAGS[:4], *FLAGS[6:], "--save-every", "2", "--compile")
    # Without the suite's TORCHINDUCTOR_CACHE_DIR, as in a job: the trainer picks the checkpoint folder.
    train.shared_env = {k: v for k, v in train.shared_env.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    shared = {"DISTRAIN_CHECKPOINT_DIR": str(tmp_path / "lineage-checkpoints")}
    first = train(*flags, "--max-steps", "2", name="first", env=shared)
    assert first.returncode == 0, first.describe()
    cache = tmp_path / "lineage-checkpoints" / "compile-cache"
    assert first.lines("compile_cache=") == [f"compile_cache={cache}"], first.describe()
    assert any(cache.rglob("*")), "the compiler wrote nothing beside the checkpoints"
    (line,) = first.lines("first_step_s=")
    assert line.endswith("compile_cache_hits=0")
    resumed = train(*flags, "--max-steps", "4", name="resumed", env=shared)
    assert resumed.returncode == 0, resumed.describe()
    assert resumed.lines("resumed_from=")
    (line,) = resumed.lines("first_step_s=")
    assert int(line.rsplit("=", 1)[1]) > 0, line


def test_the_cli_passes_the_compile_unit_and_refuses_it_for_deepspeed(cli, tmp_path):
    """What a user types: the unit reaches the job's training flags, and a DeepSpeed job that asks
    for blocks is refused in one line at plan time, naming the flag, before anything is sent."""
    base = ("submit", "--instance", "local", "--processes", "2", "--dry-run", "--json")
    r = cli(*base, "--strategy", "ddp", "--", "--compile-unit", "block", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    command = json.loads(r.stdout)["request"]["command"]
    assert command[command.index("--compile-unit") + 1] == "block"
    wrong = cli(*base, "--strategy", "zero2", "--", "--compile-unit", "block", cwd=tmp_path)
    assert wrong.returncode == 2 and json.loads(wrong.stdout)["result"]["status"] == "NotSubmitted"
    assert (
        "--compile-unit block applies to --strategy ddp, single, fsdp, zero3 or zero3-offload, not zero2"
        in wrong.stderr
    )


def test_the_cli_passes_compiled_autograd_and_refuses_it_where_it_does_not_apply(cli, tmp_path):
    """What a user types for P3's candidate: the flag reaches the job's command; under a strategy
    it does not serve, one line at plan time names it, and nothing is sent."""
    base = ("submit", "--instance", "local", "--processes", "2", "--dry-run", "--json")
    r = cli(*base, "--strategy", "ddp", "--", "--compiled-autograd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--compiled-autograd" in json.loads(r.stdout)["request"]["command"]
    wrong = cli(*base, "--strategy", "zero2", "--", "--compiled-autograd", cwd=tmp_path)
    assert wrong.returncode == 2 and json.loads(wrong.stdout)["result"]["status"] == "NotSubmitted"
    assert "--compiled-autograd applies to --strategy ddp or single, not zero2" in wrong.stderr


@pytest.mark.slow  # Dynamo's first trace in a process: about 3 s
@pytest.mark.parametrize("accum", [1, 4])
def test_the_compiled_autograd_graph_takes_no_scalar_from_the_accumulation_scaling(accum):
    """Accelerate's `loss / k` leaves k, a Scalar, on the division's backward node, which compiled
    autograd lifts into its graph as an input: the one torch 2.11 passed as a Python int where
    Inductor's kernel read a tensor, so the first backward failed on 4 H200s (bench/README.md,
    session 11). The trainer seeds the backward with 1/k instead: no such input, the same gradients."""
    import torch
    from torch._dynamo import compiled_autograd

    from distrain_cloud.training.compiling import seeded_backward

    def backward_graph_inputs(backward) -> tuple[list, list]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
        x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
        graphs: list = []

        def capture(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        with compiled_autograd._enable(torch.compile(backend=capture)):
            backward(torch.nn.functional.cross_entropy(torch.compile(model, backend="eager")(x), y))
        (inputs,) = [n.meta["example_value"] for n in graphs[0].graph.nodes if n.name == "l_inputs_"]
        return [t for t in inputs if t.dim() == 0 and not t.is_floating_point()], [p.grad for p in model.parameters()]

    scalars, grads = backward_graph_inputs(lambda loss: (loss / accum).backward())  # what Accelerate does
    assert [int(t) for t in scalars] == [accum]  # the input that failed under torch 2.11
    fake_accelerator = type("Acc", (), {"scaler": None, "gradient_accumulation_steps": accum})()
    seeded_scalars, seeded_grads = backward_graph_inputs(lambda loss: seeded_backward(fake_accelerator, loss))
    assert seeded_scalars == []
    for seeded, divided in zip(seeded_grads, grads, strict=True):
        torch.testing.assert_close(seeded, divided, rtol=0, atol=0)
