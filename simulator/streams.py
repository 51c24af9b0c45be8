"""A rank's compute stream beside a communication stream: how long a collective and the
compute it overlaps take together.

A framework that overlaps a collective with compute (Megatron-Core's tensor-parallel
backward: the input-gradient all_reduce beside the weight-gradient GEMM; FSDP: the next
block's all_gather beside the current block) issues the collective on its own CUDA stream
while the compute stream runs the window's kernels. The two are not free of each other: a
collective kernel holds some SMs while it runs (NCCL runs one thread block per channel;
fidelity_notes.md "Collectives": overlap is never free), so a GEMM launched beside it runs
on the remaining SMs (``Roofline.kernel_time(k, sms=...)``: more waves), and its kernels
return to full speed once the collective is done.

The model is a two-stream fluid simulation: the collective starts with the first window
task; each window task runs at its contended duration while the collective is in flight
and at its full-speed duration after it; the pair ends when both streams are done. With an
empty window the collective is exposed (its whole time is on the critical path).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.errors import SimulatorError


@dataclass(frozen=True)
class Kernel:
    """One compute kernel of a window: ``seconds`` alone, ``contended`` seconds when it
    runs entirely beside a collective (>= ``seconds``)."""

    seconds: float
    contended: float

    def __post_init__(self) -> None:
        if not (self.seconds >= 0 and self.contended >= self.seconds):
            raise SimulatorError(f"kernel times need 0 <= seconds <= contended, got "
                             f"{self.seconds}, {self.contended}")


def overlapped_time(comm: float, window: Sequence[Kernel]) -> float:
    """Seconds until a collective of ``comm`` seconds and the compute ``window`` it overlaps
    are both done (module docstring).

    While the collective runs, kernel i progresses at ``1 / contended_i`` of its work per
    second; once the collective ends it finishes at full speed: a kernel with a fraction
    ``f`` of its work left takes ``f * seconds_i`` more. If the window ends first the
    collective's remainder is exposed. Exact for this fluid model; e.g. one GEMM of 1 s
    (1.25 s contended) beside a 0.5 s all_reduce: 0.5 s at 40% progress, then 0.6 s: 1.1 s.

    Raises ValueError for a negative collective time."""
    if comm < 0:
        raise SimulatorError(f"collective time must be >= 0 s, got {comm}")
    t, left = 0.0, comm
    for k in window:
        if left <= 0.0:
            t += k.seconds
            continue
        if k.contended <= left:  # the whole kernel runs beside the collective
            t += k.contended
            left -= k.contended
            continue
        done = left / k.contended if k.contended > 0 else 1.0
        t += left + (1.0 - done) * k.seconds
        left = 0.0
    return t + max(0.0, left)


def exposed_time(comm: float, window: Sequence[Kernel]) -> float:
    """Seconds the pair adds beyond the window alone at full speed: ``overlapped_time -
    sum(seconds)`` (the collective's exposed part plus the window's contention)."""
    return overlapped_time(comm, window) - sum(k.seconds for k in window)


def prefetched_chain(compute: Sequence[Kernel], gathers: Sequence[float], depth: int,
                     reduces: Sequence[float] | None = None) -> float:
    """Seconds of a chain of blocks whose parameters are all_gathered before they run
    (FSDP / ZeRO-3), with the gathers prefetched ``depth`` blocks ahead on one
    communication stream and, optionally, each block's gradients reduce_scattered on the
    same stream after it (FSDP's backward).

    Gather 0 is issued at time 0; gather j >= 1 when block ``j - depth`` starts (at 0 if
    that is < 0), or, with ``depth`` 0 (no prefetch), when block j-1 ends. Reduce i is
    issued when block i ends. The stream runs its items one after another in issue order.
    Block i starts when block i-1 has ended and gather i is done; while the stream is busy
    it runs beside the collectives in flight (:func:`overlapped_time` with the stream's
    remaining busy time). The chain ends when the last block and every reduce are done
    (FSDP waits for its reduce_scatters at the end of backward). Seconds, in execution
    order. E.g. three 1 s blocks with 0.5 s gathers: 3.5 s prefetched (only the first
    gather exposed), 4.5 s without prefetch.

    Raises ValueError when the lists differ in length or ``depth`` < 0."""
    n = len(compute)
    if len(gathers) != n or (reduces is not None and len(reduces) != n) or depth < 0:
        raise SimulatorError(f"prefetched_chain: {n} blocks need {n} gathers (and reduces) and "
                         f"depth >= 0; got {len(gathers)} gathers, depth {depth}")
    queue: list[tuple[float, int, str, int, float]] = []
    order = itertools.count()
    done: dict[tuple[str, int], float] = {}
    comm_free = 0.0

    def push(at: float, kind: str, idx: int, dur: float) -> None:
        heapq.heappush(queue, (at, next(order), kind, idx, dur))

    def run(until: float | None = None, item: tuple[str, int] | None = None) -> None:
        """Run queued items issued by ``until`` (or until ``item`` is done)."""
        nonlocal comm_free
        while queue and (item is not None and item not in done or
                         item is None and queue[0][0] <= (until or 0.0)):
            at, _, kind, idx, dur = heapq.heappop(queue)
            comm_free = max(comm_free, at) + dur
            done[(kind, idx)] = comm_free

    if n == 0:
        return 0.0
    push(0.0, "g", 0, gathers[0])
    if depth >= 1:
        for j in range(1, min(depth, n)):
            push(0.0, "g", j, gathers[j])
    comp_free = 0.0
    for i, k in enumerate(compute):
        run(item=("g", i))
        start = max(comp_free, done[("g", i)])
        if depth >= 1 and i + depth < n:
            push(start, "g", i + depth, gathers[i + depth])
        run(until=start)
        busy = max(0.0, comm_free - start)
        comp_free = start + overlapped_time(busy, [k]) - max(0.0, busy - k.contended)
        if depth == 0 and i + 1 < n:
            push(comp_free, "g", i + 1, gathers[i + 1])
        if reduces is not None:
            push(comp_free, "r", i, reduces[i])
    run(until=float("inf"))
    return max(comp_free, comm_free) if reduces is not None else comp_free
