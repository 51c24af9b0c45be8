"""Closed forms, memory formulas and legality of the pipeline schedules.

Closed forms: formulas.md "Pipeline schedules" (Narayanan et al. 2021; Qi et al. 2024,
Table 2). Times are integer nanoseconds so equalities are exact."""

from __future__ import annotations

import pytest

from simulator import ScheduleError, build_schedule, simulate_pipeline

PS = (2, 4, 8, 16)


def _run(name, p, m, v, tf, tb, tw, comm=0, memory=None):
    s = build_schedule(name, p, m, v)
    return simulate_pipeline(s, {"F": tf * 1e-9, "B": tb * 1e-9, "W": tw * 1e-9}, comm * 1e-9, memory=memory)


def _bubble_ns(res, m, tf, tb, tw):
    return round(max(res.span) * 1e9) - m * (tf + tb + tw)


@pytest.mark.parametrize("name", ["FThenB", "1F1B"])
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("m", [1, 3, 8, 33])
def test_fthenb_1f1b_step_closed_form(name, p, m):
    # T_W = 0: fused BW takes T_B, step (m+p-1)(T_F+T_B); with T_W > 0 it is (m+p-1)(T_F+T_B+T_W)
    assert _run(name, p, m, 1, 1100, 2300, 0).step_time_ns == (m + p - 1) * 3400
    assert _run(name, p, m, 1, 1100, 2300, 700).step_time_ns == (m + p - 1) * 4100


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_vpp_bubble_closed_form(p, v, k):
    m, tf, tb = k * p, 120 * v, 240 * v  # per-stage times; each chunk takes 1/v
    res = _run("VPP", p, m, v, tf, tb, 0)
    assert res.step_time_ns == m * (tf + tb) + (p - 1) * (tf + tb) // v


TIMES = [(100, 100, 100), (100, 120, 80), (130, 110, 90), (185, 181, 93)]


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("t", TIMES)
def test_zbh1_bubble_closed_form(p, k, t):
    tf, tb, tw = t
    m = k * p
    assert _bubble_ns(_run("ZBH1", p, m, 1, tf, tb, tw), m, tf, tb, tw) == (p - 1) * (tf + tb - tw)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("t", TIMES)
def test_zbh2_bubble_closed_form(p, k, t):
    tf, tb, tw = t
    m = k * p  # m >= 2p
    assert _bubble_ns(_run("ZBH2", p, m, 1, tf, tb, tw), m, tf, tb, tw) == (p - 1) * (tf + tb - 2 * tw)


def _zbv_grid():
    """m >= 2p for every p in PS: the edges 2p, 2p+1, multiples, 64, and the (p, m) pairs
    where the earlier unit-time greedy kept one to three chunk passes of bubble."""
    for p in PS:
        for m in sorted({2 * p, 2 * p + 1, 3 * p - 1, 3 * p, 4 * p + 2, 64} | ({20, 24, 30, 54} if p == 8 else set())
                        | ({33, 43, 49, 52, 61} if p == 16 else set())):
            yield p, m


@pytest.mark.parametrize("p, m", list(_zbv_grid()))
def test_zbvpp_zero_bubble_equal_times(p, m):
    """ZB-V (Qi et al. 2024, sec. 6): T_F = T_B = T_W and m >= 2p -> bubble exactly 0 (every
    rank busy from its first pass to its last), and p*M_B on every rank (M_W = M_B/2)."""
    res = _run("ZBVPP", p, m, 2, 200, 200, 200, memory={"M_B": 1.0, "M_W": 0.5})
    assert _bubble_ns(res, m, 200, 200, 200) == 0
    assert res.bubble_ratio == 0.0
    assert [round(s * 1e9) for s in res.span] == [m * 600] * p
    assert res.peak_memory == [float(p)] * p


# The CLI example of issue 6 (Zero Bubble Table 9, 1.5B, m = 24 rounded; ms).
CLI_TIMES = {"F": 18.5e-3, "B": 18.1e-3, "W": 9.3e-3}


