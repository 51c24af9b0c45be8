"""``ZBVPP``: the ZB-V schedule (two chunks per rank in a V), built by a time-aware heuristic.

Source: Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241, sec. 6,
Fig. 8): rank i holds virtual stages i (chunk 0) and 2p-1-i (chunk 1), so a micro-batch
starts and ends on rank 0; with T_F = T_B = T_W the bubble is zero and every rank peaks at
p*M_B. The construction follows the behaviour of the public ZB-V scheduler
(sail-sg/zero-bubble-pipeline-parallelism, ``zerobubble/scheduler/zbv.py``), re-derived:
passes are placed in order with their ASAP start times (T_comm added on every cross-rank
input; the turn of the V on rank p-1 and the loss on rank 0 stay on one rank):

1. Warm-up: chunk-0 forward of micro-batch 0 on every rank; then from the last rank up,
   rank r (and every rank above it) runs more chunk-0 forwards while they end before the
   chunk-1 forward of micro-batch 0 comes back from rank r+1, keeping memory for the V
   below (2 + 2r forwards reserved); then its chunk-1 forward. Ranks are then topped up
   with alternating chunk-0/chunk-1 forwards so each holds at least as many as the one above.
2. 2m rounds; in each every rank runs one B (the chunk-0 B once its input was placed,
   otherwise the chunk-1 B; chunk-0 ranks bottom-up first, then chunk-1 ranks top-down)
   and then one F (chunk 1 if its input was placed, else chunk 0). Before a pass whose
   input arrives later, pending W passes fill the gap while a whole W fits; if a shorter
   gap remains, one more W goes in when idling would push the rank's bubble above the
   worst rank's (switches ``fill_b``/``fill_f``). W passes also run when an F needs memory.
3. Leftover W passes at the end. Each (fill_b, fill_f) run is repeated with the previous
   run's per-rank bubbles as allowance while that lowers the worst bubble; the order with
   the smallest cost (largest per-rank span) is kept, searching stops at zero bubble.

Memory: a chunk F holds M_B/2 (2 units), its B frees half of that and its W the rest
(M_W = M_B/2 per stage); the cap is 2p chunk forwards (4p units) = p*M_B per rank
(formulas.md).

Point-to-point order (issue 16 item 4): a rank below the top runs the extra chunk-0
forwards of rule 1 while the rank above already consumes a chunk-1 gradient from it, so
for p >= 2 and m >= 3 some rank's sends to its upper neighbour, in its own action order,
differ from the order that neighbour consumes them. No order avoids it at this bubble and
memory (an exhaustive search at p = 2, m = 4 and p = 3, m = 6 finds no zero-bubble V at
p*M_B whose sends follow the receiver's order), so the schedule is kept and the sender
holds the activation back until the gradient before it has gone
(``simulator.schedules.p2p.send_plan``; at most one message per rank on every p <= 16,
m <= 64), which costs no time; ``Schedule.validate`` checks that every pair then matches.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Mapping

from simulator.schedules.base import (
    Action,
    Schedule,
    ScheduleError,
    make_schedule,
    register_schedule,
    times_ns,
    v_shape_vstages,
)

_F, _B, _W = 0, 1, 2  # pass kinds; slot ``2 * kind + chunk`` indexes the counters
_MEM = (2, -1, -1)
_MAX_RERUNS = 8


class _VPlan:
    """State of one ZB-V construction; times in integer ns, memory in units (F = 2).

    ``end[((2 * kind + c) * p + r) * m + i]`` is the end time of F/B (kind 0/1) of chunk c,
    micro-batch i on rank r, -1 while unplaced."""

    def __init__(self, p: int, m: int, times: tuple[int, int, int], comm: int, allowance: list[int] | None):
        self.p, self.m, self.comm, self.budget = p, m, comm, 4 * p
        self.dur = times
        self.count = [[0] * p for _ in range(6)]
        self.end = [-1] * (4 * p * m)
        self.free, self.idle, self.mem = [0] * p, [0] * p, [0] * p
        self.max_idle = 0
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.rows: list[list[tuple[int, int, int]]] = [[] for _ in range(p)]  # (kind, mb, chunk)
        self.allowance = allowance or [0] * p
        self.max_allowance = max(self.allowance)

    def n(self, kind: int, c: int, r: int) -> int:
        return self.count[2 * kind + c][r]

    def _key(self, kind: int, c: int, r: int, i: int) -> int:
        return ((2 * kind + c) * self.p + r) * self.m + i

    def put(self, r: int, kind: int, c: int, i: int | None = None) -> None:
        """Place rank r's next (kind, c) pass (a W: the given micro-batch ``i``) at the
        earliest time its stream is free and its input has arrived. Raises ScheduleError
        when its input is not placed yet."""
        slot = 2 * kind + c
        counts = self.count[slot]
        i = counts[r] if i is None else i
        free = start = self.free[r]
        p, m = self.p, self.m
        end = self.end
        if kind != _W:
            q = r - 1 if kind == c else r + 1  # source(): F chunk 0 and B chunk 1 from r - 1
            src = (slot * p + q) * m + counts[r] if 0 <= q < p else -1
            src_end = end[src] if src >= 0 else 0
            if src_end < 0 or not (  # _local_input_placed, inlined
                    (c == 0 or r != p - 1 or end[r * m + i] >= 0) if kind == _F else
                    (end[(c * p + r) * m + i] >= 0
                     and (c == 1 or r != p - 1 or end[(3 * p + r) * m + i] >= 0))):
                raise ScheduleError(f"ZBVPP: {'FBW'[kind]}{i} chunk {c} on rank {r} placed before its input")
            if src >= 0 and src_end + self.comm > start:
                start = src_end + self.comm
            end[(slot * p + r) * m + i] = start + self.dur[kind]
        if start > free and self.count[0][r]:
            idle = self.idle[r] = self.idle[r] + start - free
            if idle > self.max_idle:
                self.max_idle = idle
        self.free[r] = start + self.dur[kind]
        self.mem[r] += _MEM[kind]
        counts[r] += 1
        self.rows[r].append((kind, i, c))
        if kind == _B:
            self.pending[r].append((c, i))

    def actions(self) -> list[list[Action]]:
        """The per-rank passes placed so far, as Actions."""
        new = tuple.__new__  # Action(...) without the NamedTuple constructor's call
        return [[new(Action, ("FBW"[k], r, i, c)) for k, i, c in row] for r, row in enumerate(self.rows)]

    def put_w(self, r: int) -> None:
        """Run rank r's oldest pending W (it needs no input, so it starts when the stream is
        free and adds no idle time). Raises ScheduleError when none is pending."""
        pending = self.pending[r]
        if not pending:
            raise ScheduleError(f"ZBVPP: rank {r} has no W left to free memory (p={self.p}, m={self.m})")
        c, i = pending.popleft()
        self.count[4 + c][r] += 1
        self.free[r] += self.dur[_W]
        self.mem[r] -= 1  # _MEM[_W]
        self.rows[r].append((_W, i, c))


def _warmup(s: _VPlan) -> None:
    p, m, tf = s.p, s.m, s.dur[_F]
    for r in range(p):
        s.put(r, _F, 0)
    for r in range(p - 1, -1, -1):
        if r < p - 1:
            due = s.end[s._key(_F, 1, r + 1, 0)] + s.comm
            while (s.mem[r] + _MEM[_F] * (2 + 2 * r) <= s.budget and s.free[r] + tf <= due
                   and s.n(_F, 0, r) < m):
                for q in range(r + 1):
                    s.put(q, _F, 0)
        s.put(r, _F, 1)
    chunk = 0
    for r in range(1, p):
        def total(q: int) -> int:
            return s.n(_F, 0, q) + s.n(_F, 1, q)

        while total(r) < total(r - 1) or s.n(_F, 1, r) <= s.n(_F, 1, r - 1) < m:
            for q in range(p - 1, r - 1, -1):
                if s.n(_F, chunk, q) < m:
                    s.put(q, _F, chunk)
            chunk = 1 - chunk


def _round(s: _VPlan, fill_b: bool, fill_f: bool) -> None:
    """One round of rule 2: a B on every rank (:func:`_b_passes`), then an F
    (:func:`_f_passes`). :meth:`_VPlan.put` and ``put_w`` are inlined there with the state
    in locals (this loop is most of a ZB-V build: 2m rounds of 2p passes per run, up to 32
    runs per build); the construction as it was before that is ``tests/_zbv_reference.py``,
    which it must equal. Layout of ``end``: slot ``2 * kind + chunk``, then rank, then
    micro-batch."""
    _b_passes(s, fill_b)
    _f_passes(s, fill_f)


def _fill(s: _VPlan, r: int, arrival: int, partial: bool) -> None:
    """Rank r's pending W passes into the gap before a pass whose input arrives at
    ``arrival`` (ns): each W that fits whole; with ``partial``, one more when idling would
    push the rank's bubble above the worst rank's (module docstring, rule 2).
    ``_VPlan.put_w`` inlined."""
    pend, free, count, rows, tw = s.pending[r], s.free, s.count, s.rows[r], s.dur[_W]
    while pend and arrival >= free[r] + tw:
        c, i = pend.popleft()
        count[4 + c][r] += 1
        free[r] += tw
        s.mem[r] -= 1
        rows.append((_W, i, c))
    if partial and pend:
        if arrival - free[r] > max(s.max_idle, s.max_allowance - s.allowance[r]) - s.idle[r]:
            c, i = pend.popleft()
            count[4 + c][r] += 1
            free[r] += tw
            s.mem[r] -= 1
            rows.append((_W, i, c))


def _b_passes(s: _VPlan, fill_b: bool) -> None:
    """The B half of a round. Chunk: 1 while the rank has run as many chunk-0 as chunk-1
    backwards, or while the chunk-0 input (from rank r + 1) is not placed and chunk-1
    backwards remain; else 0. Chunk-0 ranks go bottom-up first, then chunk-1 ranks
    top-down; pending W fill the gap before each. Raises ScheduleError when a rank has no
    backward left or one's input is not placed."""
    p, m, comm, end = s.p, s.m, s.comm, s.end
    nb0, nb1, nf0 = s.count[2], s.count[3], s.count[0]
    free, idle, mem, rows, pending = s.free, s.idle, s.mem, s.rows, s.pending
    tb = s.dur[_B]
    pm, last = p * m, p - 1
    bbase = (2 * pm, 3 * pm)  # end[] base of B of chunk 0, 1
    chunks = []
    for r in range(p):
        if nb0[r] >= nb1[r] or (nb1[r] < m and r < last and end[bbase[0] + (r + 1) * m + nb0[r]] < 0):
            chunks.append(1)
        else:
            chunks.append(0)
    order = [r for r in range(last, -1, -1) if chunks[r] == 0] + [r for r in range(p) if chunks[r] == 1]
    for r in order:
        c = chunks[r]
        cnt = nb1 if c else nb0
        i = cnt[r]
        if i >= m:
            raise ScheduleError(f"ZBVPP: rank {r} ran out of chunk-{c} backwards (p={p}, m={m})")
        if c == 0:  # input: B chunk 0 of rank r + 1 (none on the last rank: the V's turn)
            e = end[bbase[0] + (r + 1) * m + i] if r < last else -1
            if r < last and e < 0:
                raise ScheduleError(f"ZBVPP: B{i} chunk 0 on rank {r} placed before its input")
            if e >= 0 and pending[r]:
                _fill(s, r, e + comm, True)
            ok = end[r * m + i] >= 0 and (r != last or end[bbase[1] + r * m + i] >= 0)
        else:  # input: B chunk 1 of rank r - 1 (none on rank 0: the loss)
            e = end[bbase[1] + (r - 1) * m + i] if r > 0 else -1
            if r > 0 and e < 0:
                raise ScheduleError(f"ZBVPP: B{i} chunk 1 on rank {r} placed before its input")
            if e >= 0 and pending[r]:
                _fill(s, r, e + comm, fill_b)
            ok = end[pm + r * m + i] >= 0  # F chunk 1 of this micro-batch
        if not ok:
            raise ScheduleError(f"ZBVPP: B{i} chunk {c} on rank {r} placed before its input")
        start = fr = free[r]  # _VPlan.put from here
        if e >= 0 and e + comm > start:
            start = e + comm
        end[bbase[c] + r * m + i] = free[r] = start + tb
        if start > fr and nf0[r]:
            idle[r] += start - fr
            if idle[r] > s.max_idle:
                s.max_idle = idle[r]
        rows[r].append((_B, i, c))
        mem[r] -= 1
        cnt[r] = i + 1
        pending[r].append((c, i))


