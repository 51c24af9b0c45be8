"""Issue 18 item 1: the fast paths of the simulator give what the plain ones give.

* the SimPy play equals an independent list-scheduling evaluation of the same model
  (every action starts when its rank is free and its inputs plus hops have arrived);
* the ZB heuristic's early abandon chooses what running all eight switch settings to the
  end chooses;
* schedules are built and validated once per argument set, plays memoised per
  (schedule, times, T_comm, sync);
* the partition passes' batched edits keep ``list.insert`` order.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.errors import CompletionError
from completion.ir import Operation, Program, Value
from completion.ops.registry import TensorType
from completion.passes.splice import OpSplicer
from simulator import build_schedule, simulate_pipeline
from simulator.bounds.step import fused_backward
from simulator.pipeline_sim import clear_play_cache, normalize_stage_times
from simulator.schedules import p2p
from simulator.schedules.base import clear_schedule_cache
from simulator.schedules.zb_auto import _best, zb_heuristic

NAMES = ("FThenB", "1F1B", "VPP", "ZBH1", "ZBH2", "ZB", "ZBVPP")


def list_schedule(sched, times, hop_ns):
    """Reference evaluation without SimPy: repeatedly place, on any rank, its next action
    whose inputs are done; start = max(rank free, input end + hop). Returns
    {(rank, kind, mb, chunk): (start, end)} in ns."""
    nvs = sched.num_vstages
    owner = {vs: r for r, row in enumerate(sched.vstage) for vs in row}
    done: dict[tuple[str, int, int], int] = {}
    free = [0] * sched.num_stages
    nxt = [0] * sched.num_stages
    out = {}
    progress = True
    while progress:
        progress = False
        for r, row in enumerate(sched.actions):
            while nxt[r] < len(row):
                a = row[nxt[r]]
                vs = sched.vstage[r][a.chunk]
                tf, tb, tw, tbw = times[r][a.chunk]
                if a.kind == "F":
                    deps = [] if vs == 0 else [(("F", vs - 1, a.microbatch), owner[vs - 1])]
                    dur, outs = tf, [("F", vs, a.microbatch)]
                elif a.kind == "W":
                    deps, dur, outs = [(("B", vs, a.microbatch), r)], tw, [("W", vs, a.microbatch)]
                else:
                    deps = [(("F", vs, a.microbatch), r)]
                    if vs < nvs - 1:
                        deps.append((("B", vs + 1, a.microbatch), owner[vs + 1]))
                    dur = tbw if a.kind == "BW" else tb
                    outs = [("B", vs, a.microbatch)] + ([("W", vs, a.microbatch)] if a.kind == "BW" else [])
                if any(k not in done for k, _ in deps):
                    break
                start = max([free[r]] + [done[k] + (0 if src == r else hop_ns) for k, src in deps])
                end = start + dur
                for k in outs:
                    done[k] = end
                free[r] = end
                out[(r, a.kind, a.microbatch, a.chunk)] = (start, end)
                nxt[r] += 1
                progress = True
    return out


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 5), m=st.integers(1, 10),
       tf=st.floats(0.1, 3.0), tb=st.floats(0.1, 3.0), tw=st.floats(0.1, 3.0),
       comm=st.sampled_from([0.0, 0.05, 0.4]), skew=st.floats(0.0, 1.0))
def test_play_equals_list_scheduling(name, p, m, tf, tb, tw, comm, skew):
    v = 2 if name in ("VPP", "ZBVPP") else 1
    if name == "VPP":
        m = p * max(1, m // p)
    opts = {"stage_times": {"F": tf, "B": tb, "W": tw}, "comm_time": comm} if name in ("ZB", "ZBVPP") else {}
    sched = build_schedule(name, p, m, v, **opts)
    per_stage = [{"F": tf * (1 + skew * r), "B": tb, "W": tw} for r in range(p)]
    res = simulate_pipeline(sched, per_stage, comm)
    ref = list_schedule(sched, normalize_stage_times(sched, per_stage), round(comm * 1e9))
    got = {(e.rank, e.kind, e.microbatch, e.chunk): (e.start, e.end) for e in res.timeline}
    assert got == ref
    assert res.step_time_ns == max(e for _, e in ref.values())
    for r in range(p):
        mine = [se for k, se in ref.items() if k[0] == r]
        assert res.busy_time[r] == pytest.approx(sum(e - s for s, e in mine) * 1e-9, abs=1e-12)
        assert res.span[r] == pytest.approx((max(e for _, e in mine) - min(s for s, _ in mine)) * 1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), t=st.tuples(*[st.integers(1, 40)] * 3),
       comm=st.integers(0, 20), limit=st.sampled_from([2, 3, 4, 8, 12, 24]))
def test_zb_early_abandon_chooses_as_the_full_search(p, m, t, comm, limit):
    """``_best`` (runs abandoned once their final-cost lower bound reaches the best) picks
    the same switches, cost and order as running all eight settings to the end (first of
    the smallest cost, itertools.product order)."""
    full = []
    for sw in itertools.product((True, False), repeat=3):
        rows, cost = zb_heuristic(p, m, t, comm, limit, *sw)
        full.append((cost, sw, rows))
    want = min(full, key=lambda x: x[0])  # min keeps the first of equal costs
    plan, cost, sw = _best(p, m, t, comm, limit)
    assert (cost, sw) == want[:2]
    assert plan.actions() == want[2]


def test_schedules_are_built_and_validated_once(monkeypatch):
    clear_schedule_cache()
    calls = []
    real = p2p._sends_match_consumption
    monkeypatch.setattr(p2p, "_sends_match_consumption", lambda s: calls.append(1) or real(s))
    a = build_schedule("ZB", 4, 8, stage_times={"F": 1.0, "B": 1.0, "W": 0.5})
    b = build_schedule("ZB", 4, 8, stage_times={"W": 0.5, "B": 1.0, "F": 1.0})
    c = build_schedule("ZB", 4, 8, stage_times={"F": 1.0, "B": 1.0, "W": 0.6})
    assert a is b and a is not c
    simulate_pipeline(a, {"F": 1.0, "B": 1.0, "W": 0.5})
    assert len(calls) == 2  # a and c, each once (simulate_pipeline does not validate again)


def test_plays_are_memoised_per_schedule_times_and_sync():
    clear_play_cache()
    s = build_schedule("1F1B", 4, 8)
    r1 = simulate_pipeline(s, {"F": 1.0, "B": 2.0, "W": 0.0}, 0.1)
    r2 = simulate_pipeline(s, {"F": 1.0, "B": 2.0, "W": 0.0}, 0.1)
    r3 = simulate_pipeline(s, {"F": 1.0, "B": 2.0, "W": 0.0}, 0.1, p2p_sync=True)
    assert r1.timeline == r2.timeline and r1.timeline is not r2.timeline
    assert r1.step_time == r2.step_time and r3.step_time > r1.step_time
    # 1F1B without communication: (m + p - 1)(T_F + T_BW) = 11 * 3 (Narayanan et al. 2021)
    assert simulate_pipeline(s, {"F": 1.0, "B": 2.0, "W": 0.0}).step_time == pytest.approx(33.0)


def test_a_copy_with_other_meta_replays_from_the_memo(monkeypatch):
    """ZB-V's builder plays the order it returns (``zb_v`` compares it with the plain
    order), then returns ``with_meta`` of it: the step's play of that copy at the same
    times is the memoised one; another order of the same shape is played."""
    from simulator import pipeline_sim

    clear_schedule_cache()
    clear_play_cache()
    plays = []
    real = pipeline_sim._play
    monkeypatch.setattr(pipeline_sim, "_play", lambda *a: plays.append(1) or real(*a))
    times = {"F": 3.0, "B": 2.0, "W": 1.0}
    s = build_schedule("ZBVPP", 4, 8, 2, stage_times=times, comm_time=0.5)
    built = len(plays)  # the tuned and the plain order, each played once
    assert built == 2 and s.meta["cost_s"] > 0
    r = simulate_pipeline(s, times, 0.5)
    assert len(plays) == built and max(r.span) == pytest.approx(s.meta["cost_s"])
    simulate_pipeline(s.with_meta(note="copy"), times, 0.5)
    assert len(plays) == built
    other = build_schedule("ZBH1", 4, 8)
    simulate_pipeline(other, times, 0.5)
    assert len(plays) == built + 1


def test_fused_backward_read_off_the_registry():
    assert fused_backward("1F1B", 1) and fused_backward("VPP", 2) and fused_backward("FThenB", 1)
    assert not fused_backward("ZBH1", 1) and not fused_backward("ZB", 1) and not fused_backward("ZBVPP", 2)


def test_op_splicer_keeps_insert_order():
    prog = Program()
    x = Value(TensorType((2,), "float32"), "x")
    a = prog.append(Operation("pd_op.relu", [x], [Value(x.type, "a")], {}))
    b = prog.append(Operation("pd_op.relu", [a.results[0]], [Value(x.type, "b")], {}))
    ed = OpSplicer(prog)
    n1 = Operation("pd_op.relu", [x], [Value(x.type, "n1")], {})
    n2 = Operation("pd_op.relu", [x], [Value(x.type, "n2")], {})
    g1 = [Operation("pd_op.relu", [x], [Value(x.type, f"g1_{i}")], {}) for i in range(2)]
    g2 = [Operation("pd_op.relu", [x], [Value(x.type, "g2")], {})]
    ed.insert_before(b, n1)
    ed.insert_before(b, n2)
    ed.insert_after(a, g1)
    ed.insert_after(a, g2)
    ed.commit()
    names = [op.results[0].name for op in prog.ops]
    # list.insert(index(b)) twice, then list.insert(index(a) + 1) per group: newest group first
    assert names == ["a", "g2", "g1_0", "g1_1", "n1", "n2", "b"]
    assert (n1, 0) in x.uses and n1.program is prog
    ed = OpSplicer(prog)
    with pytest.raises(CompletionError, match="still has users"):
        ed.remove(a)
    ed.remove(b)
    ed.commit()
    assert "b" not in [op.results[0].name for op in prog.ops] and b.program is None
    assert all(o is not b for o, _ in a.results[0].uses)
