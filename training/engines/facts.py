"""What each engine is, one row per engine name: the facts other code reads about an engine
without importing it. Torch-free: the run's decisions (decisions.py), the flag check (args.py),
the head loss (modeling.py) and the launcher's memory estimate read them, each instead of a copy
of its own. An engine's code is its file beside this one (a subclass of base.Engine); its row
here registers it (engine_for imports `code`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies import Strategy

# How the model is sharded and wrapped, one file each in this folder.
SINGLE, DDP, DEEPSPEED, FSDP2, GRAPH_FSDP = "single", "ddp", "deepspeed", "fsdp2", "graph_fsdp"


@dataclass(frozen=True)
class Facts:
    code: str  # "module:Class" in this folder
    # The model's weights stay fp32 under autocast, as DDP's do. False: the engine keeps a 16-bit
    # model itself (DeepSpeed's; FSDP2's MixedPrecisionPolicy gathers 16-bit weights and Accelerate
    # wraps no autocast around it), which leaves other tensors on the GPU (memory.mode).
    autocast: bool
    # losses.head_loss reads the LM head's weight whole: the replicated model's, or in-graph fsdp's,
    # gathered when read. The other sharded engines hold it their own way.
    head_loss: bool
    # float8 linears (training/fp8.py) convert the replicated model's linears; the sharded engines
    # hold their weights their own way.
    fp8: bool


FACTS: dict[str, Facts] = {
    SINGLE: Facts("ddp:DDPEngine", autocast=True, head_loss=True, fp8=True),  # Accelerate wraps nothing
    DDP: Facts("ddp:DDPEngine", autocast=True, head_loss=True, fp8=True),
    DEEPSPEED: Facts("deepspeed:DeepSpeedEngine", autocast=False, head_loss=False, fp8=False),
    FSDP2: Facts("fsdp2:FSDP2Engine", autocast=False, head_loss=False, fp8=False),
    GRAPH_FSDP: Facts("graph_fsdp:GraphFSDPEngine", autocast=True, head_loss=True, fp8=False),
}


def engine_of(strategy: Strategy, in_graph: bool = False) -> str:
    """The engine that runs `strategy`; fsdp's is one of two (`in_graph`: strategies.fsdp_in_graph)."""
    if strategy is Strategy.fsdp:
        return GRAPH_FSDP if in_graph else FSDP2
    if strategy.uses_deepspeed:
        return DEEPSPEED
    return SINGLE if strategy is Strategy.single else DDP


def takes_fp8(strategy: Strategy) -> bool:
    """Whether every engine `strategy` may run converts linears to float8 (fsdp's either engine)."""
    return all(FACTS[engine_of(strategy, in_graph)].fp8 for in_graph in (False, True))
