"""Float8 matmuls on torch._scaled_mm alone: the LM head's (losses.head_loss, --fp8-head) and
every converted linear layer's (`Float8Linear`; --fp8-linear native, auto's choice for the
tensorwise recipe), with no torchao.

The scaling is torchao's tensorwise recipe: one dynamic scale per tensor, its largest magnitude
mapped onto the float8 format's largest value; e4m3 for the forward's operands, e5m2 for the
output gradient (the wider range gradients need; --fp8-grad-dtype e4m3 trades it for a third
mantissa bit, as torchao's rowwise recipe does); the forward accumulates in the tensor cores'
fast mode, the backward in the exact one unless --fp8-fast-accum says otherwise.

What differs from torchao's `Float8Linear` is what the backward reads. torchao's backward casts the
layer's saved input and its fp32 weight to float8 again (an amax pass and a cast over each); this
one reads the float8 copies its forward made. Same values: a tensorwise scale does not depend on
when it is computed. Under torch.compile the partitioner already keeps torchao's forward casts
for the backward, so the peak memory is the same; llama-1b's step ran 1.1% faster on an H200
(bench/README.md, session 22), and nothing of torchao needs to be installed.

_scaled_mm takes its first operand row-major and its second column-major (cuBLAS's float8
layouts), so each backward matmul reads one operand transposed: a copy of a float8 tensor, half a
bf16 one. Every dimension it multiplies over must be a multiple of 16 (FP8_MULTIPLE): the weight
gradient sums over the rows, so a batch whose row count is not one is padded with zero rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GRAD_DTYPES = {"e5m2": E5M2, "e4m3": E4M3}  # --fp8-grad-dtype: the output gradient's float8 format
FP8_MULTIPLE = 16  # _scaled_mm's operands: every dimension a multiple of 16


def fp8_scale(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The scale that maps magnitude `amax` onto float8 `dtype`'s largest value."""
    return torch.finfo(dtype).max / amax.float().clamp(min=1e-12)


