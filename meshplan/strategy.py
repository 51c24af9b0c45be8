"""``Strategy`` (plain data, defined in :mod:`completion.strategy` so that the cost model
and the executor read the same object), re-exported for ``from meshplan.strategy import
Strategy``."""

from completion.strategy import (
    DTYPES,
    OPTIMIZERS,
    RECOMPUTE,
    SCHEDULES,
    Strategy,
    StrategyError,
    canonical_schedule,
)

__all__ = ["DTYPES", "OPTIMIZERS", "RECOMPUTE", "SCHEDULES", "Strategy", "StrategyError",
           "canonical_schedule"]
