"""Unit-time greedy list scheduler that derives the handcrafted zero-bubble orders.

ZB-H1 and ZB-H2 (Qi et al. 2024, sec. 2, Fig. 3, Table 2) are defined by their memory
budgets: on rank r (0-based) at most ``cap_unb[r]`` micro-batches
whose F ran but whose B did not, and at most ``cap_live[r]`` whose F ran but whose W did
not (each holds M_B before B, M_W after). Playing every pass at unit time (one slot per
F, B or W of a chunk, no communication) with the priority "B if ready, else F if ready and
within the caps, else the oldest pending W" yields the published orders:

* ZB-H1: cap_unb = p - r, cap_live = p -> worker i=r+1 holds (p-i+1)M_B + (i-1)M_W;
* ZB-H2: cap_unb = 2(p - r) - 1, cap_live = 2p - 1 -> (2p-2i+1)M_B + (2i-2)M_W.

With several chunks per rank the deeper virtual stage goes first (its pass frees memory
sooner). (ZB-V is not derived here: at unit time this greedy leaves a bubble for some
(p, m); ``zbv.py`` builds it time-aware.)
"""

from __future__ import annotations

from collections import deque

from simulator.schedules.base import Action, ScheduleError


def unit_greedy(
    p: int,
    m: int,
    vstage: tuple[tuple[int, ...], ...],
    cap_unb: list[int],
    cap_live: list[int],
) -> tuple[list[list[Action]], int]:
    """Per-rank action lists, and the largest per-rank span in slots, from the unit-time
    greedy described in the module docstring.

    ``vstage[r][c]`` is the virtual stage of chunk c on rank r (``base.interleaved_vstages``);
    ``cap_unb`` and ``cap_live`` have one entry per rank, in micro-batches. An F may start
    on rank r while ``unb + 1 <= cap_unb[r]`` and ``unb + 1 + pending_w <= cap_live[r]``
    (a pending W counted like a full activation).

    Raises ScheduleError if the caps admit no progress (e.g. a cap below 1)."""
    g = _Greedy(p, m, vstage, cap_unb, cap_live)
    total, placed, t, idle_slots = 3 * g.nvs * m, 0, 0, 0
    while placed < total:
        progressed = False
        for r in range(p):
            act = g.take(r, t)
            if act is None:
                continue
            g.place(r, t, act)
            placed += 1
            progressed = True
        t += 1
        idle_slots = 0 if progressed else idle_slots + 1
        if idle_slots > 2:
            raise ScheduleError(f"greedy order: no progress at slot {t} (caps {cap_unb}, {cap_live})")
    return g.rows, g.span()


class _Greedy:
    """State of the unit-time greedy: finish slots of F and B per (virtual stage,
    micro-batch), next micro-batch per (rank, chunk), pending W queues, the activation
    counters checked against the caps, and each rank's first and last busy slot."""

    def __init__(self, p: int, m: int, vstage: tuple[tuple[int, ...], ...],
                 cap_unb: list[int], cap_live: list[int]):
        v = len(vstage[0])
        self.m, self.nvs, self.vstage = m, p * v, vstage
        self.cap_unb, self.cap_live = cap_unb, cap_live
        self.f_done: dict[tuple[int, int], int] = {}  # (vstage, mb) -> finish slot
        self.b_done: dict[tuple[int, int], int] = {}
        self.next_f = [[0] * v for _ in range(p)]
        self.next_b = [[0] * v for _ in range(p)]
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.unb = [0] * p  # micro-batches whose F ran but whose B did not
        self.live = [0] * p  # micro-batches whose F ran but whose W did not
        self.rows: list[list[Action]] = [[] for _ in range(p)]
        # deeper virtual stage first (its pass frees memory sooner)
        self.order = [sorted(range(v), key=lambda c, r=r: -vstage[r][c]) for r in range(p)]
        self.first_slot = [-1] * p
        self.end_slot = [0] * p

    def take(self, r: int, t: int) -> tuple[str, int, int] | None:
        """The action rank r runs at slot t by the priority B, F (within the caps), oldest
        pending W (dequeued here); None when nothing is ready."""
        f_ok = self.unb[r] < self.cap_unb[r] and self.live[r] + 1 <= self.cap_live[r]
        b = self._ready_b(r, t)
        f = self._ready_f(r, t) if f_ok else None
        return b or f or (("W",) + self.pending_w[r].popleft() if self.pending_w[r] else None)

    def place(self, r: int, t: int, act: tuple[str, int, int]) -> None:
        """Record ``act = (kind, chunk, mb)`` on rank r in slot t (it finishes at t + 1)."""
        kind, c, mb = act
        if self.first_slot[r] < 0:
            self.first_slot[r] = t
        self.end_slot[r] = t + 1
        vs = self.vstage[r][c]
        self.rows[r].append(Action(kind, r, mb, c))
        if kind == "F":
            self.f_done[(vs, mb)] = t + 1
            self.next_f[r][c] += 1
            self.unb[r] += 1
            self.live[r] += 1
        elif kind == "B":
            self.b_done[(vs, mb)] = t + 1
            self.next_b[r][c] += 1
            self.unb[r] -= 1
            self.pending_w[r].append((c, mb))
        else:
            self.live[r] -= 1

    def span(self) -> int:
        """Largest per-rank span (last busy slot + 1 - first busy slot)."""
        return max(e - f for e, f in zip(self.end_slot, self.first_slot, strict=True))

    def _ready_b(self, r: int, t: int) -> tuple[str, int, int] | None:
        for c in self.order[r]:
            mb, vs = self.next_b[r][c], self.vstage[r][c]
            if mb < self.m and self.f_done.get((vs, mb), t + 1) <= t:
                if vs == self.nvs - 1 or self.b_done.get((vs + 1, mb), t + 1) <= t:
                    return ("B", c, mb)
        return None

    def _ready_f(self, r: int, t: int) -> tuple[str, int, int] | None:
        for c in self.order[r]:
            mb, vs = self.next_f[r][c], self.vstage[r][c]
            if mb < self.m and (vs == 0 or self.f_done.get((vs - 1, mb), t + 1) <= t):
                return ("F", c, mb)
        return None
