"""An experiment for issue 15 P4: sharding compiled into the model's graph, against compiled DDP.

The `fsdp` strategy (FSDP2) runs its all-gathers and reduce-scatters from hooks between compiled
regions, and at GPT-2 small on 4 GPUs its step is bound by that host time (0.57-0.73x compiled DDP,
bench/README.md). Here every parameter is instead a flat fp32 shard whose full weight a
parametrization all-gathers (a functional collective, whose gradient is a reduce-scatter); the
whole model is compiled once, so the collectives are ops in its graph, which Inductor schedules
with the rest. That is the idea of SimpleFSDP; this script measures whether it is worth a strategy.

    torchrun --standalone --nproc-per-node 2 bench/graph_sharding.py --cpu     # losses of every side, gloo
    torchrun --standalone --nproc-per-node 4 bench/graph_sharding.py           # GPUs: tokens/s, peak

Sides (SIDES): compiled DDP as the trainer's default; the sharded model with one collective per weight;
with Inductor's collective bucketing; with bucketing and its compute/communication reordering; and
with bucketing and the weights gathered again for the backward instead of kept (selective
checkpointing: ZeRO-3's memory, as SimpleFSDP does); and each transformer block compiled alone, the
rest eager (a short compile), with and without that recompute. Every side trains the same GPT-2 (untied
embeddings, so each weight has one owner), bf16 autocast on GPUs (the gathers and reduce-scatters in
bf16), AdamW, the same data; one table row each. Not a strategy: no checkpoints, no evaluation.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.utils import parametrize
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import REQUIRED_ENV  # noqa: E402


def _gather_again(ctx, op, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Selective checkpointing's policy: the gather (and its cast) run again in the backward."""
    from torch.utils.checkpoint import CheckpointPolicy

    again = (
        torch.ops._c10d_functional.all_gather_into_tensor.default,
        torch.ops._c10d_functional.wait_tensor.default,
        torch.ops.aten._to_copy.default,
    )
    return CheckpointPolicy.MUST_RECOMPUTE if op in again else CheckpointPolicy.PREFER_SAVE


class Gathered(torch.nn.Module):
    """weight = all-gather of every process's flat shard, cut to the weight's shape, in `dtype`;
    with `recompute`, gathered again for the backward instead of kept (ZeRO-3's memory)."""

    def __init__(self, shape: torch.Size, numel: int, dtype: torch.dtype, recompute: bool) -> None:
        super().__init__()
        self.shape, self.numel, self.dtype, self.recompute = shape, numel, dtype, recompute

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        full = funcol.all_gather_tensor_autograd(shard.to(self.dtype), gather_dim=0, group=dist.group.WORLD)
        return full[: self.numel].view(self.shape)

    def forward(self, shard: torch.Tensor) -> torch.Tensor:
        if not self.recompute:
            return self.gather(shard)
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        context = functools.partial(create_selective_checkpoint_contexts, _gather_again)  # Dynamo traces a partial
        return checkpoint(self.gather, shard, use_reentrant=False, context_fn=context)

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:  # the shard this process keeps
        world, rank = dist.get_world_size(), dist.get_rank()
        flat = weight.detach().flatten()
        per = -(-flat.numel() // world)
        flat = torch.nn.functional.pad(flat, (0, per * world - flat.numel()))
        return flat[rank * per : (rank + 1) * per].clone()


# Inductor's passes for graph-placed collectives (names of torch 2.13; those a torch lacks are skipped
# and the row says so): one all-gather and one reduce-scatter per parameter otherwise.
SIDES = {
    "ddp": {},
    "graph-sharded": {},
    "graph-bucketed": {"bucket_all_gathers_fx": "all", "bucket_reduce_scatters_fx": "all"},
    "graph-overlap": {
        "bucket_all_gathers_fx": "all",
        "bucket_reduce_scatters_fx": "all",
        "reorder_for_compute_comm_overlap": True,
    },
    # and the gathered weights not kept for the backward, but gathered again (as ZeRO-3 and fsdp do)
    "graph-bucketed-recompute": {"bucket_all_gathers_fx": "all", "bucket_reduce_scatters_fx": "all"},
    # each transformer block compiled on its own (one graph serves all 12, their weights its inputs),
    # the rest eager: the compile of one block instead of the whole model's (95-121 s on 4 H200s,
    # session 13), each block's gathers and reduce-scatters bucketed inside its graph
    "graph-blocks": {"bucket_all_gathers_fx": "all", "bucket_reduce_scatters_fx": "all"},
    "graph-blocks-recompute": {"bucket_all_gathers_fx": "all", "bucket_reduce_scatters_fx": "all"},
}


def inductor_settings(side: str) -> tuple[dict, list[str]]:
    """`side`'s Inductor options this torch has, and the names of those it lacks."""
    import torch._inductor.config as config

    wanted = SIDES[side]
    return {k: v for k, v in wanted.items() if k in config._config}, [k for k in wanted if k not in config._config]


def shard_in_graph(model: torch.nn.Module, dtype: torch.dtype, recompute: bool, skip: str | None = None) -> None:
    """Every weight of `model` (but those under the module named `skip`) a parametrized shard."""
    for path, module in list(model.named_modules()):
        if skip and path.startswith(skip):
            continue
        for name, p in list(module.named_parameters(recurse=False)):
            gathered = Gathered(p.shape, p.numel(), dtype, recompute)
            parametrize.register_parametrization(module, name, gathered, unsafe=True)


class ShardedBlock(torch.nn.Module):
    """A transformer block whose weights are flat shards, run through one shared template block.

    A parametrization gives each module a class of its own, so Dynamo compiles every parametrized
    block again; here every block is this one class and calls the same compiled function with its
    shards as inputs, so one graph serves all blocks (gather, block, and in the backward the
    reduce-scatters, bucketed inside it)."""

    def __init__(self, block, template, dtype: torch.dtype, recompute: bool, fn) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.template, self.fn = [template], fn  # template in a list: not a submodule, its weights not ours
        params = dict(block.named_parameters())
        self.names = list(params)
        self.gathers = [Gathered(p.shape, p.numel(), dtype, recompute) for p in params.values()]
        shards = [g.right_inverse(p) for g, p in zip(self.gathers, params.values(), strict=True)]
        self.shards = torch.nn.ParameterList([torch.nn.Parameter(s) for s in shards])

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.fn(self.template[0], self.names, self.gathers, list(self.shards), args, kwargs)


def run_block(template, names, gathers, shards, args, kwargs):  # type: ignore[no-untyped-def]
    weights = {n: g(s) for n, g, s in zip(names, gathers, shards, strict=True)}
    return torch.func.functional_call(template, weights, args, kwargs)


def shard_blocks(model: GPT2LMHeadModel, dtype: torch.dtype, recompute: bool, backend: str) -> None:
    """Each block a ShardedBlock over one compiled function; the other weights parametrized, eager."""
    blocks = model.transformer.h
    template = blocks[0]
    fn = torch.compile(run_block, backend=backend)
    sharded = [ShardedBlock(b, template, dtype, recompute, fn) for b in blocks]
    model.transformer.h = torch.nn.ModuleList(sharded)
    shard_in_graph(model, dtype, recompute, skip="transformer.h")
    template.requires_grad_(False)  # its own weights are never used: functional_call replaces them


def build(args: argparse.Namespace, device: torch.device) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    if args.cpu:
        config = GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=512, n_positions=args.seq)
    else:
        config = GPT2Config(n_positions=args.seq)  # GPT-2 small
    config.tie_word_embeddings = False
    config.use_cache = False  # as the trainer trains: no KV cache (shared blocks would share its layer 0, too)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = GPT2LMHeadModel(config).to(device)
    model.loss_type = "ForCausalLM"  # as the trainer does: transformers' warning about it breaks the graph
    return model


