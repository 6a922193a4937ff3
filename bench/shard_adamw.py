"""Host time of one fsdp optimizer step: torch's fused AdamW over FSDP2's DTensors (the baseline,
what fsdp used before) against training/sharded.shard_local_adamw (the same kernel on the local
shards), in the same run, over GPT-2 small's 148 parameter tensors at width 64 (so the arithmetic
is small and the time is the host's: DTensor dispatch, list building).

    torchrun --standalone --nproc-per-node 2 bench/shard_adamw.py          # CPU processes over gloo, ~20 s

Not a GPU measurement: it sizes a host cost; the GPU machines say what it is worth there.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import GPT2Config, GPT2LMHeadModel

from distrain_cloud.training.sharded import shard_local_adamw


def ms_per_step(step, steps: int = 50) -> float:
    step()  # warm: the state exists
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


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
    if dist.get_rank() == 0:
        print(f"{len(params)} parameter tensors, {dist.get_world_size()} processes")
        for name, ms in times.items():
            print(f"| {name} | {ms:.2f} ms a step |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
