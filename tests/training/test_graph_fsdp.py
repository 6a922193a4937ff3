"""fsdp's engine that shards inside the compiled graph (--compile-unit model, training/graph_fsdp.py;
the default for compiled GPU runs of 5,000+ steps): every weight a flat shard that an all-gather in the
graph turns back into the weight. Which engine a job gets and what its plan shows; on CPU processes over
gloo, that it trains like eager DDP (tied embeddings, decay groups, clipping, accumulation) and saves a
loadable model; that its checkpoints (one shard file per process) resume on another number of
processes, and refuse FSDP2 in one line; that fp16's loss scale agrees across processes. Its exact
resume after kill -9 runs through the CLI (test_local_backend.py). (A separate file from test_fsdp.py so
that pytest-xdist, which hands out whole files, can run the two engines' slow tests on different workers.)"""

from __future__ import annotations

import json

import pytest
from test_fsdp import assert_trains_like, compared_lm_flags, lm_flags

from distrain_cloud.training import checkpoint
from distrain_cloud.training.args import parse_args
from distrain_cloud.training.decisions import decide, plan_configs
from distrain_cloud.training.strategies import fsdp_in_graph, fsdp_plugin_settings

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
    assert plan_configs(decide(long, world=8, cuda=True), 8) == {
        "fsdp_sharding": "in the compiled graph, every weight a flat shard (default for 5,000+ steps compiled "
        "(--compile-unit block for FSDP2))"
    }
    blocks = parse_args(["--strategy", "fsdp", "--max-steps", "20000", "--compile-unit", "block"])
    assert plan_configs(decide(blocks, world=8, cuda=True), 8)["fsdp_plugin"] == fsdp_plugin_settings()
    base = ("submit", "--instance", "local", "--processes", "2", "--strategy", "fsdp", "--dry-run", "--json")
    r = cli(*base, "--", "--compile", "--compile-unit", "model", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["configs"]["fsdp_sharding"].endswith("(--compile-unit model)")
    # On CPUs the same long run keeps FSDP2, and so does its plan (it once said in-graph here).
    assert plan_configs(decide(long, world=2, cuda=False), 2)["fsdp_plugin"] == fsdp_plugin_settings()
    r = cli(*base, "--", "--max-steps", "20000", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    configs = json.loads(r.stdout)["configs"]
    assert "fsdp_sharding" not in configs and configs["fsdp_plugin"] == fsdp_plugin_settings()


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
    with pytest.raises(checkpoint.CheckpointError, match="lacks graph_shards_0.pt, graph_shards_1.pt: resuming"):
        checkpoint.check_resumable(path, in_graph, 1, "fsdp", "in-graph")  # another process count: resharded


@pytest.mark.slow
@pytest.mark.multiprocess
def test_in_graph_fsdp_trains_like_eager_ddp_and_saves_a_loadable_model(
    train, sharded_lm_baseline, no_dropout_config, aot_eager
):
    """The same causal-LM job (tied embeddings, clipping, 2 micro-batches a step, a generated sample at
    the end) under eager DDP (the baseline test_fsdp.py's FSDP2 is compared with too) and sharded in
    the compiled graph on 2 processes: the same losses and evaluation within rounding, one graph, and
    the full model saved from the shards, its embeddings still tied."""
    ddp = sharded_lm_baseline
    graph = train(*compared_lm_flags(no_dropout_config), *IN_GRAPH, name="lm-graph", processes=2, env=aot_eager)
    saved = assert_trains_like(ddp, graph, rel=1e-4, atol=1e-5)
    assert saved.lm_head.weight is saved.transformer.wte.weight
    # 2 blocks of 12 weights, both embeddings, the final norm's 2; the LM head shares the token embeddings'
    sharding = "fsdp_sharding=in-graph weights=28 processes=2 (--compile-unit model)"
    assert graph.lines("fsdp_sharding=") == [sharding], graph.describe()
    assert graph.lines("compile_unit=") == ["compile_unit=model"], graph.describe()
    assert graph.lines("compiled_graphs=") == ["compiled_graphs=1"], graph.describe()
    assert graph.lines("optimizer_params") == ddp.lines("optimizer_params")  # the same decay groups


@pytest.mark.parametrize("numel", [1, 5, 7, 12, 50304])
def test_shards_cut_for_another_number_of_processes_are_the_ones_that_number_would_hold(numel):
    """A checkpoint saved by n processes, resumed on m: each new shard is the slice, zero-padded,
    that sharding the whole weight for m processes would have given (Gathered.right_inverse)."""
    import torch

    from distrain_cloud.training.graph_fsdp import cut_shard

    def shards(flat, world):
        per = -(-numel // world)
        padded = torch.nn.functional.pad(flat, (0, per * world - numel))
        return [padded[r * per : (r + 1) * per] for r in range(world)]

    flat = torch.arange(1, numel + 1, dtype=torch.float32)
    for saved in (1, 2, 3, 4, 8):
        for world in (1, 2, 3, 4, 8):
            cut = [cut_shard(shards(flat, saved), numel, world, r) for r in range(world)]
            assert all(torch.equal(c, e) for c, e in zip(cut, shards(flat, world), strict=True)), (saved, world)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_in_graph_fsdp_resumes_on_another_number_of_processes(train, aot_eager, auto_as_on_gpus, no_dropout_config):
    """A spot job back on an instance with another GPU count: step 4's checkpoint of 2 processes
    resumes on 1, its shards (weights and AdamW moments) cut from both files, with twice the
    micro-batches a step (checkpoint.resume_batches), and trains on as the 2 processes did (no
    dropout: only the order of the reductions differs). Both runs leave --strategy at its default,
    auto (strategies.resolve_auto): the first decides as on GPUs, and picks the engine once the
    model is loaded and found small enough; the resumed one takes its checkpoint's engine, where on
    one process it would otherwise pick ddp. A folder missing a process's file (several nodes, no
    shared disk) is refused in one line."""
    flags = [*lm_flags(no_dropout_config), *IN_GRAPH, "--save-every", "4", "--log-every", "1"]
    auto = [*lm_flags(no_dropout_config), "--compile", "--save-every", "4", "--log-every", "1"]
    as_on_gpus = {**aot_eager, **auto_as_on_gpus(min_steps=8, max_params=10**6)}
    two = train(*auto, "--keep-checkpoints", "4", name="two", processes=2, env=as_on_gpus)
    assert two.returncode == 0, two.describe()
    picked = "auto: sharded in the compiled graph: 8 steps of 180,608 parameters on 2 GPUs of one node repay its"
    assert [line[: 15 + len(picked)] for line in two.lines("strategy=")] == [f"strategy=fsdp ({picked}"]
    assert two.lines("fsdp_sharding=")[0].startswith("fsdp_sharding=in-graph weights=28 processes=2 (auto:")
    assert two.lines("ddp_bucket_mb=") == []
    train.with_checkpoint("one", two, 4)
    on = train(*auto, name="one", env=aot_eager)
    assert on.returncode == 0, on.describe()
    assert on.lines("strategy=") == [
        "strategy=fsdp (auto: sharded in the compiled graph, as the checkpoint it resumes was trained)"
    ], on.describe()
    assert on.lines("resumed_from=") == ["resumed_from=checkpoint-00000004 step=4"], on.describe()
    assert on.lines("resumed on") == [
        "resumed on 1 process from a checkpoint of 2: --grad-accum 2 keeps its global batch of 16 (8 x 2 x 1)"
    ]
    assert sorted(on.train_losses) == [5, 6, 7, 8]
    for step, loss in on.train_losses.items():
        assert loss == pytest.approx(two.train_losses[step], rel=1e-5), (step, on.train_losses, two.train_losses)
    assert on.final_eval["eval_loss"] == pytest.approx(two.final_eval["eval_loss"], rel=1e-5)

    partial = train.with_checkpoint("partial", two, 4).checkpoint_dir / "checkpoint-00000004"
    (partial / "graph_shards_1.pt").unlink()  # never there, as on node 0 of two
    checkpoint.write_manifest(partial)
    refused = train(*flags, name="partial", env=aot_eager)
    assert refused.returncode == 2, refused.describe()
    assert "was saved by 2 processes and lacks graph_shards_1.pt: resuming with 1 instead" in refused.stderr


def test_a_checkpoint_resharded_holds_what_was_saved(tmp_path):
    """graph_fsdp.reshard, in one process: files written as 2 processes would have written a
    model's shards and AdamW state (each flat tensor halved, zero-padded) come back as the one
    process's whole state: every weight (the tied embedding once), both moments and the step."""
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    from distrain_cloud.training import graph_fsdp

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=6, vocab_size=11, n_positions=8))
        graph_fsdp.shard_model(model, torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
        optimizer.step()
        whole = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

        def half(t, r):
            per = -(-t.numel() // 2)
            return torch.nn.functional.pad(t, (0, 2 * per - t.numel()))[r * per : (r + 1) * per].clone()

        for r in (0, 1):
            moments = {
                i: {k: v if v.dim() == 0 else half(v, r) for k, v in state.items()}
                for i, state in whole["optimizer"]["state"].items()
            }
            part = {
                "model": {k: half(v, r) for k, v in whole["model"].items()},
                "optimizer": {"state": moments, "param_groups": whole["optimizer"]["param_groups"]},
            }
            torch.save(part, graph_fsdp.shard_file(tmp_path, r))
        back = graph_fsdp.reshard(tmp_path, 2, model, optimizer, world=1, rank=0)
        assert back["model"].keys() == whole["model"].keys()
        assert all(torch.equal(back["model"][k], v) for k, v in whole["model"].items())
        for i, state in whole["optimizer"]["state"].items():
            assert all(torch.equal(back["optimizer"]["state"][i][k], v) for k, v in state.items())
    finally:
        dist.destroy_process_group()


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
        scaler = agreeing_scaler(scaler, "cpu")
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

    # A fork of this process is not safe: an earlier test here ran a gloo group in it, and CI once
    # saw a forked rank die in init_process_group. A fork server is a fresh interpreter with torch
    # loaded once, so each rank still starts without torch's import.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
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
