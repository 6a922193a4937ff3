"""fp8's gradients against fp32's on one tiny Llama, its projections unfused and fused (CPU, eager).

    python bench/fp8_grad_study.py [MICRO_BATCH]     # sequences of 128 tokens; default 8

Session 34 found fp8 (60 steps at micro-batch 16 on an H200) 3.7% behind bf16 unfused and 1.1%
with --fuse-projections. This asks whether the arithmetic alone differs: the same model and batch,
each weight's gradient's relative error (norm of the difference over fp32's norm) in bf16 autocast,
fp8's default layers, and those layers with q/k/v and gate/up fused. torch._scaled_mm runs on CPU
(no fast accumulation there, and no compiler): what it cannot show is what the GPU does differently.
"""

from __future__ import annotations

import copy
import sys

import torch
import transformers

from distrain_cloud.training import fp8 as F8
from distrain_cloud.training.fusion import fuse_projections

torch.manual_seed(0)
cfg = transformers.LlamaConfig(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
base = transformers.LlamaForCausalLM(cfg).float()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
ids = torch.randint(0, 512, (N, 128))


def grads(model, amp):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def fp8_model(fused: bool) -> torch.nn.Module:
    """A copy of the model with fp8's default layers (fast accumulation is a GPU matter), fused or not."""
    model = copy.deepcopy(base)
    F8.use_fp8(model, fast_accum="grad-input")
    if fused:
        fuse_projections(model)
    return model


ref = grads(copy.deepcopy(base), False)
bf = grads(copy.deepcopy(base), True)
gu, gf = grads(fp8_model(False), True), grads(fp8_model(True), True)


def err(g, name):
    r = ref[name]
    return ((g[name] - r).norm() / r.norm()).item()


print(f"rows {N * 128}: relative gradient error against fp32's")
for name in ref:  # fused, the parameters keep their names
    if "layers.0" in name or "layers.1.mlp" in name or "embed" in name:
        print(f"{name:47s} bf16 {err(bf, name):.4f}  fp8 {err(gu, name):.4f}  fp8 fused {err(gf, name):.4f}")
