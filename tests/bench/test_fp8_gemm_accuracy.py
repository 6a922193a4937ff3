"""bench/fp8_gemm_accuracy.py on CPU: each float8 matmul measured against the exact product of its
own float8 operands, the rows written as JSON, and an unknown layer refused by name."""

from __future__ import annotations

import json

import benchscript
import pytest


@pytest.fixture(scope="module")
def probe():
    return benchscript.load("fp8_gemm_accuracy")


def test_it_measures_the_sum_apart_from_the_outputs_rounding(probe, tmp_path, capsys):
    out = tmp_path / "gemm.json"
    rows = probe.main(["--rows", "256", "--layers", "k_proj,qkv", "--device", "cpu", "--json", str(out)])
    assert [(r["layer"], r["out"], r["in"], r["rows"]) for r in rows] == [
        ("k_proj", 512, 2048, 256),
        ("qkv", 3072, 2048, 256),
    ]
    for r in rows:
        # CPU sums in fp32 with no fast mode: the fp32 outputs are the exact product to fp32's rounding,
        # and a bf16 output adds bf16's (2^-9 relative at most: about 1.6e-3 in norm)
        for name in ("forward", "grad_input"):
            assert r[f"{name}_fast_float32"] == r[f"{name}_exact_float32"] < 1e-5
            assert 1e-3 < r[f"{name}_exact_bfloat16"] < 2.5e-3
        assert r["grad_weight_exact_float32"] < 1e-5 and "grad_weight_exact_bfloat16" not in r
    saved = json.loads(out.read_text())
    assert saved["device"] == "cpu" and saved["rows"] == rows
    assert "qkv 3072x2048 rows=256 forward_fast_bfloat16=" in capsys.readouterr().out


def test_an_unknown_layer_is_refused_by_name(probe, capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--layers", "k_proj,o_porj"])
    assert exit_.value.code == 2
    assert "--layers: o_porj not among q_proj, k_proj, gate_proj, down_proj, qkv, gate_up" in capsys.readouterr().err
