"""The interface every engine keeps, and what most of them share.

An engine is how the model is sharded and wrapped: plain DDP (and one process), DeepSpeed's
ZeRO, PyTorch's FSDP2, or fsdp sharded inside the compiled graph. The trainer holds one and never
asks which; each engine gets the run's decisions (training/decisions.py) and a `say` callback
for its log lines, never the trainer, so an engine file imports nothing of the recipe.

The order the trainer calls them in: environment, accelerator_settings (before the Accelerator),
accelerator_built, loaded (the model, before it moves), shard, optimizer, prepare, compile, then
per step clip, and at checkpoints save_extras / load_extras, at the end full_state_dict.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..args import ArgumentError
from ..decisions import Decisions
from ..optim import ClippedAdamW

Say = Callable[[str], None]


class Engine:
    """DDP's way, the default of every method: Accelerate wraps the model, nothing is sharded."""

    setup_words = ""  # said while the model is prepared, where that may take minutes
    clips_gradients = True  # False: the engine clips inside its own optimizer step
    weights_sharded = False  # every process must run each forward of a generation together
    loss_alone_without_blocks = False  # compiled block by block, a model without blocks compiles its loss only
    eager_fallback = False  # a failed compiled backward may turn the whole job eager (Trainer._backward)
    ddp_wrapped = False  # DDP's reducer hooks overlap the all-reduces with the backward

    def __init__(self, decisions: Decisions, say: Say):
        self.decisions, self.args, self.say = decisions, decisions.args, say

    def environment(self, *, cuda: bool) -> dict[str, str]:
        """Variables to set before the Accelerator reads them."""
        return {}

    def accelerator_settings(self, world: int, *, cuda: bool) -> tuple[dict[str, Any], str | None]:
        """The Accelerator's plugin arguments for this engine, and the process group's backend
        where it must be named (None: Accelerate's pick)."""
        return {}, None

    def ops_to_build(self) -> list[str]:
        """Native ops this machine must compile before the engine runs (minutes, silent): said
        before it starts. None for most engines."""
        return []

    def accelerator_built(self, accelerator: Any) -> None:
        """What the engine checks or sets on the Accelerator once it exists."""

    def loaded(self, model: Any) -> None:
        """What the engine marks on the model right after it is loaded."""

    def shard(self, model: Any, accelerator: Any) -> None:
        """Shard the model before its optimizer is built (engines that shard it themselves)."""

    def optimizer(self, groups: list[dict[str, Any]], lr: float, accelerator: Any) -> Any:
        # Fused AdamW is one kernel per step instead of several per parameter.
        fused = accelerator.device.type == "cuda"
        if self.args.compile_optimizer and type(self).clip is Engine.clip:
            # --compile-optimizer: the clip moves into the step (training/optim.py), which computes the
            # plain norm of every gradient, the norm this engine's clip computes; sharded engines clip
            # their shards themselves and keep their own way.
            self.clips_gradients = False
            return ClippedAdamW(groups, lr=lr, max_norm=self.args.max_grad_norm, fused=fused)
        return torch.optim.AdamW(groups, lr=lr, fused=fused)

    def prepare(self, accelerator: Any, model: Any, optimizer: Any, train_dl: Any, eval_dl: Any) -> tuple:
        """The model, optimizer and loaders as the engine runs them."""
        return accelerator.prepare(model, optimizer, train_dl, eval_dl)

    def compile(self, accelerator: Any, model: Any, backend: Any) -> tuple[Any, Any]:
        """The model compiled whole, and a compiler for the backward (--compiled-autograd), or None."""
        compiled = torch.compile(model, backend=backend)
        self.say("compile_unit=model")
        return compiled, None

    def clip(self, accelerator: Any, model: Any, max_norm: float) -> None:
        """Clip the gradients' total norm."""
        accelerator.clip_grad_norm_(model.parameters(), max_norm)

    def save_extras(self, folder: Any, accelerator: Any, model: Any, optimizer: Any) -> None:
        """This process's part of a checkpoint beside Accelerate's save_state."""

    def load_extras(self, folder: Any, accelerator: Any, model: Any, optimizer: Any, saved: dict[str, Any]) -> None:
        """This process's part of a checkpoint beside Accelerate's load_state."""

    def full_state_dict(self, accelerator: Any, model: Any, optimizer: Any) -> tuple[Any, dict[str, Any]]:
        """The unwrapped model and its full state dict, for save_pretrained (collective)."""
        return accelerator.unwrap_model(model), accelerator.get_state_dict(model)


def transformer_blocks(model: Any) -> list[Any]:
    """The model's transformer blocks: modules of the classes it names in _no_split_modules (GPT2Block,
    BertLayer), the unit FSDP shards and ZeRO-3 fetches whole. FSDP2 renames a sharded block's class
    (FSDPGPT2Block, a subclass), so base classes count too."""
    model = getattr(model, "_orig_mod", model)
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


def map_first_input(module: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Pre-hook `module` so that its forward receives fn(its first input) in place of that input,
    given by position or by the name of forward's first parameter (hidden_states in transformers'
    blocks and attentions, x in their MLPs). --residual-dtype's casts and --fuse-projections'
    fused matmuls (training/fusion.py) both ride on it; a call without that input is an error, not
    a forward that silently skips the change."""
    name = next(iter(inspect.signature(module.forward).parameters))

    def hook(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        if name not in kwargs:
            raise TypeError(f"{type(module).__name__}.forward was called without its input {name!r}")
        return args, {**kwargs, name: fn(kwargs[name])}

    module.register_forward_pre_hook(hook, with_kwargs=True)


def residual_in_bf16(model: Any, auto: bool = False) -> str:
    """--residual-dtype bf16: cast each transformer block's input hidden states to bf16, so that
    the residual stream runs in bf16 under autocast over fp32 weights (ddp, single). There the
    embeddings' output is fp32, and each block adds its bf16 sublayer outputs onto that fp32
    stream, so every norm and add reads and writes 4 bytes an element; the sharded engines,
    whose weights are 16-bit, already run it in 2. In a pre-norm model (GPT-2, Llama) only the
    first block's cast converts anything; a post-norm one (BERT), whose norms autocast to fp32,
    needs each. The log line (`auto`: said as --residual-dtype auto's pick), or ArgumentError where
    the model names no block class."""
    blocks = transformer_blocks(model)
    if not blocks:
        raise ArgumentError(
            f"--residual-dtype bf16: {type(model).__name__} names no transformer block class "
            "(_no_split_modules); drop --residual-dtype"
        )

    for block in blocks:
        map_first_input(block, lambda hidden: hidden.to(torch.bfloat16))
    said = "--residual-dtype auto: a Llama-style causal LM under bf16 autocast" if auto else "--residual-dtype"
    return f"residual_dtype=bf16 ({said}: each of the {len(blocks)} blocks' inputs cast to bf16)"
