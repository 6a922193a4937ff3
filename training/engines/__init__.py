"""One file per engine behind one interface (base.Engine); engine_for picks the one the run's
decisions name. The trainer never branches on an engine: it calls these.

Torch-free to import: each engine's row in facts.FACTS names its class, imported when picked,
so the plan and the flag check read the facts without loading torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .facts import FACTS

if TYPE_CHECKING:
    from ..decisions import Decisions
    from .base import Engine, Say


def engine_for(decided: Decisions, say: Say) -> Engine:
    """The engine the run's decisions name, saying its lines through `say`."""
    module, _, name = FACTS[decided.engine].code.partition(":")
    engine: type[Engine] = getattr(importlib.import_module(f".{module}", __name__), name)
    return engine(decided, say)


__all__ = ["engine_for"]
