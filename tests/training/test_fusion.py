"""--fuse-projections: a Llama-style model's q/k/v projections as one matmul and its gate/up
projections as another, with the model's layers, parameters and outputs as they were."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from tinylm import LLAMA, tiny_causal_lm
from torch.utils._python_dispatch import TorchDispatchMode

from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.fusion import FUSABLE, fuse_projections

# tiny_causal_lm's model types differ where fusion must care: Qwen2's q/k/v carry biases, Qwen3
# normalises q and k after their projections


class _Matmuls(TorchDispatchMode):
    """The matmul kernels a block of code runs (aten's mm and addmm, float8's _scaled_mm), each as
    (its op, its second operand's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten._scaled_mm):
            operand = args[2] if func.overloadpacket is torch.ops.aten.addmm else args[1]
            self.calls.append((func.overloadpacket, tuple(operand.shape)))
        return func(*args, **(kwargs or {}))


def _forward_backward(model: torch.nn.Module, ids: torch.Tensor, autocast: bool = False):
    """The logits and every parameter's gradient, by name, of one forward and backward."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out.logits.detach().float(), grads


@pytest.mark.parametrize("model_type", FUSABLE)
def test_a_fused_model_computes_what_it_did_with_the_same_parameters_under_their_names(model_type):
    plain = tiny_causal_lm(model_type)
    fused = copy.deepcopy(plain)
    line = fuse_projections(fused)
    assert line == "fuse_projections=on (--fuse-projections: q/k/v in 2 attentions, gate/up in 2 MLPs)"
    assert list(fused.state_dict()) == list(plain.state_dict())  # checkpoints and the saved model
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in plain.named_parameters()]

    ids = torch.randint(0, 256, (2, 24))
    logits, grads = _forward_backward(plain, ids)
    got_logits, got_grads = _forward_backward(fused, ids)
    torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_each_block_runs_four_matmuls_where_it_ran_seven():
    plain = tiny_causal_lm("llama", layers=3)
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    ids = torch.randint(0, 256, (2, 16))
    counts = []
    for model in (plain, fused):
        with torch.no_grad(), _Matmuls() as seen:
            model(input_ids=ids)
        counts.append(len(seen.calls))
    # per block q, k, v, o, gate, up, down -> qkv, o, gate|up, down; the LM head's one in both
    assert counts == [3 * 7 + 1, 3 * 4 + 1]


class _Cats(TorchDispatchMode):
    """The dtype and shape of each concatenation a block of code runs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.cat:
            self.calls.append((out.dtype, tuple(out.shape)))
        return out


def test_under_autocast_each_weight_is_cast_before_the_concatenation():
    """As each layer's own call cast its fp32 weight to bf16, the group concatenates bf16 weights:
    no fp32 copy of the group's width to write and read back (Inductor's kernels on CPU wrote
    one), and the model computes what the unfused one does under autocast."""
    plain = tiny_causal_lm("llama", layers=1)
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    ids = torch.randint(0, 256, (2, 16))
    with _Cats() as seen:
        logits, grads = _forward_backward(fused, ids, autocast=True)
    weights = [(dtype, shape) for dtype, shape in seen.calls if shape in ((64 + 2 * 32, 64), (2 * 128, 64))]
    assert weights == [(torch.bfloat16, (128, 64)), (torch.bfloat16, (256, 64))]
    expected_logits, expected = _forward_backward(plain, ids, autocast=True)
    torch.testing.assert_close(logits, expected_logits, rtol=2e-2, atol=2e-2)
    for name, grad in expected.items():  # fp32 gradients of the fp32 weights, as unfused
        assert grads[name].dtype == torch.float32, name
        torch.testing.assert_close(grads[name], grad, rtol=5e-2, atol=5e-3, msg=name)


def test_generation_with_the_kv_cache_matches_the_unfused_model():
    plain = tiny_causal_lm("llama")
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    prompt = torch.randint(0, 256, (1, 8))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(fused.generate(prompt, **kwargs), plain.generate(prompt, **kwargs))


def test_a_saved_fused_model_loads_into_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    fused = tiny_causal_lm("llama")
    fuse_projections(fused)
    fused.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, fused(input_ids=ids).logits)


@pytest.mark.slow  # two Inductor compiles of a narrow llama
def test_the_fused_model_compiles_to_one_graph_and_matches_eager():
    from torch._dynamo.utils import counters

    plain = tiny_causal_lm("llama")
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    ids = torch.randint(0, 256, (2, 16))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fused, fullgraph=True)  # a graph break would raise
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(input_ids=ids, labels=ids)
        expected = plain(input_ids=ids, labels=ids)
    got.loss.backward()
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(got.logits.float(), expected.logits.float(), rtol=2e-2, atol=2e-2)


