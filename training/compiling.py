"""torch.compile as the trainer uses it: a backend that survives Inductor's failures, the block-by-
block compile, compiled autograd, and the contexts that run compiled code eagerly."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._dynamo import compiled_autograd as torch_compiled_autograd
from torch._dynamo import utils as dynamo_utils

from . import faults
from .args import ArgumentError
from .engines.base import Engine, transformer_blocks
from .modeling import HEAD_LOSS


def inductor_or_eager(mode: str, say):
    """Inductor's torch.compile backend for `mode`; a graph it fails to compile runs eagerly, once
    said, so a compiler bug costs speed, not the job. (A backward graph is compiled at its first
    backward, outside this guard: Trainer._backward catches a failure there.)"""
    inductor = torch._TorchCompileInductorWrapper(mode, None, False)
    warned: list[bool] = []

    def backend(graph, example_inputs):
        try:
            if faults.compile_fails():  # a test's Inductor failure (training/faults.py)
                raise RuntimeError("injected compile failure")
            return inductor(graph, example_inputs)
        except Exception as e:
            if not warned:
                reason = " ".join(str(e).split())[:200] or type(e).__name__
                say(f"warning: torch.compile failed ({reason}); running that part eagerly (--no-compile avoids it)")
                warned.append(True)
            return graph.forward

    return backend


def compile_times_line(top: int = 8) -> str:
    """Where the first step's compile went, by the compiler's own timers
    (torch._dynamo.utils.compile_times), the longest first. Times are inclusive (a phase holds
    the phases it calls) and summed over calls. The longest first compile (fsdp sharded in the
    graph: about 80 s against DDP's 25-30 s at GPT-2 small) is what these name the parts of."""
    try:
        names, values = dynamo_utils.compile_times(repr="csv", aggregate=True)
        timed = sorted(((str(n), float(str(v))) for n, v in zip(names, values, strict=True)), key=lambda nt: -nt[1])
    except Exception:  # a private helper: its form may change with torch, and this is only a log line
        return ""
    return " ".join(f"{name}:{seconds:.1f}s" for name, seconds in timed[:top])


def fail_partway(model) -> None:
    """Test hook: the next backward raises partway, after some gradients have reached their hooks
    (DDP's reducer's among them), as a kernel failing inside a compiled backward leaves it."""
    params = [p for p in model.parameters() if p.requires_grad]
    handles: list[Any] = []

    def fail(grad):
        handles.pop().remove()
        raise RuntimeError("injected failure in the compiled backward")

    handles.append(params[len(params) // 2].register_hook(fail))


def seeded_backward(accelerator: Any, loss: Any) -> None:
    """accelerator.backward(loss) for compiled autograd (ddp or one process, no DeepSpeed): the
    accumulation's 1/k seeds the backward instead of dividing the loss. Accelerate's `loss / k`
    saves k, a Scalar, on the division's backward node; compiled autograd lifts it into its graph
    as an input, and under torch 2.11 with CUDA it then passed the Python int where Inductor's
    first kernel read a 0-d tensor (bench/README.md, session 11). Seeded, the graph has no Scalar
    input, and every gradient is the same."""
    scaler = accelerator.scaler  # fp16's loss scale: a tensor product, no Scalar either
    scaled = scaler.scale(loss) if scaler is not None else loss
    scaled.backward(torch.full_like(scaled, 1.0 / accelerator.gradient_accumulation_steps))


def compiled_autograd(compiler: Any) -> Any:
    """A context in which backward runs through torch's compiled autograd with `compiler`; none if None."""
    if compiler is None:
        return contextlib.nullcontext()
    return torch_compiled_autograd._enable(compiler)


def eager() -> Any:
    """A context in which what was compiled (the model, or the blocks in place and the loss) runs
    eagerly, compiling nothing new. set_stance is torch >= 2.6; the [train] extra allows 2.4,
    where this does nothing (and Accelerate refuses FSDP2, so fsdp, anyway)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


def tune_kernels() -> None:
    """--compile-tuning: Inductor then tries block sizes and warp counts around its heuristic pick
    for each generated kernel (the norms, dropouts, adds and the loss: about 40% of GPT-2 small's
    GPU time on an H100, the rest being cuBLAS and cuDNN)."""
    inductor_config.coordinate_descent_tuning = True


def compile_blocks(model: Any, engine: Engine, backend: Any, requested_unit: str | None, say: Any) -> bool:
    """Compile each transformer block's forward and the loss, not the model (--compile-unit block;
    by default under fsdp and ZeRO-3, strategies.BLOCK_COMPILED). Blocks of one class share one
    compiled graph (Dynamo lifts their weights to inputs), so the compile takes about one
    block's time whatever the depth. False, with nothing compiled, where ZeRO-3 is compiled with no
    --compile-unit and the model names no block class: the caller then compiles the whole model
    (the default compile decision keeps such a model eager). `model`: unwrapped.

    fsdp and ZeRO-3: the sharding hooks around a block or unit (gather its weights, free them,
    reduce its gradients) run eagerly between compiled blocks, as in torchtitan, instead of
    breaking one compiled graph at every unit. DDP: a block's gradients reach DDP's reducer when
    that block's backward ends, so its buckets are all-reduced while earlier blocks' backward
    runs, as in an eager step; one compiled model instead all-reduces its one bucket after the
    whole backward."""
    blocks = transformer_blocks(model)
    if not blocks and not engine.loss_alone_without_blocks:  # FSDP2 then compiles the loss alone, as before
        if requested_unit is None:  # ZeRO-3's default unit: compile the whole model instead
            return False
        raise ArgumentError(
            f"--compile-unit block: {type(model).__name__} names no "
            "transformer block class (_no_split_modules); use --compile-unit model"
        )
    if engine.ddp_wrapped:
        # Dynamo would otherwise split each block's graph at DDP's bucket boundaries (the
        # splitting one compiled model needs); the reducer's own hooks give the overlap here.
        torch._dynamo.config.optimize_ddp = False
    for block in blocks:
        block.forward = torch.compile(block.forward, backend=backend)
    # And the model's own loss, which the blocks leave out: eager, it upcasts the logits
    # (16x1024x50k for GPT-2 small) to fp32 and reads and writes them several times each way;
    # compiled, one fused pass (about 20 ms of an H100's step, bench/README.md, session 7).
    # --lm-loss fast needs no compiling: its one pass over the logits is a kernel of its own.
    fast = bool(model.__dict__.get(HEAD_LOSS))
    if not fast:
        model.loss_function = torch.compile(model.loss_function, backend=backend)
    say(f"compile_unit=block blocks={len(blocks)} loss={'fast' if fast else 'compiled'}")
    return True
