"""meshplan: how should this model be split on this cluster, and how fast and how big will
each training step be? See docs/design.md for the architecture.

The public API, imported lazily so that ``meshplan --help`` stays fast::

    from meshplan import Engine, Strategy, Plan
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "Engine": "meshplan.engine",
    "EngineError": "meshplan.engine",
    "Strategy": "completion.strategy",
    "StrategyError": "completion.strategy",
    "Plan": "meshplan.plan",
    "PlanError": "meshplan.plan",
    "MeshplanError": "meshplan.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """``meshplan.Engine`` and friends, imported on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'meshplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
