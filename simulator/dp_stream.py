"""The data-parallel communication stream of each pipeline rank: gradient buckets reduced
as the backward produces them, played on SimPy after the pipeline.

Frameworks reduce gradients in buckets (Megatron-Core ``DistributedDataParallelConfig
.bucket_size``, PyTorch DDP's 25 MiB buckets, DeepSpeed's reduce_bucket_size). A chunk's
gradients are final after the backward of its last micro-batch; with the profile's
``overlap.dp_grad_reduce`` each bucket is issued as soon as the last backward action of its
chunk has produced it -- the backward runs the layers last to first, so bucket j of a chunk
(parameters in reverse layer order) is ready ``fraction_j`` of the way through that action
-- and the rank's dp stream reduces the buckets one after another, overlapping the compute
still running; without overlap every bucket is issued when the rank's last action ends
(Megatron-LM 2021: all_reduce after the backward). The stream's end is when the rank's
gradients are synchronised. The dp stream does not slow the compute beside it here (its
contention is charged to the tensor-parallel and FSDP collectives, which overlap GEMMs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import simpy

from simulator.errors import SimulatorError
from simulator.result import TimelineEvent

#: kinds of actions that finish a chunk's gradients (a W, or a fused BW; a B of a schedule
#: without W actions produces them too)
_BACKWARD = ("W", "BW", "B")


def last_backward(timeline: Iterable[TimelineEvent]) -> dict[tuple[int, int], TimelineEvent]:
    """(rank, chunk) -> the last action that produces the chunk's weight gradients (its last
    W or BW, else its last B), by end time."""
    best: dict[tuple[int, int], TimelineEvent] = {}
    rank_has_w: set[tuple[int, int]] = set()
    for e in timeline:
        if e.kind in ("W", "BW"):
            rank_has_w.add((e.rank, e.chunk))
    for e in timeline:
        key = (e.rank, e.chunk)
        if e.kind not in _BACKWARD or (e.kind == "B" and key in rank_has_w):
            continue
        if key not in best or e.end > best[key].end:
            best[key] = e
    return best


def grad_reduce_end(timeline: Sequence[TimelineEvent], num_ranks: int,
                    buckets: Mapping[tuple[int, int], Sequence[tuple[float, float]]],
                    overlap: bool) -> list[float]:
    """Per rank, the second its last gradient bucket is reduced (0 for a rank without
    buckets): the end of the last interval of :func:`grad_reduce_intervals`."""
    spans = grad_reduce_intervals(timeline, num_ranks, buckets, overlap)
    return [s[-1][1] * 1e-9 if s else 0.0 for s in spans]


def grad_reduce_intervals(timeline: Sequence[TimelineEvent], num_ranks: int,
                          buckets: Mapping[tuple[int, int], Sequence[tuple[float, float]]],
                          overlap: bool) -> list[list[tuple[int, int]]]:
    """Per rank, the (start, end) integer nanoseconds of each gradient bucket's collective
    on its dp stream, in the order the stream runs them (what the step's Chrome trace draws
    on the DP thread, ``simulator.step_trace``).

    Args:
        timeline: the played pipeline (integer ns events, ``SimResult.timeline``).
        buckets: (rank, chunk) -> [(fraction of the chunk's last backward action at which
            the bucket is ready, seconds of its collective)], in issue order.
        overlap: issue buckets during the backward (module docstring), else after the
            rank's last action.

    Raises ValueError for a fraction outside [0, 1] or a negative time."""
    env = simpy.Environment()
    spans: list[list[tuple[int, int]]] = [[] for _ in range(num_ranks)]
    last = last_backward(timeline)
    rank_end = [0] * num_ranks
    for e in timeline:
        rank_end[e.rank] = max(rank_end[e.rank], e.end)
    releases: list[list[tuple[int, int]]] = [[] for _ in range(num_ranks)]  # (release ns, ns)
    for (r, c), items in buckets.items():
        ev = last.get((r, c))
        for frac, sec in items:
            if not 0.0 <= frac <= 1.0 or sec < 0:
                raise SimulatorError(f"gradient bucket of rank {r} chunk {c}: fraction {frac} must "
                                 f"be in [0, 1] and seconds {sec} >= 0")
            if overlap and ev is not None:
                at = ev.start + round(frac * (ev.end - ev.start))
            else:
                at = rank_end[r]
            releases[r].append((at, round(sec * 1e9)))

    def stream(r: int, items: list[tuple[int, int]]):
        for at, dur in sorted(items):
            if at > env.now:
                yield env.timeout(at - env.now)
            start = env.now
            yield env.timeout(dur)
            spans[r].append((start, env.now))

    for r in range(num_ranks):
        if releases[r]:
            env.process(stream(r, releases[r]))
    env.run()
    return spans
