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