def test_float8_groups_multiply_in_float8_once_per_group(narrow_llama):
    from distrain_cloud.training.fp8 import use_fp8

    torch.manual_seed(0)
    model = narrow_llama(layers=2)
    reference = copy.deepcopy(model)
    use_fp8(model, "tensorwise", 0, "none", False, "native", "dynamic")
    fuse_projections(model)
    ids = torch.randint(0, 256, (2, 32))

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), _Matmuls() as seen:
        logits = model(input_ids=ids).logits
    scaled = [shape for op, shape in seen.calls if op is torch.ops.aten._scaled_mm]
    # (in, out) per block: q|k|v (llama-1b's head_dim 64: 4 + 2 x 2 heads), o, gate|up (2 x 128),
    # down; the head stays bf16
    assert sorted(set(scaled)) == sorted({(64, 512), (256, 64), (64, 256), (128, 64)})
    assert len(scaled) == 2 * 4
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(input_ids=ids).logits
    # float8's own error, as the unfused float8 layers show it (tests/training/test_fp8_linear.py)
    assert (logits.float() - expected.float()).abs().mean() < 0.1 * expected.float().abs().mean()
    # and it trains: a backward through the fused float8 matmuls reaches every weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_fused_float8_group_casts_its_gradient_to_the_layers_format(narrow_llama, monkeypatch):
    """--fp8-grad-dtype e4m3 with --fuse-projections: the group's one backward cast is e4m3, as each
    of its layers' would have been."""
    from distrain_cloud.training import fp8_linear
    from distrain_cloud.training.fp8 import use_fp8

    model = narrow_llama(layers=1)
    use_fp8(model, "tensorwise", 0, "none", False, "native", "dynamic", grad_dtype="e4m3")
    fuse_projections(model)
    casts: list[torch.dtype] = []
    real = fp8_linear.to_fp8
    monkeypatch.setattr(fp8_linear, "to_fp8", lambda t, dtype: casts.append(dtype) or real(t, dtype))
    ids = torch.randint(0, 256, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    del casts[:]
    loss.backward()
    # one output-gradient cast per float8 matmul: q|k|v, o, gate|up, down
    assert casts == [fp8_linear.E4M3] * 4


def test_a_group_whose_layers_differ_in_precision_stays_unfused(narrow_llama):
    """--fp8-bf16-layers q_proj,k_proj leaves v_proj float8: attention's group mixes kinds and stays
    as it is, the MLP's fuses."""
    from distrain_cloud.training.fp8 import use_fp8

    model = narrow_llama(layers=1)
    use_fp8(model, "tensorwise", 0, "none", False, "native", "dynamic", bf16_layers=("q_proj", "k_proj"))
    assert fuse_projections(model).startswith(
        "fuse_projections=on (--fuse-projections: q/k/v in 0 attentions, gate/up in 1 MLPs)"
    )
    attention = model.model.layers[0].self_attn
    assert type(attention.q_proj) is torch.nn.Linear and type(attention.v_proj).__name__ == "Float8Linear"


def test_the_shared_pre_hook_maps_the_first_input_by_position_or_name_and_refuses_a_call_without_it():
    from distrain_cloud.training.engines.base import map_first_input

    class Owner(torch.nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    owner = Owner()
    map_first_input(owner, lambda x: x + 1)
    assert owner(torch.ones(2)).tolist() == [2.0, 2.0]
    assert owner(x=torch.ones(2), scale=3.0).tolist() == [6.0, 6.0]
    with pytest.raises(TypeError, match="^Owner.forward was called without its input 'x'$"):
        owner(scale=2.0)


def test_gpt2_and_other_model_types_are_refused_in_one_line():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ArgumentError, match=r"^--fuse-projections applies to llama, mistral, qwen2, qwen3 models, "
                       r"not gpt2 \(GPT-2's attention projects q, k and v in one matmul already\)"):  # fmt: skip
        fuse_projections(gpt2)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--strategy", "zero3"], "--fuse-projections applies to --strategy ddp or single, not zero3"),
        (["--strategy", "fsdp"], "--fuse-projections applies to --strategy ddp or single, not fsdp"),
        (
            ["--precision", "fp8", "--strategy", "ddp", "--fp8-linear", "torchao"],
            "--fuse-projections under --precision fp8 fuses the native float8 layers with dynamic scaling",
        ),
        (
            ["--precision", "fp8", "--strategy", "ddp", "--fp8-scaling", "delayed"],
            "--fuse-projections under --precision fp8 fuses the native float8 layers with dynamic scaling",
        ),
    ],
)
def test_the_flag_is_refused_where_it_cannot_apply(flags, message):
    with pytest.raises(ArgumentError, match=f"^{re.escape(message)}"):
        parse_args([*LLAMA, "--fuse-projections", *flags])


@pytest.mark.parametrize("flags", [[], ["--precision", "bf16"], ["--precision", "fp8", "--strategy", "ddp"]])
def test_the_flag_is_taken_under_ddp_single_and_auto(flags):
    assert parse_args([*LLAMA, "--fuse-projections", *flags]).fuse_projections
    assert not parse_args([*LLAMA, *flags]).fuse_projections


@pytest.mark.slow  # an entry-point run
def test_the_trainer_says_it_trains_and_saves_the_model_with_its_layers(train):
    from safetensors import safe_open

    run = train(*LLAMA, "--fuse-projections", "--max-steps", "3", "--report-to", "none", "--block-size", "64")
    assert run.returncode == 0, run.describe()
    assert run.lines("fuse_projections=") == [
        "fuse_projections=on (--fuse-projections: q/k/v in 2 attentions, gate/up in 2 MLPs)"
    ]
    assert len(run.train_losses) >= 1
    saved = list(run.contract.model_dir.glob("*.safetensors"))
    assert saved
    with safe_open(str(saved[0]), "pt") as f:
        names = set(f.keys())
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"} <= names


def test_submit_plans_a_job_with_the_flag_and_refuses_it_under_zero3(capsys, no_aws_config):
    from distrain_cloud.launcher import cli

    job = ["--task", "causal-lm", "--preset", "llama-1b", "--fuse-projections"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["submit", "--instance", "p5.48xlarge", "--precision", "bf16", "--dry-run", "--", *job])
    assert exit_.value.code == 0 and '"--fuse-projections"' in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["submit", "--instance", "p5.48xlarge", "--strategy", "zero3", "--dry-run", "--", *job])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith(
        "error: training arguments: --fuse-projections applies to --strategy ddp or single, not zero3"
    )
