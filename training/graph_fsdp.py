"""`--strategy fsdp` sharded inside the compiled graph (`--compile-unit model`; the default for
compiled GPU runs of 5,000+ steps, strategies.fsdp_in_graph).

FSDP2 (fsdp's other engine, training/sharded.py) gathers a unit's weights and reduce-scatters its
gradients from hooks that run between compiled blocks, and at GPT-2 small on 4 GPUs that host time
bounds the step (0.57-0.85x compiled DDP, bench/README.md). Here, as in SimpleFSDP, every weight is
instead a flat shard of 1/world of its elements, and a parametrization turns the shard back into
the weight: an all-gather by a functional collective, whose gradient is a reduce-scatter. The whole
model is then compiled once, so the gathers and reduce-scatters are ops of its graph, which Inductor
buckets together and schedules with the rest: 1.00-1.07x compiled DDP at GPT-2 small on 4 H200s and
1.72x FSDP2 at GPT-2 XL, with the gradients and optimizer state sharded (bench/README.md, session 14).
The price is the whole model's compile (90 s at small against FSDP2's 15 s, 363 s at XL) and the
whole 16-bit model gathered at the step's peak.

The shards are ordinary parameters, so AdamW, clipping and the data path are the plain ones;
what changes is that each process holds its own part of the state: it saves and loads its own file
(`save`, `load`), and the full weights are gathered once at the end (`unshard`) for the saved model,
the Hub and the generated sample. Tied weights (GPT-2's embeddings and LM head) stay one shard.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.utils import parametrize

from .sharded import clip_sharded_grads_

# Inductor's passes for collectives in the graph (torch >= 2.9): without them every weight is its own
# all-gather and reduce-scatter, 148 of each for GPT-2 small.
INDUCTOR_SETTINGS = {"bucket_all_gathers_fx": "all", "bucket_reduce_scatters_fx": "all"}


# The same collective under its torch 2.13 name; the old one warns there on every eager call.
_gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd


class Gathered(torch.nn.Module):
    """weight = the all-gather of every process's flat shard, cut to the weight's shape, in
    `dtype` (the training precision: the gathers and reduce-scatters move half the bytes)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape, self.numel, self.dtype = shape, shape.numel(), dtype

    def forward(self, shard: torch.Tensor) -> torch.Tensor:
        group = dist.group.WORLD
        assert group is not None  # shard_model ran in a process group
        full = _gather(shard.to(self.dtype), gather_dim=0, group=group)
        return full[: self.numel].view(self.shape)

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """The shard this process keeps: its slice of the flat weight, zero-padded to a multiple
        of the world size (the padding gets zero gradients, so it stays zero)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        flat = weight.detach().flatten()
        per = -(-flat.numel() // world)
        flat = torch.nn.functional.pad(flat, (0, per * world - flat.numel()))
        return flat[rank * per : (rank + 1) * per].clone()


def shard_model(model: Any, dtype: Any) -> int:
    """Make every trainable weight of `model` a flat shard gathered on use; returns how many.
    Collective, and cheap: each process keeps its slice of the weights it already holds (loaded
    from the same checkpoint or seed). A weight tied to another (one Parameter under two names)
    stays one shard, gathered under each name; its gradients add up in that shard. Each shard
    remembers the weight's shape (`full_shape`), so AdamW's decay groups are those of the model."""
    # Listed before any change: parametrizing a weight turns that Parameter into its shard in place,
    # and a tied twin is found by identity.
    weights = [
        (module, name, p, p.shape)
        for module in model.modules()
        for name, p in module.named_parameters(recurse=False)
        if p.requires_grad
    ]
    shards: dict[int, Any] = {}
    for module, name, p, shape in weights:
        tied = shards.get(id(p))
        if tied is not None:  # registered over a stand-in (the shared Parameter is a shard now), then shared
            module._parameters[name] = torch.nn.Parameter(torch.empty(shape, device="meta"))
        parametrize.register_parametrization(module, name, Gathered(shape, dtype), unsafe=True)
        slot = module.parametrizations[name]
        if tied is not None:
            slot.original = tied
            continue
        slot.original.full_shape = tuple(shape)
        shards[id(p)] = slot.original
    return len(shards)


def clip_(model: Any, max_norm: float) -> Any:
    """Clip the gradients to a total 2-norm of `max_norm` over every process's shards (one
    all-reduce of the sum of squares), as torch.nn.utils.clip_grad_norm_ does on whole gradients.
    Weights left whole (frozen ones have no gradient) would be counted once per process: there are
    none, since shard_model shards every trainable weight."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    return clip_sharded_grads_(grads, max_norm, group=dist.group.WORLD)


class AgreeingGradScaler(torch.amp.GradScaler):
    """A GradScaler whose inf/NaN check is the max over the processes (agreeing_scaler says why)."""

    # Both ways a GradScaler checks gradients (unscale_, and step's check for fused optimizers
    # when unscale_ was not called) go through _unscale_grads_.
    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        for found in per_device.values():  # one device per process: every process all-reduces once
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return per_device


