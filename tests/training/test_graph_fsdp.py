"""fsdp's engine that shards inside the compiled graph (--compile-unit model, training/graph_fsdp.py;
the default for compiled GPU runs of 5,000+ steps): every weight a flat shard that an all-gather in the
graph turns back into the weight. Which engine a job gets and what its plan shows; on CPU processes over
gloo, that it trains like eager DDP (tied embeddings, decay groups, clipping, accumulation), saves a
loadable model, resumes exactly after kill -9 from one shard file per process, and refuses FSDP2's
checkpoints and other world sizes in one line. (A separate file from test_fsdp.py so that pytest-xdist,
which hands out whole files, can run the two engines' slow tests on different workers.)"""

from __future__ import annotations

import json

import pytest
from test_fsdp import RESUME_FLAGS, assert_resumed_exactly, assert_trains_like, lm_flags

from distrain_cloud.training import checkpoint
from distrain_cloud.training.args import parse_args
from distrain_cloud.training.strategies import Strategy, fsdp_in_graph, fsdp_plugin_settings, plan_configs

IN_GRAPH = ["--strategy", "fsdp", "--compile", "--compile-unit", "model"]


@pytest.mark.parametrize(
    ("flags", "cuda", "in_graph", "why"),
    [
        (["--max-steps", "5000"], True, True, "default for 5,000+ steps compiled (--compile-unit block for FSDP2)"),
        (["--max-steps", "4999"], True, False, "default: FSDP2, whose first compile is shorter, below 5,000"),
        (["--epochs", "3"], True, False, "default: FSDP2, whose first compile is shorter"),  # length unknown yet
        (["--max-steps", "9000"], False, False, "default: FSDP2 when not compiled on GPUs"),
        (["--max-steps", "9000", "--no-compile"], True, False, "default: FSDP2 when not compiled on GPUs"),
        (["--max-steps", "9000", "--compile-unit", "block"], True, False, "--compile-unit block"),
        (["--max-steps", "9000", "--fsdp-blocks-per-unit", "2"], True, False, "--fsdp-blocks-per-unit sizes FSDP2"),
        (["--max-steps", "10", "--compile-unit", "model"], False, True, "--compile-unit model"),
    ],
)
def test_fsdp_shards_in_the_graph_by_default_for_long_compiled_runs_on_gpus(flags, cuda, in_graph, why):
    decided, reason = fsdp_in_graph(parse_args(["--strategy", "fsdp", *flags]), cuda=cuda)
    assert decided is in_graph and reason.startswith(why), reason


