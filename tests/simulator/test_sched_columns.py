"""Issue 18: the vectorised schedule checks (``simulator.schedules.columns``) and the play's
re-armed stream event give what the plain paths give.

* ``Schedule.validate`` with the integer columns accepts exactly what the per-action walk
  accepts and, on a defect, raises the walk's message (schedules built, then mutated:
  actions swapped, dropped, duplicated, moved to another rank, chunk or micro-batch,
  renamed, given a float or a huge micro-batch);
* the vectorised p2p check answers what comparing ``p2p._walk``'s message lists answers;
* the play of a schedule that took the vectorised path equals the independent list
  scheduling of tests/simulator/test_sim_speed.py.

``columns.MIN_ACTIONS`` is set to 0 here so that the small schedules hypothesis draws take
the vectorised path (the production threshold only skips it below 1,024 actions).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import build_schedule, simulate_pipeline
from simulator.errors import ScheduleError
from simulator.pipeline_sim import clear_play_cache, normalize_stage_times
from simulator.schedules import columns, p2p
from simulator.schedules.base import Action, Schedule, clear_schedule_cache
from tests.simulator.test_sim_speed import list_schedule

NAMES = ("FThenB", "1F1B", "VPP", "ZBH1", "ZBH2", "ZB", "ZBVPP")


@pytest.fixture(autouse=True)
def _vectorised_always(monkeypatch):
    monkeypatch.setattr(columns, "MIN_ACTIONS", 0)
    clear_schedule_cache()
    clear_play_cache()
    yield
    clear_schedule_cache()
    clear_play_cache()


def _built(name: str, p: int, m: int):
    v = 2 if name in ("VPP", "ZBVPP") else 1
    if name == "VPP":
        m = p * max(1, m // p)
    return build_schedule(name, p, m, v), m, v


def _mutate(rows: list[list], how: str, r: int, i: int, j: int, m: int) -> None:
    row = rows[r]
    i, j = i % len(row), j % len(row)
    kind, stage, mb, c = row[i]
    if how == "swap":
        row[i], row[j] = row[j], row[i]
    elif how == "drop":
        del row[i]
    elif how == "dup":
        row.insert(j, row[i])
    elif how == "rank":
        row[i] = Action(kind, stage + 1, mb, c)
    elif how == "chunk":
        row[i] = Action(kind, stage, mb, c + 1 + j % 2)
    elif how == "mb":
        row[i] = Action(kind, stage, (mb + 1 + j) % (m + 1), c)
    elif how == "kind":
        # an unknown kind ("X") cycles back to "F", so two "kind" mutations of one action are valid input
        row[i] = Action({"F": "B", "B": "BW", "W": "F", "BW": "X"}.get(kind, "F"), stage, mb, c)
    elif how == "float":
        row[i] = Action(kind, stage, float(mb), c)
    elif how == "huge":
        row[i] = Action(kind, stage, mb + 2**40, c)


def _plain_verdict(s: Schedule) -> str | None:
    """The plain path's answer: None if valid, else the error message."""
    try:
        s._check_actions()
        sends, consumes, _ = p2p._walk(s)
        if sends != consumes:
            p2p.check_p2p(s)  # deferred sends may still be fine; raises on a real mismatch
    except (ScheduleError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _verdict(s: Schedule) -> str | None:
    try:
        s.validate()
    except (ScheduleError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 5), m=st.integers(1, 9),
       muts=st.lists(st.tuples(st.sampled_from(["swap", "drop", "dup", "rank", "chunk", "mb", "kind",
                                                "float", "huge"]),
                               st.integers(0, 4), st.integers(0, 99), st.integers(0, 99)), max_size=2))
def test_validate_with_columns_equals_the_plain_walk(name, p, m, muts):
    s, m, v = _built(name, p, m)
    rows = [list(r) for r in s.actions]
    for how, r, i, j in muts:
        if rows[r % p]:
            _mutate(rows, how, r % p, i, j, m)
    t = Schedule(s.name, p, m, v, tuple(map(tuple, rows)), s.vstage)
    assert _verdict(t) == _plain_verdict(Schedule(s.name, p, m, v, t.actions, s.vstage))
    assert ("_columns" in t.__dict__) == (columns.columns(t.actions) is not None
                                          and columns.actions_complete(columns.columns(t.actions), p, m, v))


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 6), m=st.integers(1, 12),
       swaps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 200), st.integers(0, 200)), max_size=3))
