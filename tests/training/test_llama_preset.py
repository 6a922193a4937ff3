"""The llama-1b preset: Llama 3.2 1B's shapes built from config (no download), counted on the
meta device (no 5 GB allocated), sized the same by the launcher's memory estimate, and trained
at a tiny width through the entry point."""

from __future__ import annotations

import pytest
import torch

from distrain_cloud.launcher.memory import estimate, model_shape
from distrain_cloud.training import modeling
from distrain_cloud.training.args import parse_args

LLAMA_3_2_1B_PARAMS = 1_235_814_400  # Llama 3.2 1B's own count (tied embeddings counted once)


@pytest.mark.slow  # importing transformers' Llama takes over 3 s on a loaded machine
def test_the_preset_has_llama_3_2_1b_shapes_without_allocating_them():
    args = parse_args(["--task", "causal-lm", "--preset", "llama-1b", "--block-size", "2048"])
    tokenizer = modeling.load_tokenizer(args)
    with torch.device("meta"):  # the trainer's own loading path, no weights allocated
        model = modeling.load_model(args, tokenizer)
    c = model.config
    assert (c.model_type, c.hidden_size, c.num_hidden_layers, c.intermediate_size) == ("llama", 2048, 16, 8192)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (32, 8, 128256)  # GQA: 4 per group
    theta = c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta
    assert theta == 500000.0 and c.hidden_act == "silu" and c.attention_dropout == 0.0
    assert c.tie_word_embeddings and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert type(model.model.norm).__name__ == "LlamaRMSNorm"
    attention = model.model.layers[0].self_attn
    assert attention.k_proj.weight.shape == (8 * 64, 2048) and attention.q_proj.weight.shape == (2048, 2048)
    assert sum(p.numel() for p in model.parameters()) == LLAMA_3_2_1B_PARAMS
    # the launcher sizes the same model without torch
    assert model_shape(args).params == LLAMA_3_2_1B_PARAMS


def test_the_memory_estimate_covers_the_preset_and_fp8():
    shape = model_shape(parse_args(["--task", "causal-lm", "--preset", "llama-1b"]))
    assert shape is not None and shape.family == "llama" and shape.kv_heads == 8
    e = estimate(shape, strategy="ddp", precision="bf16", batch_size=8, seq_len=2048, world_size=1, compiled=True)
    # fp32 weights and AdamW's moments: 12 bytes a parameter
    assert e.terms["weights"] + e.terms["optimizer"] == pytest.approx(12 * LLAMA_3_2_1B_PARAMS / 2**30)
    assert 30 < e.device_gib < 80, e  # one H100 at micro-batch 8, sequences of 2048
    assert e.notes == [] or not any("llama" in n for n in e.notes)  # calibrated: bench/memory_runs.py, session 18
    fp8 = estimate(shape, strategy="ddp", precision="fp8", batch_size=8, seq_len=2048, world_size=1, compiled=True)
    # compiled, fp8 keeps none of bf16's copies of the two norms' outputs and the MLP's activation
    # (bench/fp8_saved_bytes.py): 2 (2 d + I) bytes per token and layer
    saved = 2 * (2 * 2048 + 8192) * 8 * 2048 * 16 / 2**30
    assert e.terms["activations"] - fp8.terms["activations"] == pytest.approx(saved)
    eager, eager8 = (
        estimate(shape, strategy="ddp", precision=p, batch_size=8, seq_len=2048, world_size=1, compiled=False)
        for p in ("bf16", "fp8")
    )
    # eager, 4 d + I bytes (bench/fp8_saved_bytes.py counts it)
    assert eager.terms["activations"] - eager8.terms["activations"] == pytest.approx(
        (4 * 2048 + 8192) * 8 * 2048 * 16 / 2**30
    )
    assert {k: v for k, v in fp8.terms.items() if k != "activations"} == {
        k: v for k, v in e.terms.items() if k != "activations"
    }


@pytest.mark.slow  # a short entry-point run
def test_a_narrow_llama_trains_through_the_entry_point(train):
    narrow = (
        "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
        "num_key_value_heads=2,vocab_size=1024"
    )
    run = train(
        "--task", "causal-lm", "--preset", "llama-1b", "--config-overrides", narrow,
        "--dataset", "builtin:corpus", "--block-size", "32", "--batch-size", "4",
        "--max-steps", "4", "--log-every", "2", "--report-to", "none", "--no-save-model",
        "--max-eval-samples", "8", "--generate-tokens", "2",
    )  # fmt: skip
    assert run.returncode == 0, run.describe()
    losses = run.train_losses
    assert len(losses) == 2 and all(0 < v < 20 for v in losses.values()), losses
    assert run.lines("precision=") == [
        "precision=no (default on no CUDA GPU: fp32, as the launcher picks; --precision to choose)"
    ]
