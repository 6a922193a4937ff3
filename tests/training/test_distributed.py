"""Several processes on CPU, started the way every backend starts them (node_launch):
DDP over gloo gives the numbers of one process, and DeepSpeed ZeRO-2/3 train and save."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

EVAL_SAMPLES = 151  # not a multiple of the global eval batch (16): the last batch is uneven


def ddp_flags(no_dropout_config) -> list[str]:
    """The job of ddp_pair and of the fp16-reduce run: the comparison needs the very same one."""
    return [
        "--model-config",
        str(no_dropout_config),
        "--max-steps",
        "40",
        "--lr",
        "2e-3",
        "--log-every",
        "10",
        "--eval-every",
        "20",
        "--report-to",
        "none",
        # 300 validation examples, of which the first 151 are evaluated
        "--validation-fraction",
        "0.2",
        "--max-eval-samples",
        str(EVAL_SAMPLES),
    ]


@pytest.fixture(scope="module")
def ddp_pair(module_train, no_dropout_config):
    """The same job on 1 process (batch 16) and on 2 (batch 8 each): the same global batches.

    Batches are global and split across processes (split_batches), so both see the same
    data at every step. The model has no dropout: each process draws its own dropout masks,
    which no world size can reproduce.
    """
    common = ddp_flags(no_dropout_config)
    one = module_train(*common, "--batch-size", "16", name="ddp-one")
    two = module_train(*common, "--batch-size", "8", name="ddp-two", processes=2)
    assert one.returncode == 0, one.describe()
    assert two.returncode == 0, two.describe()
    return one, two


def test_fp16_gradient_reduce_stays_close_to_fp32(ddp_pair, module_train, no_dropout_config):
    """--ddp-reduce-dtype registers DDP's compression hook: the all-reduce runs in fp16,
    so losses move by rounding only (and do move: the hook really ran)."""
    _, two = ddp_pair
    half = module_train(
        *ddp_flags(no_dropout_config), "--batch-size", "8", "--ddp-reduce-dtype", "fp16", name="ddp-fp16", processes=2
    )
    assert half.returncode == 0, half.describe()
    assert half.train_losses.keys() == two.train_losses.keys()
    for step, loss in two.train_losses.items():
        assert half.train_losses[step] == pytest.approx(loss, rel=1e-2), step
    assert half.train_losses != two.train_losses


def world_size(run) -> int:
    return json.loads((run.contract.model_dir / "training_args.json").read_text())["world_size"]


def test_two_processes_really_run(ddp_pair):
    _, two = ddp_pair
    (launch,) = two.lines("node_launch ")
    assert launch.startswith("node_launch node_rank=0 nodes=1 processes=2 distributed_type=MULTI_CPU "), launch
    # node_launch passes the thread count accelerate launch would pick itself, so it notes nothing.
    assert "were not passed to `accelerate launch`" not in two.stderr, two.describe()
    assert world_size(two) == 2, two.describe()
    # Only the main process prints and writes metrics.
    assert len(two.lines("model_saved=")) == 1
    assert len(two.lines("step=")) == len(two.metrics) == 4 + 2


def test_two_processes_give_the_numbers_of_one(ddp_pair):
    one, two = ddp_pair
    assert [e["step"] for e in one.evals] == [e["step"] for e in two.evals] == [20, 40]
    for a, b in zip(one.evals, two.evals, strict=True):
        assert a["eval_accuracy"] == b["eval_accuracy"], (a, b)
        assert a["eval_f1_macro"] == b["eval_f1_macro"], (a, b)
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-3), (a, b)
    assert one.train_losses.keys() == two.train_losses.keys()
    for step, loss in one.train_losses.items():
        assert two.train_losses[step] == pytest.approx(loss, rel=1e-3), step
    # Training did something, so the agreement above is not that of two untouched models.
    assert one.evals[-1]["eval_loss"] < one.evals[0]["eval_loss"] or one.train_losses[40] < one.train_losses[10]


FAIL_BACKWARD = "DISTRAIN_TEST_COMPILED_BACKWARD_FAIL"  # trainer._backward's test hook: its first backward fails


def lm_flags(no_dropout_config) -> list[str]:
    """The causal-LM job of the compiled-DDP comparisons (the global batch is added per run)."""
    return [
        "--task",
        "causal-lm",
        "--model-config",
        str(no_dropout_config),
        "--block-size",
        "64",
        "--max-steps",
        "8",
        "--log-every",
        "2",
        "--lr",
        "2e-3",
        "--report-to",
        "none",
        "--no-save-model",
        "--generate-tokens",
        "0",
        "--max-eval-samples",
        "32",
    ]


@pytest.fixture(scope="module")
def lm_one(module_train, no_dropout_config):
    """One eager process on batches of 16: the numbers every compiled 2-process variant must give."""
    one = module_train(*lm_flags(no_dropout_config), "--batch-size", "16", name="lm-one")
    assert one.returncode == 0, one.describe()
    return one


ACCUM = 2


def accum_flags(no_dropout_config) -> list[str]:
    """lm_flags with accumulation (--grad-accum 2), of the eager and compiled-autograd DDP comparisons:
    2 processes on micro-batches of 4 make lm_one's global batches of 16, so lm_one is their
    baseline too (one eager process, no accumulation: the averaging over micro-batches and
    processes must give the numbers of one whole batch)."""
    return [*lm_flags(no_dropout_config), "--grad-accum", str(ACCUM)]


@pytest.mark.parametrize(
    "unit,bucket_mb,unit_line,graphs,fails,slow_link",
    [
        ("model", 1000, "compile_unit=model", 1, False, False),
        # NCCL's peer-to-peer off stands for a slow link (strategies.slow_gpu_link): small buckets.
        # The same run's first compiled backward fails: the model's 180,608 parameters fill less
        # than one bucket of either size, so the reducer the fallback resets is the same as with
        # the default buckets, and one 2-process run proves both (they were a run each).
        ("model", 25, "compile_unit=model", 1, True, True),
        # One graph serves both blocks (their weights are its inputs); the loss is the one-pass
        # head loss (--lm-loss fast), a kernel of its own, not compiled.
        ("block", 25, "compile_unit=block blocks=2 loss=fast", 1, False, False),
    ],
    ids=["model", "model-slow-link-backward-fails", "block"],
)
def test_compiled_ddp_gives_the_numbers_of_one_eager_process(
    train, lm_one, no_dropout_config, aot_eager, auto_as_on_gpus, unit, bucket_mb, unit_line, graphs, fails, slow_link
):
    """--compile under DDP trains like one eager process on the same global batches, whichever
    --compile-unit: the whole model (Dynamo's DDP graph splitting, with the compiled default of one
    large bucket, training/strategies.ddp_bucket_mb) or each block and the loss (no splitting:
    DDP's reducer takes each block's gradients as its backward ends, in eager-sized buckets). Over
    a slow link (here NCCL's peer-to-peer off) the whole model keeps eager-sized buckets, and says why.
    Where the first compiled backward fails (its graph is compiled then, out of reach of the
    backend's guard), the job says so once and goes on eagerly, DDP's reducer reset for the forward
    whose backward failed, to the same numbers."""
    flags, one = lm_flags(no_dropout_config), lm_one
    compiled = ["--compile", "--compile-unit", unit]
    env = {**aot_eager, **({FAIL_BACKWARD: "1"} if fails else {}), **({"NCCL_P2P_DISABLE": "1"} if slow_link else {})}
    if (unit, fails, slow_link) == ("model", False, False):
        # --strategy auto (the default) as on GPUs, whose model is too big for the in-graph engine: it
        # is ddp once the model is loaded, and its buckets are said then.
        env |= auto_as_on_gpus(min_steps=8, max_params=1000)
    two = train(*flags, "--batch-size", "8", *compiled, name="lm-two-compiled", processes=2, env=env)
    assert two.returncode == 0, two.describe()
    assert two.lines("warning: the compiled backward failed") == (
        ["warning: the compiled backward failed (injected failure in the compiled backward); the job runs eagerly "
         "from here (--no-compile avoids it)"] if fails else []
    )  # fmt: skip
    assert two.lines("ddp_bucket_mb=") == [f"ddp_bucket_mb={bucket_mb}"]
    assert two.lines("strategy=") == (
        ["strategy=ddp (auto: no CUDA GPUs)"]
        if (unit, fails, slow_link) != ("model", False, False)
        else ["strategy=ddp (auto: 180,608 parameters: above 1,000 fsdp's in-graph engine is not faster)"]
    ), two.describe()
    assert two.lines("ddp: ") == (
        ["ddp: NCCL_P2P_DISABLE is set: small gradient buckets, so the all-reduces overlap the backward"]
        if slow_link else []
    )  # fmt: skip
    assert two.lines("compile_unit=") == [unit_line]
    assert two.lines("compiled_graphs=") == [f"compiled_graphs={graphs}"]
    # where the first compile went, by torch's own timers (the AOT Autograd phase holds aot_eager's)
    (times,) = two.lines("compile_times=")
    assert "create_aot_dispatcher_function:" in times and times.endswith("s"), times
    assert two.lines("compile_backend=") == ["compile_backend=aot_eager (DISTRAIN_COMPILE_BACKEND)"]
    assert one.train_losses.keys() == two.train_losses.keys() == {2, 4, 6, 8}
    for step, loss in one.train_losses.items():
        assert two.train_losses[step] == pytest.approx(loss, rel=1e-3), (step, one.train_losses, two.train_losses)
    assert two.final_eval["eval_loss"] == pytest.approx(one.final_eval["eval_loss"], rel=1e-3)


@pytest.mark.parametrize("fails", [False, True], ids=["compiled", "compiled-backward-fails"])
def test_compiled_autograd_ddp_gives_the_numbers_of_one_eager_process(
    train, lm_one, no_dropout_config, aot_eager, fails
):
    """--compiled-autograd (P3's candidate: DDP's all-reduces traced into one compiled backward,
    where the compiler may overlap them) trains like one eager process on the same global batches,
    through accumulation's no-sync micro-steps and its synchronising ones. Where the compiled
    backward fails (as it did on 4 H200s under torch 2.11), the job says so once and goes on
    eagerly from a fresh forward, to the same numbers."""
    one = lm_one
    two = train(
        *accum_flags(no_dropout_config),
        "--batch-size",
        str(8 // ACCUM),
        "--compile",
        "--compiled-autograd",
        name="ca-two",
        processes=2,
        env={
            **aot_eager,
            "TORCH_LOGS": "compiled_autograd",
            **({FAIL_BACKWARD: "1"} if fails else {}),
        },
    )
    assert two.returncode == 0, two.describe()
    assert two.lines("compiled_autograd=") == ["compiled_autograd=on (the backward one graph, DDP's all-reduces in it)"]
    assert two.lines("ddp_bucket_mb=") == ["ddp_bucket_mb=25"]
    warnings = two.lines("warning: the compiled backward failed")
    if fails:
        assert warnings == [
            "warning: the compiled backward failed (injected failure in the compiled backward); the backward runs "
            "eagerly from here, each gradient all-reduced alone (drop --compiled-autograd)"
        ]
    else:
        assert warnings == []
        # The traced backward calls DDP's Python reducer (its per-parameter hooks), not the C++ one.
        assert "[__compiled_autograd]" in two.stderr and "hook_type = 'post_acc_grad_hook'" in two.stderr
    assert one.train_losses.keys() == two.train_losses.keys() == {2, 4, 6, 8}
    for step, loss in one.train_losses.items():
        assert two.train_losses[step] == pytest.approx(loss, rel=1e-3), (step, one.train_losses, two.train_losses)


def test_ddp_with_accumulation_averages_over_micro_batches_and_processes(train, lm_one, no_dropout_config):
    """Eager DDP through accumulation's no-sync micro-steps and its synchronising ones: the numbers
    of one process on the same global batches. (AdamW and the clipping would hide a uniform scale
    of every gradient; the order and the averaging of the micro-batches they do not.)"""
    one = lm_one
    two = train(*accum_flags(no_dropout_config), "--batch-size", str(8 // ACCUM), name="accum-two", processes=2)
    assert two.returncode == 0, two.describe()
    assert one.train_losses.keys() == two.train_losses.keys() == {2, 4, 6, 8}
    for step, loss in one.train_losses.items():
        assert two.train_losses[step] == pytest.approx(loss, rel=1e-4), (step, one.train_losses, two.train_losses)
    assert two.final_eval["eval_loss"] == pytest.approx(one.final_eval["eval_loss"], rel=1e-4)


# The resume tests' backend: Dynamo alone. What they prove (the checkpoint keeps the model's own
# names under its compiled wrappers, the resumed steps are the uninterrupted ones) is Dynamo's
# wrapping, not the graphs AOTAutograd makes of it, which the comparisons above check.
DYNAMO_ONLY = {"DISTRAIN_COMPILE_BACKEND": "eager"}


def killed_and_resumed(train, flags: list[str], name: str, env: dict[str, str]):
    """The job of `flags` (--max-steps 5 --save-every 3 --log-every 1) killed right after step 5,
    then run again with the same flags, resuming from step 3's checkpoint to redo steps 4 and 5.

    The killed run is the uninterrupted run up to its kill (it saved the same checkpoints, and
    its steps 4 and 5 are logged before it dies): its losses are the ones the resumed steps must
    give, with no third run to train them again."""
    killed = train(*flags, name=name, env={**env, "DISTRAIN_TEST_KILL_AT_STEP": "5"})
    resumed = train(*flags, name=name, env=env)
    assert killed.returncode in (-9, 137), killed.describe()
    assert sorted(killed.train_losses) == [1, 2, 3, 4, 5], killed.describe()
    assert resumed.returncode == 0, resumed.describe()
    assert resumed.lines("resumed_from=") == ["resumed_from=checkpoint-00000003 step=3"]
    return killed, resumed


def test_a_job_compiled_block_by_block_resumes_where_an_uninterrupted_one_goes(train, no_dropout_config):
    """What a user does next with --compile-unit block: a job killed after a checkpoint runs again
    with the same flags (as `distrain-cloud resume` does). The blocks' compiled forwards and the
    loss are attributes, not weights, so the checkpoint is the model's own and the resumed steps
    are those of one uninterrupted run."""
    flags = ["--task", "causal-lm", "--model-config", str(no_dropout_config), "--block-size", "64", "--lr", "2e-3"]
    flags += ["--batch-size", "8", "--max-steps", "5", "--log-every", "1", "--save-every", "3", "--report-to", "none"]
    flags += ["--compile", "--compile-unit", "block", "--no-save-model", "--generate-tokens", "0"]
    killed, resumed = killed_and_resumed(train, flags, "blocks", DYNAMO_ONLY)
    assert resumed.lines("compile_unit=") == ["compile_unit=block blocks=2 loss=fast"]
    assert {s: resumed.train_losses[s] for s in (4, 5)} == {s: killed.train_losses[s] for s in (4, 5)}


def test_uneven_last_eval_batch_counts_every_sample_once(ddp_pair):
    one, two = ddp_pair
    assert EVAL_SAMPLES % 16 != 0 and (EVAL_SAMPLES % 16) % 2 == 1  # 7 left: 4 and 3 per process
    for run in (one, two):
        assert [e["eval_samples"] for e in run.evals] == [EVAL_SAMPLES, EVAL_SAMPLES], run.describe()


def check_saved_model(run, world: int, auto_class):
    """The model `run` saved loads whole with `auto_class` and gives finite logits, which it returns."""
    import torch

    saved = json.loads((run.contract.model_dir / "training_args.json").read_text())
    assert saved["world_size"] == world
    model, info = auto_class.from_pretrained(run.contract.model_dir, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert sum(p.numel() for p in model.parameters()) == saved["num_parameters"]
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
    # Real weights, not the empty placeholders of an ungathered ZeRO-3 shard.
    assert model.get_input_embeddings().weight.abs().sum() > 0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    assert torch.isfinite(logits).all()
    return model, logits


def check_saved_classifier(run, world: int) -> None:
    from transformers import AutoModelForSequenceClassification

    model, logits = check_saved_model(run, world, AutoModelForSequenceClassification)
    assert model.config.num_labels == 3
    assert logits.shape == (1, 3)


@pytest.mark.deepspeed
def test_compiled_zero2_compiles_the_model_inside_the_engine_once(train, lm_one, no_dropout_config, aot_eager):
    """--compile under DeepSpeed compiles the model inside its engine (engine.compile). Compiling
    the engine itself traced its forward's bookkeeping, whose flags change between steps: the
    model was compiled again at each of the first steps (4 times on CPU; on GPUs each costs tens
    of seconds). The recompiles are Dynamo's guards failing (on ZeRO-2's
    epilogue_ran_this_backward flag), whatever the backend: under aot_eager, with the engine
    compiled whole again, this test fails on them, without Inductor's C++ build in each process
    (a minute on 2 cores). It trains like one eager process on the same global batches (lm_one,
    as the compiled DDP variants): an eager ZeRO-2 run of its own cost one more 2-process
    DeepSpeed run and proved no more.

    The same run is ZeRO-2's on 2 processes that trains, evaluates and saves a model that loads whole
    (test_deepspeed_trains_and_saves_a_loadable_model's 2-process ZeRO-2 classifier was a run of its
    own and proved no more: one ZeRO-2 process saves a classifier in
    test_zero2_follows_the_same_schedule_as_ddp, eager ZeRO-2 trains on 2 processes in
    test_checkpoint.py's zero2_of_two, and ZeRO-3 on 2 processes saves in
    test_zero3_causal_lm_generates_a_sample)."""
    # lm_flags but saving the model: the weights the engine's compiled model trained, under their own names
    flags = [f for f in lm_flags(no_dropout_config) if f != "--no-save-model"]
    flags += ["--batch-size", "8", "--strategy", "zero2", "--compile"]
    compiled = train(*flags, name="zero2-compiled", processes=2, env={**aot_eager, "TORCH_LOGS": "recompiles"})
    assert compiled.returncode == 0, compiled.describe()
    (launch,) = compiled.lines("node_launch ")
    assert launch.startswith("node_launch node_rank=0 nodes=1 processes=2 "), launch
    assert "Recompiling function" not in compiled.stderr, compiled.describe()
    assert compiled.lines("compile_unit=") == ["compile_unit=model (inside DeepSpeed's engine)"]
    assert lm_one.train_losses.keys() == compiled.train_losses.keys() == {2, 4, 6, 8}
    for step, loss in lm_one.train_losses.items():
        assert compiled.train_losses[step] == pytest.approx(loss, rel=1e-3), step
    assert compiled.train_losses[8] < compiled.train_losses[2], compiled.train_losses  # it trained
    final = compiled.final_eval
    assert final["eval_samples"] > 0 and math.isfinite(final["eval_loss"]), final  # 32 texts, in blocks of 64
    from transformers import AutoModelForCausalLM

    model, logits = check_saved_model(compiled, 2, AutoModelForCausalLM)
    assert logits.shape == (1, 4, model.config.vocab_size)


@pytest.mark.deepspeed
@pytest.mark.slow  # two DeepSpeed runs with Dynamo: about 15 s each strategy
@pytest.mark.parametrize(
    ("strategy", "unit"),
    [
        ("zero2", "compile_unit=model (inside DeepSpeed's engine)"),
        ("zero3", "compile_unit=block blocks=2 loss=compiled"),
    ],
)
def test_a_compiled_deepspeed_job_resumes_where_an_uninterrupted_one_goes(train, no_dropout_config, strategy, unit):
    """ZeRO-2 compiles by default on GPUs, so spot interruptions meet it compiled: a job killed
    after a checkpoint runs again with the same flags (as `distrain-cloud resume` does) and goes on
    with the uninterrupted run's losses. ZeRO-2's model is compiled in place inside the engine,
    ZeRO-3's blocks one by one, so the checkpoint keeps the model's own names, and the saved model
    loads as one. --generate-tokens 0 saves it without a sample (it ended the job in an error after
    the save before)."""
    flags = ["--task", "causal-lm", "--model-config", str(no_dropout_config), "--block-size", "64", "--lr", "2e-3"]
    flags += ["--batch-size", "8", "--max-steps", "5", "--log-every", "1", "--save-every", "3", "--report-to", "none"]
    flags += ["--strategy", strategy, "--compile", "--generate-tokens", "0", "--max-eval-samples", "16"]
    killed, resumed = killed_and_resumed(train, flags, f"{strategy}c", DYNAMO_ONLY)
    assert resumed.lines("compile_unit=") == [unit]
    assert resumed.lines("sample=") == [] and not (resumed.contract.output_dir / "sample.txt").exists()
    assert {s: resumed.train_losses[s] for s in (4, 5)} == pytest.approx({s: killed.train_losses[s] for s in (4, 5)})
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(resumed.contract.model_dir, output_loading_info=True)
    assert not any(info.values()), info  # every weight under the model's own name


def test_zero2_follows_the_same_schedule_as_ddp(train, ddp_pair, no_dropout_config):
    """The learning rate is set on the optimizer each step (trainer.lr_at); under DeepSpeed the
    optimizer is wrapped twice, so prove the schedule reaches it: in fp32 on one process,
    ZeRO-2 and DDP must log the same losses while the rate decays. The DDP run is ddp_pair's
    one process (--strategy auto: ddp on CPU), not a run of its own. The ZeRO-2 run is also one
    DeepSpeed process started without a launcher, which trains and saves."""
    ddp, _ = ddp_pair
    assert json.loads((ddp.contract.model_dir / "training_args.json").read_text())["strategy"] == "ddp"
    zero2 = train(*ddp_flags(no_dropout_config), "--batch-size", "16", "--strategy", "zero2", name="sched-zero2")
    assert zero2.returncode == 0, zero2.describe()
    check_saved_classifier(zero2, 1)
    assert list(ddp.train_losses) == [10, 20, 30, 40]
    for step, loss in ddp.train_losses.items():
        assert zero2.train_losses[step] == pytest.approx(loss, rel=1e-5), step


@pytest.fixture(scope="module")
def zero3_runs(module_train, no_dropout_config):
    """ZeRO-3 on 2 processes gathering whole GPT-2 blocks (--zero3-block-fetch, the default) and
    then a sample generated, and the same run gathering layer by layer."""
    common = [
        "--task",
        "causal-lm",
        "--model-config",
        str(no_dropout_config),
        "--strategy",
        "zero3",
        "--max-steps",
        "8",
        "--batch-size",
        "4",
        "--log-every",
        "2",
        "--lr",
        "2e-3",
        "--report-to",
        "none",
    ]
    # The sample is generated from the model as saved at the end (--no-save-model skips both).
    block = module_train(*common, "--generate-tokens", "8", name="z3-block", processes=2)
    layer = module_train(*common, "--no-save-model", "--no-zero3-block-fetch", name="z3-layer", processes=2)
    return block, layer


@pytest.mark.deepspeed
def test_zero3_causal_lm_generates_a_sample(zero3_runs):
    """ZeRO-3 on 2 processes trains, evaluates and saves a model that loads whole (a 2-process
    ZeRO-3 run of a loadable-model test of its own proved no more).
    Generation under ZeRO-3 runs on every process (synced_gpus); only the main one prints."""
    run, _ = zero3_runs
    assert run.returncode == 0, run.describe()
    assert run.lines("zero3_fetch_unit=") == ["zero3_fetch_unit=GPT2Block"], run.describe()
    samples = run.lines("sample=")
    assert len(samples) == 1, run.describe()
    text = json.loads(samples[0][len("sample=") :])
    assert text.startswith("The"), text
    assert math.isfinite(run.final_eval["eval_perplexity"])
    # Trained, and saved whole: the gathered shards of both processes, each weight under its own name.
    assert run.train_losses[8] < run.train_losses[2], run.train_losses
    from transformers import AutoModelForCausalLM

    model, logits = check_saved_model(run, 2, AutoModelForCausalLM)
    assert logits.shape == (1, 4, model.config.vocab_size)


@pytest.mark.deepspeed
def test_zero3_block_fetch_changes_nothing_but_the_gathering(zero3_runs, no_dropout_config):
    """Gathering whole GPT-2 blocks (--zero3-block-fetch, the default) must train exactly
    like ZeRO-3's per-layer gathering: same losses, step for step."""
    block, layer = zero3_runs
    assert block.returncode == 0 and layer.returncode == 0, block.describe() + layer.describe()
    assert block.lines("zero3_fetch_unit=") and not layer.lines("zero3_fetch_unit=")
    # Weight decay is split by the parameters' real shapes, not ZeRO-3's flat shards.
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**json.loads(no_dropout_config.read_text())))
    decay = sum(p.numel() for p in model.parameters() if p.ndim >= 2)
    no_decay = sum(p.numel() for p in model.parameters() if p.ndim < 2)
    assert block.lines("optimizer_params") == [f"optimizer_params decay={decay} no_decay={no_decay}"]
    assert list(block.train_losses) == [2, 4, 6, 8]
    for step, loss in layer.train_losses.items():
        assert block.train_losses[step] == pytest.approx(loss, rel=1e-6), step


