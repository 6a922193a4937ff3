"""The MLP's float8 casts in one pass each, against the two passes a compiled fp8 step runs now, on
one GPU at llama-1b's shapes (issue 40): the backward's cast of the gradient into gate/up (e5m2),
and the forward's cast of the down projection's input silu(gate) * up (e4m3). A prototype, timed
and rejected (bench/README.md, session 30): on an H200 Inductor's two passes stream at about 3.7
TB/s and these kernels at 1.5-2.1, so the backward's one pass is slower (1.7 against 1.2 ms) and the
forward's 0.14 ms faster, too little for a custom op. Kept to re-time on other cards and compilers.

Session 29's profile of llama-1b's fp8 step (one H200, micro-batch 16) put 72 of 366 ms a step in
finding float8 scales and casting, 27 of them on this one gradient: dynamic scaling must know the
tensor's largest magnitude before it casts, so Inductor runs an amax pass over silu's backward
(0.62 ms a layer) and then a cast that reads the same 1.6 GB again and writes the e5m2 gradient
and the transposed copy the weight gradient's matmul needs (1.07 ms, about 2.5 TB/s).

The one pass casts with a scale known before it starts: the previous step's amax, with a binade of
headroom (HEADROOM), and records this step's amax as it goes (persistent programs, each walking
tiles a grid apart and adding its maximum with one atomic max). A second
launch recasts only if that amax left the band the scale serves: above it (the cast saturated) or
more than RECAST_BELOW times below it (the smallest values lost precision needlessly). Its
programs read two numbers and stop when nothing is to be done; a first step (no amax yet) always
recasts. So the values are dynamic scaling's whenever the amax moved, and otherwise cast with a
scale at most three binades below its, which e5m2's 30-odd binades of range leave harmless.

The forward's kernel does the same for silu(gate) * up in e4m3 (0.36 ms amax, 0.43 cast a layer
in the profile), writing the transposed copy the down projection's weight gradient reads (made in
the backward now); e4m3 spans about 18 binades, so its band is narrower (RECAST_BELOW_E4M3).

    python bench/fp8_onepass.py [--rows 32768 --cols 8192]    # on a CUDA machine

Prints milliseconds and TB/s of each path (and the kernels each compiled one launches), and the
fraction of bytes on which the one pass and the two agree when both use dynamic scaling's scale,
the one pass's outputs poisoned first.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from _benchlib import cuda_median_ms

try:  # the training step's own float8 scale and cast, the references here
    from distrain_cloud.training.fp8_linear import E4M3, E5M2, cast_fp8, fp8_scale
except ModuleNotFoundError:  # a checkout not `pip install -e`'d: run.py's symlink package, as it runs jobs
    from run import package_shim

    sys.path.insert(0, str(package_shim(Path(tempfile.mkdtemp(prefix="fp8-onepass-")))))
    from distrain_cloud.training.fp8_linear import E4M3, E5M2, cast_fp8, fp8_scale

E5M2_MAX, E4M3_MAX = torch.finfo(E5M2).max, torch.finfo(E4M3).max  # the kernels write them as literals
HEADROOM = 2.0  # the scale maps HEADROOM x the previous amax onto the format's largest value
RECAST_BELOW = 4.0  # recast when the amax fell below 1/RECAST_BELOW of the one the scale came from
# e4m3 spans about 18 binades, not e5m2's 30-odd: the forward's band is narrower, so that its scale
# is at most 4x below dynamic scaling's (2 binades) where the gradient's may be 8x
RECAST_BELOW_E4M3 = 2.0


@triton.jit
def _swiglu_grad_cast(
    gh_ptr,  # [M, N] the gradient of silu(gate) * up, bf16
    gate_ptr,  # [M, N] bf16
    up_ptr,  # [M, N] bf16
    scale_ptr,  # [2] float32: the scales of the gate and up gradients (recast: rewritten)
    prev_ptr,  # [2] float32: the amaxes the scales came from (0: none yet)
    amax_ptr,  # [2] float32: this pass's amaxes (zeroed first; the recast reads them)
    dg_ptr,  # [M, N] e5m2: d gate
    dgt_ptr,  # [N, M] e5m2: d gate, transposed
    du_ptr,  # [M, N] e5m2: d up
    dut_ptr,  # [N, M] e5m2: d up, transposed
    M,
    N,
    HEADROOM: tl.constexpr,
    RECAST_BELOW: tl.constexpr,
    RECAST: tl.constexpr,  # the second launch: redo a tensor only if its amax left the band
    TRANSPOSE: tl.constexpr,  # write the transposed copies (off: only to time the kernel without them)
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    # persistent: each program walks tiles a grid apart and keeps its amax in registers, so that
    # the atomics number the programs, not the tiles (tens of thousands on one address serialise)
    scale_g = tl.load(scale_ptr)
    scale_u = tl.load(scale_ptr + 1)
    lim_g = M  # the rows each tensor is written for: all, or none when a recast has nothing to redo
    lim_u = M
    if RECAST:
        prev_g, prev_u = tl.load(prev_ptr), tl.load(prev_ptr + 1)
        amax_g, amax_u = tl.load(amax_ptr), tl.load(amax_ptr + 1)
        redo_g = (amax_g > HEADROOM * prev_g) | (amax_g * RECAST_BELOW < prev_g)
        redo_u = (amax_u > HEADROOM * prev_u) | (amax_u * RECAST_BELOW < prev_u)
        # the scale dynamic scaling would use; every program computes the same one
        scale_g = tl.where(redo_g, 57344.0 / tl.maximum(amax_g, 1e-12), scale_g)
        scale_u = tl.where(redo_u, 57344.0 / tl.maximum(amax_u, 1e-12), scale_u)
        lim_g = tl.where(redo_g, M, 0)
        lim_u = tl.where(redo_u, M, 0)
        if tl.program_id(0) == 0:
            tl.store(scale_ptr, scale_g)
            tl.store(scale_ptr + 1, scale_u)
    tiles_n = tl.cdiv(N, BN)
    tiles = tl.cdiv(tl.maximum(lim_g, lim_u), BM) * tiles_n  # a recast with nothing to redo walks none
    top_g = 0.0
    top_u = 0.0
    for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
        rows = (t // tiles_n) * BM + tl.arange(0, BM)
        cols = (t % tiles_n) * BN + tl.arange(0, BN)
        # masks built in each orientation from the indices: transposing a mask costs a layout change
        do_g = (rows[:, None] < lim_g) & (cols[None, :] < N)
        do_u = (rows[:, None] < lim_u) & (cols[None, :] < N)
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        need = do_g | do_u
        gh = tl.load(gh_ptr + offs, mask=need, other=0.0).to(tl.float32)
        gate = tl.load(gate_ptr + offs, mask=need, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + offs, mask=need, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        d_up = gh * gate * sig
        d_gate = gh * up * sig * (1.0 + gate * (1.0 - sig))
        if not RECAST:
            top_g = tl.maximum(top_g, tl.max(tl.max(tl.abs(d_gate), axis=1), axis=0))
            top_u = tl.maximum(top_u, tl.max(tl.max(tl.abs(d_up), axis=1), axis=0))
        g8 = tl.clamp(d_gate * scale_g, -57344.0, 57344.0).to(tl.float8e5, fp_downcast_rounding="rtne")
        u8 = tl.clamp(d_up * scale_u, -57344.0, 57344.0).to(tl.float8e5, fp_downcast_rounding="rtne")
        tl.store(dg_ptr + offs, g8, mask=do_g)
        tl.store(du_ptr + offs, u8, mask=do_u)
        if TRANSPOSE:
            offs_t = cols[:, None].to(tl.int64) * M + rows[None, :]
            tl.store(dgt_ptr + offs_t, tl.trans(g8), mask=(cols[:, None] < N) & (rows[None, :] < lim_g))
            tl.store(dut_ptr + offs_t, tl.trans(u8), mask=(cols[:, None] < N) & (rows[None, :] < lim_u))
    if not RECAST:
        tl.atomic_max(amax_ptr, top_g)
        tl.atomic_max(amax_ptr + 1, top_u)


@triton.jit
def _swiglu_cast(
    gate_ptr,  # [M, N] bf16
    up_ptr,  # [M, N] bf16
    scale_ptr,  # [1] float32: the scale of silu(gate) * up (recast: rewritten)
    prev_ptr,  # [1] float32: the amax the scale came from (0: none yet)
    amax_ptr,  # [1] float32: this pass's amax (zeroed first; the recast reads it)
    h_ptr,  # [M, N] e4m3: silu(gate) * up, the down projection's input
    ht_ptr,  # [N, M] e4m3: the same, transposed (its weight gradient's operand)
    M,
    N,
    HEADROOM: tl.constexpr,
    RECAST_BELOW: tl.constexpr,
    RECAST: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """The forward's counterpart: the down projection's input in e4m3, in one pass, as above."""
    scale = tl.load(scale_ptr)
    lim = M
    if RECAST:
        prev, amax = tl.load(prev_ptr), tl.load(amax_ptr)
        redo = (amax > HEADROOM * prev) | (amax * RECAST_BELOW < prev)
        scale = tl.where(redo, 448.0 / tl.maximum(amax, 1e-12), scale)
        lim = tl.where(redo, M, 0)
        if tl.program_id(0) == 0:
            tl.store(scale_ptr, scale)
    tiles_n = tl.cdiv(N, BN)
    tiles = tl.cdiv(lim, BM) * tiles_n
    top = 0.0
    for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
        rows = (t // tiles_n) * BM + tl.arange(0, BM)
        cols = (t % tiles_n) * BN + tl.arange(0, BN)
        todo = (rows[:, None] < M) & (cols[None, :] < N)
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        gate = tl.load(gate_ptr + offs, mask=todo, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + offs, mask=todo, other=0.0).to(tl.float32)
        h = gate * tl.sigmoid(gate) * up
        if not RECAST:
            top = tl.maximum(top, tl.max(tl.max(tl.abs(h), axis=1), axis=0))
        h8 = tl.clamp(h * scale, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
        tl.store(h_ptr + offs, h8, mask=todo)
        if TRANSPOSE:
            done_t = (cols[:, None] < N) & (rows[None, :] < M)
            tl.store(ht_ptr + cols[:, None].to(tl.int64) * M + rows[None, :], tl.trans(h8), mask=done_t)
    if not RECAST:
        tl.atomic_max(amax_ptr, top)


PROGRAMS = 132 * 8  # the persistent kernels' programs: 8 per SM of an H100/H200 (a tuning knob)


def _out(m: int, n: int, dtype: torch.dtype, device: torch.device, poison: bool) -> torch.Tensor:
    """An output buffer; with `poison` filled with bytes no cast writes (0x7F: NaN in e5m2, 448's
    neighbour NaN in e4m3), so that a check cannot pass on what an earlier tensor left in reused
    memory (it did once: a quarter of the transposed copies unwritten read as right)."""
    t = torch.empty(m, n, dtype=dtype, device=device)
    return t.view(torch.uint8).fill_(0x7F).view(dtype) if poison else t


def _launch_twice(
    kernel, args: tuple, m: int, n: int, band: float, bm: int, bn: int, warps: int, programs: int, transpose: bool
) -> None:
    """`kernel`'s cast launch, then its recast launch (a no-op unless the amax left the band)."""
    grid = (min(programs, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    for recast in (False, True):
        kernel[grid](*args, m, n, HEADROOM=HEADROOM, RECAST_BELOW=band, RECAST=recast, TRANSPOSE=transpose,
                     BM=bm, BN=bn, num_warps=warps)  # fmt: skip


def scales_from(prev: torch.Tensor, dtype: torch.dtype = E5M2) -> torch.Tensor:
    """The scales a pass starts with: HEADROOM x the previous amaxes on float8 `dtype`'s largest
    value, or 1 where there is none yet (the recast then always runs)."""
    return torch.where(prev > 0, fp8_scale(HEADROOM * prev, dtype), torch.ones_like(prev))


def swiglu_cast(
    gate: torch.Tensor,
    up: torch.Tensor,
    prev: torch.Tensor,
    bm: int = 64,
    bn: int = 64,
    warps: int = 4,
    programs: int = PROGRAMS,
    transpose: bool = True,
    poison: bool = False,
) -> tuple[torch.Tensor, ...]:
    """silu(gate) * up in e4m3 and transposed: (h, h_t, scale, amax), scale [1] the scale used,
    amax [1] this step's (the next step's `prev`)."""
    m, n = gate.shape
    h, h_t = _out(m, n, E4M3, gate.device, poison), _out(n, m, E4M3, gate.device, poison)
    scale = scales_from(prev, E4M3)
    amax = torch.zeros(1, dtype=torch.float32, device=gate.device)
    args = (gate, up, scale, prev, amax, h, h_t)
    _launch_twice(_swiglu_cast, args, m, n, RECAST_BELOW_E4M3, bm, bn, warps, programs, transpose)
    return h, h_t, scale, amax


def swiglu_grad_cast(
    grad_h: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    prev: torch.Tensor,
    bm: int = 64,
    bn: int = 64,
    warps: int = 4,
    programs: int = PROGRAMS,
    transpose: bool = True,
    poison: bool = False,
) -> tuple[torch.Tensor, ...]:
    """d gate and d up of silu(gate) * up, each in e5m2 and transposed: (dg, dg_t, du, du_t, scale,
    amax), scale [2] the scales used (the inverse goes to _scaled_mm), amax [2] this step's (the
    next step's `prev`)."""
    m, n = grad_h.shape
    dev = grad_h.device
    out = [_out(*shape, E5M2, dev, poison) for shape in ((m, n), (n, m), (m, n), (n, m))]
    scale = scales_from(prev)
    amax = torch.zeros(2, dtype=torch.float32, device=dev)
    _launch_twice(_swiglu_grad_cast, (grad_h, gate, up, scale, prev, amax, *out), m, n, RECAST_BELOW, bm, bn, warps,
                  programs, transpose)  # fmt: skip
    return (*out, scale, amax)


def swiglu_grads(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d gate and d up of silu(gate) * up in fp32: autograd's, written out."""
    g, u, gh = gate.float(), up.float(), grad_h.float()
    sig = torch.sigmoid(g)
    return gh * u * sig * (1 + g * (1 - sig)), gh * g * sig


def two_passes(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What a compiled fp8 step does now (dynamic scaling): each gradient's amax, then its cast and
    the transposed copy."""
    out: list[torch.Tensor] = []
    for d in swiglu_grads(grad_h, gate, up):
        scale = fp8_scale(d.abs().amax(), E5M2)
        d8, _ = cast_fp8(d, E5M2, scale)
        out += [d8, d8.t().contiguous(), scale]
    return tuple(out)


def inductor_one_pass(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor):
    """The one pass written for Inductor: the casts at scales known beforehand (`scale` [2]), each
    gradient's amax beside them, no recast. Whether Inductor makes one kernel of it decides if the
    step needs Triton of its own (on an H200 it did not: the same two kernels as two_passes')."""
    out: list[torch.Tensor] = []
    for d, s in zip(swiglu_grads(grad_h, gate, up), scale.unbind(), strict=True):
        d8, _ = cast_fp8(d, E5M2, s)
        out += [d8, d8.t().contiguous(), d.abs().amax()]
    return tuple(out)


def inductor_forward_one_pass(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor):
    """inductor_one_pass's forward counterpart: h in e4m3 at a scale given, its transpose, its amax."""
    h = torch.nn.functional.silu(gate.float()) * up.float()
    h8, _ = cast_fp8(h, E4M3, scale)
    return h8, h8.t().contiguous(), h.abs().amax()


def forward_two_passes(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The forward's cast as a compiled fp8 step runs it: silu(gate) * up's amax, then its e4m3
    cast (the transposed copy is made in the backward there; here beside it, to compare alike)."""
    h = torch.nn.functional.silu(gate.float()) * up.float()
    scale = fp8_scale(h.abs().amax(), E4M3)
    h8, _ = cast_fp8(h, E4M3, scale)
    return h8, h8.t().contiguous(), scale


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> float:
    """The fraction of `a`'s bytes equal to `b`'s."""
    return (a.view(torch.uint8) == b.view(torch.uint8)).float().mean().item()


def agreement(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, reference=two_passes, **opts):
    """The one pass given the previous amax that makes its scale dynamic scaling's (so its recast
    idles), against `reference` (two_passes, compiled or not): the fraction of equal bytes in each
    of the four outputs, the amax it recorded, the true amax, and that previous amax. Triton's
    sigmoid and torch's may differ in the last bit, which moves a value sitting at a rounding tie:
    a handful of bytes, where a wrong scale would move most of them."""
    want = reference(grad_h, gate, up)
    exact = torch.stack([want[2], want[5]])  # dynamic scaling's scales
    prev_same = E5M2_MAX / (HEADROOM * exact)
    got = swiglu_grad_cast(grad_h, gate, up, prev_same, poison=True, **opts)
    pairs = ((got[0], want[0]), (got[1], want[1]), (got[2], want[3]), (got[3], want[4]))
    same = [_same_bytes(a, b) for a, b in pairs]
    return same, got[5], E5M2_MAX / exact, prev_same


def forward_agreement(gate: torch.Tensor, up: torch.Tensor, reference=forward_two_passes, **opts):
    """agreement's forward counterpart: the fraction of equal bytes in h and its transpose, the amax
    recorded, the true amax, and the previous amax that gives dynamic scaling's scale."""
    want = reference(gate, up)
    prev_same = (E4M3_MAX / (HEADROOM * want[2])).reshape(1)
    got = swiglu_cast(gate, up, prev_same, poison=True, **opts)
    same = [_same_bytes(a, b) for a, b in zip(got[:2], want[:2], strict=True)]
    return same, got[3], (E4M3_MAX / want[2]).reshape(1), prev_same


# (rows, columns, warps, programs): a program's tile, beside the default 64 x 64, 4 warps, PROGRAMS
TILES = (
    (64, 64, 4, 132 * 4),
    (64, 64, 4, 132 * 16),
    (64, 64, 8, PROGRAMS),
    (32, 128, 4, PROGRAMS),
    (64, 128, 4, PROGRAMS),
    (64, 128, 8, PROGRAMS),
    (128, 64, 8, PROGRAMS),
    (128, 128, 8, PROGRAMS),
)


def kernels(fn) -> str:
    """The CUDA kernels one call of `fn` launches, with their microseconds (what Inductor fused)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return "; ".join(f"{e.key[:60]} {e.device_time_total:.0f} us" for e in rows)


def _time(rows: list[tuple[str, Callable[[], object]]], moved: int) -> None:
    for name, fn in rows:
        ms = cuda_median_ms(fn)
        print(f"{name}: {ms:.3f} ms, {moved / ms / 1e9:.2f} TB/s")
        if "Inductor" in name or "compiled" in name:
            print(f"  kernels: {kernels(fn)}")


def _equal(same) -> str:
    return ", ".join(f"{x:.6f}" for x in same)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=32768, help="tokens: micro-batch x sequence (16 x 2048)")
    p.add_argument("--cols", type=int, default=8192, help="the MLP's width (llama-1b: 8192)")
    a = p.parse_args()
    torch.manual_seed(0)
    shape, dev = (a.rows, a.cols), "cuda"
    grad_h = (1e-4 * torch.randn(shape, device=dev)).bfloat16()
    gate, up = torch.randn(shape, device=dev).bfloat16(), torch.randn(shape, device=dev).bfloat16()
    moved = 3 * grad_h.numel() * 2 + 4 * grad_h.numel()  # three bf16 tensors read, four e5m2 written

    compiled = torch.compile(two_passes)
    same, recorded, amax, prev_same = agreement(grad_h, gate, up, compiled)
    print(
        "one pass at dynamic scaling's scale, bytes equal to the two passes' (d gate, its transpose, d up, "
        f"its transpose): {_equal(same)}"
    )
    print(f"amax recorded {recorded.tolist()} against {amax.tolist()}")
    print(f"  tiles 128x64, 8 warps: {_equal(agreement(grad_h, gate, up, compiled, bm=128, bn=64, warps=8)[0])}")
    inductor = torch.compile(inductor_one_pass)
    rows: list[tuple[str, Callable[[], object]]] = [
        ("two passes (compiled, what the step runs)", lambda: compiled(grad_h, gate, up)),
        ("one pass in Inductor (scale given, amax beside)", lambda: inductor(grad_h, gate, up, scales_from(prev_same))),
        ("one pass, the recast idle", lambda: swiglu_grad_cast(grad_h, gate, up, prev_same)),
        ("one pass, the recast redoing both", lambda: swiglu_grad_cast(grad_h, gate, up, prev_same * 1e-3)),
        ("one pass without the transposed copies", lambda: swiglu_grad_cast(grad_h, gate, up, prev_same, transpose=False)),  # noqa: E501
    ]  # fmt: skip
    for bm, bn, w, n in TILES:
        rows.append(
            (
                f"one pass, tiles {bm}x{bn}, {w} warps, {n} programs",
                partial(swiglu_grad_cast, grad_h, gate, up, prev_same, bm, bn, w, n),
            )
        )
    _time(rows, moved)

    # the forward: silu(gate) * up cast to e4m3 for the down projection, with its transposed copy
    forward = torch.compile(forward_two_passes)
    same, recorded, amax, prev_same = forward_agreement(gate, up, forward)
    print(f"forward, bytes equal (h, its transpose): {_equal(same)}; amax {recorded.tolist()} against {amax.tolist()}")
    print(f"  tiles 128x64, 8 warps: {_equal(forward_agreement(gate, up, forward, bm=128, bn=64, warps=8)[0])}")
    inductor_forward = torch.compile(inductor_forward_one_pass)
    moved = 2 * gate.numel() * 2 + 2 * gate.numel()  # two bf16 tensors read, two e4m3 written
    rows = [
        ("forward, two passes and the transposed copy (compiled)", lambda: forward(gate, up)),
        ("forward, one pass in Inductor (scale given, amax beside)", lambda: inductor_forward(gate, up, scales_from(prev_same, E4M3))),  # noqa: E501
        ("forward, one pass, the recast idle", lambda: swiglu_cast(gate, up, prev_same)),
        ("forward, one pass, the recast redoing it", lambda: swiglu_cast(gate, up, prev_same * 1e-3)),
        ("forward, one pass without the transposed copy", lambda: swiglu_cast(gate, up, prev_same, transpose=False)),
    ]  # fmt: skip
    for bm, bn, w, n in TILES:
        rows.append(
            (
                f"forward, one pass, tiles {bm}x{bn}, {w} warps, {n} programs",
                partial(swiglu_cast, gate, up, prev_same, bm, bn, w, n),
            )
        )
    _time(rows, moved)


if __name__ == "__main__":
    main()