def test_vectorised_p2p_check_equals_the_message_walk(name, p, m, swaps):
    """Swapping two actions of a rank keeps the per-action checks true and may cross a
    pair's messages: the columns' answer equals comparing ``_walk``'s message lists."""
    s, m, v = _built(name, p, m)
    rows = [list(r) for r in s.actions]
    for r, i, j in swaps:
        row = rows[r % p]
        i, j = i % len(row), j % len(row)
        row[i], row[j] = row[j], row[i]
    t = Schedule(s.name, p, m, v, tuple(map(tuple, rows)), s.vstage)
    cols = columns.columns(t.actions)
    assert cols is not None and columns.actions_complete(cols, p, m, v)
    sends, consumes, _ = p2p._walk(t)
    assert columns.sends_match_consumption(cols, t.vstage, t.num_vstages, m) == (sends == consumes)


def test_crossed_messages_are_a_mismatch():
    """Hand-derived, p = 2, m = 2: rank 0 runs F0 F1 BW0 BW1 (GPipe), so it sends the
    activations of micro-batches 0, 1 in that order. Rank 1 running F0 BW0 F1 BW1 consumes
    them in the same order (match); running F1 BW1 F0 BW0 it consumes 1 before 0 (the pair
    0 -> 1 crosses, and so does its gradient pair 1 -> 0), which the full check then
    resolves by deferring a send."""
    r0 = (Action("F", 0, 0), Action("F", 0, 1), Action("BW", 0, 0), Action("BW", 0, 1))
    ok = (Action("F", 1, 0), Action("BW", 1, 0), Action("F", 1, 1), Action("BW", 1, 1))
    crossed = (Action("F", 1, 1), Action("BW", 1, 1), Action("F", 1, 0), Action("BW", 1, 0))
    vst = ((0,), (1,))
    assert columns.sends_match_consumption(columns.columns((r0, ok)), vst, 2, 2)
    assert not columns.sends_match_consumption(columns.columns((r0, crossed)), vst, 2, 2)
    # not an error: rank 0 defers the activation of 0 until that of 1 is sent (p2p docstring)
    t = Schedule("crossed", 2, 2, 1, (r0, crossed), vst)
    t.validate()
    assert p2p.max_deferred(t) == 1


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 5), m=st.integers(1, 10),
       tf=st.floats(0.1, 3.0), tb=st.floats(0.1, 3.0), tw=st.floats(0.1, 3.0),
       comm=st.sampled_from([0.0, 0.05, 0.4]), sync=st.booleans())
def test_play_of_a_vectorised_schedule_equals_list_scheduling(name, p, m, tf, tb, tw, comm, sync):
    v = 2 if name in ("VPP", "ZBVPP") else 1
    if name == "VPP":
        m = p * max(1, m // p)
    opts = {"stage_times": {"F": tf, "B": tb, "W": tw}, "comm_time": comm} if name in ("ZB", "ZBVPP") else {}
    sched = build_schedule(name, p, m, v, **opts)
    assert "_columns" in sched.__dict__
    per_stage = [{"F": tf * (1 + 0.3 * r), "B": tb, "W": tw} for r in range(p)]
    res = simulate_pipeline(sched, per_stage, comm, p2p_sync=sync)
    got = {(e.rank, e.kind, e.microbatch, e.chunk): (e.start, e.end) for e in res.timeline}
    if not sync:
        assert got == list_schedule(sched, normalize_stage_times(sched, per_stage), round(comm * 1e9))
    assert res.step_time_ns == max(e.end for e in res.timeline)
    assert len(res.timeline) == sum(map(len, sched.actions))


def test_columns_refuse_what_is_not_an_action():
    assert columns.columns(()) is None
    assert columns.columns(((("F", 0, 0),),)) is None  # three fields
    assert columns.columns(((("Q", 0, 0, 0),),)) is None  # unknown kind
    assert columns.columns(((("F", 0, 0.0, 0),),)) is None  # a float micro-batch
    assert columns.columns(((("F", 0, 2**40, 0),),)) is None  # beyond int32
    c = columns.columns(((Action("F", 0, 1), Action("BW", 0, 1, 0)), (Action("W", 1, 0, 2),)))
    assert c.offsets.tolist() == [0, 2, 3] and c.kind.tolist() == [0, 3, 2]
    assert c.rank.tolist() == [0, 0, 1] and c.microbatch.tolist() == [1, 1, 0] and c.chunk.tolist() == [0, 0, 2]


def test_the_fast_p2p_check_holds_beyond_46340_ranks():
    """rank * p overflowed int32 from p = 46,341: the vectorised check then said "no" and
    validation fell back to the plain walk, O(p^2) (a bad-input hunt: `simulate --stages
    46400` ran for minutes). 1F1B at p = 46,400, m = 1 is a correct schedule."""
    from simulator.schedules.columns import columns as cols
    from simulator.schedules.columns import sends_match_consumption

    p = 46_400  # the actions by hand: building validates, and with the bug would not return
    actions = tuple((Action("F", r, 0, 0), Action("BW", r, 0, 0)) for r in range(p))
    vstage = tuple((r,) for r in range(p))
    assert sends_match_consumption(cols(actions), vstage, p, 1)
