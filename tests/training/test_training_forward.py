"""The trainer's model forward (modeling.training_forward): no key/value cache unless asked
for, and in training only the loss.

Under torch.compile every unread output that requires grad is a graph output the forward
writes and the backward zero-fills and reads; with bf16, accelerate makes the logits an fp32 one.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from distrain_cloud.training import modeling

LAYERS, VOCAB = 2, 128
IDS = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))


def gpt2(ours: bool):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=LAYERS, n_head=2, n_embd=64, n_positions=64, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config).train()
    model.loss_type = "ForCausalLM"  # as modeling.load_model sets it
    if ours:
        modeling.training_forward(model)
    return model


def test_training_returns_the_same_loss_alone():
    default, ours = gpt2(False), gpt2(True)
    torch.manual_seed(1)
    expected = default(input_ids=IDS, labels=IDS)
    torch.manual_seed(1)  # the same dropout masks
    got = ours(input_ids=IDS, labels=IDS)
    assert expected.logits is not None and expected.past_key_values is not None
    assert torch.equal(got.loss, expected.loss) and got.logits is None and got.past_key_values is None
    got.loss.backward()
    assert ours.lm_head.weight.grad is not None


def test_evaluation_and_label_free_forwards_keep_their_logits_without_a_cache_unless_asked():
    default, ours = gpt2(False).eval(), gpt2(True).eval()
    out = ours(input_ids=IDS, labels=IDS)
    assert torch.equal(out.logits, default(input_ids=IDS, labels=IDS).logits) and out.past_key_values is None
    assert ours(input_ids=IDS, use_cache=True).past_key_values is not None  # asked for: built
    ours.train()  # the chunked-loss path: hidden states, no labels
    assert ours(input_ids=IDS, output_hidden_states=True).hidden_states is not None
    # generate() reads the class's signature and asks for its cache itself: the same tokens.
    assert inspect.signature(ours.forward) == inspect.signature(default.forward)
    ours.eval()
    prompt = IDS[:1, :4]
    assert torch.equal(
        ours.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0),
        default.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0),
    )


def test_encoders_without_a_cache_argument_run_as_before():
    config = transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=32, intermediate_size=64, vocab_size=VOCAB
    )
    bert = transformers.BertForSequenceClassification(config)
    modeling.training_forward(bert)
    out = bert(input_ids=IDS, labels=torch.tensor([0, 1]))
    assert out.loss is not None and out.logits is None


def graph_outputs(model, fn, dynamo_graphs) -> list[tuple[int, ...]]:
    """Shapes of the outputs of the (one) graph Dynamo captures for fn."""
    graphs = dynamo_graphs(fn, IDS)
    assert len(graphs) == 1
    outputs = next(n for n in graphs[0].graph.nodes if n.op == "output").args[0]
    return [tuple(o.meta["example_value"].shape) for o in outputs]


@pytest.mark.slow  # Dynamo traces three models
def test_compiled_graphs_have_no_cache_and_in_training_only_the_loss(dynamo_graphs):
    default, ours = gpt2(False), gpt2(True)
    assert graph_outputs(ours, lambda x: ours(input_ids=x, labels=x), dynamo_graphs) == [()]
    default.eval(), ours.eval()
    # Evaluation keeps the logits; the default also returns each layer's keys and values.
    evaluated = graph_outputs(ours, lambda x: ours(input_ids=x).logits, dynamo_graphs)
    assert evaluated == [(*IDS.shape, VOCAB)]
    cached = graph_outputs(default, lambda x: default(input_ids=x), dynamo_graphs)
    assert len(cached) == len(evaluated) + 2 * LAYERS


@pytest.fixture
def fresh_accelerate():
    """accelerate keeps its settings in process-wide state; each test here sets its own."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.slow  # Inductor compiles a forward and a backward
@pytest.mark.parametrize("ours", [False, True])
def test_no_logits_sized_gradient_in_the_compiled_bf16_backward(ours, fresh_accelerate):
    """Through accelerate's bf16 preparation and torch.compile, as the trainer runs it."""
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    torch._dynamo.reset()
    acc = Accelerator(mixed_precision="bf16", dynamo_plugin=TorchDynamoPlugin(backend="aot_eager"), cpu=True)
    model = acc.prepare(gpt2(ours))
    for _ in range(2):  # compile, then measure a steady step
        acc.backward(model(input_ids=IDS, labels=IDS).loss)
    with torch.profiler.profile(record_shapes=True) as prof:
        acc.backward(model(input_ids=IDS, labels=IDS).loss)
    filled = [e.input_shapes[0] for e in prof.events() if e.name in ("aten::zero_", "aten::fill_")]
    logits_sized = [s for s in filled if s[-1:] == [VOCAB] and s[:-1] == list(IDS.shape)]
    assert bool(logits_sized) is not ours, filled
    # accelerate can still take its wrappers off (saving, generation).
    unwrapped = acc.unwrap_model(model, keep_fp32_wrapper=False).eval()
    assert unwrapped(input_ids=IDS).logits.shape == (*IDS.shape, VOCAB)
    torch._dynamo.reset()


def test_the_trainer_prepares_its_model_with_it(tmp_path, fresh_accelerate):
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.contract import Contract
    from distrain_cloud.training.trainer import Trainer

    args = parse_args(["--task", "causal-lm", "--preset", "tiny-gpt2", "--report-to", "none"])
    trainer = Trainer(
        args,
        Contract(model_dir=tmp_path / "model", output_dir=tmp_path / "output", checkpoint_dir=tmp_path / "checkpoints"),
    )
    trainer.setup()
    assert trainer.lm_loss_why_not is None  # --lm-loss fast, the default, applies
    assert trainer.accelerator.unwrap_model(trainer.model).__dict__[modeling.HEAD_LOSS]
    ids = next(iter(trainer.train_dl))["input_ids"]
    trainer.model.train()
    out = trainer.model(input_ids=ids, labels=ids)
    assert out.loss is not None and out.logits is None and out.past_key_values is None
    trainer.model.eval()
    out = trainer.model(input_ids=ids)
    assert out.logits is not None and out.past_key_values is None