def cast_fp8(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` times `scale` in float8 `dtype`, saturated at its largest value, and the inverse scale,
    which _scaled_mm multiplies back."""
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def to_fp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in float8 `dtype` scaled so that its largest magnitude lands on the format's largest
    value (dynamic scaling), and the inverse scale."""
    return cast_fp8(x, dtype, fp8_scale(x.abs().amax(), dtype))


def column_major(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous().t()


def pad_rows(x: torch.Tensor, multiple: int = FP8_MULTIPLE) -> torch.Tensor:
    """`x` [N, d] with zero rows appended up to a multiple of `multiple` rows (itself if none)."""
    pad = -x.shape[0] % multiple
    return torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x


class _Float8Matmul(torch.autograd.Function):
    """x [N, in] @ weight[out, in].T in float8, N a multiple of FP8_MULTIPLE; `scales` (x's, the
    weight's) known beforehand (delayed scaling), else each tensor's own (dynamic); the output
    gradient cast to `grad_dtype` (GRAD_DTYPES' values)."""

    @staticmethod
    def forward(ctx, x, weight, fast_grad_input: bool, fast_grad_weight: bool, scales=None, grad_dtype=E5M2):
        if scales is None:
            (x8, x_inv), (w8, w_inv) = to_fp8(x, E4M3), to_fp8(weight, E4M3)
        else:
            (x8, x_inv), (w8, w_inv) = cast_fp8(x, E4M3, scales[0]), cast_fp8(weight, E4M3, scales[1])
        out = torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=x.dtype, use_fast_accum=True)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.dtypes, ctx.fast = (x.dtype, weight.dtype), (fast_grad_input, fast_grad_weight)
        ctx.grad_dtype = grad_dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = to_fp8(grad.contiguous(), ctx.grad_dtype)  # row-major: a gradient may arrive as a strided view
        grad_x = torch._scaled_mm(
            g8, column_major(w8), scale_a=g_inv, scale_b=w_inv, out_dtype=ctx.dtypes[0], use_fast_accum=ctx.fast[0]
        )
        # in the weight's own dtype (fp32 master weights): no bf16 rounding before it accumulates
        grad_w = torch._scaled_mm(
            g8.t().contiguous(),
            column_major(x8),
            scale_a=g_inv,
            scale_b=x_inv,
            out_dtype=ctx.dtypes[1],
            use_fast_accum=ctx.fast[1],
        )
        return grad_x, grad_w, None, None, None, None


def float8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    fast_grad_input: bool,
    fast_grad_weight: bool,
    scales_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    grad_dtype: torch.dtype = E5M2,
) -> torch.Tensor:
    """F.linear(x, weight, bias) with the matmul in float8 (_Float8Matmul), in the autocast dtype;
    `scales_of(rows)` gives delayed scaling's scales (None: dynamic), `grad_dtype` the output
    gradient's format. Float8Linear's forward, and --fuse-projections' (training/fusion.py) over a
    group's concatenated weights."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    with torch.autocast(device_type=device, enabled=False):
        rows = x.reshape(-1, weight.shape[1]).to(dtype)
        # only a backward sums over the rows; generation's odd row counts run as they are
        padded = pad_rows(rows) if torch.is_grad_enabled() else rows
        scales = scales_of(rows) if scales_of is not None else None
        out = _Float8Matmul.apply(padded, weight, fast_grad_input, fast_grad_weight, scales, grad_dtype)
        out = out[: rows.shape[0]].reshape(*x.shape[:-1], weight.shape[0])
        return out if bias is None else out + bias.to(dtype)


AMAX_HISTORY = 16  # --fp8-scaling delayed: the forwards whose largest magnitudes set the scales


def _record(history: torch.Tensor, t: torch.Tensor) -> None:
    """Push `t`'s largest magnitude onto `history`, the newest first."""
    history.copy_(torch.cat([t.detach().abs().amax().float().reshape(1), history[:-1]]))


def delayed_scale(history: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The scale for float8 `dtype` from an amax `history`: its largest, or 1 while it holds nothing
    (Transformer Engine's scales also start at 1). A tensor expression, not a branch, so that a
    compiled step has one graph from the first forward on."""
    top = history.amax()
    return torch.where(top > 0, fp8_scale(top, dtype), torch.ones_like(top))


class Float8Linear(torch.nn.Linear):
    """nn.Linear whose matmul runs in float8 (_Float8Matmul) in the autocast dtype; the bias, if
    any, is added in that dtype. `fast_grad_input`/`fast_grad_weight`: --fp8-fast-accum;
    `grad_dtype`: --fp8-grad-dtype.

    Delayed scaling (`use_delayed_scaling`, --fp8-scaling delayed), Transformer Engine's recipe:
    the input's and weight's scales come from the largest magnitudes of the last AMAX_HISTORY
    forwards that built a graph for a backward, so the cast needs no pass over the tensor first and
    the compiler may fuse it into the kernel that produces the input (on an H200 it did not:
    llama-1b ran 0.8% slower than with dynamic scaling, bench/README.md session 23). A value beyond
    the history's largest saturates. The weight's history starts with the weight's own largest magnitude; the
    input's starts empty, so the first training forward casts its input at scale 1. Evaluation and
    generation read the histories without adding to them. The output gradient always scales
    dynamically. The histories are not saved with the model (non-persistent buffers): a resumed
    run starts them again."""

    fast_grad_input = False
    fast_grad_weight = False
    grad_dtype = E5M2
    delayed = False
    amax_input: torch.Tensor  # delayed scaling's histories (buffers), the newest first
    amax_weight: torch.Tensor

    def use_delayed_scaling(self) -> None:
        self.delayed = True
        for name in ("amax_input", "amax_weight"):
            self.register_buffer(name, torch.zeros(AMAX_HISTORY, device=self.weight.device), persistent=False)
        with torch.no_grad():
            _record(self.amax_weight, self.weight)

    def _scales(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Delayed scaling's two scales, from the histories before this forward adds `x` to them."""
        if not self.delayed:
            return None
        scales = (delayed_scale(self.amax_input, E4M3), delayed_scale(self.amax_weight, E4M3))
        if torch.is_grad_enabled():
            _record(self.amax_input, x)
            _record(self.amax_weight, self.weight)
        return scales

    @classmethod
    def from_linear(
        cls, linear: torch.nn.Linear, fast_grad_input: bool, fast_grad_weight: bool, grad_dtype: torch.dtype = E5M2
    ) -> Float8Linear:
        """A Float8Linear holding `linear`'s own parameters (the optimizer's, if one was built)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        new.weight, new.bias = linear.weight, linear.bias
        new.fast_grad_input, new.fast_grad_weight = fast_grad_input, fast_grad_weight
        new.grad_dtype = grad_dtype
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return float8_linear(
            x, self.weight, self.bias, self.fast_grad_input, self.fast_grad_weight, self._scales, self.grad_dtype
        )

    def extra_repr(self) -> str:
        grads = "" if self.grad_dtype == E5M2 else ", grad=e4m3"
        return f"{super().extra_repr()}, float8=tensorwise{' delayed' if self.delayed else ''}{grads}"


def convert(
    model: torch.nn.Module,
    names: set[str],
    fast_grad_input: bool,
    fast_grad_weight: bool,
    delayed: bool = False,
    grad_dtype: torch.dtype = E5M2,
) -> None:
    """Replace the nn.Linear layers of `model` named in `names` by Float8Linear, in place; with
    `delayed`, scaled from their amax history (Float8Linear.use_delayed_scaling); their output
    gradients cast to `grad_dtype`."""
    for name in sorted(names):
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        layer = Float8Linear.from_linear(getattr(owner, child), fast_grad_input, fast_grad_weight, grad_dtype)
        if delayed:
            layer.use_delayed_scaling()
        setattr(owner, child, layer)
