"""fsdp by PyTorch's FSDP2: the trainer's units of consecutive transformer blocks, then
Accelerate's unit of the rest, each gathered for its forward and backward and freed after;
gradients and the fp32 weights and AdamW state stay sharded (checkpoints: one file per process).
With --fsdp-blocks-per-unit 0 the whole model is one unit (the trainer's), its forward compiled whole."""

from __future__ import annotations

from typing import Any

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from ..args import ArgumentError
from ..modeling import count_parameters
from ..sharded import (
    clip_sharded_grads_,
    shard_block_units,
    shard_local_adamw,
    shard_model_as_one_unit,
    sharded_params,
)
from ..strategies import fsdp_blocks_per_unit, fsdp_plugin_settings
from .base import Engine, transformer_blocks


class FSDP2Engine(Engine):
    weights_sharded = True
    loss_alone_without_blocks = True
    _clipped: list[Any] | None = None  # the parameters clipped on their shards, found at the first clip

    def environment(self, *, cuda: bool) -> dict[str, str]:
        return {} if cuda else {"ACCELERATE_USE_CPU": "true"}  # gloo, as node_launch asks on CPU

    def accelerator_settings(self, world: int, *, cuda: bool) -> tuple[dict[str, Any], str | None]:
        self.plugin = FullyShardedDataParallelPlugin(**fsdp_plugin_settings())
        return {"fsdp_plugin": self.plugin}, None

    def accelerator_built(self, accelerator: Any) -> None:
        """Make sure accelerate runs `fsdp` as FSDP. Accelerate 1.x turns its plugin on only for
        GPU-like devices (its state lists MULTI_GPU, MULTI_XPU, ... but not MULTI_CPU) and otherwise
        quietly runs plain DDP, while FSDP2 itself shards over gloo on CPU: on CPU the state is set to
        FSDP here, in both of accelerate's shared states (AcceleratorState copies PartialState's on
        every construction), so CPU jobs and tests run the sharding, checkpoints and saves of GPU jobs."""
        state = accelerator.state
        if state.distributed_type == DistributedType.FSDP:
            return
        if state.distributed_type != DistributedType.MULTI_CPU:
            raise ArgumentError(
                f"--strategy fsdp needs a process group, but accelerate runs {state.distributed_type.value}: "
                "start it with distrain-cloud submit or node_launch"
            )
        state.fsdp_plugin = self.plugin
        state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    def shard(self, model: Any, accelerator: Any) -> None:
        """Shard the transformer blocks in units of several consecutive blocks
        (strategies.fsdp_blocks_per_unit), before Accelerate shards the rest of the model; with
        --fsdp-blocks-per-unit 0, the whole model as one unit."""
        blocks = transformer_blocks(model)
        if self.args.fsdp_blocks_per_unit == 0:  # its hooks on the root alone, around the forward
            # Made here: Accelerate's would carve the embeddings and the final norm and head into
            # units of their own, whose hooks would break the compiled forward (compile below).
            plugin, mixed = accelerator.state.fsdp_plugin, accelerator.mixed_precision != "no"
            shard_model_as_one_unit(model, plugin, mixed_precision=mixed)
            self.say(f"fsdp_shard_unit=model blocks={len(blocks)} blocks_per_unit=0 units=1")
            if self.decisions.fsdp_units_why:  # the model's size decided it: say so
                self.say(f"fsdp: FSDP2 ({self.decisions.fsdp_units_why})")
            return
        if not blocks:
            self.say("fsdp_shard_unit=model blocks=0")
            return
        per_unit = fsdp_blocks_per_unit(self.args.fsdp_blocks_per_unit, len(blocks), count_parameters(blocks[0]))
        acc, name = accelerator, type(blocks[0]).__name__  # before FSDP renames it FSDP<name>
        units = shard_block_units(blocks, per_unit, acc.state.fsdp_plugin, mixed_precision=acc.mixed_precision != "no")
        self.say(f"fsdp_shard_unit={name} blocks={len(blocks)} blocks_per_unit={per_unit} units={units}")
        if acc.device.type == "cuda":  # where the other engine is an option worth naming
            self.say(f"fsdp: FSDP2 ({self.decisions.engine_why})")

    def compile(self, accelerator: Any, model: Any, backend: Any) -> tuple[Any, Any]:
        """The model's forward compiled whole, beneath its one unit's hooks (--fsdp-blocks-per-unit 0).

        FSDP2 runs a unit's hooks (gather its weights, and after the backward reduce-scatter its
        gradients) eagerly, and every module of a unit carries them, so units of blocks split a
        compiled model into a graph a block, each called from Python (12 for GPT-2 small, about
        24 ms of a 58 ms step's host time on 2 H200s, bench/README.md, session 28). With the model
        one unit, its hooks sit on the root, around `forward`: the forward and backward are each
        one graph, as compiled DDP's, and the weights are gathered once a step, for the whole step,
        and the gradients reduce-scattered once, after the backward."""
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.forward = torch.compile(unwrapped.forward, backend=backend)
        self.say("compile_unit=model (inside FSDP2's one unit)")
        return model, None

    def optimizer(self, groups: list[dict[str, Any]], lr: float, accelerator: Any) -> Any:
        return shard_local_adamw(groups, lr=lr)

    def clip(self, accelerator: Any, model: Any, max_norm: float) -> None:
        """On the local shards (training/sharded.py)."""
        if self._clipped is None:
            self._clipped = sharded_params(model.parameters()) or []
        grads = [p.grad for p in self._clipped if p.grad is not None]
        if not grads:  # nothing sharded to clip: the general way (which also has nothing to do if no grads)
            accelerator.clip_grad_norm_(model.parameters(), max_norm)
            return
        accelerator.unscale_gradients()  # fp16's loss scale first, once, as Accelerate's own clipping does
        clip_sharded_grads_(grads, max_norm)
