"""The ZB automatic-schedule heuristic (``simulator.schedules.zb_auto``) as it was before
its speed-ups of issue 18 (commit 07ab042), kept verbatim as the reference the optimised
builder must equal (tests/completion/test_sched_fastpaths.py). Not used by the package."""

from __future__ import annotations

import itertools

from simulator.schedules.base import Action, ScheduleError

_F, _B, _W = 0, 1, 2  # pass kinds (index of the counters); "FBW"[kind] is the name
_MEM = (2, -1, -1)  # memory units per pass (F, B, W); M_B = 2 units


class _Plan:
    """Per-stage state of the schedule being built; times in integer ns. Passes are
    recorded as ``kind * m + micro-batch`` ints; :meth:`actions` turns them into Actions."""

    def __init__(self, p: int, m: int, times: tuple[int, int, int], comm: int, budget: int):
        self.p, self.m, self.comm, self.budget = p, m, comm, budget
        self.dur = times
        self.count = [[0] * p for _ in range(3)]
        self.free = [0] * p  # time the stage's compute stream is next free
        self.idle = [0] * p  # idle time after the stage's first F
        self.mem = [0] * p
        self.end = [[[0] * m for _ in range(p)] for _ in range(2)]  # F and B end times
        self.rows: list[list[int]] = [[] for _ in range(p)]

    def arrival(self, r: int, kind: int) -> int:
        """Time the input of stage r's next ``kind`` pass is available (F or B)."""
        i = self.count[kind][r]
        if kind == _F:
            return 0 if r == 0 else self.end[_F][r - 1][i] + self.comm
        return self.end[_F][r][i] if r == self.p - 1 else self.end[_B][r + 1][i] + self.comm

    def pending_w(self, r: int) -> int:
        return self.count[_B][r] - self.count[_W][r]

    def put(self, r: int, kind: int) -> None:
        cnt = self.count[kind]
        i = cnt[r]
        free = self.free[r]
        start = free if kind == _W else max(free, self.arrival(r, kind))
        if self.count[_F][r]:
            self.idle[r] += start - free
        self.free[r] = end = start + self.dur[kind]
        if kind != _W:
            self.end[kind][r][i] = end
        self.mem[r] += _MEM[kind]
        cnt[r] = i + 1
        self.rows[r].append(kind * self.m + i)

    def fill_before(self, r: int, arrival: int, greedy: bool) -> None:
        """Run pending W passes in the gap before ``arrival`` (rule 2 of the module doc)."""
        tw = self.dur[_W]
        while self.pending_w(r) and self.free[r] + tw <= arrival:
            self.put(r, _W)
        if self.pending_w(r) and self.free[r] < arrival:
            if greedy or arrival - self.free[r] > max(self.idle) - self.idle[r]:
                self.put(r, _W)

    def cost(self) -> int:
        return max(self.free[r] - (self.end[_F][r][0] - self.dur[_F]) for r in range(self.p))

    def final_cost_bound(self) -> int:
        """A lower bound on :meth:`cost` once every pass is placed: each stage's stream is
        free no earlier than now plus the durations of its passes still to run (every pass
        starts no earlier than the stream is free), and the first F's start is fixed."""
        m, (tf, tb, tw) = self.m, self.dur
        cf, cb, cw = self.count
        return max(self.free[r] + (m - cf[r]) * tf + (m - cb[r]) * tb + (m - cw[r]) * tw
                   - (self.end[_F][r][0] - tf) for r in range(self.p))

    def actions(self) -> list[list[Action]]:
        m = self.m
        return [[Action("FBW"[code // m], r, code % m) for code in row] for r, row in enumerate(self.rows)]


def _warmup(s: _Plan, gap_ok: bool) -> None:
    p, m, tf = s.p, s.m, s.dur[_F]
    for r in range(p):
        s.put(r, _F)
    extra = [0] * p
    b_back = s.end[_F][p - 1][0] + s.dur[_B]  # when B_0 of stage r+1 ends (estimate)
    for r in range(p - 2, -1, -1):
        t, mem, due = s.free[r], s.mem[r], b_back + s.comm
        while 1 + extra[r] < m and mem + _MEM[_F] <= s.budget and (t + tf <= due if gap_ok else t < due):
            t, mem, extra[r] = t + tf, mem + _MEM[_F], extra[r] + 1
        b_back = max(t, due) + s.dur[_B]
    for r in range(1, p):
        while 0 < extra[r] and extra[r] >= extra[r - 1] and 1 + extra[r] < m:
            extra[r] -= 1
    for r in range(p):
        for _ in range(extra[r]):
            s.put(r, _F)
    for r in range(p - 1, -1, -1):
        s.put(r, _B)


def _wants_f(s: _Plan, r: int, prio_b: bool) -> bool:
    if s.count[_F][r] >= s.m:
        return False
    if not prio_b or r + 1 >= s.p or s.count[_F][r] < s.count[_F][r + 1] + 2:
        return True
    tf, tb, tw = s.dur
    next_b = s.free[r + 1] + tf + tb + s.comm
    if s.free[r] >= next_b:
        return False
    need_w = max(0, min(s.pending_w(r), s.mem[r] + _MEM[_F] - s.budget))
    if s.free[r] + tf + need_w * tw <= next_b:
        return True
    return next_b - s.free[r] > max(s.idle) - s.idle[r]


def _round(s: _Plan, prio_b: bool, greedy: bool) -> None:
    p = s.p
    want = [_wants_f(s, r, prio_b) for r in range(p)]
    for r in range(p - 2, -1, -1):
        want[r] = want[r] and want[r + 1]
    for r in (r for r in range(p) if want[r]):
        while s.mem[r] + _MEM[_F] > s.budget:
            if not s.pending_w(r):
                raise ScheduleError(f"ZB: memory limit {s.budget / 2} M_B leaves stage {r} no room for an F")
            s.put(r, _W)
        if r > 0:
            s.fill_before(r, s.arrival(r, _F), greedy)
        s.put(r, _F)
    for r in range(p - 1, -1, -1):
        if r < p - 1:
            s.fill_before(r, s.arrival(r, _B), greedy)
        if r == 0 and s.count[_F][0] == s.m:
            while s.pending_w(0):
                s.put(0, _W)
        s.put(r, _B)


def _run(p: int, m: int, times: tuple[int, int, int], comm: int, budget: int, gap_ok: bool,
         prio_b: bool, greedy: bool, beat: int | None = None) -> _Plan | None:
    """One run; None as soon as its final cost can no longer get below ``beat``."""
    if budget < _MEM[_F]:
        raise ScheduleError(f"ZB: memory limit {budget / 2} M_B is below one micro-batch")
    s = _Plan(p, m, times, comm, budget)
    _warmup(s, gap_ok)
    for _ in range(1, m):
        _round(s, prio_b, greedy)
        if beat is not None and s.final_cost_bound() >= beat:
            return None
    for r in range(p):
        while s.pending_w(r):
            s.put(r, _W)
    return s


def zb_heuristic(p: int, m: int, times: tuple[int, int, int], comm: int, budget: int,
                 gap_ok: bool, prio_b: bool, greedy: bool) -> tuple[list[list[Action]], int]:
    """One run of the heuristic (module docstring) with the three switches; returns the
    per-stage action lists and their cost (largest per-stage span, ns). ``times`` are
    (T_F, T_B, T_W) ns, ``comm`` T_comm ns, ``budget`` the limit in units (M_B = 2 units).
    Raises ScheduleError if ``budget`` < 2 (no room for one micro-batch)."""
    s = _run(p, m, times, comm, budget, gap_ok, prio_b, greedy)
    assert s is not None  # never abandoned without ``beat``
    return s.actions(), s.cost()


def _best(p: int, m: int, times: tuple[int, int, int], comm: int, budget: int
          ) -> tuple[_Plan, int, tuple[bool, bool, bool]]:
    """The run of smallest cost over the eight switch settings, the first one on ties (in
    ``itertools.product`` order). A run is abandoned as soon as its cost cannot get below
    the best so far (:meth:`_Plan.final_cost_bound` is a lower bound on its final cost), so
    the choice is exactly that of running all eight to the end."""
    best: tuple[_Plan, int, tuple[bool, bool, bool]] | None = None
    for switches in itertools.product((True, False), repeat=3):
        s = _run(p, m, times, comm, budget, *switches, beat=None if best is None else best[1])
        if s is None:
            continue
        cost = s.cost()
        if best is None or cost < best[1]:
            best = (s, cost, switches)
    return best
