"""``DualPipeV``: DeepSeek's DualPipe cut in half -- a V of two chunks per rank whose steady
state pairs one micro-batch's forward with another's backward.

Sources: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437, sec. 3.2.1,
Table 2: bubble (PP/2 - 1)(F&B + B - 3W)); the public schedule, deepseek-ai/DualPipe at
3da1bbe ``dualpipe/dualpipev.py`` ``DualPipeV.step`` (the "cut-in-half" of Sea AI Lab),
whose README gives DualPipeV the same bubble with PP the number of stages (2 per device).
Rank r of p holds virtual stages r (chunk 0) and 2p - 1 - r (chunk 1), as ZB-V
(``simulator.schedules.base.v_shape_vstages``): a micro-batch runs chunk 0 down the ranks
and chunk 1 back up, its loss on rank 0. The step of rank r, re-derived from
``DualPipeV.step`` (F_c: a forward of chunk c, the next micro-batch of that chunk; B_c a
full backward (BW), B'_c a backward for inputs whose weight gradient W is deferred, W the
oldest deferred one; F_a&B_b the overlapped pair, here its forward then its backward):

1. 2 (p - r - 1) x F_0;
2. (r + 1) x [F_0, F_1];
3. (p - r - 1) x [B'_1, W, F_1];
4. (m - 2p + r + 1) x [F_0&B_1, F_1&B_0] (rank p-1's first F_0&B_1 not overlapped upstream,
   the same order here);
5. (p - r - 1) x [B_1, F_1&B_0];
6. (r + 1) x [B_1, B_0], their second half B' (on odd ranks from the chunk-1 backward of
   the middle pair, on even ranks from its chunk-0 backward);
7. (p - r - 1) x [W, B'_0];
8. (r + 1) x W.

It needs m >= 2p micro-batches (``DualPipeV.step``'s assertion). Each F&B pair is a unit
(``Schedule.pairs``): it starts once both passes' inputs are there and takes both passes'
time, F&B = F + B (the engine runs one pass at a time; what DualPipe overlaps inside a pair
is one micro-batch's expert-parallel all-to-all with the other's compute, which the step
model takes from the framework profile: ``overlap.moe_a2a``, :mod:`simulator.profiles`).
With equal chunk passes (F = T_B = T_W) every rank's bubble is then (p - 1)(F&B + B - 3W),
the report's Table 2 with PP = 2p stages (B the full backward, T_B + T_W):
tests/simulator/test_dualpipe.py derives it by hand.
"""

from __future__ import annotations

from collections import deque

from simulator.errors import ScheduleError
from simulator.schedules.base import (
    Action,
    Schedule,
    make_schedule,
    register_schedule,
    v_shape_vstages,
)


class _Rank:
    """The action list of one rank as ``DualPipeV.step`` issues it: per chunk the next
    forward and backward micro-batch, and the FIFO of deferred weight gradients."""

    def __init__(self, r: int) -> None:
        self.r = r
        self.f = [0, 0]
        self.b = [0, 0]
        self.deferred: deque[tuple[int, int]] = deque()
        self.row: list[Action] = []
        self.pairs: set[int] = set()

    def fwd(self, c: int) -> None:
        self.row.append(Action("F", self.r, self.f[c], c))
        self.f[c] += 1

    def bwd(self, c: int, zb: bool = False) -> None:
        mb = self.b[c]
        self.b[c] += 1
        if zb:
            self.row.append(Action("B", self.r, mb, c))
            self.deferred.append((c, mb))
        else:
            self.row.append(Action("BW", self.r, mb, c))

    def pair(self, c0: int, c1: int) -> None:
        """F&B: a forward of chunk ``c0`` overlapped with a full backward of chunk ``c1``."""
        self.pairs.add(len(self.row))
        self.fwd(c0)
        self.bwd(c1)

    def weight(self) -> None:
        c, mb = self.deferred.popleft()
        self.row.append(Action("W", self.r, mb, c))


def _rank_actions(r: int, p: int, m: int) -> tuple[list[Action], frozenset[int]]:
    """Rank ``r``'s actions, steps 1-8 of the module docstring, and the indices of its F&B
    pairs (``Schedule.pairs``)."""
    k = _Rank(r)
    for _ in range(2 * (p - r - 1)):
        k.fwd(0)
    for _ in range(r + 1):
        k.fwd(0)
        k.fwd(1)
    for _ in range(p - r - 1):
        k.bwd(1, zb=True)
        k.weight()
        k.fwd(1)
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:  # DualPipeV: "we don't overlap these two chunks"
            k.fwd(0)
            k.bwd(1)
        else:
            k.pair(0, 1)
        k.pair(1, 0)
    for _ in range(p - r - 1):
        k.bwd(1)
        k.pair(1, 0)
    zb = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        k.bwd(1, zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        k.bwd(0, zb)
    for _ in range(p - r - 1):
        k.weight()
        k.bwd(0, zb=True)
    for _ in range(r + 1):
        k.weight()
    if k.deferred or k.f != [m, m] or k.b != [m, m]:
        raise ScheduleError(f"DualPipeV: rank {r} ends with passes left (p={p}, m={m})")
    return k.row, frozenset(k.pairs)


@register_schedule("DualPipeV")
def build_dualpipev(p: int, m: int, v: int = 2) -> Schedule:
    """The DualPipeV schedule of ``p`` ranks (2p virtual stages in a V) and ``m``
    micro-batches (module docstring). Raises ScheduleError unless v = 2 and m >= 2p."""
    if v != 2:
        raise ScheduleError(f"DualPipeV: num_chunks must be 2 (a V of two chunks per rank), got {v}")
    if m < 2 * p:
        raise ScheduleError(f"DualPipeV: needs at least 2 x pp = {2 * p} micro-batches (DualPipe's "
                            f"DualPipeV.step asserts it), got {m}")
    rows, pairs = zip(*(_rank_actions(r, p, m) for r in range(p)), strict=True)
    return make_schedule("DualPipeV", p, m, 2, list(rows), v_shape_vstages(p), tuple(pairs))
