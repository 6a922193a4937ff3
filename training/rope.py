"""--rope-tables: RoPE's cos and sin computed once a forward, as an op the compiler cannot inline.
The default wherever the model is compiled (session 27: llama-1b 1.1-1.8% faster on an H200).

Llama-style models in transformers compute the rotary embedding's cos and sin in one module
(`model.rotary_emb`) and hand them to every attention. Compiling the whole model, Inductor sees a
short pointwise chain over two small inputs (positions times inverse frequencies, cos, sin) and
inlines it into each consumer: every layer's q and k rotation kernel, forward and backward,
evaluates cos and sin again for each of its elements. On llama-1b at micro-batch 16 (1xH200,
bench/measurements/2026-11-29-session26.md) those kernels take 12.6 ms of a 462 ms step, at about a
quarter of the memory bandwidth that reading q and k needs; with the tables read instead they are
memory-bound passes of about a third of that.

Computed by a custom op (opaque to Inductor), the tables are buffers each layer reads. The op is
the module's own formula (transformers 5.x, modeling_llama.LlamaRotaryEmbedding.forward): positions
times inverse frequencies in fp32, the halves concatenated, cos and sin times the attention scaling,
cast to the input's dtype. Only rope types whose inverse frequencies are fixed at construction are
tabled (STATIC_ROPE): the dynamic ones (dynamic NTK, longrope) change them with the sequence length
inside the module's forward, which keeps running for them. Parameters, buffers and the saved model
are untouched: only the module's forward is replaced, on this process's model object.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch

# transformers' rope types whose forward is the default formula over an inverse frequency fixed at
# construction (modeling_rope_utils: their init functions; dynamic_rope_update skips them)
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@torch.library.custom_op("distrain::rope_tables", mutates_args=())
def rope_tables(
    inv_freq: torch.Tensor, position_ids: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of [*position_ids.shape, 2 * len(inv_freq)], as transformers' rotary module
    returns them (autocast does not reach inside a custom op: fp32 throughout, as the module's)."""
    freqs = position_ids[..., None].float() * inv_freq.to(device=position_ids.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


@rope_tables.register_fake
def _(inv_freq, position_ids, scaling, dtype):
    shape = (*position_ids.shape, 2 * inv_freq.shape[-1])
    return position_ids.new_empty(shape, dtype=dtype), position_ids.new_empty(shape, dtype=dtype)


def _tabled_forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_tables(self.inv_freq, position_ids, float(self.attention_scaling), x.dtype)


def _why_not_tabled(module: torch.nn.Module) -> str | None:
    """Why this rotary module keeps its own forward, or None where rope_tables computes the same."""
    rope_type = getattr(module, "rope_type", None)
    if rope_type not in STATIC_ROPE:
        tabled = ", ".join(STATIC_ROPE)
        return f"rope type {rope_type!r}, not one of {tabled} (the dynamic ones change their frequencies as they run)"
    if not isinstance(getattr(module, "inv_freq", None), torch.Tensor):
        return "no inv_freq buffer"
    if not isinstance(getattr(module, "attention_scaling", None), (int, float)):
        return "no attention_scaling"
    if list(inspect.signature(module.forward).parameters) != ["x", "position_ids"]:
        return "a forward other than (x, position_ids)"
    return None


def use_rope_tables(model: torch.nn.Module, *, auto: bool = False) -> str:
    """--rope-tables (or its default, `auto`, on a compiled model): replace the forward of `model`'s
    rotary modules (transformers' classes named *RotaryEmbedding) by rope_tables where it computes
    the same. The log line."""
    tabled, kept = [], []
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("RotaryEmbedding"):
            continue
        if why := _why_not_tabled(module):
            kept.append(f"{name}: {why}")
            continue
        module.forward = types.MethodType(_tabled_forward, module)
        tabled.append(name)
    if not tabled:
        why = "; ".join(kept) or f"{type(model).__name__} has no rotary embedding module"
        return f"rope_tables=off ({'auto' if auto else '--rope-tables'}: {why})"
    return (
        f"rope_tables=on ({len(tabled)} {tabled[0]}: cos and sin computed once a forward, "
        f"outside the compiler, and read by every layer{'; auto: the model is compiled' if auto else ''})"
    )
