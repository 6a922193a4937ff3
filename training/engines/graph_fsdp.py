"""fsdp sharded inside the compiled graph (training/graph_fsdp.py): every weight a flat shard that
an all-gather in the model's graph turns back into the weight. The model stays outside
Accelerate's prepare (DDP would all-reduce the shards), so this engine places it, runs its forward
under the training precision's autocast, and saves and loads its shards itself."""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist

from .. import graph_fsdp
from .base import Engine


class GraphFSDPEngine(Engine):
    weights_sharded = True

    def environment(self, *, cuda: bool) -> dict[str, str]:
        return {} if cuda else {"ACCELERATE_USE_CPU": "true"}  # gloo, as node_launch asks on CPU

    def shard(self, model: Any, accelerator: Any) -> None:
        acc = accelerator
        if not dist.is_initialized():  # one process: Accelerate starts no group, the gathers need one
            timeout = datetime.timedelta(seconds=self.args.collective_timeout)
            dist.init_process_group("nccl" if acc.device.type == "cuda" else "gloo", timeout=timeout)
        model.to(acc.device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(acc.mixed_precision, torch.float32)
        weights = graph_fsdp.shard_model(model, dtype)
        if acc.mixed_precision != "no":
            model.forward = torch.autocast(acc.device.type, dtype=dtype)(model.forward)
        why = self.decisions.engine_why
        self.say(f"fsdp_sharding=in-graph weights={weights} processes={acc.num_processes} ({why})")

    def prepare(self, accelerator: Any, model: Any, optimizer: Any, train_dl: Any, eval_dl: Any) -> tuple:
        if accelerator.scaler is not None:  # fp16: every process skips an overflowing step, or none
            accelerator.scaler = graph_fsdp.agreeing_scaler(accelerator.scaler, accelerator.device.type)
        optimizer, train_dl, eval_dl = accelerator.prepare(optimizer, train_dl, eval_dl)
        return model, optimizer, train_dl, eval_dl

    def compile(self, accelerator: Any, model: Any, backend: Any) -> tuple[Any, Any]:
        # The shards' gathers and reduce-scatters bucketed in the graph.
        for key, value in graph_fsdp.INDUCTOR_SETTINGS.items():
            if hasattr(inductor_config, key):  # torch >= 2.9
                setattr(inductor_config, key, value)
        return super().compile(accelerator, model, backend)

    def clip(self, accelerator: Any, model: Any, max_norm: float) -> None:
        accelerator.unscale_gradients()  # fp16's loss scale first, as Accelerate's own clipping does
        graph_fsdp.clip_(model, max_norm)

    def save_extras(self, folder: Any, accelerator: Any, model: Any, optimizer: Any) -> None:
        graph_fsdp.save(folder, accelerator.unwrap_model(model, keep_torch_compile=False), optimizer)

    def load_extras(self, folder: Any, accelerator: Any, model: Any, optimizer: Any, saved: dict[str, Any]) -> None:
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
        graph_fsdp.load(folder, unwrapped, optimizer, saved.get("world_size"))

    def full_state_dict(self, accelerator: Any, model: Any, optimizer: Any) -> tuple[Any, dict[str, Any]]:
        """Collective: the full weights, in place, for the model, the Hub and the sample."""
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)  # names without compile's prefix
        optimizer.state.clear()  # training is over: its memory makes room for the weights
        graph_fsdp.unshard(unwrapped)
        return unwrapped, unwrapped.state_dict()