def test_the_plan_shows_the_fsdp_engine_a_gpu_job_gets(cli, tmp_path):
    long = parse_args(["--strategy", "fsdp", "--max-steps", "20000"])
    assert plan_configs(Strategy.fsdp, long, 8) == {
        "fsdp_sharding": "in the compiled graph, every weight a flat shard (default for 5,000+ steps compiled "
        "(--compile-unit block for FSDP2))"
    }
    blocks = parse_args(["--strategy", "fsdp", "--max-steps", "20000", "--compile-unit", "block"])
    assert plan_configs(Strategy.fsdp, blocks, 8)["fsdp_plugin"] == fsdp_plugin_settings()
    base = ("submit", "--instance", "local", "--processes", "2", "--strategy", "fsdp", "--dry-run", "--json")
    r = cli(*base, "--", "--compile", "--compile-unit", "model", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["configs"]["fsdp_sharding"].endswith("(--compile-unit model)")


def test_checkpoints_of_one_fsdp_engine_refuse_the_other(tmp_path):
    path = tmp_path / "checkpoint-00000004"
    in_graph = {"strategy": "fsdp", "world_size": 2, "sharding": "in-graph"}
    checkpoint.check_resumable(path, in_graph, 2, "fsdp", "in-graph")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.check_resumable(path, in_graph, 2, "fsdp")
    assert str(e.value) == (
        f"checkpoint-00000004 in {tmp_path} was saved with --strategy fsdp --compile-unit model, which stores its "
        "state differently from --strategy fsdp: resume with --strategy fsdp --compile-unit model, or move the "
        "checkpoints away to start over"
    )
    fsdp2 = {"strategy": "fsdp", "world_size": 2}
    with pytest.raises(checkpoint.CheckpointError, match="resume with --strategy fsdp, or move"):
        checkpoint.check_resumable(path, fsdp2, 2, "fsdp", "in-graph")
    with pytest.raises(checkpoint.CheckpointError, match="splits its state across processes, but this run has 1"):
        checkpoint.check_resumable(path, in_graph, 1, "fsdp", "in-graph")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_in_graph_fsdp_trains_like_eager_ddp_and_saves_a_loadable_model(train, no_dropout_config, aot_eager):
    """The same causal-LM job (tied embeddings, clipping, 2 micro-batches a step, a generated sample at
    the end) under eager DDP and sharded in the compiled graph on 2 processes: the same losses and
    evaluation within rounding, one graph, and the full model saved from the shards, its embeddings
    still tied."""
    flags = [*lm_flags(no_dropout_config), "--grad-accum", "2"]  # the shards' gradients add up
    ddp, graph = train.many(
        [
            {"flags": [*flags, "--strategy", "ddp"], "name": "lm-ddp", "processes": 2},
            {"flags": [*flags, *IN_GRAPH], "name": "lm-graph", "processes": 2, "env": aot_eager},
        ],
        parallel=1,
    )
    saved = assert_trains_like(ddp, graph, rel=1e-4, atol=1e-5)
    assert saved.lm_head.weight is saved.transformer.wte.weight
    # 2 blocks of 12 weights, both embeddings, the final norm's 2; the LM head shares the token embeddings'
    sharding = "fsdp_sharding=in-graph weights=28 processes=2 (--compile-unit model)"
    assert graph.lines("fsdp_sharding=") == [sharding], graph.describe()
    assert graph.lines("compile_unit=") == ["compile_unit=model"], graph.describe()
    assert graph.lines("compiled_graphs=") == ["compiled_graphs=1"], graph.describe()
    assert graph.lines("optimizer_params") == ddp.lines("optimizer_params")  # the same decay groups


@pytest.mark.slow
@pytest.mark.multiprocess
def test_in_graph_fsdp_killed_and_resumed_matches_the_uninterrupted_one(train, aot_eager):
    """kill -9 after step 5; the rerun resumes from step 4's checkpoint, one shard file per process
    (its weights and optimizer state), and ends bit for bit where the uninterrupted run does.
    Resuming with one process, or with FSDP2's fsdp, is refused in one line."""
    flags = [*RESUME_FLAGS, "--compile", "--compile-unit", "model"]
    whole = train(*flags, name="graph-whole", processes=2, env=aot_eager)
    assert whole.returncode == 0, whole.describe()
    killed = train(*flags, name="graph-killed", processes=2, env={**aot_eager, "DISTRAIN_TEST_KILL_AT_STEP": "5"})
    assert killed.returncode != 0 and max(killed.train_losses) == 5, killed.describe()
    (ckpt,) = [p for p in killed.contract.complete_checkpoints() if p.name == "checkpoint-00000004"]
    assert sorted(p.name for p in ckpt.glob("graph_shards_*.pt")) == ["graph_shards_0.pt", "graph_shards_1.pt"]

    alone = train(*flags, name="graph-killed", env=aot_eager)
    assert alone.returncode == 2, alone.describe()
    assert "which splits its state across processes, but this run has 1: run it with 2 processes" in alone.stderr
    fsdp2 = train(*RESUME_FLAGS, name="graph-killed", processes=2)
    assert fsdp2.returncode == 2, fsdp2.describe()
    assert "resume with --strategy fsdp --compile-unit model" in fsdp2.stderr

    again = train(*flags, name="graph-killed", processes=2, env=aot_eager)
    assert again.returncode == 0, again.describe()
    assert_resumed_exactly(again, whole)


def _overflow_on_rank_1(rank: int, store: str, agree: bool, clip: bool, out) -> None:
    """One fp16-style optimizer step on 2 gloo processes, each holding its own shard, where only
    rank 1's gradient overflowed, in the trainer's order: unscale_ when it clips, then step, update."""
    import torch
    import torch.distributed as dist

    from distrain_cloud.training.graph_fsdp import agreeing_scaler

    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    shard = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([shard], lr=0.1, fused=True)  # as the trainer makes it on GPUs
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)  # as Accelerate would make it
    if agree:
        scaler = agreeing_scaler(scaler)
    scaler.scale((shard * (float("inf") if rank == 1 else 1.0)).sum()).backward()
    if clip:
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    out.put((rank, shard.detach().tolist(), scaler.get_scale(), scaler.get_growth_interval()))
    dist.destroy_process_group()


@pytest.mark.slow  # 2 s each here, two processes
@pytest.mark.parametrize(("agree", "clip"), [(True, True), (True, False), (False, True)])
def test_under_fp16_every_process_skips_a_step_that_overflowed_on_one_shard(tmp_path, agree, clip):
    """Each process checks only its own shards for inf/NaN. The engine's scaler takes the max over
    the processes, so all skip the step and halve the scale together; Accelerate's plain one (the
    control, agree=False) lets rank 0 step at the old scale while rank 1 backs off, after which
    every reduce-scatter would add gradients scaled differently."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # no CUDA here; fork spares each process torch's import
    out = ctx.Queue()
    store = str(tmp_path / "store")
    procs = [ctx.Process(target=_overflow_on_rank_1, args=(r, store, agree, clip, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = {r: tuple(rest) for r, *rest in (out.get(timeout=60) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    skipped = ([1.0] * 4, 512.0, 7)
    if agree:
        assert results == {0: skipped, 1: skipped}
    else:
        assert results[1] == skipped and results[0][1:] == (1024.0, 7) and results[0][0] != [1.0] * 4
