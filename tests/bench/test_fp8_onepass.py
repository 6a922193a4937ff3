"""bench/fp8_onepass.py's kernels (the gate/up gradient's cast, the down projection's input's) in
Triton's CPU interpreter: the scale each casts with, the amax it records, the recast's decisions,
the transposed copies and the tiles' edges, against torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

CHECK = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
import fp8_onepass as f

g = torch.Generator().manual_seed(3)
M, I = 40, 72  # neither a multiple of the 16 x 32 tiles: the masks at both edges
grad_h = (1e-3 * torch.randn(M, I, generator=g)).bfloat16()
gate, up = torch.randn(M, I, generator=g).bfloat16(), torch.randn(M, I, generator=g).bfloat16()
grads = f.swiglu_grads(grad_h, gate, up)
amax = torch.stack([d.abs().amax() for d in grads])
exact = f.E5M2_MAX / amax  # dynamic scaling's scales
cases = {  # the previous amaxes, and the scales the cast must end with
    "first step": (torch.zeros(2), exact),
    "steady": (amax / f.HEADROOM, exact),
    "inside the band": (amax / 1.5, f.E5M2_MAX / (f.HEADROOM * amax / 1.5)),
    "grown past the headroom": (amax / 10, exact),
    "fell below a quarter": (amax * 10, exact),
}


def only_carries(name, d8, x, want):
    # `d8` is torch's cast `want` of `x`, but where the interpreter rounds otherwise than a GPU: it
    # drops the carry when a value rounds up to the next power of two (7.54 gives 4, not 8 in e5m2),
    # and truncates below the smallest normal (0.0055 gives 2 of e4m3's steps of 2**-9, not 3)
    got, ref = d8.float(), want.float()
    info = torch.finfo(d8.dtype)
    step = {torch.float8_e4m3fn: 2.0**-9, torch.float8_e5m2: 2.0**-16}[d8.dtype]
    differ = d8.view(torch.uint8) != want.view(torch.uint8)
    carry = (got * 2 == ref) & (torch.log2(ref.abs()).frac() == 0) & (x.abs() < ref.abs())
    truncated = (ref.abs() <= info.smallest_normal) & ((got - x).abs() < step) & (got.abs() <= x.abs())
    assert bool((differ <= (carry | truncated)).all()), (name, int(differ.sum()), int(carry.sum()))
    assert differ.float().mean() < 0.1, name


for name, (prev, want_scale) in cases.items():
    dg, dg_t, du, du_t, scale, recorded = f.swiglu_grad_cast(grad_h, gate, up, prev.clone(), bm=16, bn=32, programs=2)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0, msg=name)
    torch.testing.assert_close(recorded, amax, rtol=1e-6, atol=0, msg=name)
    for d8, d8_t, d, s in ((dg, dg_t, grads[0], scale[0]), (du, du_t, grads[1], scale[1])):
        x = (d * s).clamp(-f.E5M2_MAX, f.E5M2_MAX)
        want = f.cast_fp8(d, f.E5M2, s)[0]  # the training step's cast
        assert torch.equal(d8_t.view(torch.uint8), d8.view(torch.uint8).t()), name
        only_carries(name, d8, x, want)
# the GPU script's own check (its main() minus the timing): the same bytes but for the carries
same, recorded, true_amax, _ = f.agreement(grad_h, gate, up)
assert min(same) > 0.9, same
torch.testing.assert_close(recorded, amax, rtol=1e-6, atol=0)
torch.testing.assert_close(true_amax, amax, rtol=1e-6, atol=0)
# the forward's kernel: silu(gate) * up in e4m3, its band narrower (RECAST_BELOW_E4M3)
h = torch.nn.functional.silu(gate.float()) * up.float()
h_amax = h.abs().amax().reshape(1)
h_exact = f.E4M3_MAX / h_amax
forward_cases = {
    "first step": (torch.zeros(1), h_exact),
    "steady": (h_amax / f.HEADROOM, h_exact),
    "inside the band": (h_amax * 1.5, f.E4M3_MAX / (f.HEADROOM * h_amax * 1.5)),
    "grown past the headroom": (h_amax / 10, h_exact),
    "fell below half": (h_amax * 2.5, h_exact),
}
for name, (prev, want_scale) in forward_cases.items():
    h8, h8_t, scale, recorded = f.swiglu_cast(gate, up, prev.clone(), bm=16, bn=32, programs=2)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0, msg=name)
    torch.testing.assert_close(recorded, h_amax, rtol=1e-6, atol=0, msg=name)
    assert torch.equal(h8_t.view(torch.uint8), h8.view(torch.uint8).t()), name
    x = (h * scale).clamp(-f.E4M3_MAX, f.E4M3_MAX)
    only_carries(name, h8, x, f.cast_fp8(h, f.E4M3, scale)[0])
same, recorded, true_amax, _ = f.forward_agreement(gate, up)
assert min(same) > 0.9, same
torch.testing.assert_close(recorded, h_amax, rtol=1e-6, atol=0)
torch.testing.assert_close(true_amax, h_amax, rtol=1e-6, atol=0)
print("kernel ok")
"""


@pytest.mark.slow  # a fresh interpreter: Triton reads TRITON_INTERPRET when it is imported
def test_the_one_pass_cast_agrees_with_torch_in_tritons_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(BENCH)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "kernel ok" in done.stdout, done.stderr[-3000:]
