"""Issue 18: the optimised schedule builders and the engine give exactly what the plain
code gave. Each fast path is compared with the construction as it was before the
speed-ups (kept verbatim under tests/, ``_zbv_reference``), over random sizes, times,
T_comm and switches (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tests._zbv_reference as zbv_ref
from simulator.schedules import zbv
from tests._rule_cache import disable_rule_cache

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


def _freeze_plain(x):
    """``completion.propagate.freeze`` before issue 18 (the plain recursion)."""
    if isinstance(x, (list, tuple)):
        return tuple(_freeze_plain(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((str(k), _freeze_plain(v)) for k, v in x.items()))
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
ATTRS = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                     | st.dictionaries(st.text(max_size=3) | st.integers(0, 3), inner, max_size=4)
                     | st.sets(st.integers(0, 5), max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(x=ATTRS)
@example(x={"0": [], 0: None})
def test_freeze_equals_the_plain_recursion(x):
    from completion.propagate import freeze

    try:
        want = _freeze_plain(x)
    except TypeError:  # e.g. {'0': [], 0: None}: keys equal as strings, values not orderable
        with pytest.raises(TypeError):
            freeze(x)
        return
    got = freeze(x)
    assert got == want and type(got) is type(want)
    hash(got)


def test_completion_with_the_rule_cache_equals_without(monkeypatch):
    """The rule cache's keys (plain (shape, attr, priority) tuples, shared hint attrs) give
    the printed program that calling the rule every time gives: zb-gpt-6.2b, 2 layers,
    Megatron dp2 x mp4, pipeline of 2, after partition and reshard."""
    from completion import apply_partition_pass, apply_reshard_pass, build_model
    from completion.annotate import shard_megatron
    from completion.backward import append_backward
    from completion.completer import Completer
    from completion.mesh import ProcessMesh
    from completion.optimizer import apply_optimizer
    from completion.pir.printer import print_program

    def printed() -> str:
        p = build_model("zb-gpt-6.2b", 4, num_layers=2)
        append_backward(p)
        apply_optimizer(p, "adamw")
        shard_megatron(p, ProcessMesh.of(2, 4, dim_names=("dp", "mp")), "dp", "mp")
        Completer(p, pp_degree=2).complete()
        apply_partition_pass(p)
        apply_reshard_pass(p)
        return print_program(p)

    cached = printed()

    disable_rule_cache(monkeypatch)  # every infer runs the rule
    assert printed() == cached


NAMES = ("FThenB", "1F1B", "VPP", "ZBH1", "ZBH2", "ZB", "ZBVPP")


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 6), m=st.integers(1, 12), v=st.integers(1, 3),
       swaps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 200), st.integers(0, 200)), max_size=3))
def test_p2p_fast_check_equals_the_message_walk(name, p, m, v, swaps):
    """``_sends_match_consumption`` (int messages, per-chunk lists) answers what comparing
    the tuple messages of ``_walk`` answers, on built schedules and on schedules with two
    actions of a rank swapped (which may cross the messages of a pair)."""
    from simulator import build_schedule
    from simulator.schedules import p2p
    from simulator.schedules.base import Schedule

    if name == "ZBVPP":
        v = 2
    elif name != "VPP":
        v = 1
    else:
        m = p * max(1, m // p)
    s = build_schedule(name, p, m, v)
    rows = [list(r) for r in s.actions]
    for r, i, j in swaps:
        row = rows[r % p]
        i, j = i % len(row), j % len(row)
        row[i], row[j] = row[j], row[i]
    t = Schedule(s.name, p, m, s.num_chunks, tuple(map(tuple, rows)), s.vstage)
    sends, consumes, _ = p2p._walk(t)
    assert p2p._sends_match_consumption(t) == (sends == consumes)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 24))
def test_one_f_one_b_rows_are_actions(p, m):
    """The 1F1B rows built without the NamedTuple call are Actions equal to the spelled-out
    Megatron order (warm-up min(p - r - 1, m) forwards, then F/BW pairs, then the rest)."""
    from simulator.schedules.base import Action
    from simulator.schedules.classic import one_f_one_b_rows

    for r, row in enumerate(one_f_one_b_rows(p, m)):
        warm = min(p - r - 1, m)
        want = [Action("F", r, i) for i in range(warm)]
        for i in range(m - warm):
            want += [Action("F", r, warm + i), Action("BW", r, i)]
        want += [Action("BW", r, i) for i in range(m - warm, m)]
        assert row == want and all(type(a) is Action for a in row)


def test_gc_paused_restores_the_collector():
    import gc

    from completion.gc_pause import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with gc_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 30), t=TIMES, comm=st.integers(0, 30),
       limit=st.sampled_from([2, 3, 4, 8, 12, 24, 64]))
def test_zb_auto_choice_equals_the_plain_heuristic(p, m, t, comm, limit):
    """The ZB automatic schedule (put with its arrival inlined, W fill on local counters)
    chooses the run, switches and cost of the plain heuristic, and the same order."""
    import tests._zb_reference as zb_ref
    from simulator.schedules import zb_auto

    def best(mod):
        try:
            plan, cost, sw = mod._best(p, m, t, comm, limit)
        except Exception as e:
            return type(e).__name__, str(e)
        return cost, sw, plan.rows, plan.idle, plan.free, plan.actions()

    assert best(zb_auto) == best(zb_ref)
