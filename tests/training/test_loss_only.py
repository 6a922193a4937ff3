"""Training forwards return only the loss (modeling.loss_only_in_training).

With bf16 and accelerate, returned logits are copied to fp32; under torch.compile that copy is
an output of the compiled graph, so the backward also zero-fills and reads a gradient for it.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from distrain_cloud.training import modeling

VOCAB = 128


def gpt2(loss_only: bool):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=VOCAB,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.loss_type = "ForCausalLM"
    if loss_only:
        modeling.loss_only_in_training(model)
    return model


IDS = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))


def test_training_returns_the_same_loss_alone_and_everything_else_is_unchanged():
    default, ours = gpt2(False), gpt2(True)
    torch.manual_seed(1)
    expected = default(input_ids=IDS, labels=IDS)
    torch.manual_seed(1)  # the same dropout masks
    got = ours(input_ids=IDS, labels=IDS)
    assert torch.equal(got.loss, expected.loss) and got.logits is None
    got.loss.backward()
    assert ours.lm_head.weight.grad is not None
    # Without labels (the chunked-loss path) and in eval mode the full output comes back.
    assert ours(input_ids=IDS, output_hidden_states=True).hidden_states is not None
    ours.eval(), default.eval()
    assert torch.equal(ours(input_ids=IDS, labels=IDS).logits, default(input_ids=IDS, labels=IDS).logits)
    # The class's signature stays visible to forward_kwargs() and generate().
    assert inspect.signature(ours.forward) == inspect.signature(default.forward)
    assert modeling.forward_kwargs(ours) == {"use_cache": False}


@pytest.mark.parametrize("loss_only", [False, True])
def test_no_logits_sized_gradient_in_the_compiled_bf16_backward(loss_only):
    """Through accelerate's bf16 preparation and torch.compile, as the trainer runs it."""
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    torch._dynamo.reset()
    acc = Accelerator(mixed_precision="bf16", dynamo_plugin=TorchDynamoPlugin(backend="aot_eager"), cpu=True)
    model = acc.prepare(gpt2(loss_only))
    for _ in range(2):  # compile, then measure a steady step
        acc.backward(model(input_ids=IDS, labels=IDS, use_cache=False).loss)
    with torch.profiler.profile(record_shapes=True) as prof:
        acc.backward(model(input_ids=IDS, labels=IDS, use_cache=False).loss)
    filled = [e.input_shapes[0] for e in prof.events() if e.name in ("aten::zero_", "aten::fill_")]
    logits_sized = [s for s in filled if s[-1:] == [VOCAB] and s[:-1] == list(IDS.shape)]
    assert bool(logits_sized) is not loss_only, filled
    # accelerate can still take its wrappers off (saving, generation), and eval is untouched.
    unwrapped = acc.unwrap_model(model, keep_fp32_wrapper=False).eval()
    assert unwrapped(input_ids=IDS).logits.shape == (*IDS.shape, VOCAB)
    torch._dynamo.reset()


def test_one_graph_with_the_loss_as_its_only_large_output(dynamo_graphs):
    model = gpt2(True)
    graphs = dynamo_graphs(lambda x: model(input_ids=x, labels=x, use_cache=False), IDS)
    assert len(graphs) == 1
    outputs = next(n for n in graphs[0].graph.nodes if n.op == "output").args[0]
    shapes = [tuple(o.meta["example_value"].shape) for o in outputs if hasattr(o, "meta") and "example_value" in o.meta]
    assert (*IDS.shape, VOCAB) not in shapes and () in shapes, shapes
