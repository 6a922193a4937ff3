"""DDP, and one process: Accelerate wraps the model in DistributedDataParallel (with one process,
not at all); every process holds the whole model and its optimizer state."""

from __future__ import annotations

from typing import Any

import torch

from .base import Engine


class DDPEngine(Engine):
    eager_fallback = True  # the reducer can be reset and the job run eagerly (Trainer._backward)
    ddp_wrapped = True

    def prepare(self, accelerator: Any, model: Any, optimizer: Any, train_dl: Any, eval_dl: Any) -> tuple:
        if self.decisions.compiled and self.args.compiled_autograd:
            # Read when DDP wraps the model (acc.prepare): its reducer then leaves the all-reduces
            # to compiled autograd, which traces them into the backward graph.
            torch._dynamo.config.optimize_ddp = "python_reducer"
        return super().prepare(accelerator, model, optimizer, train_dl, eval_dl)

    def compile(self, accelerator: Any, model: Any, backend: Any) -> tuple[Any, Any]:
        compiled, _ = super().compile(accelerator, model, backend)
        if not self.args.compiled_autograd:
            return compiled, None
        reduces = ", DDP's all-reduces in it" if accelerator.num_processes > 1 else ""
        self.say(f"compiled_autograd=on (the backward one graph{reduces})")
        return compiled, torch.compile(backend=backend)
