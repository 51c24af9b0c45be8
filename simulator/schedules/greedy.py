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
    """Per-rank action lists, and the largest per-rank span in slots, from the unit-time greedy described in the module docstring.

    An F may start on rank r while ``unb + 1 <= cap_unb[r]`` and
    ``unb + 1 + pending_w <= cap_live[r]`` (a pending W counted like a full activation).

    Raises ScheduleError if the caps admit no progress (e.g. a cap below 1)."""
    v = len(vstage[0])
    nvs = p * v
    f_done: dict[tuple[int, int], int] = {}  # (vstage, mb) -> finish slot
    b_done: dict[tuple[int, int], int] = {}
    next_f = [[0] * v for _ in range(p)]
    next_b = [[0] * v for _ in range(p)]
    pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
    unb = [0] * p
    live = [0] * p
    rows: list[list[Action]] = [[] for _ in range(p)]
    order = [sorted(range(v), key=lambda c, r=r: -vstage[r][c]) for r in range(p)]
    total, placed, t = 3 * nvs * m, 0, 0
    idle_slots = 0
    first_slot = [-1] * p
    end_slot = [0] * p
    while placed < total:
        progressed = False
        for r in range(p):
            f_ok = unb[r] < cap_unb[r] and live[r] + 1 <= cap_live[r]
            b = _ready_b(r, t, m, nvs, vstage, order[r], f_done, b_done, next_b)
            f = _ready_f(r, t, m, vstage, order[r], f_done, next_f) if f_ok else None
            act = b or f or (("W",) + pending_w[r].popleft() if pending_w[r] else None)
            if act is None:
                continue
            kind, c, mb = act
            if first_slot[r] < 0:
                first_slot[r] = t
            end_slot[r] = t + 1
            vs = vstage[r][c]
            rows[r].append(Action(kind, r, mb, c))
            if kind == "F":
                f_done[(vs, mb)] = t + 1
                next_f[r][c] += 1
                unb[r] += 1
                live[r] += 1
            elif kind == "B":
                b_done[(vs, mb)] = t + 1
                next_b[r][c] += 1
                unb[r] -= 1
                pending_w[r].append((c, mb))
            else:
                live[r] -= 1
            placed += 1
            progressed = True
        t += 1
        idle_slots = 0 if progressed else idle_slots + 1
        if idle_slots > 2:
            raise ScheduleError(f"greedy order: no progress at slot {t} (caps {cap_unb}, {cap_live})")
    return rows, max(e - f for e, f in zip(end_slot, first_slot, strict=True))


def _ready_b(r, t, m, nvs, vstage, order, f_done, b_done, next_b):
    for c in order:
        mb, vs = next_b[r][c], vstage[r][c]
        if mb < m and f_done.get((vs, mb), t + 1) <= t:
            if vs == nvs - 1 or b_done.get((vs + 1, mb), t + 1) <= t:
                return ("B", c, mb)
    return None


def _ready_f(r, t, m, vstage, order, f_done, next_f):
    for c in order:
        mb, vs = next_f[r][c], vstage[r][c]
        if mb < m and (vs == 0 or f_done.get((vs - 1, mb), t + 1) <= t):
            return ("F", c, mb)
    return None
