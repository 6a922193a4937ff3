"""One file per engine behind one interface (base.Engine); engine_for picks the one the run's
decisions name. The trainer never branches on an engine: it calls these."""

from __future__ import annotations

from .. import decisions
from .base import Engine, Say, transformer_blocks
from .ddp import DDPEngine
from .deepspeed import DeepSpeedEngine
from .fsdp2 import FSDP2Engine
from .graph_fsdp import GraphFSDPEngine

ENGINES: dict[str, type[Engine]] = {
    decisions.SINGLE: DDPEngine,  # one process: Accelerate wraps nothing, DDP's way otherwise
    decisions.DDP: DDPEngine,
    decisions.DEEPSPEED: DeepSpeedEngine,
    decisions.FSDP2: FSDP2Engine,
    decisions.GRAPH_FSDP: GraphFSDPEngine,
}


def engine_for(decided: decisions.Decisions, say: Say) -> Engine:
    """The engine the run's decisions name, saying its lines through `say`."""
    return ENGINES[decided.engine](decided, say)


__all__ = ["Engine", "engine_for", "transformer_blocks"]
