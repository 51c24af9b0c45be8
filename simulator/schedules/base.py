"""Pipeline schedule data model: actions, per-rank action lists, the schedule registry.

An action is ``(kind, stage, microbatch, chunk)``: ``kind`` is ``F`` (forward), ``B``
(input-gradient backward), ``W`` (weight-gradient backward) or ``BW`` (fused full
backward, B immediately followed by W); ``stage`` is the physical pipeline stage (= rank
of the pipeline group); ``chunk`` is the local model chunk on that rank (0 unless VPP/ZBVPP).
The model order of chunks is given by ``Schedule.vstage[rank][chunk]`` (virtual stage id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from simulator.errors import SimulatorError

KINDS = ("F", "B", "W", "BW")


class ScheduleError(SimulatorError):
    """Invalid schedule name/arguments, or a schedule whose actions cannot all run."""


class Action(NamedTuple):
    """One unit of work on one rank (see module docstring)."""

    kind: str
    stage: int
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "") + f"@s{self.stage}"


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: for each rank the ordered list of its actions.

    ``vstage[rank][chunk]`` is the virtual stage (model position, 0 = first layers) of that
    chunk; there are ``num_stages * num_chunks`` virtual stages. ``name`` is informative.
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    actions: tuple[tuple[Action, ...], ...]
    vstage: tuple[tuple[int, ...], ...]
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def num_vstages(self) -> int:
        """Virtual stages: num_stages * num_chunks."""
        return self.num_stages * self.num_chunks

    def rank_of_vstage(self) -> dict[int, tuple[int, int]]:
        """Map virtual stage -> (rank, chunk)."""
        return {vs: (r, c) for r, row in enumerate(self.vstage) for c, vs in enumerate(row)}

    def validate(self) -> None:
        """Check that every (virtual stage, micro-batch) has exactly one F and exactly one
        backward (a BW, or one B and one W), each on the rank that owns the chunk.

        Raises ScheduleError naming the first missing/duplicated/misplaced action."""
        p, m, v = self.num_stages, self.num_microbatches, self.num_chunks
        if len(self.actions) != p or len(self.vstage) != p:
            raise ScheduleError(f"{self.name}: expected {p} ranks, got {len(self.actions)}")
        seen: set[tuple[str, int, int, int]] = set()
        for r, row in enumerate(self.actions):
            for a in row:
                if a.kind not in KINDS:
                    raise ScheduleError(f"{self.name}: unknown action kind {a.kind!r} in {a}")
                if a.stage != r or not 0 <= a.chunk < v or not 0 <= a.microbatch < m:
                    raise ScheduleError(f"{self.name}: action {a} misplaced on rank {r}")
                key = (a.kind, r, a.microbatch, a.chunk)
                if key in seen:
                    raise ScheduleError(f"{self.name}: duplicated action {a}")
                seen.add(key)
        for r in range(p):
            for c in range(v):
                for mb in range(m):
                    has_f = ("F", r, mb, c) in seen
                    fused = ("BW", r, mb, c) in seen
                    split = ("B", r, mb, c) in seen, ("W", r, mb, c) in seen
                    ok_bw = fused != any(split) and (fused or all(split))
                    if not has_f or not ok_bw:
                        raise ScheduleError(
                            f"{self.name}: rank {r} chunk {c} micro-batch {mb} lacks an F or a "
                            f"complete backward (BW, or B and W)"
                        )


Builder = Callable[..., Schedule]
TIME_AWARE = ("ZB", "ZBVPP")  # builders that accept stage_times / comm_time
SCHEDULES: dict[str, Builder] = {}


def register_schedule(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a schedule builder to the registry under ``name``."""

    def deco(fn: Builder) -> Builder:
        SCHEDULES[name] = fn
        return fn

    return deco