def _f_passes(s: _VPlan, fill_f: bool) -> None:
    """The F half of a round. Chunk: none once all chunk-1 forwards ran; 0 while chunk 1
    has caught up with chunk 0; 1 when its input (from rank r + 1; the last rank's own
    chunk-0 F) is placed; else 0 when chunk-0 forwards remain and their input is placed;
    else no F this round. W passes run first while the F would exceed the memory cap, and
    fill the gap before it. Raises ScheduleError when an input is not placed."""
    p, m, comm, end = s.p, s.m, s.comm, s.end
    nf0, nf1 = s.count[0], s.count[1]
    free, idle, mem, rows, pending = s.free, s.idle, s.mem, s.rows, s.pending
    tf = s.dur[_F]
    pm, last = p * m, p - 1
    fbase = (0, pm)  # end[] base of F of chunk 0, 1
    budget = s.budget - _MEM[_F]
    for r in range(p):
        n0, n1 = nf0[r], nf1[r]
        if n1 >= m:
            continue
        if n1 >= n0:
            c = 0
        elif r == last or end[fbase[1] + (r + 1) * m + n1] >= 0:
            c = 1
        elif n0 < m and (r == 0 or end[(r - 1) * m + n0] >= 0):
            c = 0
        else:
            continue
        while mem[r] > budget:
            s.put_w(r)
        if c == 0:  # input: F chunk 0 of rank r - 1 (none on rank 0)
            i = n0
            e = end[(r - 1) * m + i] if r > 0 else -1
            if r > 0 and e < 0:
                raise ScheduleError(f"ZBVPP: F{i} chunk 0 on rank {r} placed before its input")
            ok = True
        else:  # input: F chunk 1 of rank r + 1 (none on the last rank: its own chunk-0 F)
            i = n1
            e = end[fbase[1] + (r + 1) * m + i] if r < last else -1
            if r < last and e < 0:
                raise ScheduleError(f"ZBVPP: F{i} chunk 1 on rank {r} placed before its input")
            ok = r != last or end[r * m + i] >= 0
        if e >= 0 and pending[r]:
            _fill(s, r, e + comm, fill_f)
        if not ok:
            raise ScheduleError(f"ZBVPP: F{i} chunk {c} on rank {r} placed before its input")
        start = fr = free[r]  # _VPlan.put from here
        if e >= 0 and e + comm > start:
            start = e + comm
        end[fbase[c] + r * m + i] = free[r] = start + tf
        if start > fr and nf0[r]:
            idle[r] += start - fr
            if idle[r] > s.max_idle:
                s.max_idle = idle[r]
        rows[r].append((_F, i, c))
        mem[r] += _MEM[_F]
        (nf1 if c else nf0)[r] = i + 1


