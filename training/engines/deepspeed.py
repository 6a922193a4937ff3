"""DeepSpeed's ZeRO stages 1-3, with or without CPU offload: Accelerate hands the model and
optimizer to DeepSpeed's engine, which shards the optimizer state (and with ZeRO-3 the weights),
clips and steps. DeepSpeed is imported only where it runs: its import takes seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate.utils import DeepSpeedPlugin

from ..strategies import deepspeed_config_for
from .base import Engine, transformer_blocks


class DeepSpeedEngine(Engine):
    setup_words = " (DeepSpeed builds its ops on first use: minutes on a fresh machine)"
    clips_gradients = False  # DeepSpeed clips inside its step (the config's gradient_clipping)

    @property
    def weights_sharded(self) -> bool:  # type: ignore[override]
        return self.decisions.zero_stage == 3

    def accelerator_settings(self, world: int, *, cuda: bool) -> tuple[dict[str, Any], str | None]:
        plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config_for(self.args, world))
        # Without a named backend accelerate counts one process under DeepSpeed on CPU while
        # DeepSpeed sees them all; gloo makes both agree.
        return {"deepspeed_plugin": plugin}, None if cuda else "gloo"

    def ops_to_build(self) -> list[str]:
        """The ops DeepSpeed compiles with its JIT on first use, not yet built here: the CPU
        accelerator's shared-memory comm op (every ZeRO run on CPU) and, with offload, CPUAdam.
        Built is cheap to know: prebuilt into the install (installed_ops), or a library in
        torch's extension folder from an earlier run (each takes a minute or more to build)."""
        try:
            import deepspeed.ops
            from deepspeed.accelerator import get_accelerator
            from deepspeed.git_version_info import installed_ops
            from torch.utils.cpp_extension import _get_build_directory  # private: guarded
        except ImportError:
            return []
        wanted = ["ShareMemCommBuilder"] + (["CPUAdamBuilder"] if self.decisions.strategy.offload else [])
        names = []
        for cls in wanted:
            try:
                builder = get_accelerator().create_op_builder(cls)  # None where the accelerator has none
                if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
                    continue
                if installed_ops.get(builder.name, False):
                    continue
                folder = Path(_get_build_directory(builder.name, verbose=False))
            except Exception:  # noqa: BLE001 - unknown: the slow phase's line still says it after 10 s
                continue
            if not (folder / f"{builder.name}.so").is_file():
                names.append(builder.name)
        return names

    def loaded(self, model: Any) -> None:
        """ZeRO-3 gathers parameters per module through Python hooks; for GPT-2's dozen small
        layers per block that host overhead, not bandwidth, bounds the step. Making each
        transformer block (the classes the model names in _no_split_modules, the unit FSDP
        wraps) a ZeRO-3 leaf gathers a block at once: a block's parameters are live together,
        which prefetching brings about anyway."""
        if self.decisions.zero_stage != 3 or not self.args.zero3_block_fetch:
            return
        from deepspeed.utils import set_z3_leaf_modules

        classes = sorted({type(m) for m in transformer_blocks(model)}, key=lambda c: c.__name__)
        if classes:
            set_z3_leaf_modules(model, classes)
            self.say("zero3_fetch_unit=" + ",".join(c.__name__ for c in classes))

    def optimizer(self, groups: list[dict[str, Any]], lr: float, accelerator: Any) -> Any:
        if self.decisions.strategy.offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam  # the optimizer runs where its state lives

            return DeepSpeedCPUAdam(groups, lr=lr)
        return super().optimizer(groups, lr, accelerator)

    def compile(self, accelerator: Any, model: Any, backend: Any) -> tuple[Any, Any]:
        # DeepSpeed's own way: compile the model inside its engine, in place. Compiling the
        # engine traced its forward's bookkeeping too, whose flags change between steps: the
        # first steps each compiled the whole model again (4 compiles on 2 CPU processes; on 4
        # H200s ZeRO-2's second 10 steps did not finish in 47 s, bench/README.md, session 9).
        model.compile(backend=backend)
        self.say("compile_unit=model (inside DeepSpeed's engine)")
        return model, None
