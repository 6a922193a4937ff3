"""What a Llama block stack saves for its backward, bf16 against fp8, per token and layer (CPU).

launcher/memory.py's fp8 term says how many bytes a token and layer fp8 saves against bf16. This
counts them: a tiny Llama (the trainer's own bf16 residual stream and rope tables, our float8
layers with auto's recipe) runs one training step at two batch sizes under bf16 autocast, every
tensor autograd saves is caught by a saved-tensors hook (a compiled graph's too) and counted once
by its storage; the difference between the batches, per token and layer, is the activations'
slope, free of the weights and everything else a step holds once.

    python bench/fp8_saved_bytes.py                    # compiled and eager, I = 2d and 4d
    python bench/fp8_saved_bytes.py --hidden 128 --intermediate 512 --modes compiled

Finding (torch 2.13, Inductor on CPU; session 37): compiled, fp8 saves 4d + 2I bytes a token and
layer against bf16, where one float8 byte for each bf16 input's two would save 3d + I: the
partitioner keeps no float8 tensor at all. It recomputes the casts in the backward from what the
block saves anyway (the residual stream, the MLP's gate and up outputs, attention's output), so
fp8 drops the bf16 copies bf16 keeps of both norms' outputs and of the MLP's activation. Keeping
q_proj and k_proj bf16 keeps the attention norm's output again (+2d). Eager, where each float8 layer
saves its input in float8 and autocast's bf16 layers their own bf16 casts, fp8 saves 4d + I. Each
exact at I = 2d, 4d and 6d. llama-1b's compiled peaks on H200s agree within 1.5%
(bench/measurements/2026-11-30-session37.md). Session 38 measured the rest on H200s: eager fp8 kept
7.7d less than eager bf16 (4d + I = 8d), and with the MLP 6d wide compiled fp8 kept 4.0 bytes per
element of width where bf16 kept 6.75 (this count: 4 and 6; launcher/memory.py's MLP_BYTES).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

try:
    import distrain_cloud.training  # noqa: F401
except ModuleNotFoundError:  # a checkout not `pip install -e`'d (the GPU machines): run.py's symlink package
    from run import package_shim

    sys.path.insert(0, str(package_shim(Path(tempfile.mkdtemp(prefix="fp8-saved-bytes-")))))

RECIPES = {"bf16": None, "fp8": (), "fp8-qk": ("q_proj", "k_proj")}  # --fp8-bf16-layers of each fp8 recipe
TERMS = {"compiled": "4d + 2I", "eager": "4d + I"}  # launcher/memory.py's fp8 saving, a token and layer


def saved_bytes(
    recipe: str, batch: int, *, hidden: int, intermediate: int, layers: int, seq: int, compiled: bool
) -> int:
    """The bytes autograd saves over one training step of the block stack, each storage once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from distrain_cloud.training import fp8
    from distrain_cloud.training.engines.base import residual_in_bf16
    from distrain_cloud.training.rope import use_rope_tables

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 32),
        num_key_value_heads=max(1, hidden // 128),
        vocab_size=256,
        max_position_embeddings=seq,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    residual_in_bf16(model, auto=True)
    use_rope_tables(model)
    if RECIPES[recipe] is not None:
        fp8.use_fp8(model, fast_accum="grad-input", grad_dtype="e4m3", bf16_layers=RECIPES[recipe])
    torch._dynamo.reset()  # each model is new to dynamo: past its recompile limit it would run eager
    body = torch.compile(model.model) if compiled else model.model
    ids = torch.randint(0, 256, (batch, seq))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for _ in range(2):  # the first compiles; count the second
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            hidden_states = body(input_ids=ids).last_hidden_state
        hidden_states.float().pow(2).mean().backward()
    return sum(seen.values())


def per_token_layer(
    recipe: str, *, hidden: int, intermediate: int, compiled: bool, layers: int = 2, seq: int = 64
) -> float:
    """The saved bytes a token and layer: the slope between batches 2 and 4, over the layers (the
    final norm's few bytes a token ride along, under 1% at these sizes)."""
    small, large = (
        saved_bytes(recipe, b, hidden=hidden, intermediate=intermediate, layers=layers, seq=seq, compiled=compiled)
        for b in (2, 4)
    )
    return (large - small) / (2 * seq * layers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, action="append", help="default: 2 and 4 times --hidden")
    p.add_argument("--modes", default="compiled,eager")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    d, rows = a.hidden, []
    for mode in a.modes.split(","):
        for inter in a.intermediate or [2 * d, 4 * d]:
            got = {r: per_token_layer(r, hidden=d, intermediate=inter, compiled=mode == "compiled") for r in RECIPES}
            row = {"mode": mode, "d": d, "I": inter, **{r: got[r] / d for r in RECIPES}}
            row["fp8 saves (d)"] = row["bf16"] - row["fp8"]
            row["q,k bf16 cost (d)"] = row["fp8-qk"] - row["fp8"]
            rows.append(row)
            print(
                f"{mode:8} d={d} I={inter}: bf16 {row['bf16']:.2f}d, fp8 {row['fp8']:.2f}d, fp8 q/k bf16 "
                f"{row['fp8-qk']:.2f}d bytes a token and layer; fp8 saves {row['fp8 saves (d)']:.2f}d "
                f"(the estimate's term, {TERMS[mode]}: {(4 + (2 if mode == 'compiled' else 1) * inter / d):.2f}d)",
                flush=True,
            )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
