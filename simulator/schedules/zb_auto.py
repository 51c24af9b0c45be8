"""``ZB``: the Zero Bubble paper's automatic (heuristic) scheduler under a memory limit.

Source: Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR), sec. 3.1, and the
behaviour of ``initial_solution``/``manual_order`` in the public repository
sail-sg/zero-bubble-pipeline-parallelism (``megatron/core/pipeline_parallel/auto_schedule.py``),
re-derived here. The scheduler plays the pipeline forward in time (each pass starts as
soon as its stage is free and its input has arrived, T_comm added on every cross-stage
input) and proceeds in rounds, one micro-batch per round:

1. Warm-up (round 0): every stage runs F_0; then, from the last stage backwards, stage r
   gets as many extra forwards as fit before B_0 comes back from stage r+1 (plus T_comm)
   within the memory limit -- so a larger T_comm gives a longer warm-up. Variant
   ``gap_ok``: an extra F is added only if it *ends* before B_0 arrives; otherwise while it
   *starts* before. The counts are then made strictly decreasing along the pipeline.
   Then B_0 runs on every stage, last to first.
2. Round i: every stage runs one F (if any is left) and then B_i, last stage first. Before
   a pass whose input is not there yet, pending W passes fill the gap while a W fits
   entirely; if a shorter gap remains, one more W goes in when leaving the gap idle would
   raise the stage's bubble above the worst stage's (or always, variant ``greedy``). W
   passes also run when an F needs memory. Variant ``prio_b``: a stage two or more
   forwards ahead of the next one skips its F when that F (plus the W it needs for
   memory) would delay the next B; a stage runs an F only if the next stage does too.
   Stage 0, once all its forwards are done, flushes its W passes before each B.
3. Leftover W passes run at the end.

The three switches (``gap_ok``, ``prio_b``, ``greedy``) are searched and the order with
the smallest cost is kept; cost is the paper's: the largest per-stage span (first F start
to last pass end), exactly what ``simulate_pipeline`` reports for the same inputs (stored
in ``Schedule.meta["cost_s"]``).

Memory is counted as in the paper's scheduler: F = +2 units, B = -1, W = -1 (M_B = 2
units, M_W = 1). ``memory_limit`` is in units of M_B per stage: ``p`` is ZB-1p (2p units),
``2p`` is ZB-2p (4p units, the default). With the 1.5B inputs of the paper's Table 9 this
reproduces its Table 5 ZB-1p and ZB-2p bubble rates (tests/test_engine.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from simulator.schedules.base import (
    Action,
    Schedule,
    ScheduleError,
    interleaved_vstages,
    make_schedule,
    register_schedule,
    require_single_chunk,
    times_ns,
)

_MEM = {"F": 2, "B": -1, "W": -1}


class _Plan:
    """Per-stage state of the schedule being built; times in integer ns."""

    def __init__(self, p: int, m: int, times: tuple[int, int, int], comm: int, budget: int):
        self.p, self.m, self.comm, self.budget = p, m, comm, budget
        self.dur = dict(zip("FBW", times, strict=True))
        self.count = {k: [0] * p for k in "FBW"}
        self.free = [0] * p  # time the stage's compute stream is next free
        self.idle = [0] * p  # idle time after the stage's first F
        self.mem = [0] * p
        self.end = {k: [[0] * m for _ in range(p)] for k in "FB"}
        self.rows: list[list[Action]] = [[] for _ in range(p)]

    def arrival(self, r: int, kind: str) -> int:
        """Time the input of stage r's next ``kind`` pass is available (F or B)."""
        i = self.count[kind][r]
        if kind == "F":
            return 0 if r == 0 else self.end["F"][r - 1][i] + self.comm
        return self.end["F"][r][i] if r == self.p - 1 else self.end["B"][r + 1][i] + self.comm

    def pending_w(self, r: int) -> int:
        return self.count["B"][r] - self.count["W"][r]

    def put(self, r: int, kind: str) -> None:
        i = self.count[kind][r]
        start = self.free[r] if kind == "W" else max(self.free[r], self.arrival(r, kind))
        if self.count["F"][r]:
            self.idle[r] += start - self.free[r]
        self.free[r] = start + self.dur[kind]
        if kind != "W":
            self.end[kind][r][i] = self.free[r]
        self.mem[r] += _MEM[kind]
        self.count[kind][r] += 1
        self.rows[r].append(Action(kind, r, i))

    def fill_before(self, r: int, arrival: int, greedy: bool) -> None:
        """Run pending W passes in the gap before ``arrival`` (rule 2 of the module doc)."""
        while self.pending_w(r) and self.free[r] + self.dur["W"] <= arrival:
            self.put(r, "W")
        if self.pending_w(r) and self.free[r] < arrival:
            if greedy or arrival - self.free[r] > max(self.idle) - self.idle[r]:
                self.put(r, "W")

    def cost(self) -> int:
        return max(self.free[r] - (self.end["F"][r][0] - self.dur["F"]) for r in range(self.p))


