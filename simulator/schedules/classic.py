"""GPipe (FThenB), 1F1B and Megatron's interleaved 1F1B (VPP), with fused backward (BW).

Sources: Huang et al. 2019 (GPipe); Narayanan et al. 2021 (Megatron-LM, 1F1B and the
interleaved schedule; warm-up counts as in Megatron's
``forward_backward_pipelining_with/without_interleaving``, see formulas.md).
The backward is one fused ``BW`` action (T_B + T_W), as those schedules run it.
"""

from __future__ import annotations

from simulator.schedules.base import (
    Action,
    Schedule,
    ScheduleError,
    interleaved_vstages,
    make_schedule,
    register_schedule,
    require_single_chunk,
)

_MULTI_CHUNK_HINT = " (use VPP or ZBVPP)"


@register_schedule("FThenB")
def fthenb(p: int, m: int, v: int = 1) -> Schedule:
    """GPipe: every rank runs all m forwards, then all m fused backwards (micro-batch order).
    No communication: step (m + p - 1)(T_F + T_B + T_W). Any m >= 1 is legal."""
    require_single_chunk("FThenB", v, _MULTI_CHUNK_HINT)
    rows = [[Action("F", r, i) for i in range(m)] + [Action("BW", r, i) for i in range(m)] for r in range(p)]
    return make_schedule("FThenB", p, m, 1, rows, interleaved_vstages(p, 1))


def one_f_one_b_rows(p: int, m: int) -> list[list[Action]]:
    """Megatron 1F1B order: rank r runs min(p-r-1, m) warm-up forwards, then (F, BW) pairs,
    then the remaining backwards. Works for any m >= 1 (m < p included)."""
    new = tuple.__new__  # Action(...) without the NamedTuple constructor's call
    rows = []
    for r in range(p):
        warm = min(p - r - 1, m)
        row = [new(Action, ("F", r, i, 0)) for i in range(warm)]
        for i in range(m - warm):
            row.append(new(Action, ("F", r, warm + i, 0)))
            row.append(new(Action, ("BW", r, i, 0)))
        row += [new(Action, ("BW", r, i, 0)) for i in range(m - warm, m)]
        rows.append(row)
    return rows


@register_schedule("1F1B")
def one_f_one_b(p: int, m: int, v: int = 1) -> Schedule:
    """1F1B (PipeDream-flush / Megatron non-interleaved). Step (m+p-1)(T_F+T_B+T_W) without
    communication; peak activations min(p - r, m) micro-batches on rank r."""
    require_single_chunk("1F1B", v, _MULTI_CHUNK_HINT)
    return make_schedule("1F1B", p, m, 1, one_f_one_b_rows(p, m), interleaved_vstages(p, 1))


def _vpp_slot(k: int, p: int, v: int, backward: bool) -> tuple[int, int]:
    """Megatron's mapping of the k-th forward/backward on a rank to (micro-batch, chunk):
    micro-batches go in groups of p through chunk 0, 1, ..., v-1 (backward: v-1 ... 0)."""
    chunk = (k // p) % v
    if backward:
        chunk = v - 1 - chunk
    return (k // (p * v)) * p + k % p, chunk


@register_schedule("VPP")
def interleaved(p: int, m: int, v: int = 2) -> Schedule:
    """Megatron interleaved 1F1B with v chunks per rank (chunk k of rank r = virtual stage
    k*p + r). Warm-up forwards on rank r: min(m*v, 2(p-r-1) + (v-1)p). Requires m to be a
    multiple of p (Megatron's constraint). v = 1 is plain 1F1B. Without communication the
    bubble is (p-1)(T_F+T_B+T_W)/v (Narayanan et al. 2021, sec. 2.2.2), T_* per stage.

    p = 2 is legal here (case 11): the engine matches each transfer by (virtual stage,
    micro-batch), not by peer, so "previous" and "next" being the same rank is harmless."""
    if v == 1:
        s = one_f_one_b(p, m)
        return Schedule("VPP", p, m, 1, s.actions, s.vstage)
    if m % p:
        raise ScheduleError(f"VPP: num_microbatches ({m}) must be a multiple of num_stages ({p})")
    total = m * v
    rows = []
    for r in range(p):
        warm = min(total, 2 * (p - r - 1) + (v - 1) * p)
        row = []
        for k in range(warm):
            mb, c = _vpp_slot(k, p, v, False)
            row.append(Action("F", r, mb, c))
        for i in range(total - warm):
            mb, c = _vpp_slot(warm + i, p, v, False)
            row.append(Action("F", r, mb, c))
            mb, c = _vpp_slot(i, p, v, True)
            row.append(Action("BW", r, mb, c))
        for i in range(total - warm, total):
            mb, c = _vpp_slot(i, p, v, True)
            row.append(Action("BW", r, mb, c))
        rows.append(row)
    return make_schedule("VPP", p, m, v, rows, interleaved_vstages(p, v))
