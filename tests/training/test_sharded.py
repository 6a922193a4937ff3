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

    from distrain_cloud.training.sharded import clip_sharded_grads_, sharded_params

    plain, batch = _model_with_grads(torch)
    sharded, _ = _model_with_grads(torch)
    fully_shard(sharded)
    _backward(plain, batch)
    _backward(sharded, batch)

    expected = torch.nn.utils.clip_grad_norm_(plain.parameters(), max_norm)
    params = sharded_params(sharded.parameters())
    assert params is not None
    total = clip_sharded_grads_([p.grad for p in params], max_norm)

    assert float(total) == pytest.approx(float(expected), rel=1e-6)
    for p, q in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad.full_tensor(), rtol=1e-6, atol=1e-7)
    if max_norm < float(expected):
        clipped = torch.linalg.vector_norm(torch.stack([q.grad.full_tensor().norm() for q in sharded.parameters()]))
        assert float(clipped) == pytest.approx(max_norm, rel=1e-5)


def test_plain_gradients_are_left_to_the_general_clip():
    import torch

    from distrain_cloud.training.sharded import sharded_params

    model, batch = _model_with_grads(torch)
    _backward(model, batch)
    before = [p.grad.clone() for p in model.parameters()]
    assert sharded_params(model.parameters()) is None
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before, strict=True))
    assert sharded_params([torch.nn.Parameter(torch.ones(2), requires_grad=False)]) is None  # nothing trains


class _Accelerator:
    """What FSDP2Engine.clip asks of Accelerate: the fp16 unscale and the general clip (counted)."""

    def __init__(self, torch):
        self.torch, self.general_clips = torch, 0

    def unscale_gradients(self) -> None:
        pass

    def clip_grad_norm_(self, parameters, max_norm):
        self.general_clips += 1
        return self.torch.nn.utils.clip_grad_norm_(parameters, max_norm)


def test_fsdp2_engine_clips_on_the_shards_every_step_after_deciding_once(one_process_group, monkeypatch):
    """The engine finds the sharded parameters at its first clip and reuses them: each later step's
    new gradients are still clipped as torch clips plain ones, and the placements are not checked again."""
    import types

    import torch
    from torch.distributed.fsdp import fully_shard

    from distrain_cloud.training import sharded as sharded_module
    from distrain_cloud.training.engines import fsdp2

    engine = fsdp2.FSDP2Engine(types.SimpleNamespace(args=None), say=print)
    accelerator = _Accelerator(torch)
    plain, _ = _model_with_grads(torch)
    model, _ = _model_with_grads(torch)
    fully_shard(model)
    decided = []
    monkeypatch.setattr(fsdp2, "sharded_params", lambda ps: decided.append(1) or sharded_module.sharded_params(ps))
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        batch = (torch.randn(32, 8), torch.randn(32, 3))
        for m in (plain, model):
            m.zero_grad(set_to_none=True)
            _backward(m, batch)
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        engine.clip(accelerator, model, 0.5)
        for p, q in zip(plain.parameters(), model.parameters(), strict=True):
            assert torch.allclose(p.grad, q.grad.full_tensor(), rtol=1e-6, atol=1e-7)
    assert decided == [1] and accelerator.general_clips == 0

    unsharded = fsdp2.FSDP2Engine(types.SimpleNamespace(args=None), say=print)  # plain parameters: the general way
    _backward(plain, batch)
    unsharded.clip(accelerator, plain, 0.5)
    assert accelerator.general_clips == 1


def _sharded_model(torch, fully_shard, seed: int):
    model, batch = _model_with_grads(torch, seed)
    fully_shard(model)
    return model, batch


