"""The executor's view of a pipeline schedule: per pipeline stage, the ordered actions.

The executor does not build schedules (``simulator`` does; docs/design.md: executor imports
only ``completion`` and ``clusters``). Its callers pass one in — ``meshplan.validation``
builds it with ``simulator.build_schedule`` — and the executor reads it duck-typed: a
schedule is either an object with an ``actions`` attribute or a sequence with one row per
pipeline stage, each row a sequence of actions with the attributes ``kind`` (``F``, ``B``,
``W`` or ``BW`` = B then W), ``stage``, ``microbatch`` and ``chunk`` (0 when absent) —
the simulator's ``Action`` fits. Rows are copied into :class:`StepAction` tuples, so what
travels to the spawned ranks is executor data only.

A plan with one pipeline stage needs no schedule: its only sensible order is F then BW
per micro-batch (:func:`single_stage_order`, what every 1-stage schedule reduces to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from executor.errors import ExecutorError

KINDS = ("F", "B", "W", "BW")


class ActionOrderError(ExecutorError, ValueError):
    """A schedule that does not fit the plan (rows, kinds, micro-batches, chunks)."""


class StepAction(NamedTuple):
    """One action of one rank: run unit ``kind`` of ``chunk`` on ``microbatch``."""

    kind: str
    stage: int
    microbatch: int
    chunk: int = 0


Rows = tuple[tuple[StepAction, ...], ...]


def single_stage_order(num_microbatches: int) -> Rows:
    """The one-stage order: F then BW for each micro-batch."""
    row = []
    for mb in range(num_microbatches):
        row += [StepAction("F", 0, mb), StepAction("BW", 0, mb)]
    return (tuple(row),)


def _action(a: Any, stage: int, m: int, chunks: int) -> StepAction:
    try:
        act = StepAction(str(a.kind), int(a.stage), int(a.microbatch), int(getattr(a, "chunk", 0)))
    except (AttributeError, TypeError, ValueError) as e:
        raise ActionOrderError(f"schedule row {stage}: {a!r} is not an action with kind, stage, "
                            f"microbatch and chunk ({e})") from None
    if act.kind not in KINDS:
        raise ActionOrderError(f"schedule row {stage}: action kind {act.kind!r} is not one of {list(KINDS)}")
    if not 0 <= act.microbatch < m:
        raise ActionOrderError(f"schedule row {stage}: micro-batch {act.microbatch} outside 0..{m - 1}")
    if not 0 <= act.chunk < chunks:
        raise ActionOrderError(f"schedule row {stage}: chunk {act.chunk} outside 0..{chunks - 1}")
    return act


def schedule_rows(schedule: Any, num_stages: int, num_microbatches: int,
                  num_chunks: int = 1) -> Rows:
    """Per-stage action rows of ``schedule`` (module docstring), checked against the plan.

    ``schedule=None`` is accepted for one stage only (:func:`single_stage_order`).
    Raises ActionOrderError when the schedule is missing for a pipeline, has a row count other
    than ``num_stages``, or names a kind, micro-batch or chunk the plan does not have."""
    if schedule is None:
        if num_stages != 1:
            raise ActionOrderError(f"a plan with pp={num_stages} needs a pipeline schedule "
                                f"(schedule=...; meshplan.validation builds it)")
        return single_stage_order(num_microbatches)
    rows = getattr(schedule, "actions", schedule)
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise ActionOrderError(f"a schedule must have per-stage action rows, got {type(rows).__name__}")
    if len(rows) != num_stages:
        raise ActionOrderError(f"the schedule has {len(rows)} rows but the plan has {num_stages} "
                            f"pipeline stages")
    return tuple(tuple(_action(a, s, num_microbatches, num_chunks) for a in row)
                 for s, row in enumerate(rows))
