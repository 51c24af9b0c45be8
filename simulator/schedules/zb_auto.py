"""``ZB``: the Zero Bubble paper's automatic (heuristic) scheduler under a memory limit.

Source: Qi et al. 2024, sec. 3.1. The heuristic, as implemented here (time-aware list
scheduling, each rank deciding at the moment its compute stream is free):

1. Warm-up: schedule F passes as long as the memory limit allows, before the first B.
2. Afterwards a ready B always goes first (it is on the critical path), then a ready F
   within the memory limit; when neither is ready a pending W fills the gap if the gap is
   at least T_W, or (hyperparameter ``fill_small``) if the gap is unknown/shorter; when F
   is blocked by memory a W recycles memory.
3. Stage i never runs ahead of stage i-1's forwards (a dependency).
4. Leftover W passes run at the end.
The two hyperparameters (``fill_small``, and whether an F waits for a sooner B) are grid
searched and the order with the smallest cost (largest per-rank span) is kept.

Memory is counted as in the paper's scheduler: F = +2 units, B = -1, W = -1 (so M_B = 2
units, M_W = 1 unit). ``memory_limit`` is in units of M_B per rank: ``p`` is ZB-1p (2p
units), ``2p`` is ZB-2p (4p units, the default).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from simulator.schedules.base import (
    Action,
    Schedule,
    ScheduleError,
    interleaved_vstages,
    make_schedule,
    register_schedule,
)


def _times_ns(stage_times: Mapping[str, float] | None) -> tuple[int, int, int]:
    st = stage_times or {"F": 1.0, "B": 1.0, "W": 1.0}
    if not isinstance(st, Mapping) or not {"F", "B", "W"} <= set(st):
        raise ScheduleError(f"ZB: stage_times must be a mapping with F, B, W seconds, got {st!r}")
    vals = tuple(round(float(st[k]) * 1e9) for k in "FBW")
    if min(vals) <= 0:
        raise ScheduleError(f"ZB: stage times must be > 0, got {st!r}")
    return vals


def _heuristic(p: int, m: int, tf: int, tb: int, tw: int, comm: int, budget: int, fill_small: bool,
               wait_for_b: bool) -> list[list[Action]]:
    free = [0] * p
    f_end: dict[tuple[int, int], int] = {}
    b_end: dict[tuple[int, int], int] = {}
    nf, nb = [0] * p, [0] * p
    pend: list[deque[int]] = [deque() for _ in range(p)]
    mem = [0] * p
    rows: list[list[Action]] = [[] for _ in range(p)]
    left = [3 * m] * p
    while any(left):
        r = min((i for i in range(p) if left[i]), key=lambda i: (free[i], i))
        t = free[r]
        b_arr = _arrival(b_end, (r + 1, nb[r]), comm) if r < p - 1 else f_end.get((r, nb[r]))
        if nb[r] < nf[r] and b_arr is not None and b_arr <= t:
            _put(rows, r, "B", nb[r], t, tb, free, b_end, mem, -1, pend)
            nb[r] += 1
        else:
            f_arr = 0 if r == 0 else _arrival(f_end, (r - 1, nf[r]), comm)
            f_ok = nf[r] < m and mem[r] + 2 <= budget
            b_soon = wait_for_b and nb[r] < nf[r] and b_arr is not None and b_arr < t + tf
            if f_ok and f_arr is not None and f_arr <= t and not b_soon:
                _put(rows, r, "F", nf[r], t, tf, free, f_end, mem, 2, None)
                nf[r] += 1
            elif pend[r] and (_gap_ok(t, tw, b_arr, f_arr if f_ok else None, fill_small) or not f_ok):
                _put(rows, r, "W", pend[r].popleft(), t, tw, free, None, mem, -1, None)
            else:
                free[r] = _next_time(r, t, free, left, b_arr, f_arr if f_ok else None)
                continue
        left[r] -= 1
    return rows


def _arrival(ends: dict, key: tuple[int, int], comm: int) -> int | None:
    e = ends.get(key)
    return None if e is None else e + comm


def _gap_ok(t: int, tw: int, b_arr: int | None, f_arr: int | None, fill_small: bool) -> bool:
    known = [a for a in (b_arr, f_arr) if a is not None]
    if not known:
        return fill_small
    gap = min(known) - t
    return gap >= tw or (fill_small and gap > 0)


def _next_time(r, t, free, left, b_arr, f_arr) -> int:
    cands = [a for a in (b_arr, f_arr) if a is not None and a > t]
    cands += [free[i] for i in range(len(free)) if i != r and left[i] and free[i] > t]
    if not cands:
        others = [free[i] for i in range(len(free)) if i != r and left[i]]
        if others and min(others) == t:
            return t + 1  # let a rank at the same instant decide first
        raise ScheduleError(f"ZB: rank {r} cannot progress at t={t} ns (memory limit too small?)")
    return min(cands)


def _put(rows, r, kind, mb, t, dur, free, ends, mem, dmem, pend) -> None:
    rows[r].append(Action(kind, r, mb))
    free[r] = t + dur
    mem[r] += dmem
    if ends is not None:
        ends[(r, mb)] = t + dur
    if pend is not None:
        pend[r].append(mb)


@register_schedule("ZB")
def zb_auto(p: int, m: int, v: int = 1, memory_limit: float | None = None,
            stage_times: Mapping[str, float] | None = None, comm_time: float = 0.0) -> Schedule:
    """Automatic zero-bubble schedule (module docstring). ``memory_limit`` in M_B units
    (default 2p; must be >= 1, i.e. room for one micro-batch), ``stage_times`` the per-stage
    F/B/W seconds used to place W passes (default all equal), ``comm_time`` T_comm seconds.
    Raises ScheduleError on num_chunks != 1 or a limit below one micro-batch."""
    from simulator.engine import simulate_pipeline

    if v != 1:
        raise ScheduleError(f"ZB: num_chunks must be 1, got {v}")
    limit = 2 * p if memory_limit is None else memory_limit
    if not limit >= 1:
        raise ScheduleError(f"ZB: memory_limit must be >= 1 (M_B units), got {memory_limit!r}")
    tf, tb, tw = _times_ns(stage_times)
    comm = round(float(comm_time) * 1e9)
    budget = int(2 * limit)
    best, best_cost = None, None
    for fill_small in (True, False):
        for wait_for_b in (True, False):
            rows = _heuristic(p, m, tf, tb, tw, comm, budget, fill_small, wait_for_b)
            s = make_schedule("ZB", p, m, 1, rows, interleaved_vstages(p, 1), memory_limit=limit)
            st = {"F": tf * 1e-9, "B": tb * 1e-9, "W": tw * 1e-9}
            cost = max(simulate_pipeline(s, st, comm * 1e-9).span)
            if best_cost is None or cost < best_cost:
                best, best_cost = s, cost
    return best
