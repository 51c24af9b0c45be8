"""Memory over the step, per pipeline rank, as the simulation plays it: a counter track of
the Chrome trace and a PNG, so a user sees when the peak happens and what it is made of.

The trace itself (a process per rank, a thread per stream) is ``simulator.step_trace``'s.

Each rank's curve is the activations it holds (``simulator.memory.timeline_activation_peaks``'s
rule: +M_B of (rank, chunk) at each F start, -(M_B - M_W) at a B end, -M_W at a W end, -M_B
at a fused BW end, frees first at equal times) on top of what it holds the whole step
(model states, FSDP / ZeRO-3 buffers, library workspace, CUDA context, NCCL buffers and the
allocator's fragmentation: the breakdown's lines other than ``activations`` and the
transients ``recompute``, ``loss_temporaries`` and ``op_workspace``, which last one op).
Times in nanoseconds (the timeline's), bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from simulator.memory import activation_changes, activation_delta

#: breakdown lines that last one op (drawn as the gap between the curve and the peak)
TRANSIENT_LINES = ("recompute", "loss_temporaries", "op_workspace")
GIB = 2**30


def activation_curves(timeline: Iterable[Any], num_ranks: int,
                      per_chunk: dict[tuple[int, int], tuple[float, float]]) -> list[list[tuple[int, float]]]:
    """Per rank, the activation bytes it holds after each instant with a change:
    [(time ns, bytes)], starting at time 0 (0 bytes, or the first forward's); its maximum
    is the rank's ``timeline_activation_peaks``. ``per_chunk[(rank, chunk)] = (M_B, M_W)`` bytes per
    micro-batch."""
    curves = []
    for ch in activation_changes(timeline, num_ranks, per_chunk):
        cur, pts = 0.0, [(0, 0.0)]
        for t, _, d in ch:
            cur += d
            if pts[-1][0] == int(t):  # changes at one instant: keep where they end (frees
                pts[-1] = (int(t), cur)  # come first, so that is the instant's maximum)
            else:
                pts.append((int(t), cur))
        curves.append(pts)
    return curves


def activation_ramps(timeline: Iterable[Any], num_ranks: int,
                     per_chunk: dict[tuple[int, int], tuple[float, float]]) -> list[list[tuple[int, float]]]:
    """Per rank, the activation bytes it holds drawn as they build up and drain: a point at
    the start and at the end of each action, linear in between (a forward saves its
    activations op by op, a backward frees them op by op). ``+M_B`` over an F, ``-(M_B -
    M_W)`` over a B, ``-M_W`` over a W, ``-M_B`` over a fused BW; flat between actions.
    [(time ns, bytes)] from (0, 0). A rank's actions run one after another on its compute
    stream, so every maximum of :func:`activation_curves` (which charges a forward at its
    start) is reached here at that forward's end: the two curves have the same peak, and
    a pp = 1 step, whose step curve sits at M_B throughout, shows each micro-batch's rise
    and fall."""
    acts: list[list[tuple[int, int, float]]] = [[] for _ in range(num_ranks)]
    for e in timeline:
        delta = activation_delta(e.kind, *per_chunk.get((e.rank, e.chunk), (0.0, 0.0)))
        acts[e.rank].append((int(e.start), int(e.end), delta))
    curves = []
    for rank_acts in acts:
        cur, pts = 0.0, [(0, 0.0)]
        for start, end, delta in sorted(rank_acts):
            if start > pts[-1][0]:
                pts.append((start, cur))
            cur += delta
            pts.append((end, cur))
        curves.append(pts)
    return curves


def static_bytes(memory: dict[str, int]) -> int:
    """Bytes a rank holds the whole step: its breakdown's total less the activations and
    the one-op transients (:data:`TRANSIENT_LINES`)."""
    return int(memory["total"] - memory.get("activations", 0)
               - sum(memory.get(k, 0) for k in TRANSIENT_LINES))


def counter_events(curves: list[list[tuple[int, float]]], per_rank: list[dict[str, int]]) -> list[dict]:
    """Chrome trace counter events ("ph": "C"): one track in each rank's process (pid R)
    named ``memory rank R (GiB)`` with two series, ``held`` (static bytes) and
    ``activations``, at every change; timestamps in microseconds."""
    events = []
    for r, pts in enumerate(curves):
        held = static_bytes(per_rank[r]) / GIB
        for t, b in pts:
            events.append({"name": f"memory rank {r} (GiB)", "ph": "C", "pid": r, "ts": t / 1e3,
                           "args": {"held": held, "activations": b / GIB}})
    return events


def plot(result: Any, path: str | Path) -> Path:
    """A PNG of each rank's memory over the step: the bytes held throughout plus its
    activations as they build up and drain (:func:`activation_ramps`), with its peak (the
    breakdown total with the one-op transients, dashed); ms on the x axis, GiB on the y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = activation_ramps(result.sim.timeline, len(result.memory_per_stage),
                              result.activation_per_chunk)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r, pts in enumerate(curves):
        held = static_bytes(result.memory_per_stage[r])
        xs = [t / 1e6 for t, _ in pts]
        ys = [(held + b) / GIB for _, b in pts]
        line = ax.plot(xs, ys, lw=1.0, label=f"rank {r}")[0]
        ax.axhline(result.memory_per_stage[r]["total"] / GIB, ls="--", lw=0.8,
                   color=line.get_color())
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_title("memory over the step (dashed: peak with one-op transients)")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
