"""--compile-optimizer: the gradient clip and AdamW's update as one compiled step (ddp and single).

Without it a step passes over every gradient three times after the backward: the clip's norm
reads them, its scaling reads and writes them (`_foreach_mul_`: 2.75 ms of llama-1b's 464 ms step
on an H200, bench/README.md, session 27's profile), and fused AdamW reads them again. Compiled as
one function, the clip's coefficient is applied as the update reads each gradient, so the
gradients are read twice and never written, and Inductor fuses the update's arithmetic into
kernels over the tensors' lists. Folding the coefficient into fused AdamW's `grad_scale` instead
saves less (its kernel writes the scaled gradients back) and would collide with fp16's loss
scaler, which sets the same field; fp16 is refused here for that reason.

The update is torch's own AdamW in its functional form (foreach, capturable: the form torch's
compiled-optimizer support traces), on the optimizer's own state, so the numbers, state_dict and
checkpoints are torch.optim.AdamW's: a run resumes with or without the flag."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.adamw import adamw
from torch.optim.optimizer import _get_capturable_supported_devices


def clip_and_update_(groups: list[tuple], max_norm: float, capturable: bool) -> None:
    """Clip the gradients of every group to a total 2-norm of `max_norm` (as
    torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), at most 1; 0 clips
    nothing) and apply AdamW's update to each group, (params, grads, exp_avgs, exp_avg_sqs, steps,
    lr, beta1, beta2, eps, weight_decay). The gradients are read, not changed."""
    coef = None
    if max_norm:
        grads = [g for group in groups for g in group[1]]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay in groups:
        scaled = list(grads) if coef is None else list(torch._foreach_mul(grads, coef))
        adamw(
            params,
            scaled,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            foreach=True,
            capturable=capturable,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=lr,
            weight_decay=weight_decay,
            eps=eps,
            maximize=False,
        )


class ClippedAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (built as the engines build it, `fused` on CUDA, so its state_dict is the
    same either way) whose step also clips the gradients first, in one function that `compile`
    hands to torch.compile. Eager until compiled: the same arithmetic, unfused."""

    def __init__(self, groups: list[dict[str, Any]], lr: float, max_norm: float, fused: bool):
        super().__init__(groups, lr=lr, fused=fused)
        self.max_norm = max_norm
        self._step_fn: Any = clip_and_update_  # compile() swaps in the compiled one
        self._lrs: list[Any] = []  # one 0-d tensor per group, refilled each step: a new float would recompile

    def compile(self, backend: Any) -> None:
        """Compile the clip and update (at the first step: the lists are known then). Not
        fullgraph: were a torch version to break the graph inside AdamW, the step runs in pieces
        rather than failing the job (tests/training/test_optim.py checks it is one graph)."""
        self._step_fn = torch.compile(clip_and_update_, backend=backend, dynamic=False)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            raise ValueError("ClippedAdamW takes no closure: the trainer never passes one")
        groups = []
        capturable = None
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if capturable is None:  # lr and steps as device tensors; eager CPU runs take floats
                compiled = self._step_fn is not clip_and_update_
                capturable = compiled or params[0].device.type in _get_capturable_supported_devices()
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif state["step"].device != p.device:  # loaded from a foreach (CPU-step) checkpoint
                    state["step"] = state["step"].to(p.device, torch.float32)
            states = [self.state[p] for p in params]
            while len(self._lrs) <= i:
                self._lrs.append(torch.zeros((), dtype=torch.float32, device=params[0].device))
            lr = self._lrs[i].fill_(group["lr"]) if capturable else group["lr"]
            beta1, beta2 = group["betas"]
            groups.append(
                (
                    params,
                    [p.grad for p in params],
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [s["step"] for s in states],
                    lr,
                    beta1,
                    beta2,
                    group["eps"],
                    group["weight_decay"],
                )
            )
        if groups:
            self._step_fn(groups, self.max_norm, bool(capturable))
        return None
