"""--rope-tables: the rotary embedding's cos and sin from one custom op, the same values as the
model's own module, and a compiled model that reads them instead of recomputing them per layer."""

from __future__ import annotations

import copy

import pytest
import torch
from tinylm import LLAMA, tiny_causal_lm

from distrain_cloud.training.args import parse_args
from distrain_cloud.training.rope import STATIC_ROPE, use_rope_tables

ROPE = {
    "default": {"rope_type": "default", "rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    },
    # scales cos and sin by its attention factor (1.1386 here), which the op must carry
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
}


def _tiny(model_type: str = "llama", rope: str = "default", layers: int = 2) -> torch.nn.Module:
    return tiny_causal_lm(model_type, layers, rope_parameters=ROPE[rope]).eval()


def _rotary(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_submodule("model.rotary_emb")


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_each_model_types_tables_are_its_modules_to_the_bit(model_type):
    model = _tiny(model_type)
    rotary = _rotary(model)
    positions = torch.stack([torch.arange(0, 200), torch.arange(37, 237)])  # a batch, one row offset
    x = torch.zeros(2, 200, 64)
    own = [rotary(x.to(dtype), positions) for dtype in (torch.float32, torch.bfloat16)]

    line = use_rope_tables(model)

    assert line.startswith(f"rope_tables=on (1 {type(rotary).__name__}: cos and sin computed once a forward")
    for (cos, sin), dtype in zip(own, (torch.float32, torch.bfloat16), strict=True):
        tabled_cos, tabled_sin = rotary(x.to(dtype), positions)
        assert tabled_cos.dtype == tabled_sin.dtype == dtype
        assert torch.equal(tabled_cos, cos) and torch.equal(tabled_sin, sin)


@pytest.mark.parametrize("rope", [r for r in ROPE if r in STATIC_ROPE])
def test_each_fixed_frequency_rope_type_is_tabled_with_its_scaling(rope):
    model = _tiny(rope=rope)
    rotary = _rotary(model)
    positions, x = torch.arange(0, 250)[None], torch.zeros(1, 250, 64)
    cos, sin = rotary(x, positions)
    assert use_rope_tables(model).startswith("rope_tables=on")
    tabled_cos, tabled_sin = rotary(x, positions)
    assert torch.equal(tabled_cos, cos) and torch.equal(tabled_sin, sin)
    if rope == "yarn":  # the attention factor scales both, as the module's forward does
        assert rotary.attention_scaling > 1 and cos.abs().max() > 1


def test_a_dynamic_rope_keeps_its_own_forward():
    model = _tiny(rope="dynamic")
    forward = _rotary(model).forward
    line = use_rope_tables(model)
    assert line == (
        "rope_tables=off (--rope-tables: LlamaRotaryEmbedding: rope type 'dynamic', not one of default, linear, "
        "llama3, yarn (the dynamic ones change their frequencies as they run))"
    )
    assert _rotary(model).forward == forward


def test_a_model_without_rotary_embedding_says_so():
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64))
    assert use_rope_tables(gpt2) == "rope_tables=off (--rope-tables: GPT2LMHeadModel has no rotary embedding module)"