@pytest.mark.parametrize("comm", [0.0, 0.6e-3])
def test_zbvpp_with_unequal_times_and_comm(comm):
    """With T_W ~ T_F/2 and a real T_comm ZB-V cannot be bubble-free, but at ZB-H1's memory
    (p*M_B) it must still beat ZB-H1 and ZB-1p, and even ZB-H2 ((2p-1)M_B). Tuning the order
    to the times never loses against the order built for equal times."""
    p, m, mem = 8, 24, {"M_B": 1.0, "M_W": 0.5}
    plain = build_schedule("ZBVPP", p, m, 2)
    tuned = build_schedule("ZBVPP", p, m, 2, stage_times=CLI_TIMES, comm_time=comm)
    r_plain = simulate_pipeline(plain, CLI_TIMES, comm, memory=mem)
    r_tuned = simulate_pipeline(tuned, CLI_TIMES, comm, memory=mem)
    assert r_tuned.bubble_ratio <= r_plain.bubble_ratio < 0.08
    assert max(r_tuned.span) == pytest.approx(tuned.meta["cost_s"], abs=1e-9)
    assert r_tuned.peak_memory == r_plain.peak_memory == [float(p)] * p
    one_p = build_schedule("ZB", p, m, memory_limit=p, stage_times=CLI_TIMES, comm_time=comm)
    for other in (build_schedule("ZBH1", p, m), build_schedule("ZBH2", p, m), one_p):
        assert r_plain.bubble_ratio < simulate_pipeline(other, CLI_TIMES, comm).bubble_ratio


def test_time_aware_options_only_for_zb_and_zbvpp():
    with pytest.raises(ScheduleError, match="unexpected options"):
        build_schedule("ZBH1", 4, 8, stage_times=CLI_TIMES)
    with pytest.raises(ScheduleError, match="unexpected options"):
        build_schedule("ZBVPP", 4, 8, 2, foo=1)
    with pytest.raises(ScheduleError, match="comm_time >= 0"):
        build_schedule("ZBVPP", 4, 8, 2, stage_times=CLI_TIMES, comm_time=-1.0)
    with pytest.raises(ScheduleError, match="mapping with F, B, W"):
        build_schedule("ZB", 4, 8, stage_times={"F": 1.0})


MEM = {"M_B": 1.0, "M_W": 0.25}


@pytest.mark.parametrize("p", PS)
def test_peak_memory_formulas(p):
    m = 3 * p
    one = _run("1F1B", p, m, 1, 100, 150, 50, memory=MEM).peak_memory
    assert one == [float(p - r) for r in range(p)]  # 1F1B: min(p - r, m) M_B
    h1 = _run("ZBH1", p, m, 1, 100, 150, 50, memory=MEM).peak_memory
    assert h1 == [(p - i + 1) * 1.0 + (i - 1) * 0.25 for i in range(1, p + 1)]
    h2 = _run("ZBH2", p, m, 1, 100, 150, 50, memory=MEM).peak_memory
    assert h2 == [(2 * p - 2 * i + 1) * 1.0 + (2 * i - 2) * 0.25 for i in range(1, p + 1)]
    zbv = _run("ZBVPP", p, m, 2, 200, 200, 200, memory={"M_B": 1.0, "M_W": 0.5}).peak_memory
    assert zbv == [float(p)] * p  # ZB-V: p*M_B on every rank (M_W <= M_B/2)
    assert max(zbv) == p


def test_fthenb_memory_holds_all_microbatches():
    res = _run("FThenB", 4, 10, 1, 100, 100, 0, memory={"M_B": 2.0, "static": 5.0})
    assert res.peak_memory == [25.0] * 4 and res.max_peak_memory == 25.0


