"""training/modeling.py: how models are loaded for training."""

from __future__ import annotations

import pytest
import torch

from distrain_cloud.training import modeling
from distrain_cloud.training.args import TrainArgs


@pytest.mark.slow  # Dynamo traces the model
def test_loaded_causal_lms_compile_into_one_graph_with_transformers_loss(dynamo_graphs):
    """Causal LMs are loaded with the loss transformers would fall back to named (load_model sets
    loss_type), so a compiled model is one graph up to and including it."""
    args = TrainArgs(task="causal-lm", preset="tiny-gpt2")
    tokenizer = modeling.load_tokenizer(args)
    model = modeling.load_model(args, tokenizer)
    assert model.loss_type == "ForCausalLM"
    ids = torch.randint(0, len(tokenizer), (2, 16))
    graphs = dynamo_graphs(lambda x: model(input_ids=x, labels=x, use_cache=False).loss, ids)
    assert len(graphs) == 1  # transformers' default lookup split it in two


def test_config_overrides_change_the_built_config_and_name_a_wrong_key():
    from distrain_cloud.training.args import ArgumentError, parse_args

    def config(overrides: str):
        args = parse_args(["--task", "causal-lm", "--preset", "tiny-gpt2", "--config-overrides", overrides])
        return modeling.build_config(args, modeling.load_tokenizer(args), None, None)

    got = config("attn_pdrop=0, resid_pdrop=0.05,n_layer=3")
    assert (got.attn_pdrop, got.resid_pdrop, got.embd_pdrop, got.n_layer) == (0.0, 0.05, 0.1, 3)
    with pytest.raises(ArgumentError, match="--config-overrides attn_pdropp=0: GPT2Config has no 'attn_pdropp'"):
        config("attn_pdropp=0")
    with pytest.raises(ArgumentError, match="--config-overrides n_layer=two: "):
        config("n_layer=two")
    with pytest.raises(ArgumentError, match="expects KEY=VALUE pairs separated by commas.*got 'attn_pdrop'"):
        config("attn_pdrop")
