"""Host time of fsdp's optimizer step and clip, each beside its baseline in the same run, over
GPT-2 small's 148 parameter tensors at width 64 (so the arithmetic is small and the time is the
host's: DTensor dispatch, list building):
- the step: torch's fused AdamW over FSDP2's DTensors (what fsdp used before) against
  training/sharded.shard_local_adamw (the same kernel on the local shards);
- the clip: every gradient's placement checked each step (what fsdp's clip did through session 27)
  against the parameters found once (training/sharded.sharded_params, as FSDP2Engine.clip keeps
  them), both clipping with sharded.clip_sharded_grads_.

    torchrun --standalone --nproc-per-node 2 bench/shard_adamw.py          # CPU processes over gloo, ~20 s

Not a GPU measurement: it sizes a host cost; the GPU machines say what it is worth there.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard
from transformers import GPT2Config, GPT2LMHeadModel

from distrain_cloud.training.sharded import clip_sharded_grads_, shard_local_adamw, sharded_params


def ms_per_step(step, steps: int = 50) -> float:
    step()  # warm: the state exists
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def clip_checking_each_step(params) -> None:
    """The clip as it was: the gradients' placements checked on every step."""
    grads = [p.grad for p in params if p.grad is not None]
    mesh = grads[0].device_mesh
    assert all(isinstance(g, DTensor) for g in grads) and mesh.ndim == 1
    assert not any(g.device_mesh != mesh or tuple(g.placements) != (Shard(0),) for g in grads)
    clip_sharded_grads_(grads, 1e9)


def clip_decided_once(params) -> None:
    """The clip now: the sharded parameters were found once; each step takes their gradients."""
    clip_sharded_grads_([p.grad for p in params if p.grad is not None], 1e9)


def main() -> None:
    dist.init_process_group("gloo")
    times = {}
    for name, make in (
        ("fused AdamW on DTensors (before)", lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)),
        ("shard_local_adamw (now)", lambda ps: shard_local_adamw([{"params": ps}], lr=1e-3)),
    ):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=64, n_head=2, vocab_size=512, n_positions=64))
        fully_shard(list(model.transformer.h))
        fully_shard(model)
        x = torch.randint(0, 512, (2, 32))
        model(input_ids=x, labels=x).loss.backward()
        params = list(model.parameters())
        times[name] = ms_per_step(make(params).step)
    found = sharded_params(params)
    times["clip, placements checked each step (before)"] = ms_per_step(lambda: clip_checking_each_step(params))
    times["clip, sharded parameters found once (now)"] = ms_per_step(lambda: clip_decided_once(found))
    if dist.get_rank() == 0:
        print(f"{len(params)} parameter tensors, {dist.get_world_size()} processes")
        for name, ms in times.items():
            print(f"| {name} | {ms:.2f} ms a step |")
    dist.destroy_process_group()
    # Without the interpreter's teardown, as the trainer leaves (training/__main__.py): C++ threads of
    # torch.distributed destroyed there now and then abort a process (SIGABRT), and torchrun fails.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
