"""Pipeline schedules: one module per family, all registered in ``SCHEDULES``.

``build_schedule(name, num_stages, num_microbatches, num_chunks=1, memory_limit=None)``
returns a ``Schedule`` (per-rank ordered actions). Names: FThenB, 1F1B, VPP, ZBH1, ZBH2,
ZBVPP, ZB.
"""

from __future__ import annotations

from simulator.schedules import classic, dualpipe, zb_auto, zbv, zero_bubble  # noqa: F401  (register builders)
from simulator.schedules.base import (
    KINDS,
    SCHEDULES,
    Action,
    Schedule,
    ScheduleError,
    build_schedule,
    register_schedule,
)

__all__ = ["KINDS", "SCHEDULES", "Action", "Schedule", "ScheduleError", "build_schedule", "register_schedule"]
