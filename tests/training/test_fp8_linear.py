"""--fp8-linear native (auto's choice): fp8_linear.Float8Linear multiplies in float8 on
torch._scaled_mm alone (torchao's tensorwise recipe, no torchao), its backward reading the float8
copies its forward made; through the trainer as a user runs it, on CPU processes told they are on
an H100. And --fp8-scaling delayed, its scales from the last forwards'."""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from distrain_cloud.training import fp8, fp8_linear
from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.fp8_linear import E4M3, E5M2, Float8Linear, to_fp8

FP8_DDP = ["--precision", "fp8", "--strategy", "ddp"]


def _pair(bias: bool = False, out: int = 96, fast: tuple[bool, bool] = (False, False)):
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, out, bias=bias)
    layer = torch.nn.Linear(64, out, bias=bias)
    layer.load_state_dict(ref.state_dict())
    return ref, Float8Linear.from_linear(layer, *fast)


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def _run(layer, x, g):
    x = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.float().backward(g)
    return y, x.grad


def test_it_computes_the_tensorwise_recipe_exactly_and_stays_near_bf16():
    """The weight gradient is its float8-rounded operands multiplied out in fp32, bit for bit on
    CPU, and the output is too, to bf16's rounding; all three results sit within float8's
    rounding of the bf16 layer's."""
    ref, layer = _pair()
    x, g = torch.randn(3, 48, 64), torch.randn(3, 48, 96)
    y, gx = _run(layer, x, g)
    y_ref, gx_ref = _run(ref, x, g)

    x8, x_inv = to_fp8(x.to(torch.bfloat16).reshape(-1, 64), E4M3)
    w8, w_inv = to_fp8(layer.weight.detach(), E4M3)
    g8, g_inv = to_fp8(g.to(torch.bfloat16).reshape(-1, 96), E5M2)
    deq = lambda t8, inv: t8.float() * inv  # noqa: E731
    assert torch.equal(layer.weight.grad, deq(g8, g_inv).t() @ deq(x8, x_inv))  # fp32, no bf16 rounding
    assert layer.weight.grad.dtype == torch.float32 and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float().reshape(-1, 96), deq(x8, x_inv) @ deq(w8, w_inv).t(), rtol=1e-2, atol=1e-2)

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert rel(y, y_ref) < 0.06 and rel(gx, gx_ref) < 0.1 and rel(layer.weight.grad, ref.weight.grad) < 0.1


def test_the_backward_casts_only_the_gradient_and_keeps_float8_copies():
    """The forward casts the input and the weight once; the backward casts the output gradient
    alone and multiplies the forward's float8 copies (torchao's casts both again from bf16)."""
    _, layer = _pair()
    casts: list[torch.dtype] = []
    real = fp8_linear.to_fp8

    def counting(t, dtype):
        casts.append(dtype)
        return real(t, dtype)

    saved: list[torch.dtype] = []

    def pack(t):
        saved.append(t.dtype)
        return t

    x = torch.randn(64, 64, requires_grad=True)
    with pytest.MonkeyPatch.context() as mp, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mp.setattr(fp8_linear, "to_fp8", counting)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        assert casts == [E4M3, E4M3]
        y.float().sum().backward()
    assert casts == [E4M3, E4M3, E5M2]
    assert saved.count(E4M3) == 2 and torch.bfloat16 not in saved  # the matmul saves no bf16 input


def test_e4m3_gradients_multiply_the_gradient_cast_to_e4m3():
    """--fp8-grad-dtype e4m3: the backward casts the output gradient to e4m3 (one scale per tensor),
    and the weight gradient is those float8 values multiplied out, bit for bit on CPU."""
    _, layer = _pair()
    layer.grad_dtype = E4M3
    x, g = torch.randn(2, 32, 64), torch.randn(2, 32, 96)
    _run(layer, x, g)
    x8, x_inv = to_fp8(x.to(torch.bfloat16).reshape(-1, 64), E4M3)
    g8, g_inv = to_fp8(g.to(torch.bfloat16).reshape(-1, 96), E4M3)
    assert torch.equal(layer.weight.grad, (g8.float() * g_inv).t() @ (x8.float() * x_inv))
    assert "grad=e4m3" in repr(layer)


