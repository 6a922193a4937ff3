"""--fuse-projections: each attention's query, key and value projections as one matmul, and each
MLP's gate and up projections as another.

Llama-style models (Llama, Mistral, Qwen2, Qwen3) project one input three times in attention
(q_proj, k_proj, v_proj; k and v narrow under grouped-query attention: 512 columns in llama-1b)
and twice in the MLP (gate_proj, up_proj). Separately, each is its own GEMM in the forward and
two more in the backward, and the input's gradient is the sum of three (two) GEMMs. Fused, the
input is read once, the narrow GEMMs become one wide one, and the input's gradient is one GEMM
that accumulates over the group. Under --precision fp8 the input is also cast to float8 once
where each layer cast it again.

How, without rewriting the model's code: a forward pre-hook on the owner (the attention or MLP
module) computes the group's output from the concatenated weights and hands it to the owner's
forward in place of its input; each projection is replaced by a ProjectionSlice, which keeps the
layer's own parameters (the state dict, the optimizer's groups, checkpoints and the saved model
keep their names) and returns its columns of that output. This relies on the owner using its
input only through the group's projections and for its leading (batch, sequence) shape, which
is checked by reading the forward of the model types in FUSABLE and tested for each on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .args import LLAMA_SHAPED_MODEL_TYPES, ArgumentError
from .engines.base import map_first_input
from .fp8_linear import Float8Linear, float8_linear

# The owners' groups, each projecting the owner's one input
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Model types whose attention and MLP forwards use their input only through GROUPS' layers and its
# leading shape (transformers' modeling_{llama,mistral,qwen2,qwen3}.py)
FUSABLE = LLAMA_SHAPED_MODEL_TYPES


# A native float8 layer's settings that its fused group shares: --fp8-fast-accum's two, --fp8-grad-dtype
Float8Settings = tuple[bool, bool, torch.dtype]


class ProjectionSlice(torch.nn.Module):
    """Stands where one nn.Linear of a fused group stood: holds that layer's parameters under
    their names, and returns its columns [start, end) of the group's output, which the owner's
    pre-hook passes in place of the input."""

    def __init__(self, linear: torch.nn.Linear, start: int, float8: Float8Settings | None) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.start, self.end = start, start + linear.out_features
        self.float8 = float8  # (fast_grad_input, fast_grad_weight, grad_dtype) where the layer multiplied in float8

    def forward(self, fused: torch.Tensor) -> torch.Tensor:
        return fused[..., self.start : self.end]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, columns {self.start}:{self.end}"


def _float8_of(layer: torch.nn.Module) -> Float8Settings | None:
    """The layer's float8 settings: None for a plain nn.Linear; ArgumentError for a layer this
    module cannot fuse (torchao's, or delayed scaling, whose scales are each layer's own)."""
    if type(layer) is torch.nn.Linear:
        return None
    if type(layer) is Float8Linear and not layer.delayed:
        return (layer.fast_grad_input, layer.fast_grad_weight, layer.grad_dtype)
    delayed = " (delayed scaling)" if getattr(layer, "delayed", False) else ""
    raise ArgumentError(
        f"--fuse-projections fuses nn.Linear layers and the native float8 layers with dynamic scaling, not "
        f"{type(layer).__module__}.{type(layer).__name__}{delayed}: "
        "drop --fuse-projections, --fp8-linear torchao or --fp8-scaling delayed"
    )


def _group_forward(slices: list[ProjectionSlice], x: torch.Tensor) -> torch.Tensor:
    """The group's output: x through the concatenated weights (and biases), in float8 where the
    layers were."""
    float8 = slices[0].float8
    if float8 is None:
        # Each weight cast to autocast's dtype before the concatenation, as each layer's own call
        # cast it: concatenated first, the fp32 weights made a fused fp32 copy that was written and
        # read back before the cast (on CPU, Inductor's kernels; same values either way).
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        weight = torch.cat([s.weight.to(dtype or s.weight.dtype) for s in slices])
        bias = None if slices[0].bias is None else torch.cat([s.bias.to(dtype or s.bias.dtype) for s in slices])
        return F.linear(x, weight, bias)
    # float8: the fp32 concatenation stays; the cast's amax is over the group, and _Float8Matmul
    # returns the weight's gradient in the weight's own dtype (fp32 master weights)
    weight = torch.cat([s.weight for s in slices])
    bias = None if slices[0].bias is None else torch.cat([s.bias for s in slices])
    fast_grad_input, fast_grad_weight, grad_dtype = float8
    return float8_linear(x, weight, bias, fast_grad_input, fast_grad_weight, grad_dtype=grad_dtype)


def _fuse_owner(owner: torch.nn.Module, names: tuple[str, ...]) -> bool:
    """Fuse `owner`'s layers `names` in place; False where it has not all of them."""
    found = [getattr(owner, n, None) for n in names]
    layers = [layer for layer in found if isinstance(layer, torch.nn.Linear)]
    if len(layers) != len(names):
        return False
    kinds = {_float8_of(layer) for layer in layers}
    if len(kinds) != 1 or len({(layer.in_features, layer.bias is None) for layer in layers}) != 1:
        return False  # a group whose layers differ in kind, input or bias stays as it is
    (float8,) = kinds
    slices, start = [], 0
    for name, layer in zip(names, layers, strict=True):
        slices.append(ProjectionSlice(layer, start, float8))
        setattr(owner, name, slices[-1])
        start += layer.out_features
    map_first_input(owner, lambda x: _group_forward(slices, x))
    return True


def fuse_projections(model: torch.nn.Module) -> str:
    """--fuse-projections: fuse every group of GROUPS in `model` (after --precision fp8 has swapped
    in its float8 layers). The log line, or ArgumentError for a model type outside FUSABLE."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FUSABLE:
        why = " (GPT-2's attention projects q, k and v in one matmul already)" if model_type == "gpt2" else ""
        raise ArgumentError(
            f"--fuse-projections applies to {', '.join(FUSABLE)} models, not {model_type}{why}; drop --fuse-projections"
        )
    fused = {names[0]: 0 for names in GROUPS}
    for module in list(model.modules()):
        for names in GROUPS:
            if _fuse_owner(module, names):
                fused[names[0]] += 1
    attention, mlp = fused["q_proj"], fused["gate_proj"]
    return f"fuse_projections=on (--fuse-projections: q/k/v in {attention} attentions, gate/up in {mlp} MLPs)"
