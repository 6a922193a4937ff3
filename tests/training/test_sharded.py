"""training/sharded.py: FSDP2's gradients clipped on their local shards give what
torch.nn.utils.clip_grad_norm_ gives on plain tensors, and anything else is left to it."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_process_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model_with_grads(torch, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(32, 8), torch.randn(32, 3)
    return model, (x, y)


def _backward(model, batch) -> None:
    x, y = batch
    ((model(x) - y) ** 2).sum().backward()  # large gradients: the clip scales them


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipped, and left alone (coefficient capped at 1)
def test_sharded_clip_matches_torch(one_process_group, max_norm):
    import torch
    from torch.distributed.fsdp import fully_shard

    from distrain_cloud.training.sharded import clip_sharded_grads_, sharded_grads

    plain, batch = _model_with_grads(torch)
    sharded, _ = _model_with_grads(torch)
    fully_shard(sharded)
    _backward(plain, batch)
    _backward(sharded, batch)

    expected = torch.nn.utils.clip_grad_norm_(plain.parameters(), max_norm)
    grads = sharded_grads(sharded.parameters())
    assert grads is not None
    total = clip_sharded_grads_(grads, max_norm)

    assert float(total) == pytest.approx(float(expected), rel=1e-6)
    for p, q in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad.full_tensor(), rtol=1e-6, atol=1e-7)
    if max_norm < float(expected):
        clipped = torch.linalg.vector_norm(torch.stack([q.grad.full_tensor().norm() for q in sharded.parameters()]))
        assert float(clipped) == pytest.approx(max_norm, rel=1e-5)


def test_plain_gradients_are_left_to_the_general_clip():
    import torch

    from distrain_cloud.training.sharded import sharded_grads

    model, batch = _model_with_grads(torch)
    _backward(model, batch)
    before = [p.grad.clone() for p in model.parameters()]
    assert sharded_grads(model.parameters()) is None
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before, strict=True))
    assert sharded_grads([torch.nn.Parameter(torch.ones(2))]) is None  # no gradients at all
