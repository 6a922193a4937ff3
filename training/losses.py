"""Causal-LM losses: the LM head and cross-entropy as one step whose forward writes the
logits' gradient (the default, `head_loss`), and without materialising the full logits
(`--fused-ce`).

`--fused-ce`:

GPT-2's 50K-token vocabulary makes the logits the largest tensor of a step: 16 x 1024 x
50304 values, which the standard path writes in bf16, upcasts to fp32, and reads again for
the softmax and its gradient. Here the LM head and the cross-entropy run chunk by chunk, and
the gradients with respect to the hidden states and the head's weight are computed in the
forward pass, so a chunk's logits live only while it is processed. Same loss, same
gradients (up to rounding); the matmul FLOPs are unchanged.
"""

from __future__ import annotations

import torch

from .fp8_linear import E4M3, E5M2, FP8_MULTIPLE, column_major, pad_rows, to_fp8

IGNORE = -100


def _sum_and_grad(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy summed over the rows whose label counts, and its gradient with respect to
    `logits` (fp32, [N, V]); IGNORE rows get a zero gradient."""
    lse = torch.logsumexp(logits, dim=-1)
    valid = y != IGNORE
    target = y.clamp(min=0)
    loss = ((lse - logits.gather(1, target[:, None]).squeeze(1)) * valid).sum()
    grad = torch.exp(logits - lse[:, None])
    grad.scatter_add_(1, target[:, None], -torch.ones_like(lse)[:, None])
    return loss, grad * valid[:, None]


def _chunk(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor):
    """Loss sum, d(loss sum)/dh and d(loss sum)/dw for one chunk of rows."""
    loss, grad = _sum_and_grad((h @ w.t()).float(), y)
    grad = grad.to(w.dtype)
    return loss, grad @ w, grad.t() @ h


_compiled_chunk = None


def _chunk_fn(compile_: bool):
    global _compiled_chunk
    if not compile_:
        return _chunk
    if _compiled_chunk is None:
        _compiled_chunk = torch.compile(_chunk, dynamic=False)
    return _compiled_chunk


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_rows: int, dtype, compile_: bool):
        fn = _chunk_fn(compile_)
        w = weight.to(dtype)
        h_all = hidden.to(dtype)
        count = (labels != IGNORE).sum().clamp(min=1)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(h_all)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for s in range(0, h_all.shape[0], chunk_rows):
            loss, gh, gw = fn(h_all[s : s + chunk_rows], w, labels[s : s + chunk_rows])
            total += loss
            grad_h[s : s + chunk_rows] = gh
            grad_w += gw.float()
        ctx.save_for_backward(grad_h, grad_w, count)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_out / count
        return ((grad_h.float() * scale).to(ctx.dtypes[0]), (grad_w * scale).to(ctx.dtypes[1]), None, None, None, None)


def fused_causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    dtype: torch.dtype,
    chunk_rows: int = 4096,
    compile_: bool = False,
) -> torch.Tensor:
    """Mean next-token cross-entropy of `hidden @ weight.T` (hidden: [B, T, d], the final
    hidden states; weight: the LM head's [V, d]) against `input_ids` shifted by one."""
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = input_ids[:, 1:].reshape(-1)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(h, weight, y, chunk_rows, dtype, compile_)


def liger_causal_lm_loss(
    hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor, *, dtype: torch.dtype
) -> torch.Tensor:
    """The same loss through liger-kernel's fused linear cross-entropy (Triton, CUDA only)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # checked at setup

    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = input_ids[:, 1:].reshape(-1)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE)(weight.to(dtype), h.to(dtype), y)


# ---------------------------------------------------------------- the default: head_loss
#
# The model's own loss (transformers' ForCausalLMLoss, compiled) reads GPT-2's bf16 logits
# (16 x 1024 x 50304, 1.65 GB) three times and writes their gradient once more, in two reduction
# kernels: 2.3 ms of a 39 ms step on an H100 (bench/README.md, session 17). Here the forward
# computes the loss and the gradient together, into the logits' own memory, and the backward
# only runs the two GEMMs, scaling their small outputs by the incoming gradient.


@torch.library.custom_op("distrain::cross_entropy_grad_", mutates_args=("logits",))
def cross_entropy_grad_(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of `logits` [N, V] against `targets` [N] (IGNORE rows left out); the
    logits are overwritten with its gradient with respect to them. The reference (CPU) kernel."""
    count = (targets != IGNORE).sum().clamp(min=1)
    loss, grad = _sum_and_grad(logits.float(), targets)
    logits.copy_(grad / count)
    return loss / count


@cross_entropy_grad_.register_kernel("cuda")
def _cross_entropy_grad_cuda(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from .ce_kernel import cross_entropy_grad_ as kernel

    return kernel(logits, targets)


@cross_entropy_grad_.register_fake
def _(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.new_empty((), dtype=torch.float32)


class _HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets):
        device = hidden.device.type
        # The dtype autocast would give the LM head's matmul; the gradients leave in the inputs'.
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        with torch.autocast(device_type=device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            logits = h @ w.t()
            loss = cross_entropy_grad_(logits, targets)
        ctx.save_for_backward(h, w, logits)  # logits now hold d(loss)/d(logits)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        return (*_bf16_head_grads(ctx, grad_out), None)


def _bf16_head_grads(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 head's two backward matmuls, from the 16-bit hidden states and weight and the
    logits' gradient its forward saved, in the inputs' dtypes (ctx.dtypes)."""
    h, w, grad = ctx.saved_tensors
    with torch.autocast(device_type=h.device.type, enabled=False):
        grad_h = ((grad @ w).float() * grad_out).to(ctx.dtypes[0])
        grad_w = ((grad.t() @ h).float() * grad_out).to(ctx.dtypes[1])
    return grad_h, grad_w


# ---------------------------------------------------------------- --fp8-head
#
# The same loss with the head's three matmuls in float8 (torch._scaled_mm, one dynamic scale per
# tensor, as torchao's tensorwise recipe scales the other linears): the forward's hidden states and
# weight in e4m3, the backward's logit gradient in e5m2 (the wider range gradients need). On
# llama-1b the bf16 head is a sixth of an fp8 step (bench/README.md, session 20). The casts and
# layouts are fp8_linear's, which --fp8-linear native's layers share. --fp8-head-grad-input bf16
# keeps the one of the three whose rounding reaches every block, the input's gradient, in bf16:
# e5m2's 2 mantissa bits on the logits' gradient are the suspect of the head's +1.4% eval loss
# after 400 steps on llama-1b (bench/README.md, sessions 21-25). --fp8-head-forward bf16 keeps the
# other suspect exact: the forward's logits, from which the loss and the gradient every later
# matmul reads are computed (e4m3's 3 mantissa bits on both of its inputs); the backward's two
# matmuls, two thirds of the head's FLOPs, stay float8. --fp8-head-backward bf16 is the other way
# round: the forward's matmul alone in float8 (a third of the FLOPs, and no cast of the
# vocabulary-wide logits' gradient), the backward the bf16 head's.


class _Fp8HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, fast_backward, bf16_grad_input, bf16_forward, bf16_backward):
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        with torch.autocast(device_type=device, enabled=False):
            h8, h_inv = to_fp8(hidden, E4M3)  # the backward's copies, whichever dtype the forward runs in
            w8, w_inv = to_fp8(weight, E4M3)
            if bf16_forward:  # the bf16 head's logits, as _HeadLoss computes them
                logits = hidden.to(dtype) @ weight.to(dtype).t()
            else:  # the forward reduces over the hidden size only: fast accumulation, as torchao's forward
                logits = torch._scaled_mm(
                    h8, w8.t(), scale_a=h_inv, scale_b=w_inv, out_dtype=dtype, use_fast_accum=True
                )
            loss = cross_entropy_grad_(logits, targets)
        # logits now hold d(loss)/d(logits)
        ctx.dtypes, ctx.fast, ctx.bf16_grad_input = (hidden.dtype, weight.dtype), fast_backward, bf16_grad_input
        ctx.bf16_backward = bf16_backward
        if bf16_backward:  # the bf16 head's backward, from the 16-bit inputs as _HeadLoss saves them
            ctx.save_for_backward(hidden.to(dtype), weight.to(dtype), logits)
        else:  # a bf16 input gradient reads the weight itself, not w8
            ctx.save_for_backward(h8, h_inv, weight if bf16_grad_input else w8, w_inv, logits)
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.bf16_backward:
            return (*_bf16_head_grads(ctx, grad_out), None, None, None, None, None)
        h8, h_inv, w, w_inv, grad = ctx.saved_tensors
        with torch.autocast(device_type=h8.device.type, enabled=False):
            g8, g_inv = to_fp8(grad, E5M2)
            if ctx.bf16_grad_input:  # as the bf16 head's: the gradient every block receives keeps bf16's 8 bits
                grad_h = (grad @ w.to(grad.dtype)).float()
            else:
                grad_h = torch._scaled_mm(
                    g8, column_major(w), scale_a=g_inv, scale_b=w_inv, out_dtype=torch.float32, use_fast_accum=ctx.fast
                )
            grad_w = torch._scaled_mm(
                g8.t().contiguous(),
                column_major(h8),
                scale_a=g_inv,
                scale_b=h_inv,
                out_dtype=torch.float32,
                use_fast_accum=ctx.fast,
            )
        grads = (grad_h * grad_out).to(ctx.dtypes[0]), (grad_w * grad_out).to(ctx.dtypes[1])
        return (*grads, None, None, None, None, None)


def fp8_head_why_not(hidden_size: int, vocab_size: int) -> str | None:
    """Why the LM head of these sizes cannot multiply in float8, or None."""
    if hidden_size % FP8_MULTIPLE or vocab_size % FP8_MULTIPLE:
        return f"its hidden size ({hidden_size}) and vocabulary ({vocab_size}) must both be multiples of {FP8_MULTIPLE}"
    return None


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, fp8: str | None = None) -> torch.Tensor:
    """transformers' causal-LM loss of `hidden @ weight.T` (hidden: [B, T, d], the final hidden
    states; weight: the LM head's [V, d], no bias): the mean cross-entropy of each position
    against the next label, -100 labels left out. `fp8`: the head's matmuls in float8, the
    backward's in fast accumulation ("fast") or the exact one ("exact"); with "+bf16-grad-input"
    after either, the input's gradient in bf16 (--fp8-head-grad-input bf16), with "+bf16-forward"
    the forward's logits (--fp8-head-forward bf16), with "+bf16-backward" both backward matmuls
    (--fp8-head-backward bf16)."""
    targets = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[:, 1:].reshape(-1)
    h = hidden.reshape(-1, hidden.shape[-1])
    if fp8 is None:
        return _HeadLoss.apply(h, weight, targets)
    if pad := -h.shape[0] % FP8_MULTIPLE:  # rows of zeros, labelled IGNORE: they add nothing
        h = pad_rows(h)
        targets = torch.nn.functional.pad(targets, (0, pad), value=IGNORE)
    accum, *bf16 = fp8.split("+")
    return _Fp8HeadLoss.apply(
        h, weight, targets, accum == "fast", "bf16-grad-input" in bf16, "bf16-forward" in bf16, "bf16-backward" in bf16
    )