def check_common(name: str, p: int, m: int, v: int) -> None:
    """Shared argument checks (integers, p >= 1, m >= 1, v >= 1)."""
    for label, val in (("num_stages", p), ("num_microbatches", m), ("num_chunks", v)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ScheduleError(f"{name}: {label} must be a positive integer, got {val!r}")


def require_single_chunk(name: str, v: int, hint: str = "") -> None:
    """Raise ScheduleError unless ``v`` (num_chunks) is 1, for the schedules that run one
    model chunk per rank (FThenB, 1F1B, ZBH1, ZBH2, ZB); ``hint`` is appended to the message."""
    if v != 1:
        raise ScheduleError(f"{name}: num_chunks must be 1, got {v}{hint}")


def times_ns(name: str, stage_times: Mapping[str, float] | None, comm_time: float = 0.0
             ) -> tuple[tuple[int, int, int], int]:
    """(T_F, T_B, T_W) and T_comm in integer ns for the time-aware builders (ZB, ZBVPP);
    ``stage_times`` None means 1 s each. Raises ScheduleError on a missing key, a
    non-positive pass time or a negative ``comm_time``."""
    st = {"F": 1.0, "B": 1.0, "W": 1.0} if stage_times is None else stage_times
    if not isinstance(st, Mapping) or not {"F", "B", "W"} <= set(st):
        raise ScheduleError(f"{name}: stage_times must be a mapping with F, B, W seconds, got {st!r}")
    try:
        vals = tuple(round(float(st[k]) * 1e9) for k in "FBW")
        comm = round(float(comm_time) * 1e9)
    except (TypeError, ValueError):
        raise ScheduleError(f"{name}: stage_times/comm_time must be numbers of seconds") from None
    if min(vals) <= 0 or comm < 0:
        raise ScheduleError(f"{name}: stage times must be > 0 and comm_time >= 0, got {st!r}, {comm_time!r}")
    return vals, comm


def interleaved_vstages(p: int, v: int) -> tuple[tuple[int, ...], ...]:
    """Megatron interleaving: chunk k of rank r is virtual stage k*p + r."""
    return tuple(tuple(k * p + r for k in range(v)) for r in range(p))


def v_shape_vstages(p: int) -> tuple[tuple[int, ...], ...]:
    """ZB-V: rank i holds virtual stages i (chunk 0) and 2p-1-i (chunk 1)."""
    return tuple((r, 2 * p - 1 - r) for r in range(p))


def make_schedule(name: str, p: int, m: int, v: int, rows: list[list[Action]], vstage, **meta) -> Schedule:
    """Freeze per-rank lists into a validated Schedule."""
    s = Schedule(name, p, m, v, tuple(tuple(r) for r in rows), vstage, dict(meta))
    s.validate()
    return s


def build_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_chunks: int = 1,
    memory_limit: float | None = None,
    **options,
) -> Schedule:
    """Build a registered pipeline schedule.

    Args:
        name: one of ``SCHEDULES`` (FThenB, 1F1B, VPP, ZBH1, ZBH2, ZBVPP, ZB).
        num_stages: p, pipeline stages (ranks).
        num_microbatches: m, micro-batches per step.
        num_chunks: v, model chunks per rank (VPP: any v >= 1; ZBVPP: exactly 2; else 1).
        memory_limit: only for ``ZB``: activation memory limit per rank in units of M_B
            (``p`` gives ZB-1p, ``2p`` gives ZB-2p); default ``2p``.
        options: builder-specific keywords; ``ZB`` and ``ZBVPP`` take ``stage_times``
            (``{"F","B","W"}`` seconds per stage, default all equal) and ``comm_time``
            (T_comm seconds, default 0) because their heuristics place passes by time.

    Raises:
        ScheduleError: unknown name, or an illegal (p, m, v, memory_limit) combination.
    """
    builder = SCHEDULES.get(name)
    if builder is None:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    check_common(name, num_stages, num_microbatches, num_chunks)
    if memory_limit is not None and name != "ZB":
        raise ScheduleError(f"{name}: memory_limit applies only to the ZB schedule")
    if options and (name not in TIME_AWARE or set(options) - {"stage_times", "comm_time"}):
        raise ScheduleError(f"{name}: unexpected options {sorted(options)}")
    if name == "ZB":
        options["memory_limit"] = memory_limit
    return builder(num_stages, num_microbatches, num_chunks, **options)