def _groups(model) -> list[dict]:
    """Two groups as the trainer makes them: decay on matrices, none on biases."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def test_shard_local_adamw_steps_and_saves_as_torchs_fused_adamw(one_process_group):
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from distrain_cloud.training.sharded import shard_local_adamw

    ours_model, batch = _sharded_model(torch, fully_shard, seed=1)
    torch_model, _ = _sharded_model(torch, fully_shard, seed=1)
    ours = shard_local_adamw(_groups(ours_model), lr=1e-2)
    theirs = torch.optim.AdamW(_groups(torch_model), lr=1e-2, fused=True)
    for lr in (1e-2, 5e-3, 2e-3):  # as a schedule moves it between steps
        for model, opt in ((ours_model, ours), (torch_model, theirs)):
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad()
            _backward(model, batch)
            opt.step()
    for p, q in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert isinstance(p, DTensor)
        assert torch.allclose(p.full_tensor(), q.full_tensor(), rtol=1e-6, atol=1e-7)
    # The same state, the same types (DTensor moments, a float32 step on the parameter's device):
    # a checkpoint of either loads into the other.
    mine, torchs = ours.state_dict(), theirs.state_dict()
    assert mine["param_groups"] == torchs["param_groups"]
    for key, state in torchs["state"].items():
        assert mine["state"][key].keys() == state.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for name, value in state.items():
            other = mine["state"][key][name]
            assert type(other) is type(value) and other.dtype == value.dtype and other.device == value.device
            expected = value.full_tensor() if isinstance(value, DTensor) else value
            got = other.full_tensor() if isinstance(other, DTensor) else other
            assert torch.allclose(got, expected, rtol=1e-6, atol=1e-8), (key, name)
    theirs.load_state_dict(mine)


def test_shard_local_adamw_skips_a_step_a_grad_scaler_found_inf_in(one_process_group):
    import torch
    from torch.distributed.fsdp import fully_shard

    from distrain_cloud.training.sharded import shard_local_adamw

    model, batch = _sharded_model(torch, fully_shard, seed=2)
    opt = shard_local_adamw(_groups(model), lr=1e-2)
    _backward(model, batch)
    opt.step()
    before = [p.full_tensor().clone() for p in model.parameters()]
    opt.found_inf = torch.ones(())  # what GradScaler sets for an optimizer with _step_supports_amp_scaling
    assert opt._step_supports_amp_scaling
    opt.step()
    for p, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.full_tensor(), old)
    assert all(float(s["step"]) == 1.0 for s in opt.state.values())


def test_block_units_free_their_weights_after_forward_except_the_last(one_process_group):
    """The last unit's backward comes right after the head's: it keeps its gathered weights from its
    forward on instead of gathering them twice; the others free theirs (ZeRO-3's memory)."""
    from types import SimpleNamespace

    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from distrain_cloud.training.sharded import shard_block_units

    torch.manual_seed(0)
    blocks = [torch.nn.Linear(8, 8) for _ in range(4)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(8, 2))
    plugin = SimpleNamespace(reshard_after_forward=True, cpu_offload=None, mixed_precision_policy=None)
    assert shard_block_units(blocks, 2, plugin, mixed_precision=False) == 2
    fully_shard(model)
    loss = model(torch.randn(4, 8)).sum()  # between forward and backward
    first, last = blocks[0].weight, blocks[3].weight
    assert isinstance(first, DTensor), "the first unit should have freed its gathered weights"
    assert not isinstance(last, DTensor) and last.shape == (8, 8), "the last unit should keep them"
    loss.backward()
    assert all(isinstance(p.grad, DTensor) for p in model.parameters())


def test_shard_local_adamw_resumes_from_the_state_torchs_adamw_saved(one_process_group):
    """A checkpoint written before this optimizer (torch's AdamW: foreach on CPU, fused on GPUs)
    loads into it, and the run goes on as it would have with torch's."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from distrain_cloud.training.sharded import shard_local_adamw

    def resumed_with(make):
        model, batch = _sharded_model(torch, fully_shard, seed=3)
        saved = torch.optim.AdamW(_groups(model), lr=1e-2, foreach=True)
        for _ in range(2):
            saved.zero_grad()
            _backward(model, batch)
            saved.step()
        opt = make(_groups(model))
        opt.load_state_dict(saved.state_dict())
        opt.zero_grad()
        _backward(model, batch)
        opt.step()
        return [p.full_tensor() for p in model.parameters()], opt

    ours, opt = resumed_with(lambda groups: shard_local_adamw(groups, lr=1e-2))
    torchs, _ = resumed_with(lambda groups: torch.optim.AdamW(groups, lr=1e-2, foreach=True))
    for p, q in zip(ours, torchs, strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    assert all(float(s["step"]) == 3.0 for s in opt.state.values())
