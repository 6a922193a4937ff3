"""--precision fp8: the model's linear layers multiply in float8.

bf16 autocast runs around them as under --precision bf16, with fp32 master weights and AdamW
state. Each eligible `nn.Linear` becomes a float8 one, which casts its input, weight and output
gradient to float8 with one dynamic scale per tensor (torchao's tensorwise recipe) and
multiplies with `torch._scaled_mm`: the H100's fp8 tensor cores, about twice the bf16 rate. Under
torch.compile Inductor fuses the casts into neighbouring kernels.

Not converted: the LM head (its vocabulary-wide logits are where fp8's error hurts most, and
losses.head_loss reads its weight directly; --fp8-head multiplies it in float8 there instead),
layers whose sizes are not multiples of 16 (`_scaled_mm` needs them) and, with
--fp8-bf16-edge-blocks N, the linears of the first and last N transformer blocks (the blocks nearest
the embeddings and the head, where quantisation error reaches the loss least damped). --fp8-recipe
picks torchao's scaling: tensorwise (one scale per tensor, cuBLAS's kernel), rowwise (one per row,
CUTLASS's) or rowwise-gw-hp (rowwise, with the weight gradient multiplied in bf16). GPT-2's layers
are Conv1D, not nn.Linear: nothing to convert, refused.

Accumulation: torchao multiplies the forward with the tensor cores' fast accumulation and the two
backward matmuls (input and weight gradients) with the exact one, which on Hopper promotes the
partial sums to fp32 every few steps and runs slower. --fp8-fast-accum grad-input runs the input
gradients' fast too, --fp8-fast-accum (all) the weight gradients' as well (DeepSeek-V3's report
names that promotion as what keeps long reductions exact: the weight gradient sums over every token
of the micro-batch), so both are opt-in; bench/README.md (sessions 20, 21) has their speed.

Whose layers (--fp8-linear, args.fp8_linear_of): auto, the default, swaps them for
fp8_linear.Float8Linear, the tensorwise recipe on torch._scaled_mm alone, whose backward reads the
float8 copies of the input and weight its forward made (fp8_linear.py), and needs no torchao; it
takes torchao's Float8Linear for the rowwise recipes, which are torchao's, or when asked.
--fp8-scaling delayed (native layers only) scales the inputs and weights by the largest magnitudes
of their last forwards instead of their own, so no amax pass precedes a cast (fp8_linear.py).

torchao is optional (not in requirements.txt): torchao 0.17.0 is the release built against
torch 2.11 (bench/README.md ("What the GPU machine needs") has the wheel's download line).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .args import ArgumentError

# float8 matrix units: Ada (8.9: L4, L40S) and Hopper (9.0: H100, H200) or later.
FP8_CAPABILITY = (8, 9)
TORCHAO_PIN = "torchao==0.17.0"


def fp8_problem(gpus: int, capability: tuple[int, int] | None, torchao: bool = True) -> str | None:
    """Why --precision fp8 cannot run on these GPUs (one line naming the fix), or None. Torch-free.
    The strategy is checked with the other flags (args.py: ddp or single). `torchao`: the run's
    linear layers are torchao's (--fp8-linear torchao), which must then be installed."""
    if gpus == 0:
        return (
            "--precision fp8 needs a CUDA GPU with float8 matrix units (H100, L4); this machine has none: "
            "use --precision no"
        )
    if capability is not None and capability < FP8_CAPABILITY:
        return (
            f"--precision fp8 needs compute capability >= {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} (H100, H200, L4, "
            f"L40S); these GPUs are {capability[0]}.{capability[1]}: use --precision bf16"
        )

    if torchao and importlib.util.find_spec("torchao") is None:
        return (
            f"--precision fp8 needs torchao, which is not installed: pip install {TORCHAO_PIN}, "
            "or add --fp8-linear native (torch alone)"
        )
    return None


# --fp8-recipe -> torchao's Float8LinearRecipeName value
TORCHAO_RECIPES = {"tensorwise": "tensorwise", "rowwise": "rowwise", "rowwise-gw-hp": "rowwise_with_gw_hp"}