@pytest.mark.deepspeed
@pytest.mark.slow  # one more ZeRO-3 run on 2 processes, with Dynamo
def test_compiled_zero3_compiles_block_by_block_without_recompiling(
    zero3_runs, module_train, no_dropout_config, aot_eager
):
    """--compile under ZeRO-3 compiles each block and the loss, as under fsdp. Compiled whole, Dynamo
    traced DeepSpeed's per-block hooks and recompiled them for each block (60 recompiles and 14
    graphs on 2 CPU processes; GPT-2 XL on 4 H200s hit the recompile limit). Blocks train with
    eager ZeRO-3's losses, in 2 graphs (the blocks, the loss), and generate the sample eagerly."""
    eager, _ = zero3_runs
    flags = ["--task", "causal-lm", "--model-config", str(no_dropout_config), "--strategy", "zero3"]
    flags += ["--max-steps", "8", "--batch-size", "4", "--log-every", "2", "--lr", "2e-3", "--report-to", "none"]
    env = {**aot_eager, "TORCH_LOGS": "recompiles"}
    run = module_train(*flags, "--compile", "--generate-tokens", "8", name="z3-compiled", processes=2, env=env)
    assert run.returncode == 0, run.describe()
    assert run.lines("compile_unit=") == ["compile_unit=block blocks=2 loss=compiled"]
    assert run.lines("compiled_graphs=") == ["compiled_graphs=2"]
    assert "Recompiling function" not in run.stderr, run.describe()
    assert len(run.lines("sample=")) == 1, run.describe()
    assert eager.train_losses.keys() == run.train_losses.keys() == {2, 4, 6, 8}
    for step, loss in eager.train_losses.items():
        assert run.train_losses[step] == pytest.approx(loss, rel=1e-3), step
