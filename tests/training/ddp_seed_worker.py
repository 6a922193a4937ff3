"""Run by test_distributed.py under torch.distributed.run with 2 gloo processes: DDP's gradients
and the division kernels in its second backward, DDP's own averaging against the trainer's
(_allreduce_sum_hook plus a seeded backward). Prints one JSON line from rank 0."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distrain_cloud.training.trainer import _allreduce_sum_hook, _seeded_backward


def grads_and_divisions(seeded: bool) -> tuple[list[list[float]], int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)  # as trainer._ddp_kwargs
    world = dist.get_world_size()
    if seeded:
        ddp.register_comm_hook(state=None, hook=_allreduce_sum_hook)
    no_scaler = type("Acc", (), {"scaler": None})()
    divisions = 0
    for step in range(2):  # the second: the gradients are views into DDP's buckets by then
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
        ddp.zero_grad(set_to_none=False)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            if seeded:
                _seeded_backward(no_scaler, loss, 1.0 / world)
            else:
                loss.backward()
        divisions = sum(e.count for e in prof.key_averages() if e.key == "aten::div_")
    return [p.grad.flatten().tolist() for p in model.parameters()], divisions


def main() -> None:
    dist.init_process_group("gloo")
    own, own_divisions = grads_and_divisions(seeded=False)
    seeded, seeded_divisions = grads_and_divisions(seeded=True)
    if dist.get_rank() == 0:
        print(json.dumps({"own": own, "seeded": seeded, "own_div": own_divisions, "seeded_div": seeded_divisions}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
