"""fp8's gradients against fp32's on one tiny Llama, its projections unfused and fused (CPU).

    python bench/fp8_grad_study.py [--micro-batch 8] [--compiled]   # sequences of 128 tokens
    python bench/fp8_grad_study.py --device cuda --micro-batch 256 --compiled   # on a GPU: 32,768 rows

Session 34 found fp8 (60 steps at micro-batch 16 on an H200) 3.7% behind bf16 unfused and 1.1%
with --fuse-projections. This asks whether the arithmetic alone differs: the same model and batch,
each weight's gradient's relative error (norm of the difference over fp32's norm) in bf16 autocast,
fp8's default layers, those layers with q/k/v and gate/up fused, and with e4m3 output gradients
(--fp8-grad-dtype e4m3). `--compiled` runs the two fp8
models' forward through torch.compile (Inductor on CPU) and adds each one's distance from its own
eager gradients. torch._scaled_mm runs on CPU (no fast accumulation there): what this cannot show
is what the GPU's kernels do differently: `--device cuda` runs the same study there (fast
accumulation and Inductor's GPU kernels included), at llama-1b's row counts with enough sequences.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch
import transformers

try:
    from distrain_cloud.training import fp8
    from distrain_cloud.training.fusion import fuse_projections
except ModuleNotFoundError:  # a checkout not `pip install -e`'d (the GPU machines): run.py's symlink package
    from run import package_shim

    sys.path.insert(0, str(package_shim(Path(tempfile.mkdtemp(prefix="fp8-grad-study-")))))
    from distrain_cloud.training import fp8
    from distrain_cloud.training.fusion import fuse_projections

CONFIG = dict(  # llama-1b's kind of model, narrow: 8 query heads over 2 key-value heads, as llama-1b's 32 over 8
    vocab_size=512,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
Grads = dict[str, torch.Tensor]


def grads(model: torch.nn.Module, ids: torch.Tensor, autocast: bool) -> Grads:
    """Each parameter's gradient (fp32) of the causal LM loss on `ids` (on `ids`' device)."""
    model.zero_grad()
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def fp8_model(base: torch.nn.Module, fused: bool, compiled: bool, grad_dtype: str = "e5m2") -> torch.nn.Module:
    """A copy of `base` with fp8's default layers (fast accumulation is a GPU matter), fused or not
    (the parameters keep their names), its forward compiled or not, its output gradients in
    `grad_dtype` (--fp8-grad-dtype)."""
    model = copy.deepcopy(base)
    fp8.use_fp8(model, fast_accum="grad-input", grad_dtype=grad_dtype)
    if fused:
        fuse_projections(model)
    if compiled:
        model.model.forward = torch.compile(model.model.forward)
    return model


def distance(g: Grads, against: Grads, ref: Grads, name: str) -> float:
    """How far `g` is from `against` for parameter `name`, relative to fp32's gradient's size."""
    return ((g[name] - against[name]).norm() / ref[name].norm()).item()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro-batch", type=int, default=8, help="sequences of 128 tokens (default 8)")
    p.add_argument("--compiled", action="store_true", help="the fp8 models' forward through torch.compile too")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda (float8 needs compute capability >= 8.9)")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).float().to(a.device)
    ids = torch.randint(0, CONFIG["vocab_size"], (a.micro_batch, 128)).to(a.device)
    ref = grads(copy.deepcopy(base), ids, False)
    # each column: (gradients, what they are measured against)
    columns = {"bf16": (grads(copy.deepcopy(base), ids, True), ref)}
    for fused in (False, True):
        name = "fp8 fused" if fused else "fp8"
        eager = grads(fp8_model(base, fused, False), ids, True)
        columns[name] = (eager, ref)
        if a.compiled:
            compiled = grads(fp8_model(base, fused, True), ids, True)
            columns[f"{name} compiled"] = (compiled, ref)
            columns[f"{name} compiled vs eager"] = (compiled, eager)
    # session 35: torchao's rowwise recipe, whose gradients are e4m3, trained ahead of the tensorwise one
    columns["fp8 e4m3 grads"] = (grads(fp8_model(base, False, False, "e4m3"), ids, True), ref)
    print(f"rows {a.micro_batch * 128}: each gradient's distance from fp32's (vs eager: from the eager fp8 one's),")
    print("over fp32's norm")
    width = {k: max(8, len(k)) for k in columns}
    print(f"{'parameter':47s} " + " ".join(f"{k:>{width[k]}s}" for k in columns))
    for name in ref:
        if "layers.0" in name or "layers.1.mlp" in name or "embed" in name:
            cells = (f"{distance(g, against, ref, name):>{width[k]}.4f}" for k, (g, against) in columns.items())
            print(f"{name:47s} " + " ".join(cells))


if __name__ == "__main__":
    main()
