"""bench/fp8_saved_bytes.py on CPU: what a compiled Llama block saves for its backward, bf16 against
fp8, is what launcher/memory.py's fp8 term says it is."""

from __future__ import annotations

import benchscript
import pytest

from distrain_cloud.launcher.memory import estimate
from distrain_cloud.launcher.shape import ModelShape


@pytest.mark.slow  # four compiles of a one-block Llama, about 40 s
def test_the_estimates_fp8_saving_is_what_the_compiled_graph_saves():
    study = benchscript.load("fp8_saved_bytes")
    d, inter, seq, batch = 64, 128, 32, 4
    counted = {
        r: study.per_token_layer(r, hidden=d, intermediate=inter, compiled=True, layers=1, seq=seq)
        for r in ("bf16", "fp8")
    }
    # the partitioner keeps no float8 tensor: fp8 drops bf16's copies of both norms' outputs and of
    # the MLP's activation, 2 (2 d + I) bytes, not a float8 byte for each bf16 input's two (3 d + I)
    assert counted["bf16"] - counted["fp8"] == 2 * (2 * d + inter)

    shape = ModelShape("tiny", "llama", layers=1, hidden=d, heads=2, vocab=256, positions=seq, intermediate=inter,
                       kv_heads=1, tied=False)  # fmt: skip
    bf16, fp8 = (
        estimate(shape, strategy="ddp", precision=p, batch_size=batch, seq_len=seq, world_size=1, compiled=True)
        for p in ("bf16", "fp8")
    )
    per_token_layer = (bf16.terms["activations"] - fp8.terms["activations"]) * 2**30 / (batch * seq)
    assert per_token_layer == pytest.approx(counted["bf16"] - counted["fp8"])
