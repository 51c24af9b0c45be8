"""Issue 18: the optimised schedule builders and the engine give exactly what the plain
code gave. Each fast path is compared with the construction as it was before the
speed-ups (kept verbatim under tests/, ``_zbv_reference``), over random sizes, times,
T_comm and switches (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import tests._zbv_reference as zbv_ref
from simulator.schedules import zbv

TIMES = st.tuples(*[st.integers(1, 60)] * 3)
SWITCHES = st.sampled_from([(True, True), (True, False), (False, True), (False, False)])


def _state(plan) -> tuple:
    return plan.rows, plan.idle, plan.max_idle, plan.free, plan.end, plan.mem, plan.count


def _run(mod, *args):
    try:
        return _state(mod.zbv_plan(*args))
    except Exception as e:  # the same error, message included, is part of "the same result"
        return type(e).__name__, str(e)


@settings(max_examples=100, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 40), t=TIMES, comm=st.integers(0, 30), sw=SWITCHES,
       allowance=st.none() | st.lists(st.integers(0, 200), min_size=8, max_size=8))
def test_zbv_run_equals_the_plain_construction(p, m, t, comm, sw, allowance):
    """One ZB-V run (inlined round) = the plain run: order, bubbles, end times, memory."""
    allow = None if allowance is None else allowance[:p]
    assert _run(zbv, p, m, t, comm, *sw, allow) == _run(zbv_ref, p, m, t, comm, *sw, allow)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 40), t=TIMES, comm=st.integers(0, 30))
def test_zbv_search_chooses_as_the_plain_search(p, m, t, comm):
    """The search with abandoned re-runs picks the same run and switches as running every
    re-run to the end."""
    got, want = zbv._search(p, m, t, comm), zbv_ref._search(p, m, t, comm)
    assert got[1] == want[1]
    assert _state(got[0]) == _state(want[0])
    assert got[0].actions() == want[0].actions()
    assert all(type(a) is zbv.Action for row in got[0].actions() for a in row)


def test_zbv_search_stops_a_rerun_that_cannot_win(monkeypatch):
    """p = 8, m = 32 with T_comm: some re-run is abandoned (returns None), and the choice
    still equals the plain search's."""
    calls = []
    real = zbv.zbv_plan
    monkeypatch.setattr(zbv, "zbv_plan", lambda *a: calls.append(real(*a)) or calls[-1])
    got = zbv._search(8, 32, (20, 24, 16), 7)
    want = zbv_ref._search(8, 32, (20, 24, 16), 7)
    assert _state(got[0]) == _state(want[0]) and got[1] == want[1]
    assert any(c is None for c in calls)
