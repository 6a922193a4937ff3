"""The CUDA kernel behind losses.cross_entropy_grad_ (Triton; imported on CUDA only).

One program per row of logits: a first pass over the row finds its log-sum-exp (online max
and sum), a second writes the row's gradient over it. A GPT-2 row is 100 KB in bf16, so the
second pass mostly reads it back from L2: the logits leave HBM about once and the gradient is
written once, where the compiled log-softmax and its backward read them three times and write a
new gradient tensor beside them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

IGNORE = -100


@triton.jit
def _cross_entropy_grad_kernel(
    logits_ptr,
    row_stride,
    targets_ptr,
    row_loss_ptr,
    count_ptr,
    V: tl.constexpr,  # a constant: one compilation per vocabulary
    IGNORE_INDEX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row)
    cols = tl.arange(0, BLOCK)
    m = float("-inf")
    s = 0.0
    for start in range(0, V, BLOCK):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    valid = target != IGNORE_INDEX
    t = tl.where(valid, target, 0)
    x_t = tl.load(base + t).to(tl.float32)  # read before the row is overwritten
    tl.store(row_loss_ptr + row, tl.where(valid, lse - x_t, 0.0))
    scale = tl.where(valid, 1.0 / tl.load(count_ptr).to(tl.float32), 0.0)
    for start in range(0, V, BLOCK):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
        g = tl.exp(x - lse)
        g = tl.where(idx == t, g - 1.0, g) * scale
        tl.store(base + idx, g.to(logits_ptr.dtype.element_ty), mask=idx < V)


def cross_entropy_grad_(logits: torch.Tensor, targets: torch.Tensor, block: int = 4096, warps: int = 8) -> torch.Tensor:
    """Mean cross-entropy of `logits` [N, V] against `targets` [N] (IGNORE rows left out); the
    logits are overwritten with the loss's gradient with respect to them."""
    n, v = logits.shape
    count = (targets != IGNORE).sum().clamp(min=1)
    row_loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    _cross_entropy_grad_kernel[(n,)](
        logits, logits.stride(0), targets, row_loss, count, v, IGNORE_INDEX=IGNORE, BLOCK=block, num_warps=warps
    )
    return row_loss.sum() / count
