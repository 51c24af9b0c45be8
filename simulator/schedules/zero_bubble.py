"""Handcrafted zero-bubble schedules ZB-H1 and ZB-H2 (ZB-V, Paddle's ZBVPP: ``zbv.py``).

Source: Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR), sec. 2 and Table 2
(ZB-H1 bubble (p-1)(T_F+T_B-T_W), peak p*M_B; ZB-H2 bubble (p-1)(T_F+T_B-2T_W), peak
(2p-1)M_B).
Orders come from ``simulator.schedules.greedy.unit_greedy`` with each schedule's memory caps.
"""

from __future__ import annotations

from simulator.schedules.base import (
    Action,
    Schedule,
    interleaved_vstages,
    make_schedule,
    register_schedule,
    require_single_chunk,
)
from simulator.schedules.greedy import unit_greedy


@register_schedule("ZBH1")
def zb_h1(p: int, m: int, v: int = 1) -> Schedule:
    """ZB-H1 (Qi et al. 2024, Fig. 3 top): rank r runs min(p - r, m) warm-up forwards, then
    per micro-batch k: B_k, W_{k-r} (W lags r micro-batches), F_{next}; leftover W at the
    end. Worker i = r+1 holds (p-i+1)M_B + (i-1)M_W, 1F1B's peak. Any m >= 1."""
    require_single_chunk("ZBH1", v)
    rows = []
    for r in range(p):
        warm = min(p - r, m)
        row = [Action("F", r, i) for i in range(warm)]
        for k in range(m):
            row.append(Action("B", r, k))
            if k >= r:
                row.append(Action("W", r, k - r))
            if warm + k < m:
                row.append(Action("F", r, warm + k))
        row += [Action("W", r, i) for i in range(max(0, m - r), m)]
        rows.append(row)
    return make_schedule("ZBH1", p, m, 1, rows, interleaved_vstages(p, 1))


@register_schedule("ZBH2")
def zb_h2(p: int, m: int, v: int = 1) -> Schedule:
    """ZB-H2: extra warm-up forwards (worker i holds (2p-2i+1)M_B + (2i-2)M_W). Bubble
    (p-1)(T_F+T_B-2T_W) for m >= 2p; any m >= 1 runs."""
    require_single_chunk("ZBH2", v)
    rows, _ = unit_greedy(p, m, interleaved_vstages(p, 1), [2 * (p - r) - 1 for r in range(p)], [2 * p - 1] * p)
    return make_schedule("ZBH2", p, m, 1, rows, interleaved_vstages(p, 1))