def test_the_model_computes_the_same_logits_and_gradients():
    model = _tiny().train()
    tabled = copy.deepcopy(model)
    use_rope_tables(tabled)
    ids = torch.randint(0, 256, (2, 48))
    out = [m(ids, labels=ids) for m in (model, tabled)]
    assert torch.equal(out[0].logits, out[1].logits)
    for o in out:
        o.loss.backward()
    for (name, p), q in zip(model.named_parameters(), tabled.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    # the module keeps its buffers: nothing new in the state dict or the saved model
    assert tabled.state_dict().keys() == model.state_dict().keys()
    # the sample the trainer generates after training: positions past the prompt, one at a time
    prompt = ids[:1, :10]
    kwargs = {"max_new_tokens": 12, "do_sample": False, "attention_mask": torch.ones_like(prompt)}
    assert torch.equal(model.generate(prompt, **kwargs), tabled.generate(prompt, **kwargs))


@pytest.mark.slow  # two CPU compiles of a narrow Llama
def test_the_compiled_model_reads_the_tables_instead_of_recomputing_them():
    from torch._inductor.utils import run_and_get_code

    ids = torch.randint(0, 256, (2, 64))

    def compiled_code(model):
        compiled = torch.compile(model)

        def step():
            loss = compiled(ids, labels=ids).loss
            loss.backward()
            return loss

        loss, code = run_and_get_code(step)
        return loss, "\n".join(code)

    model = _tiny(layers=2).train()
    tabled = copy.deepcopy(model)
    use_rope_tables(tabled)
    torch._dynamo.reset()
    own_loss, own_code = compiled_code(model)
    tabled_loss, tabled_code = compiled_code(tabled)
    # Inductor inlines the module's cos and sin into the kernels that rotate q and k; with the
    # tables they are computed by the op, outside the generated code
    assert own_code.count(".cos()") + own_code.count(".sin()") >= 2
    assert tabled_code.count(".cos()") + tabled_code.count(".sin()") == 0
    assert "distrain.rope_tables" in tabled_code
    torch.testing.assert_close(tabled_loss, own_loss, rtol=1e-5, atol=1e-5)


def test_the_flag_is_auto_unless_given():
    assert parse_args(LLAMA).rope_tables is None  # the trainer's pick: on where the model is compiled
    assert parse_args([*LLAMA, "--rope-tables"]).rope_tables is True
    assert parse_args([*LLAMA, "--no-rope-tables"]).rope_tables is False


def test_auto_says_why_it_tabled_or_did_not():
    from transformers import AutoModelForCausalLM, GPT2Config

    line = use_rope_tables(_tiny(), auto=True)
    assert line.startswith("rope_tables=on (1 LlamaRotaryEmbedding: ")
    assert line.endswith("; auto: the model is compiled)")
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert use_rope_tables(gpt2, auto=True) == "rope_tables=off (auto: GPT2LMHeadModel has no rotary embedding module)"


@pytest.mark.slow  # an entry-point run, compiled (about 20 s on CPU)
def test_the_trainer_tables_a_compiled_model_by_default_in_one_graph(train):
    flags = ("--compile", "--compile-unit", "model", "--precision", "bf16", "--block-size", "64")
    run = train(*LLAMA, *flags, "--max-steps", "3", "--report-to", "none")
    assert run.returncode == 0, run.describe()
    assert run.lines("rope_tables=") == [
        "rope_tables=on (1 LlamaRotaryEmbedding: cos and sin computed once a forward, outside the compiler, "
        "and read by every layer; auto: the model is compiled)"
    ]
    assert run.lines("compiled_graphs=") == ["compiled_graphs=1"]  # the op breaks no graph
    assert len(run.train_losses) >= 1


@pytest.mark.slow  # an entry-point run, eager (about 10 s on CPU)
@pytest.mark.parametrize(
    "flags, lines",
    [
        ((), []),  # eager, the module computes its tables once already: auto leaves it alone
        (
            ("--rope-tables",),
            [
                "rope_tables=on (1 LlamaRotaryEmbedding: cos and sin computed once a forward, outside the "
                "compiler, and read by every layer)"
            ],
        ),
    ],
    ids=["auto", "asked"],
)
def test_an_eager_model_keeps_its_module_unless_the_flag_asks(train, flags, lines):
    run = train(*LLAMA, *flags, "--block-size", "64", "--max-steps", "2", "--report-to", "none")
    assert run.returncode == 0, run.describe()
    assert run.lines("rope_tables=") == lines


def test_submit_plans_a_job_with_the_flag(capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    job = ["--task", "causal-lm", "--preset", "llama-1b", "--rope-tables"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["submit", "--instance", "p5.48xlarge", "--precision", "bf16", "--dry-run", "--", *job])
    assert exit_.value.code == 0 and '"--rope-tables"' in capsys.readouterr().out