# ---------------------------------------------------------------- --lm-loss fast (losses.head_loss)


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=2, hidden_size=64,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).train()
    modeling.training_forward(model)
    return model


def train_args(*flags: str):
    from distrain_cloud.training.args import parse_args

    return parse_args(["--task", "causal-lm", "--preset", "tiny-gpt2", *flags])


def flags_why_not(*flags: str) -> str | None:
    """Why the run's decisions rule out the head loss for these flags (one process, on CPU)."""
    from distrain_cloud.training.decisions import decide

    return decide(train_args(*flags), world=1, cuda=False).head_loss_why_not


@pytest.mark.parametrize("build", [lambda: gpt2(True), llama], ids=["gpt2", "llama"])
def test_the_fast_lm_loss_gives_the_models_loss_and_gradients(build):
    own, fast = build(), build()
    assert modeling.use_head_loss(fast, flags_why_not()) is None
    grads = []
    for model in (own, fast):
        torch.manual_seed(1)  # the same dropout masks
        loss = model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        grads.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    (want, want_grads), (got, got_grads) = grads
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert want_grads.keys() == got_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    fast.eval()  # evaluation and generation keep the model's own forward
    assert fast(input_ids=IDS, labels=IDS).logits.shape == (*IDS.shape, VOCAB)


@pytest.mark.parametrize(
    "flags, strategy, why",
    [
        (["--lm-loss", "model"], "ddp", "--lm-loss model"),
        (["--precision", "fp16"], "ddp", "--precision fp16"),
        ([], "zero3", "--strategy zero3"),
        ([], "fsdp", "--strategy fsdp"),
        (["--fused-ce"], "ddp", "not the causal-lm loss"),
    ],
)
def test_the_fast_lm_loss_is_left_out_where_it_does_not_apply(flags, strategy, why):
    model = gpt2(True)
    assert why in modeling.use_head_loss(model, flags_why_not(*flags, "--strategy", strategy))
    assert modeling.HEAD_LOSS not in model.__dict__


def test_the_fast_lm_loss_is_left_out_for_heads_it_does_not_know():
    model = gpt2(True)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(VOCAB))
    assert "bias-free" in modeling.use_head_loss(model, flags_why_not())
    capped = gpt2(True)
    capped.config.final_logit_softcapping = 30.0
    assert "capped" in modeling.use_head_loss(capped, flags_why_not())


# ---------------------------------------------------------------- --fp8-head


def test_the_fp8_head_trains_the_model_through_its_forward_close_to_the_bf16_head():
    """use_head_loss with `fp8`: the model's own training forward runs the head in float8 (CPU's
    _scaled_mm), and loss and gradients stay near the bf16 head's (float8 has 3 mantissa bits)."""
    bf16, fp8 = llama(), llama()
    assert modeling.use_head_loss(bf16, flags_why_not()) is None
    assert modeling.use_head_loss(fp8, flags_why_not(), fp8="exact") is None
    assert fp8.__dict__[modeling.HEAD_LOSS_FP8] == "exact" and bf16.__dict__[modeling.HEAD_LOSS_FP8] is None
    results = []
    for model in (bf16, fp8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        results.append((loss, model.get_output_embeddings().weight.grad, model.model.layers[0].mlp.up_proj.weight.grad))
    (want, *want_grads), (got, *got_grads) = results
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.nn.functional.cosine_similarity(g.flatten(), w.flatten(), dim=0) > 0.98
        assert not torch.equal(g, w)  # float8's rounding: the fp8 head ran


def test_the_fp8_head_is_refused_where_the_head_cannot_run_in_float8():
    from distrain_cloud.training.args import ArgumentError

    odd = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, hidden_size=64,
            intermediate_size=128, vocab_size=100, max_position_embeddings=64,
        )
    )  # fmt: skip
    modeling.training_forward(odd)
    with pytest.raises(ArgumentError, match=r"--fp8-head: .* vocabulary \(100\) must both be multiples of 16; drop"):
        modeling.use_head_loss(odd, flags_why_not(), fp8="exact")
    biased = llama()
    biased.lm_head.bias = torch.nn.Parameter(torch.zeros(biased.config.vocab_size))
    with pytest.raises(ArgumentError, match="--fp8-head: .* an LM head other than a bias-free linear layer"):
        modeling.use_head_loss(biased, flags_why_not(), fp8="exact")


def test_the_fp8_head_needs_the_fast_lm_loss():
    from distrain_cloud.training.args import ArgumentError
    from distrain_cloud.training.decisions import decide

    args = train_args("--precision", "fp8", "--strategy", "ddp", "--fp8-head", "--lm-loss", "model")
    with pytest.raises(ArgumentError, match=r"--fp8-head: .* \(--lm-loss model\): drop --fp8-head"):
        decide(args, world=1, cuda=True)
    # not asked: fp8's auto recipe leaves the head bf16 there, and says why
    auto = decide(train_args("--precision", "fp8", "--strategy", "ddp", "--lm-loss", "model"), world=1, cuda=True)
    assert auto.args.fp8_head is False and auto.fp8_head_why == "--lm-loss model"
