"""bench/fp8_onepass.py's kernel in Triton's CPU interpreter: the scale it casts with, the amax it
records, the recast's decisions, the transposed copies and the tiles' edges, against torch."""

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
for name, (prev, want_scale) in cases.items():
    dg, dg_t, du, du_t, scale, recorded = f.swiglu_grad_cast(grad_h, gate, up, prev.clone(), bm=16, bn=32)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0, msg=name)
    torch.testing.assert_close(recorded, amax, rtol=1e-6, atol=0, msg=name)
    for d8, d8_t, d, s in ((dg, dg_t, grads[0], scale[0]), (du, du_t, grads[1], scale[1])):
        x = (d * s).clamp(-f.E5M2_MAX, f.E5M2_MAX)
        want = x.to(f.E5M2)
        assert torch.equal(d8_t.view(torch.uint8), d8.view(torch.uint8).t()), name
        # The interpreter's e5m2 rounding drops the carry when a value rounds up to the next power
        # of two (7.54 gives 4, not 8); a GPU's conversion does not. Every other byte is torch's.
        got, ref = d8.float(), want.float()
        differ = d8.view(torch.uint8) != want.view(torch.uint8)
        carry = (got * 2 == ref) & (torch.log2(ref.abs()).frac() == 0) & (x.abs() < ref.abs())
        assert bool((differ <= carry).all()), (name, int(differ.sum()), int(carry.sum()))
        assert differ.float().mean() < 0.1, name
# the GPU script's own check (its main() minus the timing): the same bytes but for the carries
same, recorded, true_amax, _ = f.agreement(grad_h, gate, up)
assert min(same) > 0.9, same
torch.testing.assert_close(recorded, amax, rtol=1e-6, atol=0)
torch.testing.assert_close(true_amax, amax, rtol=1e-6, atol=0)
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
