"""Cross-check: torch.distributed.pipelining's offline action orders played on our engine
give the same makespan as our own schedules at equal unit times."""

from __future__ import annotations

import pytest

from simulator import Action, Schedule, ScheduleError, build_schedule, simulate_pipeline
from simulator.schedules.base import interleaved_vstages, v_shape_vstages

S = pytest.importorskip("torch.distributed.pipelining.schedules", reason="torch pipelining not installed")
KIND = {"FORWARD": "F", "FULL_BACKWARD": "BW", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}


def _torch_order(cls, p, m, v):
    """pipeline_order of a torch schedule class without building stages (private helpers)."""
    helper = "_get_pipeline_order" if cls is S.Schedule1F1B else "_calculate_single_rank_operations"
    if not hasattr(cls, helper):
        pytest.skip(f"{cls.__name__}.{helper} is absent in this torch version")
    obj = cls.__new__(cls)
    obj._n_microbatches, obj.pp_group_size, obj._num_stages = m, p, p * v
    obj.num_stages, obj.n_local_stages = p * v, v
    obj.number_of_rounds = max(1, m // p)
    obj.microbatches_per_round = m // obj.number_of_rounds
    if cls is S.Schedule1F1B:
        return obj._get_pipeline_order()
    return {r: obj._calculate_single_rank_operations(r) for r in range(p)}


def _as_schedule(order, p, m, v, vst):
    where = {vs: (r, c) for r, row in enumerate(vst) for c, vs in enumerate(row)}
    rows = []
    for r in range(p):
        row = []
        for a in order[r]:
            kind = KIND.get(a.computation_type.name) if a is not None else None
            if kind is None:  # idle slots and REDUCE_GRAD are not compute actions
                continue
            rr, c = where[a.stage_index]
            assert rr == r
            row.append(Action(kind, r, a.microbatch_index, c))
        rows.append(tuple(row))
    return Schedule("torch", p, m, v, tuple(rows), vst)


CASES = [
    ("ScheduleInterleaved1F1B", "1F1B", 1),  # one local stage: plain 1F1B
    ("ScheduleInterleaved1F1B", "VPP", 2),
    ("ScheduleZBVZeroBubble", "ZBVPP", 2),
]


@pytest.mark.parametrize("cls_name, ours, v", CASES)
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_makespans_match_torch(cls_name, ours, v, p, m):
    cls = getattr(S, cls_name, None)
    if cls is None:
        pytest.skip(f"torch has no {cls_name}")
    vst = v_shape_vstages(p) if ours == "ZBVPP" else interleaved_vstages(p, v)
    theirs = _as_schedule(_torch_order(cls, p, m, v), p, m, v, vst)
    st = {"F": v * 1e-6, "B": v * 1e-6, "W": v * 1e-6}
    a = simulate_pipeline(theirs, st, 0.0).step_time_ns
    b = simulate_pipeline(build_schedule(ours, p, m, v), st, 0.0).step_time_ns
    assert a == b


def test_torch_1f1b_offline_order_is_rejected_clearly():
    """torch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's forwards
    1..m (not 0..m-1); the engine refuses it with a message instead of hanging."""
    order = _torch_order(S.Schedule1F1B, 2, 4, 1)
    with pytest.raises(ScheduleError, match="misplaced"):
        simulate_pipeline(_as_schedule(order, 2, 4, 1, interleaved_vstages(2, 1)), {"F": 1e-6, "B": 1e-6}, 0.0)
