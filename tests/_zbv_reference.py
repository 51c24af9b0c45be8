"""The ZB-V construction (``simulator.schedules.zbv``) as it was before its speed-ups of
issue 18 (commit 07ab042), kept verbatim as the reference the optimised builder must
equal: same per-rank order, per-rank bubbles and chosen switches (tests/completion/test_sched_fastpaths.py).
Not used by the package."""

from __future__ import annotations

from collections import deque

from simulator.schedules.base import Action, ScheduleError

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

    def source(self, r: int, kind: int, c: int) -> int:
        """Index in ``end`` of the cross-rank pass feeding rank r's next (kind, c) pass;
        -1 if it has none (rank 0's chunk-0 F and chunk-1 B, rank p-1's turn of the V)."""
        q = r - 1 if kind == c else r + 1  # F chunk 0 and B chunk 1 come from rank r-1
        if not 0 <= q < self.p:
            return -1
        slot = 2 * kind + c
        return (slot * self.p + q) * self.m + self.count[slot][r]

    def arrival(self, r: int, kind: int, c: int) -> int | None:
        """When rank r's next (kind, c) pass has its cross-rank input (None: none/unplaced)."""
        src = self.source(r, kind, c)
        end = -1 if src < 0 else self.end[src]
        return None if end < 0 else end + self.comm

    def placed(self, r: int, kind: int, c: int) -> bool:
        src = self.source(r, kind, c)
        return src < 0 or self.end[src] >= 0

    def _key(self, kind: int, c: int, r: int, i: int) -> int:
        return ((2 * kind + c) * self.p + r) * self.m + i

    def _local_input_placed(self, r: int, kind: int, c: int, i: int) -> bool:
        """Same-rank inputs: the V's turn (F chunk 1 / B chunk 0 on rank p-1 after chunk 0's
        F / chunk 1's B), the loss (B chunk 1 on rank 0 after its F), every B after its F."""
        last = r == self.p - 1
        if kind == _F:
            return c == 0 or not last or self.end[self._key(_F, 0, r, i)] >= 0
        if self.end[self._key(_F, c, r, i)] < 0:
            return False
        return c == 1 or not last or self.end[self._key(_B, 1, r, i)] >= 0

    def put(self, r: int, kind: int, c: int, i: int | None = None) -> None:
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
            if src_end < 0 or not self._local_input_placed(r, kind, c, i):
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
        return [[Action("FBW"[k], r, i, c) for k, i, c in row] for r, row in enumerate(self.rows)]

    def put_w(self, r: int) -> None:
        if not self.pending[r]:
            raise ScheduleError(f"ZBVPP: rank {r} has no W left to free memory (p={self.p}, m={self.m})")
        c, i = self.pending[r].popleft()
        self.put(r, _W, c, i)

    def fill(self, r: int, arrival: int | None, partial: bool) -> None:
        """Run pending W passes in the gap before ``arrival`` (rule 2 of the module doc)."""
        if arrival is None or not self.pending[r]:
            return
        tw = self.dur[_W]
        while self.pending[r] and arrival >= self.free[r] + tw:
            self.put_w(r)
        slack = max(self.max_idle, self.max_allowance - self.allowance[r]) - self.idle[r]
        if partial and self.pending[r] and arrival - self.free[r] > slack:
            self.put_w(r)


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


def _b_chunk(s: _VPlan, r: int) -> int:
    if s.n(_B, 0, r) >= s.n(_B, 1, r):
        return 1
    return 0 if s.n(_B, 1, r) >= s.m or s.placed(r, _B, 0) else 1


def _f_chunk(s: _VPlan, r: int) -> int | None:
    nf0, nf1 = s.n(_F, 0, r), s.n(_F, 1, r)
    if nf1 >= s.m:
        return None
    if nf1 >= nf0:
        return 0
    if s.placed(r, _F, 1):
        return 1
    return 0 if nf0 < s.m and s.placed(r, _F, 0) else None


def _round(s: _VPlan, fill_b: bool, fill_f: bool) -> None:
    chunks = [_b_chunk(s, r) for r in range(s.p)]
    order = [r for r in range(s.p - 1, -1, -1) if chunks[r] == 0] + [r for r in range(s.p) if chunks[r] == 1]
    for r in order:
        c = chunks[r]
        if s.n(_B, c, r) >= s.m:
            raise ScheduleError(f"ZBVPP: rank {r} ran out of chunk-{c} backwards (p={s.p}, m={s.m})")
        s.fill(r, s.arrival(r, _B, c), c == 0 or fill_b)
        s.put(r, _B, c)
    for r in range(s.p):
        c = _f_chunk(s, r)
        if c is None:
            continue
        while s.mem[r] + _MEM[_F] > s.budget:
            s.put_w(r)
        s.fill(r, s.arrival(r, _F, c), fill_f)
        s.put(r, _F, c)


def zbv_plan(p: int, m: int, times: tuple[int, int, int], comm: int, fill_b: bool, fill_f: bool,
             allowance: list[int] | None = None) -> _VPlan:
    """One run of the ZB-V heuristic (module docstring); ``times`` are per-chunk (T_F, T_B,
    T_W) ns, ``comm`` T_comm ns. The result has ``actions()`` (per-rank actions) and ``idle``
    (per-rank bubble, ns). Raises ScheduleError if the construction gets stuck."""
    s = _VPlan(p, m, times, comm, allowance)
    _warmup(s)
    for _ in range(2 * m):
        _round(s, fill_b, fill_f)
    for r in range(p):
        while s.pending[r]:
            s.put_w(r)
    return s


def _search(p: int, m: int, times: tuple[int, int, int], comm: int) -> tuple[_VPlan, tuple[bool, bool]]:
    best: tuple[_VPlan, tuple[bool, bool]] | None = None
    for switches in ((True, True), (True, False), (False, True), (False, False)):
        allowance = None
        for _ in range(_MAX_RERUNS):
            plan = zbv_plan(p, m, times, comm, *switches, allowance)
            if best is None or plan.max_idle < best[0].max_idle:
                best = (plan, switches)
            if best[0].max_idle == 0 or (allowance is not None and plan.max_idle >= max(allowance)):
                break
            allowance = plan.idle
        if best[0].max_idle == 0:
            break
    return best