def run(side: str, args: argparse.Namespace, device: torch.device) -> dict:
    world = dist.get_world_size()
    model = build(args, device)
    cuda = device.type == "cuda"
    if side == "ddp":  # as the trainer's compiled default: one 1000 MB bucket
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1000, gradient_as_bucket_view=True)
        scale = 1.0
    backend = "inductor" if cuda or args.inductor else "aot_eager"
    dtype, recompute = torch.bfloat16 if cuda else torch.float32, side.endswith("recompute")
    if side.startswith("graph-blocks"):
        shard_blocks(model, dtype, recompute, backend)
        scale = 1.0 / world  # the reduce-scatter sums; DDP averages
        compiled = model
    elif side != "ddp":
        shard_in_graph(model, dtype, recompute)
        scale = 1.0 / world
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, fused=cuda)
    if not side.startswith("graph-blocks"):
        compiled = torch.compile(model, backend=backend)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    vocab = model.module.config.vocab_size if side == "ddp" else model.config.vocab_size
    autocast = torch.autocast("cuda", torch.bfloat16) if cuda else contextlib.nullcontext()
    losses, times, first = [], [], 0.0
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            loss = compiled(input_ids=ids, labels=ids).loss
        (loss * scale).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if step == 0:
            first = time.perf_counter() - start  # the compile, mostly
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())
    from torch._dynamo.utils import counters

    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    step_s = sorted(times)[len(times) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return {"side": side, "losses": losses, "step_ms": step_s * 1e3,
            "tokens_per_s": args.batch * args.seq * world / step_s, "peak_gib": peak, "first_step_s": first,
            "graphs": graphs, "breaks": breaks}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="gloo, a 4-layer model, aot_eager: the losses only")
    p.add_argument("--inductor", action="store_true", help="with --cpu: Inductor's C++ code instead of aot_eager")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    if args.cpu:
        args.batch, args.seq, args.steps, args.warmup = 4, 32, 4, 1
    os.environ.update(REQUIRED_ENV)  # NVLink multicast off, whatever torchrun was given; before NCCL reads it
    dist.init_process_group("gloo" if args.cpu else "nccl")
    device = torch.device("cpu")
    if not args.cpu:
        device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    if dist.get_rank() == 0:  # a row as each side ends: a time limit cuts sides, not the ones done
        print("| side | tokens/s | step ms | first step s | peak GiB | graphs | graph breaks | last losses |")
        print("|---|---|---|---|---|---|---|---|", flush=True)
    for side in args.sides.split(","):
        torch._dynamo.reset()
        counters.clear()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        settings, missing = inductor_settings(side)
        with inductor_config.patch(settings):
            r = run(side, args, device)
        if dist.get_rank() == 0:
            losses = " ".join(f"{x:.4f}" for x in r["losses"][-4:])
            side += f" (this torch lacks {', '.join(missing)})" if missing else ""
            print(
                f"| {side} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {r['first_step_s']:.1f} "
                f"| {r['peak_gib']:.2f} | {r['graphs']} | {r['breaks']} | {losses} |",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