def _block_linears(model: Any) -> dict[str, Any]:
    """The model's nn.Linear layers by their paths, the LM head left out."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head}


def linear_layer_names(model: Any) -> set[str]:
    """The names --fp8-bf16-layers can give: each linear layer's own name (the last part of its
    path: q_proj), the LM head left out."""
    return {name.rpartition(".")[2] for name in _block_linears(model)}


def fp8_layer_names(model: Any, bf16_edge_blocks: int = 0, bf16_layers: tuple[str, ...] = ()) -> set[str]:
    """The names of the linear layers use_fp8 converts: every nn.Linear but the LM head, those
    of the first and last `bf16_edge_blocks` transformer blocks, those whose own name (the last
    part of the path: q_proj) is in `bf16_layers` (--fp8-bf16-layers; ArgumentError for a name no
    linear layer has), and those whose sizes `_scaled_mm` cannot take."""
    from .engines.base import transformer_blocks

    blocks = transformer_blocks(model)
    edge = min(bf16_edge_blocks, (len(blocks) + 1) // 2)
    kept = {id(m) for b in blocks[:edge] + blocks[len(blocks) - edge :] for m in b.modules()}
    linears = _block_linears(model)
    own = linear_layer_names(model)
    unknown = [n for n in bf16_layers if n not in own]
    if unknown:
        raise ArgumentError(
            f"--fp8-bf16-layers: {type(model).__name__} has no linear layer named {', '.join(unknown)}; "
            f"its layers are {', '.join(sorted(own))}"
        )
    return {
        name
        for name, m in linears.items()
        if id(m) not in kept
        and name.rpartition(".")[2] not in bf16_layers
        and m.in_features % 16 == 0
        and m.out_features % 16 == 0
    }


def fp8_config(recipe: str = "tensorwise", fast_accum: str = "none") -> Any:
    """torchao's Float8LinearConfig for `recipe`, with the backward's matmuls that `fast_accum`
    names (--fp8-fast-accum: none, grad-input or all) in fast accumulation (the forward's already
    are, in every recipe)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig
    from torchao.float8.config import Float8GemmConfig

    config = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[recipe])
    if fast_accum == "none":
        return config
    fast = Float8GemmConfig(use_fast_accum=True)
    if fast_accum == "grad-input":
        return dataclasses.replace(config, gemm_config_grad_input=fast)
    return dataclasses.replace(config, gemm_config_grad_input=fast, gemm_config_grad_weight=fast)


def use_fp8(
    model: Any,
    recipe: str = "tensorwise",
    bf16_edge_blocks: int = 0,
    fast_accum: str = "none",
    head: bool = False,
    linear: str = "native",
    scaling: str = "dynamic",
    head_grad_input: str = "fp8",
    head_forward: str = "fp8",
    head_backward: str = "fp8",
    head_why: str | None = None,
    grad_dtype: str = "e5m2",
    bf16_layers: tuple[str, ...] = (),
) -> str:
    """Convert `model`'s eligible linear layers (fp8_layer_names) to float8 ones, in place, before the
    model is prepared and compiled: fp8_linear.Float8Linear (`linear` "native", tensorwise only) or
    torchao's Float8Linear with `recipe`'s scaling (fp8_config). Returns the log line, which names
    the recipe as `fast_accum=... head=...` for the bench to record (bf16, or fp8 and the parts kept
    bf16: fp8+bf16-backward), and `head_why`, why auto left the head bf16; raises ArgumentError
    when nothing converts. `grad_dtype` (--fp8-grad-dtype): the native layers' output gradients'
    format; `bf16_layers` (--fp8-bf16-layers): block linears kept bf16 by name."""
    eligible = fp8_layer_names(model, bf16_edge_blocks, bf16_layers)
    if not eligible:
        raise ArgumentError(
            f"--precision fp8: {type(model).__name__} has no nn.Linear layer to run in float8 "
            "(GPT-2's layers are Conv1D): use --precision bf16, or a Llama-style model such as --preset llama-1b"
        )
    if linear == "native":
        from . import fp8_linear

        fast = (fast_accum in ("grad-input", "all"), fast_accum == "all")
        fp8_linear.convert(
            model, eligible, *fast, delayed=scaling == "delayed", grad_dtype=fp8_linear.GRAD_DTYPES[grad_dtype]
        )
    else:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(
            model,
            config=fp8_config(recipe, fast_accum),
            module_filter_fn=lambda _module, fqn: fqn in eligible,
        )
    kept = [] if head else [f"the LM head (auto: {head_why})" if head_why else "the LM head"]
    kept += [f"the first and last {bf16_edge_blocks} blocks"] if bf16_edge_blocks else []
    kept += [f"the {', '.join(bf16_layers)} layers"] if bf16_layers else []
    accum = {
        "none": "",
        "grad-input": ", fast accumulation in the input gradients too",
        "all": ", fast accumulation in the backward too",
    }[fast_accum]
    plural = len(kept) > 1 or kept[0].endswith(("layers", "blocks")) if kept else False
    stays = f"; {' and '.join(kept)} {'stay' if plural else 'stays'} bf16" if kept else ""
    head_words = "; the LM head in float8 inside the fast loss" if head else ""
    head_words += ", its forward bf16" if head and head_forward == "bf16" else ""
    head_words += ", its input gradient bf16" if head and head_grad_input == "bf16" else ""
    head_words += ", its backward bf16" if head and head_backward == "bf16" else ""
    whose = "torchao float8" if linear == "torchao" else "float8 on torch._scaled_mm"
    when = " delayed" if scaling == "delayed" else ""
    grads = ", e4m3 output gradients" if linear == "native" and grad_dtype == "e4m3" else ""
    bf16_parts = [
        part
        for part, dtype in (("grad-input", head_grad_input), ("forward", head_forward), ("backward", head_backward))
        if dtype == "bf16"
    ]
    head_key = "+".join(["fp8", *(f"bf16-{part}" for part in bf16_parts)]) if head else "bf16"
    # the bench records the keys (bench/run.py): the gradients' format where the native layers pick it
    grads_key = grad_dtype if linear == "native" else "torchao"
    return (
        f"fp8=on linear_layers={len(eligible)} fast_accum={fast_accum} head={head_key} grads={grads_key} "
        f"bf16_layers={','.join(bf16_layers) or 'none'} ({whose}, {recipe}{when} scaling{grads}{accum}{head_words}"
        f"{stays})"
    )