def agreeing_scaler(scaler: Any, device: str) -> Any:
    """fp16's loss scaler, made to agree across processes. Each process checks only its own shards'
    gradients for inf/NaN, so with Accelerate's plain GradScaler (the one it gives a model it does
    not shard) a process whose shard overflowed would skip the step and halve its scale while the
    others stepped, and every later reduce-scatter would add gradients scaled differently. This one
    takes the max of each check over the processes, so all skip together. Same settings as
    `scaler`, which has not scaled anything yet; `device`: its device type.

    Not torch's ShardedGradScaler: its found_inf has shape [1], and fused AdamW (the trainer's on
    GPUs) subtracts it from its 0-d step counts, which fails ("output with shape [] doesn't match
    the broadcast shape [1]", 2 H200s, torch 2.11)."""
    agreeing = AgreeingGradScaler(device, enabled=scaler.is_enabled())
    if scaler.is_enabled():  # its settings (scale, growth and backoff factors, interval)
        agreeing.load_state_dict(scaler.state_dict())
    return agreeing


def shard_file(folder: Path, rank: int) -> Path:
    return folder / f"graph_shards_{rank}.pt"


def save(folder: Path, model: Any, optimizer: Any) -> None:
    """This process's part of a checkpoint: its weight shards and their optimizer state. Accelerate's
    save_state writes the rest (the main process's optimizer file, every process's RNG state)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, shard_file(folder, dist.get_rank()))


def load(folder: Path, model: Any, optimizer: Any, saved_world: int | None = None) -> None:
    """Load what `save` wrote, after Accelerate's load_state (which gives every process the main
    process's optimizer state: replaced here). Saved by as many processes as this run has, each
    process reads its own file. Saved by another number (a spot job back on another instance
    count), each process cuts its shards out of all the files (`reshard`)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if saved_world in (None, world):
        state = torch.load(shard_file(folder, rank), map_location="cpu", weights_only=True)
    else:
        state = reshard(folder, saved_world, model, optimizer, world, rank)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


def reshard(folder: Path, saved_world: int, model: Any, optimizer: Any, world: int, rank: int) -> dict[str, Any]:
    """This process's part of a checkpoint saved by `saved_world` processes, for `world`. Every
    weight and its two AdamW moments are flat, zero-padded shards in rank order, so the new shard
    is a range of their concatenation: cut from the few old shards it spans. The files are memory
    mapped, so each process reads only the ranges it keeps."""
    # checkpoint.check_resumable has made sure every file is there
    files = [shard_file(folder, r) for r in range(saved_world)]
    old = [torch.load(f, map_location="cpu", weights_only=True, mmap=True) for f in files]

    def cut(shards: list[Any], numel: int) -> Any:
        return cut_shard(shards, numel, world, rank).clone()  # out of the mapped files

    numel = {name: math.prod(p.full_shape) for name, p in model.named_parameters(remove_duplicate=False)}
    weights = {key: cut([o["model"][key] for o in old], numel[key]) for key in old[0]["model"]}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    moments: dict[int, Any] = {}
    for index, saved in old[0]["optimizer"]["state"].items():
        n = math.prod(params[index].full_shape)
        moments[index] = {
            key: value if value.dim() == 0 else cut([o["optimizer"]["state"][index][key] for o in old], n)
            for key, value in saved.items()  # `step` is the same 0-d count everywhere
        }
    return {"model": weights, "optimizer": {"state": moments, "param_groups": old[0]["optimizer"]["param_groups"]}}


def cut_shard(shards: list[Any], numel: int, world: int, rank: int) -> Any:
    """Process `rank`'s shard, for `world` processes, of a flat tensor of `numel` elements that
    `shards` hold (one per process that saved it, in rank order, each zero-padded alike). Only the
    ranges that shard spans are read."""
    per_old, per = shards[0].numel(), -(-numel // world)
    start, stop = rank * per, min((rank + 1) * per, numel)
    parts = [
        shards[k][max(start - k * per_old, 0) : min(stop - k * per_old, per_old)]
        for k in range(start // per_old, -(-stop // per_old))
    ]
    flat = torch.cat(parts) if parts else shards[0][:0]
    return torch.nn.functional.pad(flat, (0, per - flat.numel()))


def unshard(model: Any) -> None:
    """Turn every shard back into its full fp32 weight, on every process (collective): the model is
    then a plain one for saving, the Hub and generation. Ends the sharding, so only after training.
    Each shard becomes its weight in place (the same Parameter), so tied weights stay tied."""
    done: set[int] = set()
    for module in list(model.modules()):
        if not parametrize.is_parametrized(module):
            continue
        for name in list(module.parametrizations.keys()):
            slot = module.parametrizations[name]
            again = id(slot.original) in done  # a tied twin: already whole
            done.add(id(slot.original))
            for p in slot:
                p.dtype = torch.float32  # gathered in the masters' precision, not the training's
            parametrize.remove_parametrizations(module, name, leave_parametrized=not again)
    for p in model.parameters():
        if hasattr(p, "full_shape"):
            del p.full_shape
