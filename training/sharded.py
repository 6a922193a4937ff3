"""Host-light helpers for `--strategy fsdp` (FSDP2), whose parameters and gradients are DTensors.

Units of several transformer blocks (`shard_block_units`) run FSDP2's per-unit hooks fewer times.

Every operator on a DTensor goes through its Python dispatcher (sharding propagation, then the
local operator): cheap once, costly a few hundred times a step. Once compiled, a 124M model's
GPU work per step is short enough that this host time sets the pace; on 2 H100s the clipping of
`torch.nn.utils.clip_grad_norm_` on DTensors (what Accelerate calls) took about 19 ms of host
time per step (bench/README.md, session 7). Here the same arithmetic runs on the local shards
with one all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard


def sharded_params(parameters: Iterable[Any]) -> list[Any] | None:
    """The trainable parameters, when every one is a DTensor sharded along one mesh dimension
    (FSDP2's Shard(0)) of one mesh, as their gradients then are; else None (a replicated or plain
    one would be counted once per process): the caller then clips the general way. Decided once
    per run (FSDP2 never changes a placement): checked on every step's gradients instead, they made
    the clip's host time 0.95-1.78 ms a step against 0.74-0.87 over GPT-2 small's 148 tensors on 2
    gloo processes (bench/shard_adamw.py, four runs), in a compiled FSDP2 step bound by its host."""
    params = [p for p in parameters if p.requires_grad]
    if not params or not all(isinstance(p, DTensor) for p in params):
        return None
    mesh = params[0].device_mesh
    if mesh.ndim != 1 or any(p.device_mesh != mesh or tuple(p.placements) != (Shard(0),) for p in params):
        return None
    return params


def clip_sharded_grads_(grads: list[Any], max_norm: float, group: Any = None) -> Any:
    """Clip the gradients of `sharded_params` to a total 2-norm of `max_norm`, as torch.nn.utils.clip_grad_norm_
    does (coefficient max_norm / (norm + 1e-6), at most 1), and return the total norm. `group`: the
    processes that hold the shards, by default the DTensors' mesh (plain shards name theirs)."""
    local = [_local(g) for g in grads]
    # Sum of squares of this process's shards, in fp32 whatever the gradients' type, then of all.
    squares = torch.stack([n.float() for n in torch._foreach_norm(local, 2.0)]).square().sum()
    dist.all_reduce(squares, group=group if group is not None else grads[0].device_mesh.get_group())
    total = squares.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(local, coef.to(local[0].dtype))
    return total


def _local(t: Any) -> Any:
    """A DTensor's local shard (its attribute: to_local() is an autograd call), else `t`."""
    return getattr(t, "_local_tensor", t)


def shard_local_adamw(groups: list[dict[str, Any]], lr: float) -> Any:
    """torch's fused AdamW over FSDP2's DTensor parameters, stepping on their local shards.

    torch.optim.AdamW(fused=True) hands its lists of DTensors (parameters, gradients, both
    moments: about 600 for GPT-2 small) to one fused operator through DTensor's dispatcher, which
    unwraps each and propagates their sharding on every step: 2.7-2.8 ms of host time a step against
    0.9 ms for the same kernel on the local shards (2 gloo processes, GPT-2 small's 148 tensors:
    bench/shard_adamw.py, bench/README.md, session 9). AdamW is elementwise, so each shard updates alone. The state is
    AdamW's own (step, exp_avg, exp_avg_sq, created as it creates them), so checkpoints, resume and
    Accelerate's sharded optimizer state are unchanged."""

    class ShardLocalAdamW(torch.optim.AdamW):
        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            # AdamW's defaults only (no amsgrad, maximize, capturable, differentiable): the trainer
            # makes this optimizer below and asks for none of them.
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            # Set by a GradScaler (fp16) that sees _step_supports_amp_scaling, as for fused AdamW.
            grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
            for group in self.param_groups:
                by_kind: dict[tuple[Any, Any], list[list[Any]]] = {}
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:  # as AdamW(fused=True) makes it
                        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    local = _local(p)
                    lists = by_kind.setdefault((local.device, local.dtype), [[], [], [], [], []])
                    tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
                    for bucket, t in zip(lists, tensors, strict=True):
                        bucket.append(_local(t))
                beta1, beta2 = group["betas"]
                for params, grads, exp_avgs, exp_avg_sqs, steps in by_kind.values():
                    torch._foreach_add_(steps, 1)
                    torch._fused_adamw_(
                        params,
                        grads,
                        exp_avgs,
                        exp_avg_sqs,
                        [],
                        steps,
                        amsgrad=False,
                        lr=group["lr"],
                        beta1=beta1,
                        beta2=beta2,
                        weight_decay=group["weight_decay"],
                        eps=group["eps"],
                        maximize=False,
                        grad_scale=grad_scale,
                        found_inf=found_inf,
                    )
                    if found_inf is not None:  # a skipped step does not count
                        torch._foreach_sub_(steps, [found_inf] * len(steps))
            return loss

    return ShardLocalAdamW(groups, lr=lr, fused=True)


def _upcast_for_mixed_precision(module: Any) -> None:
    """FSDP2 keeps fp32 master weights under mixed precision (its policy casts them for compute);
    Accelerate upcasts the parameters it shards, but not those of units made before it."""
    for p in module.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()


def shard_model_as_one_unit(model: Any, plugin: Any, *, mixed_precision: bool) -> None:
    """fully_shard the whole model as its only FSDP2 unit (--fsdp-blocks-per-unit 0), with Accelerate's
    settings for its root (its offload and mixed precision; resharding left to FSDP2, which keeps
    the root's weights gathered from the forward through the backward). Accelerate then leaves it
    as it is."""
    if mixed_precision:
        _upcast_for_mixed_precision(model)
    fully_shard(
        model, offload_policy=plugin.cpu_offload, mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy()
    )


def shard_block_units(blocks: list[Any], per_unit: int, plugin: Any, *, mixed_precision: bool) -> int:
    """fully_shard each run of `per_unit` consecutive transformer `blocks` as one FSDP2 unit, with
    the settings Accelerate gives the units it makes itself (its `plugin`: resharding, offload,
    mixed precision), before Accelerate shards the rest: it leaves modules that are already FSDP
    units alone, and still makes the embeddings, final norm and LM head one unit and the model
    the root. Returns the number of units."""
    if mixed_precision:  # as Accelerate upcasts the rest, but after these units are made
        for block in blocks:
            _upcast_for_mixed_precision(block)
    kwargs = {
        "reshard_after_forward": plugin.reshard_after_forward,
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    }
    units = [blocks[i : i + per_unit] for i in range(0, len(blocks), per_unit)]
    for i, unit in enumerate(units):
        # The last unit's backward comes right after the head's, so freeing its weights after its
        # forward only to gather them again a moment later costs an all-gather (and its host
        # time: about a tenth of a GPT-2-small step's) for no lower peak: the peak is where the
        # backward starts, and the weights are gathered there either way (launcher/memory.py
        # counts two units). It keeps them, as FSDP2 does for the root.
        last = {"reshard_after_forward": False} if i == len(units) - 1 else {}
        fully_shard(unit if len(unit) > 1 else unit[0], **(kwargs | last))
    return len(units)