@pytest.mark.parametrize(
    "args, match",
    [
        (("VPP", 4, 6, 2), "multiple of num_stages"),
        (("ZBVPP", 4, 8, 3), "num_chunks must be 2"),
        (("1F1B", 4, 8, 2), "num_chunks must be 1"),
        (("1F1B", 4, 0), "num_microbatches must be a positive integer"),
        (("FThenB", 0, 4), "num_stages"),
        (("Nope", 4, 4), "unknown schedule"),
        (("ZB", 4, 8, 1, 0.5), "memory_limit must be >= 1"),
        (("1F1B", 4, 8, 1, 4), "memory_limit applies only"),
    ],
)
def test_illegal_combinations_raise(args, match):
    with pytest.raises(ScheduleError, match=match):
        build_schedule(*args)


def _legal_combinations(p):
    """Every legal (schedule, m, v) for ``p`` stages with m <= 64 and v <= 4: the
    single-chunk families at v = 1, ZBVPP at v = 2, VPP at v = 1..4 when p divides m."""
    for m in range(1, 65):
        for name in ("FThenB", "1F1B", "ZBH1", "ZBH2", "ZB"):
            yield name, m, 1
        yield "ZBVPP", m, 2
        if m % p == 0:
            for v in (1, 2, 3, 4):
                yield "VPP", m, v


@pytest.mark.parametrize("p", range(1, 17))
def test_sweep_every_legal_combination_runs_without_deadlock(p):
    """Issue 6: every legal (schedule, p <= 16, m <= 64, v <= 4) simulates to completion
    (unequal F/B/W times and a p2p delay; the time-aware ZB / ZBVPP builders get them):
    one timeline event per scheduled action, and a bubble ratio in [0, 1)."""
    tf, tb, tw, comm = 300e-9, 200e-9, 100e-9, 30e-9
    times = {"F": tf, "B": tb, "W": tw}
    count = 0
    for name, m, v in _legal_combinations(p):
        opts = {"stage_times": times, "comm_time": comm} if name in ("ZB", "ZBVPP") else {}
        sched = build_schedule(name, p, m, v, **opts)
        res = simulate_pipeline(sched, times, comm)
        assert len(res.timeline) == sum(len(r) for r in sched.actions), (name, p, m, v)
        assert 0.0 <= res.bubble_ratio < 1.0, (name, p, m, v)
        count += 1
    assert count == 64 * 6 + 4 * (64 // p)


@pytest.mark.parametrize("name, expected", [("1F1B", 8 * 250), ("FThenB", 8 * 250), ("ZBH1", 8 * 200 + 50), ("ZBH2", 8 * 200 + 50)])
def test_case10_fewer_microbatches_than_stages(name, expected):
    """cases.md case 10: p = 8, m = 1 must finish. With m <= p and no communication 1F1B
    takes (m+p-1)(T_F+T_B+T_W), ZB (m+p-1)(T_F+T_B) + T_W (formulas.md)."""
    assert _run(name, 8, 1, 1, 100, 100, 50).step_time_ns == expected


def test_case10_small_m_zb_closed_form():
    # formulas.md: ZB with m <= p takes (m+p-1)(T_F+T_B) + T_W
    for name in ("ZBH1", "ZBH2"):
        for m in (1, 3, 8):
            assert _run(name, 8, m, 1, 100, 120, 50).step_time_ns == (m + 7) * 220 + 50


@pytest.mark.parametrize("v", [2, 3, 4])
def test_case11_vpp_two_stages(v):
    """cases.md case 11: VPP with p = 2 (previous and next peer are the same rank) runs,
    with Megatron's bubble (p-1)(T_F+T_B)/v."""
    m = 6
    res = _run("VPP", 2, m, v, 120 * v, 240 * v, 0, comm=0)
    assert res.step_time_ns == m * 360 * v + 360 * v // v
    with_comm = _run("VPP", 2, m, v, 120 * v, 240 * v, 0, comm=10)
    assert with_comm.step_time_ns > res.step_time_ns