def test_the_grad_dtype_flag_reaches_every_native_layer_and_the_log_line(narrow_llama):
    model = narrow_llama(layers=2)
    line = fp8.use_fp8(model, "tensorwise", 0, "none", False, "native", "dynamic", grad_dtype="e4m3")
    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(layers) == 14 and all(m.grad_dtype == E4M3 for m in layers)
    assert line.startswith("fp8=on linear_layers=14 fast_accum=none head=bf16 grads=e4m3 bf16_layers=none (")
    assert "tensorwise scaling, e4m3 output gradients" in line
    plain = narrow_llama(layers=2)
    assert "e4m3" not in fp8.use_fp8(plain, "tensorwise", 0, "none", False, "native", "dynamic")
    assert all(m.grad_dtype == E5M2 for m in plain.modules() if isinstance(m, Float8Linear))


@pytest.mark.parametrize(
    "flags",
    [["--fp8-linear", "torchao"], ["--fp8-recipe", "rowwise"]],
    ids=["torchao", "rowwise"],
)
def test_the_grad_dtype_applies_to_the_native_layers_only(flags):
    for dtype in ("e4m3", "e5m2"):  # either, named: torchao's recipes pick their own
        with pytest.raises(ArgumentError, match=rf"^--fp8-grad-dtype {dtype} applies to the native float8 layers; "):
            parse_args([*FP8_DDP, "--fp8-grad-dtype", dtype, *flags])
    assert parse_args([*FP8_DDP, "--fp8-grad-dtype", "e4m3"]).fp8_grad_dtype == "e4m3"
    assert parse_args([*FP8_DDP, *flags]).fp8_grad_dtype == "auto"


def test_layers_named_in_fp8_bf16_layers_stay_bf16_in_every_block(narrow_llama):
    model = narrow_llama(layers=2)
    line = fp8.use_fp8(model, "tensorwise", 0, "none", False, "native", "dynamic", bf16_layers=("q_proj", "k_proj"))
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    bf16 = sorted(name for name, kind in kinds.items() if kind == "Linear")
    assert bf16 == ["lm_head"] + [f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("k_proj", "q_proj")]
    assert sum(kind == "Float8Linear" for kind in kinds.values()) == 10  # v, o, gate, up, down in each block
    assert line.startswith("fp8=on linear_layers=10 ")
    assert line.endswith("; the LM head and the q_proj, k_proj layers stay bf16)")


def test_a_bf16_layer_name_no_layer_has_is_refused_with_the_names_there_are(narrow_llama):
    with pytest.raises(ArgumentError) as refused:
        fp8.use_fp8(narrow_llama(layers=1), "tensorwise", 0, "none", False, "native", "dynamic", bf16_layers=("qproj",))
    assert str(refused.value) == (
        "--fp8-bf16-layers: LlamaForCausalLM has no linear layer named qproj; its layers are down_proj, gate_proj, "
        "k_proj, o_proj, q_proj, up_proj, v_proj"
    )


@pytest.mark.parametrize(
    "value", ["q_proj, k_proj", "q_proj,,k_proj", "model.layers.0.q_proj", "q_proj,", "auto,q_proj", "none,k_proj"]
)
def test_fp8_bf16_layers_takes_bare_names(value):
    with pytest.raises(ArgumentError, match="^--fp8-bf16-layers takes layer names, comma-separated with no spaces"):
        parse_args([*FP8_DDP, "--fp8-bf16-layers", value])
    assert parse_args([*FP8_DDP, "--fp8-bf16-layers", "q_proj,k_proj"]).fp8_bf16_layers == "q_proj,k_proj"
    assert parse_args([*FP8_DDP, "--fp8-bf16-layers", "none"]).fp8_bf16_layers == "none"  # auto and none stand alone


@pytest.mark.parametrize("fast", [(False, False), (True, False), (True, True)], ids=["none", "grad-input", "all"])
def test_fast_accumulation_reaches_the_backward_matmuls_it_names(fast, monkeypatch):
    _, layer = _pair(fast=fast)
    calls: list[bool] = []
    real = torch._scaled_mm

    def recording(*args, **kw):
        calls.append(kw["use_fast_accum"])
        return real(*args, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    _run(layer, torch.randn(32, 64), torch.randn(32, 96))
    assert calls == [True, *fast]  # the forward, then the input and the weight gradients


def test_odd_row_counts_and_a_bias_train_and_generation_runs_unpadded():
    """The weight gradient sums over the rows, which _scaled_mm needs in sixteens: 21 rows are
    padded with zeros (nothing added) when a backward will run, and left as they are when not."""
    ref, layer = _pair(bias=True)
    x, g = torch.randn(3, 7, 64), torch.randn(3, 7, 96)
    y, gx = _run(layer, x, g)
    y_ref, gx_ref = _run(ref, x, g)
    assert y.shape == (3, 7, 96) and gx.shape == x.shape
    assert ((layer.bias.grad - ref.bias.grad).norm() / ref.bias.grad.norm()) < 0.05
    assert ((y.float() - y_ref.float()).norm() / y_ref.float().norm()) < 0.06
    seen: list[int] = []
    real = torch._scaled_mm

    def recording(a, *rest, **kw):
        seen.append(a.shape[0])
        return real(a, *rest, **kw)

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch, "_scaled_mm", recording)
        layer(torch.randn(1, 5, 64))
    assert seen == [5]


