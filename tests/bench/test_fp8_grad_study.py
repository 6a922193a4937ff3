"""bench/fp8_grad_study.py on CPU, as its record runs it: the table of each weight's gradient
distance from fp32's, in bf16 and fp8, its projections unfused and fused, and with e4m3 gradients."""

from __future__ import annotations

import re

import benchscript
import pytest


@pytest.mark.slow  # four backward passes of a small Llama, float8 on CPU
def test_the_study_tables_fp8_gradients_fused_and_unfused_against_fp32s(capsys):
    study = benchscript.load("fp8_grad_study")
    study.main(["--micro-batch", "1"])
    lines = capsys.readouterr().out.splitlines()
    header = ["parameter", "bf16", "fp8", "fp8", "fused", "fp8", "e4m3", "grads"]
    assert lines[0].startswith("rows 128:") and lines[2].split() == header
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines[3:]}
    # both fp8 layouts convert and fuse the projections the study names, and keep their names
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"} <= set(rows)
    for name, (bf16, unfused, fused, e4m3) in rows.items():
        # float8's rounding is far coarser than bf16's, in every layout; none of them is the fp32 gradient
        assert 0 < bf16 < 0.05 and unfused > 3 * bf16 and fused > 3 * bf16, (name, bf16, unfused, fused)
        # e4m3's third mantissa bit on the output gradients: closer to fp32's, still float8's
        assert 3 * bf16 < e4m3 < unfused, (name, bf16, unfused, e4m3)
    assert not any(re.search(r"nan|inf", line) for line in lines)
    # the fused column is the fused layout: q/k/v and gate/up slices of one float8 matmul each
    import torch
    import transformers

    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**study.CONFIG))
    kinds = {type(m).__name__ for m in study.fp8_model(base, True, False).modules()}
    assert {"ProjectionSlice", "Float8Linear"} <= kinds
    assert "ProjectionSlice" not in {type(m).__name__ for m in study.fp8_model(base, False, False).modules()}
    # on copies: the fp32 and bf16 columns' model stays plain
    assert all(type(m) is torch.nn.Linear for m in base.model.layers.modules() if isinstance(m, torch.nn.Linear))
