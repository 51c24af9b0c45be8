"""Result of a pipeline simulation: step time, bubble ratio, busy/idle, memory, timeline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from simulator.errors import SimulatorError

if TYPE_CHECKING:
    from simulator.schedules.base import Schedule

NS = 1e-9


class TimelineEvent(NamedTuple):
    """One executed action; ``start``/``end`` in integer nanoseconds."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    vstage: int
    start: int
    end: int


@dataclass
class SimResult:
    """Outcome of ``simulate_pipeline`` (seconds; memory in the unit of ``memory``).

    ``bubble_ratio`` follows Qi et al. 2024, sec. 5.3: (cost - ideal) / cost, where cost is
    the largest per-rank span (first action start to last action end, not the global
    makespan) and ideal the largest per-rank busy time (= m(T_F+T_B+T_W) for equal stages).
    ``step_time`` is the makespan from time 0 to the last action's end.
    """

    schedule_name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    step_time: float
    bubble_ratio: float
    busy_time: list[float]
    idle_time: list[float]
    span: list[float]
    peak_memory: list[float]
    timeline: list[TimelineEvent] = field(repr=False)

    @property
    def max_peak_memory(self) -> float:
        """Peak over ranks (never the mean)."""
        return max(self.peak_memory)

    @property
    def step_time_ns(self) -> int:
        """Makespan in integer nanoseconds: the last action's end (0 for an empty timeline)."""
        return max(e.end for e in self.timeline) if self.timeline else 0

    @classmethod
    def from_timeline(
        cls, schedule: Schedule, timeline: list[TimelineEvent], memory: Mapping[str, float] | None,
        stats: tuple[list[int], list[int], int] | None = None,
    ) -> SimResult:
        """Summarise an executed ``timeline`` (integer ns events, one per action) of
        ``schedule``: makespan, per-rank busy time (sum of action durations), idle time
        (makespan - busy), span (first start to last end), bubble ratio (class docstring, Qi et
        al. 2024 sec. 5.3) and per-rank peak memory (:func:`peak_memory`, in the unit of
        ``memory``). Times in the result are seconds. ``stats``: the per-rank busy and span
        ns when the caller already has them (the engine does: a rank's actions run one after
        another, so its span is its last end minus its first start). Raises ValueError on a
        bad ``memory`` mapping; ``timeline`` must not be empty."""
        p = schedule.num_stages
        per_rank: list[list[TimelineEvent]] = [[] for _ in range(p)]
        if stats is None or memory is not None:
            for e in timeline:
                per_rank[e.rank].append(e)
        if stats is None:
            busy = [sum(e.end - e.start for e in evs) for evs in per_rank]
            span = [max(e.end for e in evs) - min(e.start for e in evs) if evs else 0 for evs in per_rank]
            makespan = max(e.end for e in timeline)
        else:
            busy, span, makespan = list(stats[0]), list(stats[1]), stats[2]
        cost, ideal = max(span), max(busy)
        return cls(
            schedule_name=schedule.name,
            num_stages=p,
            num_microbatches=schedule.num_microbatches,
            num_chunks=schedule.num_chunks,
            step_time=makespan * NS,
            bubble_ratio=(cost - ideal) / cost if cost else 0.0,
            busy_time=[b * NS for b in busy],
            idle_time=[(makespan - b) * NS for b in busy],
            span=[s * NS for s in span],
            peak_memory=peak_memory(per_rank, memory, schedule.num_chunks),
            timeline=timeline,
        )

    def to_dict(self) -> dict:
        """JSON-friendly summary (no timeline); times in ms."""
        return {
            "schedule": self.schedule_name,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "step_time_ms": self.step_time * 1e3,
            "bubble_ratio": self.bubble_ratio,
            "busy_time_ms": [b * 1e3 for b in self.busy_time],
            "peak_memory": self.peak_memory,
            "max_peak_memory": self.max_peak_memory,
        }

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write Chrome trace JSON (opens in Perfetto / chrome://tracing): a process per
        rank (pid = rank, named ``pipeline rank R``) with a ``compute`` thread (tid 0)
        holding one complete ("ph": "X") event per action, times in microseconds
        (``simulator.chrome_trace``)."""
        from simulator import chrome_trace

        events = chrome_trace.metadata(self.num_stages, [(0, "compute")])
        for e in self.timeline:
            label = f"{e.kind}{e.microbatch}" + (f".c{e.chunk}" if self.num_chunks > 1 else "")
            events.append(chrome_trace.complete(
                label, e.kind, e.rank, 0, e.start, e.end,
                {"microbatch": e.microbatch, "chunk": e.chunk, "vstage": e.vstage}))
        return chrome_trace.write(events, path)

    def plot_timeline(self, path: str | Path) -> Path:
        """Write a Gantt chart PNG (``simulator.gantt``): one row per rank, F/B/W/BW
        coloured, chunks hatched, the legend right of the bars, the schedule and bubble
        ratio in the title; time in ms, 12 x (0.4 p + 1.5) inches at 100 dpi."""
        from simulator import gantt

        fig, (ax,) = gantt.figure([self.num_stages])
        bars = gantt.pipeline_bars(self.timeline)
        gantt.draw(ax, bars, self.num_stages,
                   f"{self.schedule_name}: p={self.num_stages} m={self.num_microbatches} "
                   f"v={self.num_chunks}, bubble ratio {self.bubble_ratio:.4f}")
        return gantt.save(fig, bars, path)


def peak_memory(per_rank: list[list[TimelineEvent]], memory: Mapping[str, float] | None, v: int) -> list[float]:
    """Peak activation memory per rank: +M_B/v at each F start, -(M_B-M_W)/v at B end,
    -M_W/v at W end, -M_B/v at BW end (frees before allocations at the same instant),
    plus ``static``. Zeros when ``memory`` is None. Raises ValueError on bad keys/values."""
    if memory is None:
        return [0.0] * len(per_rank)
    if not isinstance(memory, Mapping) or set(memory) - {"M_B", "M_W", "static"} or "M_B" not in memory:
        raise SimulatorError(f"memory must be a mapping with M_B (and optional M_W, static), got {memory!r}")
    mb, mw, static = (float(memory.get(k, 0.0)) for k in ("M_B", "M_W", "static"))
    if mb < 0 or mw < 0 or mw > mb:
        raise SimulatorError(f"memory needs 0 <= M_W <= M_B, got M_B={mb}, M_W={mw}")
    delta = {"B": -(mb - mw) / v, "W": -mw / v, "BW": -mb / v}
    peaks = []
    for evs in per_rank:
        changes = [(e.start, 1, mb / v) for e in evs if e.kind == "F"]
        changes += [(e.end, 0, delta[e.kind]) for e in evs if e.kind != "F"]
        changes.sort()
        cur = best = 0.0
        for _, _, d in changes:
            cur += d
            best = max(best, cur)
        peaks.append(static + best)
    return peaks
