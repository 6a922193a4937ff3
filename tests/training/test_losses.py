"""--no-logits-upcast: the causal-LM loss from bf16 logits equals transformers' fp32 one, in
value and gradient, and compiles into the model's graph without a break."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.loss.loss_utils import ForCausalLMLoss

from distrain_cloud.training.losses import IGNORE, causal_lm_loss_without_upcast

V = 96


def logits_and_labels(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(3, 17, V, generator=g)).to(torch.bfloat16)
    labels = torch.randint(0, V, (3, 17), generator=g)
    labels[0, :5] = IGNORE  # ignored positions, as padding would be
    return logits, labels


@pytest.mark.parametrize("num_items", [None, 40])
def test_same_loss_and_gradient_as_transformers(num_items):
    logits, labels = logits_and_labels()
    theirs_in = logits.clone().requires_grad_()
    ours_in = logits.clone().requires_grad_()
    theirs = ForCausalLMLoss(theirs_in, labels, V, num_items_in_batch=num_items)
    ours = causal_lm_loss_without_upcast(ours_in, labels, V, num_items_in_batch=num_items)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    theirs.backward()
    ours.backward()
    assert ours_in.grad.dtype == torch.bfloat16
    # both compute in fp32 and round once to bf16; the sums' order may differ by one ulp
    torch.testing.assert_close(ours_in.grad.float(), theirs_in.grad.float(), rtol=1e-2, atol=1e-6)
    assert (ours_in.grad[0, :4] == 0).all()  # positions whose next token is ignored


def compiled_step(model, ids) -> tuple[torch.Tensor, list[tuple[tuple[int, ...], torch.dtype]]]:
    """The loss of one compiled forward and backward, and the shapes and dtypes that forward keeps
    for the backward, as split by the partitioner Inductor uses (min-cut rematerialisation; no
    kernels are generated). fullgraph: a graph break is an error."""
    from functorch.compile import aot_module_simplified, min_cut_rematerialization_partition

    kept = []

    def forward_compiler(gm, example_inputs):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        kept.extend((tuple(n.meta["val"].shape), n.meta["val"].dtype) for n in outputs if "val" in n.meta)
        return gm

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler,
                                     bw_compiler=lambda g, _: g, partition_fn=min_cut_rematerialization_partition)

    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    loss = torch.compile(lambda x: model(input_ids=x, labels=x, use_cache=False).loss, backend=backend,
                         fullgraph=True)(ids)
    loss.backward()
    torch._dynamo.reset()
    return loss.detach(), kept


def test_compiled_into_the_models_graph_it_keeps_no_fp32_copy_of_the_logits():
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=V,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    ids = torch.randint(0, V, (2, 24))
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(torch.bfloat16)  # bf16 logits, as under autocast
    model.loss_type = "ForCausalLM"  # as modeling.load_model sets it: no graph break before the loss
    expected = model(input_ids=ids, labels=ids, use_cache=False).loss.detach()

    def logits_sized(kept) -> set[torch.dtype]:
        return {dtype for shape, dtype in kept if math.prod(shape) == ids.numel() * V}

    _, kept = compiled_step(model, ids)
    assert logits_sized(kept) == {torch.float32}  # transformers' loss keeps an fp32 copy
    model.loss_function = causal_lm_loss_without_upcast
    loss, kept = compiled_step(model, ids)
    assert logits_sized(kept) == {torch.bfloat16}
    torch.testing.assert_close(loss, expected)
    assert model.lm_head.weight.grad is not None and torch.isfinite(model.lm_head.weight.grad).all()


def test_loaded_causal_lms_compile_into_one_graph_with_transformers_loss(dynamo_graphs):
    from distrain_cloud.training import modeling
    from distrain_cloud.training.args import TrainArgs

    args = TrainArgs(task="causal-lm", preset="tiny-gpt2")
    tokenizer = modeling.load_tokenizer(args)
    model = modeling.load_model(args, tokenizer)
    assert model.loss_type == "ForCausalLM"
    ids = torch.randint(0, len(tokenizer), (2, 16))
    graphs = dynamo_graphs(lambda x: model(input_ids=x, labels=x, use_cache=False).loss, ids)
    assert len(graphs) == 1  # transformers' default lookup split it in two


@pytest.mark.slow
def test_compiled_training_gives_the_same_losses_with_it(module_train, no_dropout_config):
    """The real entry point under --compile (Inductor on CPU), with and without the flag."""
    flags = ["--task", "causal-lm", "--model-config", str(no_dropout_config), "--compile", "--max-steps", "6",
             "--log-every", "2", "--report-to", "none", "--no-save-model", "--generate-tokens", "0"]
    default, lean = module_train.many([{"flags": flags, "name": "upcast"},
                                       {"flags": [*flags, "--no-logits-upcast"], "name": "no-upcast"}])
    assert default.returncode == 0, default.describe()
    assert lean.returncode == 0, lean.describe()
    assert sorted(lean.train_losses) == [2, 4, 6]
    assert lean.lines("lm_loss=") == ["lm_loss=no-logits-upcast"] and not default.lines("lm_loss=")
    for step, loss in default.train_losses.items():
        assert lean.train_losses[step] == pytest.approx(loss, rel=1e-4), (step, default.train_losses, lean.train_losses)
    assert lean.final_eval["eval_loss"] == pytest.approx(default.final_eval["eval_loss"], rel=1e-4)
