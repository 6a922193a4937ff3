"""The trainer's forward passes build no key/value cache (modeling.forward_kwargs).

Nothing reads the cache in training, but under torch.compile every cached key and value is
an output of the compiled graph, which the backward then has to give a gradient.
"""

from __future__ import annotations

import types

import pytest
import torch
import transformers

from distrain_cloud.training import modeling
from distrain_cloud.training.args import TrainArgs
from distrain_cloud.training.trainer import Trainer

LAYERS = 2


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=LAYERS, n_head=2, n_embd=64, n_positions=64, vocab_size=128,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).train()


def test_decoders_get_use_cache_false_and_encoders_nothing(gpt2):
    assert modeling.forward_kwargs(gpt2) == {"use_cache": False}
    config = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=32,
                                     intermediate_size=64, vocab_size=128)
    bert = transformers.BertForSequenceClassification(config)
    assert modeling.forward_kwargs(bert) == {}
    bert(input_ids=torch.ones(1, 4, dtype=torch.long), **modeling.forward_kwargs(bert))  # accepted as is


def test_same_loss_no_cache_and_a_compiled_graph_without_the_cached_tensors(gpt2, dynamo_graphs):
    ids = torch.randint(0, 128, (2, 16))
    torch.manual_seed(1)
    default = gpt2(input_ids=ids, labels=ids)
    torch.manual_seed(1)  # the same dropout masks
    ours = gpt2(input_ids=ids, labels=ids, **modeling.forward_kwargs(gpt2))
    assert default.past_key_values is not None and ours.past_key_values is None
    assert torch.equal(default.loss, ours.loss)

    def graph_outputs(**kwargs) -> int:
        """Outputs of the (first) graph Dynamo captures for a training forward."""
        graphs = dynamo_graphs(lambda x: gpt2(input_ids=x, labels=x, **kwargs), ids)
        return len(next(n for n in graphs[0].graph.nodes if n.op == "output").args[0])

    # The default also returns each layer's keys and values: 2 x LAYERS more tensors.
    assert graph_outputs() == graph_outputs(**modeling.forward_kwargs(gpt2)) + 2 * LAYERS


def test_the_training_loss_goes_through_them():
    seen = []

    def model(**kwargs):
        seen.append(kwargs)
        return types.SimpleNamespace(loss=torch.tensor(1.0))

    trainer = Trainer.__new__(Trainer)  # only what _loss reads
    trainer.args, trainer.model, trainer.forward_kwargs = TrainArgs(task="causal-lm"), model, {"use_cache": False}
    ids = torch.ones(1, 4, dtype=torch.long)
    trainer._loss({"input_ids": ids}, step=0, micro=0)
    assert seen[0]["use_cache"] is False and seen[0]["labels"] is ids