def zbv_plan(p: int, m: int, times: tuple[int, int, int], comm: int, fill_b: bool, fill_f: bool,
             allowance: list[int] | None = None, stop: int | None = None) -> _VPlan | None:
    """One run of the ZB-V heuristic (module docstring); ``times`` are per-chunk (T_F, T_B,
    T_W) ns, ``comm`` T_comm ns. The result has ``actions()`` (per-rank actions) and ``idle``
    (per-rank bubble, ns). With ``stop``, None as soon as the worst bubble reaches ``stop``
    (it never shrinks: a rank's idle time only grows). Raises ScheduleError if the
    construction gets stuck."""
    s = _VPlan(p, m, times, comm, allowance)
    _warmup(s)
    for _ in range(2 * m):
        _round(s, fill_b, fill_f)
        if stop is not None and s.max_idle >= stop:
            return None
    for r in range(p):
        while s.pending[r]:
            s.put_w(r)
    return s


def _search(p: int, m: int, times: tuple[int, int, int], comm: int) -> tuple[_VPlan, tuple[bool, bool]]:
    """The best run (smallest worst bubble, the first on ties) over the four switch settings,
    each re-run with the previous run's bubbles as allowance while that lowers its worst
    bubble (at most ``_MAX_RERUNS``); stops at zero bubble.

    A re-run is abandoned once its worst bubble reaches both the best so far and the
    allowance's worst: from then on it can neither be chosen nor lead to another re-run
    (the loop would stop after it), so the choice is that of running it to the end
    (tests/completion/test_sched_fastpaths.py compares with the unabandoned search). A first run of a
    setting is never abandoned: its bubbles are the next run's allowance."""
    best: tuple[_VPlan, tuple[bool, bool]] | None = None
    for switches in ((True, True), (True, False), (False, True), (False, False)):
        allowance = None
        for _ in range(_MAX_RERUNS):
            stop = None if allowance is None else max(best[0].max_idle, max(allowance))
            plan = zbv_plan(p, m, times, comm, *switches, allowance, stop)
            if plan is None:
                break
            if best is None or plan.max_idle < best[0].max_idle:
                best = (plan, switches)
            if best[0].max_idle == 0 or (allowance is not None and plan.max_idle >= max(allowance)):
                break
            allowance = plan.idle
        if best[0].max_idle == 0:
            break
    return best


