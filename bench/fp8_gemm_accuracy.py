"""How exactly torch._scaled_mm sums, at llama-1b's float8 layers' shapes (one GPU; CPU for a check).

    python bench/fp8_gemm_accuracy.py [--rows 16384,32768] [--layers k_proj,qkv] [--json PATH]

Session 34 found fp8 training behind bf16 at micro-batch 16 and 32 but not at 8, and less behind
with --fuse-projections; the CPU (bench/fp8_grad_study.py) saw no difference between the layouts.
What changes with the micro-batch on the GPU is the weight gradient's sum: it runs over the rows
(micro-batch x 2,048 tokens), and cuBLAS picks its kernel (split-K among them) by the shape, which
fusing widens. This takes the float8 operands each training matmul of training/fp8_linear.py
multiplies (the forward, the input's gradient, the weight's gradient), with the scales and
accumulation the default recipe uses and the other one, and measures each product against the
exact product of the same float8 values (float64): what is left is the GEMM's own summation
error, not float8's rounding. A summation in float32 errs by about 1e-7 per add, so anything near
1e-3 is a kernel summing in less.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HIDDEN, INTERMEDIATE = 2048, 8192
LAYERS = {  # llama-1b's linear layers as (out, in) features; fused groups as --fuse-projections makes them
    "q_proj": (2048, HIDDEN),
    "k_proj": (512, HIDDEN),
    "gate_proj": (INTERMEDIATE, HIDDEN),
    "down_proj": (HIDDEN, INTERMEDIATE),
    "qkv": (3072, HIDDEN),
    "gate_up": (2 * INTERMEDIATE, HIDDEN),
}


def to_fp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensorwise dynamic scaling, as training/fp8_linear.py: the float8 tensor and its inverse scale."""
    top = torch.finfo(dtype).max
    scale = top / x.abs().amax().float().clamp(min=1e-12)
    return (x.float() * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def col(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous().t()


def exact(a8, a_inv, b8, b_inv) -> torch.Tensor:
    """The exact product of float8 operands and their scales, in float64."""
    return (a8.double() @ b8.double()) * (a_inv.double() * b_inv.double())


def error(a8, a_inv, b8, b_inv, out_dtype, fast: bool, want: torch.Tensor) -> float:
    """||_scaled_mm(a, b) - want|| / ||want||."""
    got = torch._scaled_mm(a8, b8, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype, use_fast_accum=fast)
    return ((got.double() - want).norm() / want.norm()).item()


def measure(layer: str, rows: int, device: str, seed: int = 0) -> dict:
    """The three matmuls of one float8 layer at `rows` rows, each with fast and exact accumulation."""
    out_f, in_f = LAYERS[layer]
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, in_f, device=device, generator=g).bfloat16()
    w = torch.randn(out_f, in_f, device=device, generator=g) * 0.02
    grad = torch.randn(rows, out_f, device=device, generator=g).bfloat16() * 1e-4
    (x8, x_inv), (w8, w_inv), (g8, g_inv) = to_fp8(x, E4M3), to_fp8(w, E4M3), to_fp8(grad, E5M2)
    row = {"layer": layer, "out": out_f, "in": in_f, "rows": rows}
    # the operands exactly as _Float8Matmul passes them (first row-major, second column-major), and
    # the dtype it asks for; the float32 output beside a bf16 one isolates the sum from the rounding
    matmuls = {
        "forward": ((x8, x_inv, w8.t(), w_inv), torch.bfloat16),
        "grad_input": ((g8, g_inv, col(w8), w_inv), torch.bfloat16),
        "grad_weight": ((g8.t().contiguous(), g_inv, col(x8), x_inv), torch.float32),
    }
    for name, (operands, trained) in matmuls.items():
        want = exact(*operands)
        for fast in (True, False):
            for out_dtype in dict.fromkeys((trained, torch.float32)):
                tag = f"{name}_{'fast' if fast else 'exact'}_{str(out_dtype).removeprefix('torch.')}"
                row[tag] = error(*operands, out_dtype, fast, want)
        del want
    return row


def matmul_names(key: str) -> list[str]:
    """[""] for a measured column of measure()'s row, else [] (the row's shape and timing)."""
    return [""] if key.startswith(("forward_", "grad_")) else []


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="8192,16384,32768,65536", help="rows: micro-batch x 2,048 tokens")
    p.add_argument("--layers", default=",".join(LAYERS), help=f"of {', '.join(LAYERS)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args(argv)
    layers = a.layers.split(",")
    unknown = [n for n in layers if n not in LAYERS]
    if unknown:
        p.error(f"--layers: {', '.join(unknown)} not among {', '.join(LAYERS)}")
    if a.device == "cuda":
        print(torch.cuda.get_device_name(), "torch", torch.__version__, "cuda", torch.version.cuda)
    print("each product's distance from the exact product of its float8 operands, over that product's norm")
    print("(forward and grad_input train with a bf16 output: its rounding alone is about 1.6e-3)")
    rows_out = []
    for layer in layers:
        for rows in (int(r) for r in a.rows.split(",")):
            start = time.perf_counter()
            r = measure(layer, rows, a.device)
            r["seconds"] = round(time.perf_counter() - start, 2)
            rows_out.append(r)
            cells = "  ".join(f"{k.removeprefix(m)}={v:.2e}" for k, v in r.items() for m in matmul_names(k))
            print(f"{layer} {r['out']}x{r['in']} rows={rows} {cells}", flush=True)
            if a.device == "cuda":
                torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "torch": torch.__version__, "rows": rows_out}, f, indent=1)
    return rows_out


if __name__ == "__main__":
    main()