def _warmup(s: _Plan, gap_ok: bool) -> None:
    p, m, tf = s.p, s.m, s.dur["F"]
    for r in range(p):
        s.put(r, "F")
    extra = [0] * p
    b_back = s.end["F"][p - 1][0] + s.dur["B"]  # when B_0 of stage r+1 ends (estimate)
    for r in range(p - 2, -1, -1):
        t, mem, due = s.free[r], s.mem[r], b_back + s.comm
        while 1 + extra[r] < m and mem + _MEM["F"] <= s.budget and (t + tf <= due if gap_ok else t < due):
            t, mem, extra[r] = t + tf, mem + _MEM["F"], extra[r] + 1
        b_back = max(t, due) + s.dur["B"]
    for r in range(1, p):
        while 0 < extra[r] and extra[r] >= extra[r - 1] and 1 + extra[r] < m:
            extra[r] -= 1
    for r in range(p):
        for _ in range(extra[r]):
            s.put(r, "F")
    for r in range(p - 1, -1, -1):
        s.put(r, "B")


def _wants_f(s: _Plan, r: int, prio_b: bool) -> bool:
    if s.count["F"][r] >= s.m:
        return False
    if not prio_b or r + 1 >= s.p or s.count["F"][r] < s.count["F"][r + 1] + 2:
        return True
    next_b = s.free[r + 1] + s.dur["F"] + s.dur["B"] + s.comm
    if s.free[r] >= next_b:
        return False
    need_w = max(0, min(s.pending_w(r), s.mem[r] + _MEM["F"] - s.budget))
    if s.free[r] + s.dur["F"] + need_w * s.dur["W"] <= next_b:
        return True
    return next_b - s.free[r] > max(s.idle) - s.idle[r]


def _round(s: _Plan, prio_b: bool, greedy: bool) -> None:
    p = s.p
    want = [_wants_f(s, r, prio_b) for r in range(p)]
    for r in range(p - 2, -1, -1):
        want[r] = want[r] and want[r + 1]
    for r in (r for r in range(p) if want[r]):
        while s.mem[r] + _MEM["F"] > s.budget:
            if not s.pending_w(r):
                raise ScheduleError(f"ZB: memory limit {s.budget / 2} M_B leaves stage {r} no room for an F")
            s.put(r, "W")
        if r > 0:
            s.fill_before(r, s.arrival(r, "F"), greedy)
        s.put(r, "F")
    for r in range(p - 1, -1, -1):
        if r < p - 1:
            s.fill_before(r, s.arrival(r, "B"), greedy)
        if r == 0 and s.count["F"][0] == s.m:
            while s.pending_w(0):
                s.put(0, "W")
        s.put(r, "B")


def zb_heuristic(p: int, m: int, times: tuple[int, int, int], comm: int, budget: int,
                 gap_ok: bool, prio_b: bool, greedy: bool) -> tuple[list[list[Action]], int]:
    """One run of the heuristic (module docstring) with the three switches; returns the
    per-stage action lists and their cost (largest per-stage span, ns). ``times`` are
    (T_F, T_B, T_W) ns, ``comm`` T_comm ns, ``budget`` the limit in units (M_B = 2 units).
    Raises ScheduleError if ``budget`` < 2 (no room for one micro-batch)."""
    if budget < _MEM["F"]:
        raise ScheduleError(f"ZB: memory limit {budget / 2} M_B is below one micro-batch")
    s = _Plan(p, m, times, comm, budget)
    _warmup(s, gap_ok)
    for _ in range(1, m):
        _round(s, prio_b, greedy)
    for r in range(p):
        while s.pending_w(r):
            s.put(r, "W")
    return s.rows, s.cost()


@register_schedule("ZB")
def zb_auto(p: int, m: int, v: int = 1, memory_limit: float | None = None,
            stage_times: Mapping[str, float] | None = None, comm_time: float = 0.0) -> Schedule:
    """Automatic zero-bubble schedule (module docstring). ``memory_limit`` in M_B units
    (default 2p; must be >= 1, i.e. room for one micro-batch), ``stage_times`` the per-stage
    F/B/W seconds (default all equal), ``comm_time`` T_comm seconds. The chosen switches and
    the predicted cost (s) are in ``meta``. Raises ScheduleError on num_chunks != 1, a
    limit below one micro-batch, or bad times."""
    require_single_chunk("ZB", v)
    limit = 2 * p if memory_limit is None else memory_limit
    if not limit >= 1:
        raise ScheduleError(f"ZB: memory_limit must be >= 1 (M_B units), got {memory_limit!r}")
    times, comm = times_ns("ZB", stage_times, comm_time)
    best = None
    for switches in itertools.product((True, False), repeat=3):
        rows, cost = zb_heuristic(p, m, times, comm, int(2 * limit), *switches)
        if best is None or cost < best[1]:
            best = (rows, cost, switches)
    rows, cost, (gap_ok, prio_b, greedy) = best
    return make_schedule("ZB", p, m, 1, rows, interleaved_vstages(p, 1), memory_limit=limit,
                         cost_s=cost * 1e-9, gap_ok=gap_ok, prio_b=prio_b, greedy=greedy)