def _cost_s(sched: Schedule, stage_times: Mapping[str, float], comm_time: float) -> float:
    """Largest per-rank span (s) of ``sched`` played by the SimPy engine."""
    from simulator.pipeline_sim import simulate_pipeline

    return max(simulate_pipeline(sched, stage_times, comm_time).span)


@functools.lru_cache(maxsize=64)
def _plain(p: int, m: int) -> tuple[Schedule, tuple[bool, bool]]:
    """The order tuned for equal times and no T_comm (it depends on p and m only), as a
    validated schedule, and its switches: built once per (p, m)."""
    plan, switches = _search(p, m, (1, 1, 1), 0)
    return make_schedule("ZBVPP", p, m, 2, plan.actions(), v_shape_vstages(p)), switches


@register_schedule("ZBVPP")
def zb_v(p: int, m: int, v: int = 2, stage_times: Mapping[str, float] | None = None,
         comm_time: float = 0.0) -> Schedule:
    """ZB-V (module docstring). ``stage_times`` ``{"F","B","W"}`` are per-stage seconds (each
    chunk takes half; default all equal) and ``comm_time`` T_comm seconds: the order is
    tuned for them, and the order tuned for equal times is kept instead when the engine
    finds it shorter. Any m >= 1 is legal; zero bubble when T_F = T_B = T_W, T_comm = 0
    and m >= 2p; peak p*M_B per rank. ``meta``: ``tuned`` (whether the times were used),
    the switches, and ``cost_s`` (largest per-rank span, s, for the given or unit times).
    Raises ScheduleError when num_chunks != 2 or the times are invalid."""
    if v != 2:
        raise ScheduleError(f"ZBVPP: num_chunks must be 2 (a V of two chunks per rank), got {v}")
    times, comm = times_ns("ZBVPP", stage_times, comm_time)
    # A chunk takes half the stage time; every decision compares sums of durations, so
    # doubling T_comm instead keeps integer ns exact (the plan's times are twice the chunk's).
    plan, switches = _search(p, m, times, 2 * comm)
    cost = max(plan.free[r] - (plan.end[plan._key(_F, 0, r, 0)] - times[_F]) for r in range(p)) * 0.5e-9
    tuned = stage_times is not None and (comm > 0 or len(set(times)) > 1)
    sched = make_schedule("ZBVPP", p, m, 2, plan.actions(), v_shape_vstages(p))
    if tuned:
        cost = _cost_s(sched, stage_times, comm_time)
        plain, plain_switches = _plain(p, m)
        plain_cost = _cost_s(plain, stage_times, comm_time)
        if plain_cost < cost:
            sched, switches, cost, tuned = plain, plain_switches, plain_cost, False
    return sched.with_meta(cost_s=cost, tuned=tuned, fill_b=switches[0], fill_f=switches[1])
