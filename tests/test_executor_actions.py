"""The executor takes pipeline schedules as data (executor.actions): rows are checked
against the plan before launch, a pipeline plan without one is refused, and the
simulator's schedule passes through unchanged."""

from __future__ import annotations

import pytest

from executor import PlanScheduleError, run_plan
from executor.actions import ActionOrderError, StepAction, schedule_rows, single_stage_order
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import plain_schedule
from simulator.schedules import build_schedule


def test_single_stage_order_is_f_then_bw_per_microbatch():
    assert single_stage_order(2) == ((StepAction("F", 0, 0), StepAction("BW", 0, 0),
                                      StepAction("F", 0, 1), StepAction("BW", 0, 1)),)


def test_simulator_schedules_are_read_duck_typed():
    sched = build_schedule("ZBVPP", 2, 4, 2)
    rows = schedule_rows(sched, 2, 4, 2)
    assert [[tuple(a) for a in r] for r in rows] == [[tuple(a) for a in r] for r in sched.actions]
    assert all(type(a) is StepAction for r in rows for a in r)


@pytest.mark.parametrize("bad, msg", [
    ((("F", 0, 0, 0),), "not an action"),
    (((StepAction("X", 0, 0),),), "kind 'X'"),
    (((StepAction("F", 0, 4),),), "micro-batch 4 outside 0..3"),
    (((StepAction("F", 0, 0, 1),),), "chunk 1 outside 0..0"),
    (((), ()), "2 rows but the plan has 1"),
])
def test_bad_rows_are_refused(bad, msg):
    with pytest.raises(ActionOrderError, match=msg):
        schedule_rows(bad, 1, 4, 1)


def test_a_pipeline_plan_needs_a_fitting_schedule_before_launch():
    plan = Plan("llama2-7b", "cpu-local", Strategy(pp=2, micro_batch_size=1, global_batch_size=4))
    with pytest.raises(PlanScheduleError, match="pp=2 needs a pipeline schedule"):
        run_plan(plan, 2)
    with pytest.raises(PlanScheduleError, match="row 0: micro-batch 2 outside 0..1"):
        run_plan(plan.__class__(plan.model, plan.cluster, plan.strategy.replace(global_batch_size=2)),
                 2, schedule=plain_schedule(plan))
