"""The causal-LM loss the trainer uses by default: the same value and gradients as
transformers' own loss, eager and compiled."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compiled"])
def test_causal_lm_loss_matches_transformers(no_dropout_config, compile_):
    from transformers import GPT2Config, GPT2LMHeadModel

    from distrain_cloud.training.losses import causal_lm_loss

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**json.loads(no_dropout_config.read_text())))
    ids = torch.randint(0, model.config.vocab_size, (3, 17))

    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    loss = causal_lm_loss(model(input_ids=ids).logits, ids, compile_=compile_)
    loss.backward()
    assert loss.item() == pytest.approx(out.loss.item(), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
