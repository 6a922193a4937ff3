"""Narrow Llama-style causal LMs for the training tests: the llama-1b preset's flags narrowed to a
64-wide, 2-block model (for entry-point runs), and the same shapes of any model type built from its
config in-process (grouped-query attention: 4 query heads, 2 key/value heads, head size 16)."""

from __future__ import annotations

from typing import Any

NARROW = (
    "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=256"
)
# the entry point's flags for a narrow Llama (the preset's tokenizer and vocabulary narrowed too)
LLAMA = ["--task", "causal-lm", "--preset", "llama-1b", "--config-overrides", NARROW]


def tiny_causal_lm(model_type: str, layers: int = 2, **config: Any) -> Any:
    """A 64-wide causal LM of `model_type` (llama, mistral, qwen2, qwen3, ...) from its config, seeded,
    with PyTorch's attention; `config` adds or replaces config fields (rope_parameters, ...)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "head_dim": 16,
        "max_position_embeddings": 256,
        **config,
    }
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields), attn_implementation="sdpa")