def test_the_layer_keeps_the_linears_parameters_and_state_dict():
    """The optimizer and checkpoints see the same tensors under the same names."""
    linear = torch.nn.Linear(32, 16)
    layer = Float8Linear.from_linear(linear, False, False)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    assert list(layer.state_dict()) == ["weight", "bias"] and "float8=tensorwise" in repr(layer)


@pytest.mark.slow  # a torch.compile on CPU
def test_it_compiles_whole_and_agrees_with_eager():
    """One graph, no break: the casts are ordinary tensor ops Inductor may fuse."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        Float8Linear.from_linear(torch.nn.Linear(64, 128), False, False),
        torch.nn.GELU(),
        Float8Linear.from_linear(torch.nn.Linear(128, 64, bias=False), False, False),
    )
    x = torch.randn(4, 32, 64)
    compiled, _ = _run(torch.compile(model, fullgraph=True), x, torch.ones(4, 32, 64))
    grads = [_grad(p).clone() for p in model.parameters()]
    model.zero_grad()
    eager, _ = _run(model, x, torch.ones(4, 32, 64))
    torch.testing.assert_close(compiled.float(), eager.float(), rtol=0.1, atol=0.1)
    for a, p in zip(grads, model.parameters(), strict=True):
        assert ((a - _grad(p)).norm() / _grad(p).norm()) < 0.05


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is optional")
def test_it_gives_torchaos_tensorwise_values():
    """The same recipe as torchao's Float8Linear: the same input gradient and output (to bf16's
    rounding); the weight gradient to within 2% (torchao returns it in bf16, and its CPU matmul
    rounds more than that on the way)."""
    from torchao.float8 import convert_to_float8_training

    ref, layer = _pair()
    theirs = torch.nn.Sequential(ref)
    convert_to_float8_training(theirs, config=fp8.fp8_config("tensorwise"))
    x, g = torch.randn(2, 48, 64), torch.randn(2, 48, 96)
    y, gx = _run(layer, x, g)
    y_ao, gx_ao = _run(theirs, x, g)
    torch.testing.assert_close(y, y_ao, rtol=2e-2, atol=0.07)
    torch.testing.assert_close(gx, gx_ao)
    assert ((layer.weight.grad - ref.weight.grad).norm() / layer.weight.grad.norm()) < 2e-2


@pytest.mark.slow  # transformers' Llama
def test_use_fp8_native_converts_every_block_linear_but_the_head_and_trains(narrow_llama, few_steps):
    torch.manual_seed(0)
    model = narrow_llama()
    line = fp8.use_fp8(model, linear="native", fast_accum="grad-input")
    assert line == (
        "fp8=on linear_layers=14 fast_accum=grad-input head=bf16 grads=e5m2 bf16_layers=none (float8 on "
        "torch._scaled_mm, tensorwise scaling, fast accumulation in the input gradients too; the LM head stays bf16)"
    )
    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(layers) == 14 and all(m.fast_grad_input and not m.fast_grad_weight for m in layers)
    assert not isinstance(model.get_output_embeddings(), Float8Linear)
    losses = few_steps(model, 4, autocast=True)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


AUTO_HEAD = "; the LM head in float8 inside the fast loss, its backward bf16"


AUTO_LAYERS = "grads=e4m3 bf16_layers=q_proj,k_proj"  # session 36's part of auto's recipe, in the keys
AUTO_WORDS = "e4m3 output gradients, fast accumulation in the input gradients too"  # ... and in words
QK = "; the q_proj, k_proj layers stay bf16"
ALL_FLOAT8 = ["--fp8-grad-dtype", "e5m2", "--fp8-bf16-layers", "none"]  # the layers' recipe before session 36


@pytest.mark.slow  # an entry-point run
@pytest.mark.parametrize(
    "flags, recipe",
    [
        # --precision fp8 alone: auto's recipe, the head's forward float8, fast input gradients, e4m3
        # output gradients and attention's query and key projections bf16 (two blocks of 7 linears)
        ([], f"linear_layers=10 fast_accum=grad-input head=fp8+bf16-backward {AUTO_LAYERS} (float8 on "
             f"torch._scaled_mm, tensorwise scaling, {AUTO_WORDS}{AUTO_HEAD}{QK})"),
        (["--fp8-scaling", "delayed", "--compile"], f"linear_layers=10 fast_accum=grad-input head=fp8+bf16-backward "
         f"{AUTO_LAYERS} (float8 on torch._scaled_mm, tensorwise delayed scaling, {AUTO_WORDS}{AUTO_HEAD}{QK})"),
        # the recipe before session 33: the whole head float8, every backward matmul exact, every
        # block linear float8 with e5m2 gradients (before session 36)
        (["--fp8-head", "--fp8-head-backward", "fp8", "--fp8-fast-accum", "none", *ALL_FLOAT8], "linear_layers=14 "
         "fast_accum=none head=fp8 grads=e5m2 bf16_layers=none (float8 on torch._scaled_mm, tensorwise scaling; the "
         "LM head in float8 inside the fast loss)"),
        # the head's own flags ask for it; its backward then stays float8 (auto)
        (["--fp8-head-grad-input", "bf16", "--fp8-head-forward", "bf16"], "linear_layers=10 fast_accum=grad-input "
         f"head=fp8+bf16-grad-input+bf16-forward {AUTO_LAYERS} (float8 on torch._scaled_mm, tensorwise scaling, "
         f"{AUTO_WORDS}; the LM head in float8 inside the fast loss, its forward bf16, its input gradient bf16{QK})"),
        # every block linear float8 (--fp8-bf16-layers none) with e4m3 gradients asked by name
        (["--no-fp8-head", "--fp8-grad-dtype", "e4m3", "--fp8-bf16-layers", "none"], "linear_layers=14 "
         "fast_accum=grad-input head=bf16 grads=e4m3 bf16_layers=none (float8 on torch._scaled_mm, tensorwise "
         f"scaling, {AUTO_WORDS}; the LM head stays bf16)"),
        # a head float8 cannot multiply (a vocabulary of 1,000): auto keeps it bf16 and says why
        # ... and the layers kept bf16 named (--fp8-bf16-layers) with e5m2 gradients, on the same run
        (["--config-overrides", "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
          "num_key_value_heads=2,vocab_size=1000", "--fp8-bf16-layers", "k_proj,q_proj", "--fp8-grad-dtype", "e5m2"],
         "linear_layers=10 fast_accum=grad-input head=bf16 grads=e5m2 bf16_layers=k_proj,q_proj (float8 on "
         "torch._scaled_mm, tensorwise scaling, fast accumulation in the input gradients too; the LM head (auto: its "
         "hidden size (64) and vocabulary (1000) must both be multiples of 16) and the k_proj, q_proj layers stay "
         "bf16)"),
    ],
    ids=[
        "auto", "delayed-compiled", "head-float8-exact-all-float8", "head-forward-and-grad-input-bf16",
        "no-head-e4m3-all-float8", "odd-vocab-named-layers-e5m2",
    ],
)  # fmt: skip
def test_the_trainer_trains_with_native_float8_linears_and_no_torchao(train, tmp_path, aot_eager, flags, recipe):
    """What a user runs: --precision fp8 (--fp8-linear auto: native) through the entry point, on CPU
    processes told they are on an H100 (fp8_shim), with torchao hidden: the layers convert with the
    recipe asked (auto's with no flag), the loss is finite; with --fp8-scaling delayed, compiled too
    (by aot_eager: Dynamo traces the trainer's graph as Inductor's would be; Inductor compiles the
    float8 layers, delayed scaling's among them, in test_it_compiles_whole_and_agrees_with_eager and
    test_delayed_scaling_compiles_one_graph, without a C++ build of the whole model per run)."""
    narrow = (
        "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
        "num_key_value_heads=2,vocab_size=1024"
    )
    run = _fp8_run(train, tmp_path, aot_eager, "--preset", "llama-1b", "--config-overrides", narrow, *flags)
    assert run.lines("fp8=") == [f"fp8=on {recipe}"], run.describe()
    assert len(run.train_losses) == 2 and all(0 < v < 20 for v in run.train_losses.values()), run.train_losses


@pytest.mark.slow  # an entry-point run
def test_auto_keeps_every_layer_float8_on_a_model_without_q_and_k_projections(train, tmp_path, aot_eager):
    """GPT-NeoX's attention is one fused query_key_value: --fp8-bf16-layers auto finds no q_proj and
    k_proj on the loaded model and keeps all eight block linears float8, where the same names typed
    are refused with the names it has."""
    import transformers

    config = tmp_path / "neox.json"
    transformers.GPTNeoXConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64,
    ).to_json_file(config)  # fmt: skip
    run = _fp8_run(train, tmp_path, aot_eager, "--model-config", str(config))
    assert run.lines("fp8=") == [
        "fp8=on linear_layers=8 fast_accum=grad-input head=bf16 grads=e4m3 bf16_layers=none (float8 on "
        f"torch._scaled_mm, tensorwise scaling, {AUTO_WORDS}; the LM head (auto: gpt_neox models: the model's own "
        "loss) stays bf16)"
    ], run.describe()
    typed = _fp8_run(
        train, tmp_path, aot_eager, "--model-config", str(config), "--fp8-bf16-layers", "q_proj,k_proj", refused=True
    )
    assert "--fp8-bf16-layers: GPTNeoXForCausalLM has no linear layer named q_proj, k_proj; its layers are " in (
        typed.stderr
    ), typed.describe()


def _fp8_run(train, tmp_path, aot_eager, *flags: str, refused: bool = False):
    """A 4-step --precision fp8 run through the entry point, on CPU processes told they are on an
    H100 (fp8_shim), with torchao hidden; its exit asserted: 0, or 2 where the flags are `refused`."""
    shim = str(Path(__file__).parent / "fp8_shim")
    hide = tmp_path / "no_torchao"  # an empty namespace package shadows an installed torchao: no torchao.float8
    (hide / "torchao").mkdir(parents=True, exist_ok=True)
    run = train(
        "--task", "causal-lm", *FP8_DDP, "--dataset", "builtin:corpus", "--block-size", "32",
        "--batch-size", "4", "--max-steps", "4", "--log-every", "2", "--report-to", "none", "--no-save-model",
        "--max-eval-samples", "8", "--generate-tokens", "2", *flags,
        env={
            "PYTHONPATH": os.pathsep.join(filter(None, [shim, str(hide), os.environ.get("PYTHONPATH")])),
            **(aot_eager if "--compile" in flags else {}),
        },
    )  # fmt: skip
    assert run.returncode == (2 if refused else 0), run.describe()
    return run


def test_native_needs_no_torchao_and_torchaos_layers_do(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    assert fp8.fp8_problem(1, (9, 0), torchao=False) is None
    problem = fp8.fp8_problem(1, (9, 0))
    assert problem is not None and problem.endswith("or add --fp8-linear native (torch alone)")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--fp8-linear", "native", "--fp8-recipe", "rowwise"], "--fp8-linear native scales tensorwise only; "
         "--fp8-recipe rowwise is torchao's: drop --fp8-linear native or --fp8-recipe"),
        (["--fp8-linear", "nativ"], "argument --fp8-linear: invalid choice: 'nativ'"),
    ],
)  # fmt: skip
def test_fp8_linear_is_checked_with_the_other_flags(flags, message):
    with pytest.raises(ArgumentError, match=f"^{message}"):
        parse_args([*FP8_DDP, *flags])
    with pytest.raises(ArgumentError, match="^--fp8-linear applies to --precision fp8, not bf16"):
        parse_args(["--precision", "bf16", "--fp8-linear", "native"])
    assert parse_args([*FP8_DDP, "--fp8-linear", "native"]).fp8_linear == "native"


@pytest.mark.parametrize(
    "flags, layers",
    [
        ([], "native"),  # auto: the tensorwise recipe needs no torchao
        (["--fp8-recipe", "rowwise"], "torchao"),  # auto: torchao's own recipe
        (["--fp8-linear", "torchao"], "torchao"),
        (["--fp8-linear", "native"], "native"),
    ],
)
def test_auto_picks_the_native_layers_unless_the_recipe_is_torchaos(flags, layers):
    from distrain_cloud.training.args import fp8_linear_of

    assert fp8_linear_of(parse_args([*FP8_DDP, *flags])) == layers


# ---------------------------------------------------------------- --fp8-scaling delayed


def _delayed() -> Float8Linear:
    _, layer = _pair()
    layer.use_delayed_scaling()
    return layer


def test_delayed_scaling_scales_by_the_history_and_records_each_training_forward():
    """The first forward casts its input at scale 1 (an empty history) and the weight by its own
    largest magnitude; later ones by the largest of the last 16 forwards with gradients (a value
    beyond it saturates); evaluation adds nothing."""
    from distrain_cloud.training.fp8_linear import AMAX_HISTORY, cast_fp8, fp8_scale

    layer = _delayed()
    w_top = layer.weight.detach().abs().amax()
    assert layer.amax_weight[0] == w_top and not layer.amax_input.any()  # before any forward
    x1 = torch.randn(32, 64)
    y1, _ = _run(layer, x1, torch.ones(32, 96))
    x8, inv = cast_fp8(x1.to(torch.bfloat16), E4M3, torch.tensor(1.0))
    w8, w_inv = cast_fp8(layer.weight.detach(), E4M3, fp8_scale(w_top, E4M3))
    torch.testing.assert_close(y1.float(), (x8.float() * inv) @ (w8.float() * w_inv).t(), rtol=1e-2, atol=1e-2)
    top1 = x1.to(torch.bfloat16).abs().amax().float()
    assert layer.amax_input[0] == top1 and not layer.amax_input[1:].any()

    x2 = 4 * x1  # four times larger: scaled by x1's largest, so most of it saturates at e4m3's 448
    y2, _ = _run(layer, x2, torch.ones(32, 96))
    x8, inv = cast_fp8(x2.to(torch.bfloat16), E4M3, fp8_scale(top1, E4M3))
    w8, w_inv = cast_fp8(layer.weight.detach(), E4M3, fp8_scale(layer.amax_weight[1], E4M3))
    expected = (x8.float() * inv) @ (w8.float() * w_inv).t()
    torch.testing.assert_close(y2.float(), expected, rtol=1e-2, atol=1e-2)
    assert torch.equal(layer.amax_input[:2], torch.stack([4 * top1, top1]))

    with torch.no_grad():  # evaluation, generation: scaled by the history, not added to it
        layer(torch.randn(5, 64))
    assert torch.count_nonzero(layer.amax_input) == 2
    for _ in range(AMAX_HISTORY + 3):
        _run(layer, torch.randn(32, 64), torch.ones(32, 96))
    assert len(layer.amax_input) == AMAX_HISTORY and torch.count_nonzero(layer.amax_input) == AMAX_HISTORY
    assert 4 * top1 not in layer.amax_input  # the oldest fell out


def test_delayed_scaling_keeps_no_state_in_the_checkpoint():
    layer = _delayed()
    _run(layer, torch.randn(16, 64), torch.ones(16, 96))
    assert list(layer.state_dict()) == ["weight"] and "float8=tensorwise delayed" in repr(layer)


@pytest.mark.slow  # a torch.compile on CPU
def test_delayed_scaling_compiles_one_graph():
    """One graph from the first forward on (an empty history is a tensor expression, not a branch:
    a recompile at the second step cost llama-1b 100 s on an H200, session 23); the histories
    update inside the graph as they do eagerly."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        Float8Linear.from_linear(torch.nn.Linear(64, 128), False, False),
        torch.nn.GELU(),
        Float8Linear.from_linear(torch.nn.Linear(128, 64, bias=False), False, False),
    )
    for layer in (model[0], model[2]):
        layer.use_delayed_scaling()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True)
    counters.clear()
    for i in range(4):
        x = torch.randn(4, 32, 64) * (1 + i)
        y, _ = _run(compiled, x, torch.ones(4, 32, 64))
        y_eager, _ = _run(eager, x, torch.ones(4, 32, 64))
        torch.testing.assert_close(y.float(), y_eager.float(), rtol=0.1, atol=0.2)
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(model[0].amax_input, eager[0].amax_input)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--fp8-linear", "torchao"], "drop --fp8-linear torchao$"),
        (["--fp8-recipe", "rowwise"], "drop --fp8-recipe$"),
        (["--fp8-recipe", "rowwise", "--fp8-linear", "torchao"], "drop --fp8-linear torchao and --fp8-recipe$"),
    ],
)
def test_delayed_scaling_runs_on_the_native_layers_only(flags, message):
    with pytest.raises(ArgumentError, match=f"^--fp8-scaling delayed runs on the native float8 layers, .*{message}"):
        parse_args([*FP8_DDP, "--fp8-scaling", "delayed", *flags])
    assert parse_args([*FP8_DDP, "--fp8-scaling", "delayed"]).fp8_scaling == "delayed"
