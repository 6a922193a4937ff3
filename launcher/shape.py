"""A model's shape: what the memory estimate (memory.py) and the throughput estimate
(throughput.py) both read of a model, and how it is read from a transformers config.

Torch-free and data-free: both estimates import it, and it imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model."""

    name: str
    family: str  # "gpt2", "bert" or "llama" (Llama-shaped decoders too): which parameter formula applies
    layers: int
    hidden: int
    heads: int
    vocab: int
    positions: int
    intermediate: int  # the MLP's inner width (4 d for GPT-2)
    kv_heads: int | None = None  # llama: key/value heads (grouped-query attention)
    tied: bool = True  # the LM head shares the input embeddings (llama-8b's does not)
    head_dim: int | None = None  # llama: each head's width where it is not hidden / heads (Qwen3's)

    @property
    def params(self) -> int:
        """Parameters, embeddings included and a tied LM head counted once, as torch counts them.

        Per layer: q, k, v and the output projection (4 d^2 + 4 d), the MLP (2 d I + I + d) and
        two LayerNorms (4 d). GPT-2 adds a final LayerNorm; BERT token types, an embedding
        LayerNorm and its pooler. Task heads are left out: under 1% of any model here.
        """
        d = self.hidden
        if self.family == "llama":  # a final RMSNorm
            return self.embeddings + self.layers * self.per_layer + d
        extra = 2 * d if self.family == "gpt2" else 2 * d + 2 * d + d * d + d
        return self.embeddings + self.layers * self.per_layer + extra

    @property
    def per_layer(self) -> int:
        """Parameters of one transformer block."""
        d, inner = self.hidden, self.intermediate
        if self.family == "llama":  # q and o, k and v over the kv heads, SwiGLU's three, two RMSNorms
            width = self.head_dim or d // self.heads
            q, kv = width * self.heads, width * (self.kv_heads or self.heads)
            return 2 * d * q + 2 * d * kv + 3 * d * inner + 2 * d
        return 4 * d * d + 4 * d + 2 * d * inner + inner + d + 4 * d

    @property
    def embeddings(self) -> int:
        positions = 0 if self.family == "llama" else self.positions  # RoPE: no position table
        head = 0 if self.tied else self.vocab  # an untied LM head: a second vocabulary-sized matrix
        return (self.vocab + positions + head) * self.hidden


# The shipped tokenizer's size: presets without a vocab_size take it (training/modeling.py).
SHIPPED_VOCAB = 746


def shape_from_config(name: str, config: Mapping[str, Any]) -> ModelShape | None:
    """A ModelShape from a transformers config (GPT-2, BERT or DistilBERT key names), or None,
    also where a size is not a positive whole number (a config file or --config-overrides may say
    anything: 0, -3, inf, "abc")."""

    def first(*keys: str, default: int | None = None, least: int = 1) -> int:
        value: Any = next((config[k] for k in keys if config.get(k) is not None), default)
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole or value < least:
            raise ValueError(f"{keys[0]}: {value!r}")
        return int(value)

    from distrain_cloud.training.args import LLAMA_SHAPED_MODEL_TYPES

    family = "gpt2" if config.get("model_type") == "gpt2" or "n_embd" in config else "bert"
    # Llama's formula for the decoders built as it is (Qwen2's q/k/v biases and Qwen3's q/k norms
    # are under 0.1% of a block)
    family = "llama" if config.get("model_type") in LLAMA_SHAPED_MODEL_TYPES else family
    try:
        hidden = first("n_embd", "hidden_size", "dim")
        return ModelShape(
            name=name,
            family=family,
            layers=first("n_layer", "num_hidden_layers", "n_layers"),
            hidden=hidden,
            heads=first("n_head", "num_attention_heads", "n_heads"),
            vocab=first("vocab_size", default=SHIPPED_VOCAB),
            # transformers' defaults: GPT2Config 1024, BertConfig 512
            positions=first("n_positions", "max_position_embeddings", default=1024 if family == "gpt2" else 512),
            intermediate=first("n_inner", "intermediate_size", "hidden_dim", default=4 * hidden),
            kv_heads=first("num_key_value_heads", default=0, least=0) or None,
            # transformers' defaults: LlamaConfig unties, GPT-2 and BERT tie
            tied=bool(config.get("tie_word_embeddings", family != "llama")),
            head_dim=(first("head_dim", default=0, least=0) or None) if family == "llama" else None,
        )
    except (TypeError, ValueError):
        return None
