"""Pipeline schedule data model: actions, per-rank action lists, the schedule registry.

An action is ``(kind, stage, microbatch, chunk)``: ``kind`` is ``F`` (forward), ``B``
(input-gradient backward), ``W`` (weight-gradient backward) or ``BW`` (fused full
backward, B immediately followed by W); ``stage`` is the physical pipeline stage (= rank
of the pipeline group); ``chunk`` is the local model chunk on that rank (0 unless VPP/ZBVPP).
The model order of chunks is given by ``Schedule.vstage[rank][chunk]`` (virtual stage id).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from completion.gc_pause import gc_paused
from simulator.errors import ScheduleError
from simulator.schedules.columns import actions_complete, columns
from simulator.schedules.p2p import check_p2p, send_plan

KINDS = ("F", "B", "W", "BW")
_KIND_CODE = {"F": 0, "B": 1, "W": 2, "BW": 3}

#: Most passes (F, B and W; 3 x stages x chunks x micro-batches) a schedule may have: the
#: complexity guard of ``build_schedule`` and ``Schedule.validate``. Building and simulating
#: takes 25-110 us per pass (ZB-V's searched order the most), so the largest legal schedule
#: runs in about a minute; 2**19 covers pp = 64 with 2730 micro-batches, or pp = 8 with
#: 21845.
MAX_ACTIONS = 2**19
#: Longest pass or hop time (seconds) a schedule builder or the engine accepts: about 11.6
#: days. Times enter the event loop as integer nanoseconds (1e15 at most, exact in a
#: float), so every time stays representable; infinity, NaN and 1e308 are refused.
MAX_TIME_S = 1e6
#: Largest ZB memory limit (units of M_B): above the micro-batch count the limit never
#: binds, and MAX_ACTIONS keeps m far below this.
MAX_MEMORY_LIMIT = float(2**20)


__all__ = ["KINDS", "MAX_ACTIONS", "MAX_MEMORY_LIMIT", "MAX_TIME_S", "SCHEDULES", "Action",
           "Schedule", "ScheduleError", "build_schedule", "check_common", "clear_schedule_cache", "check_size",
           "check_time", "interleaved_vstages", "make_schedule", "register_schedule",
           "require_single_chunk", "times_ns", "v_shape_vstages"]


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
    pairs: tuple[frozenset[int], ...] = ()
    """Per rank, the indices j of actions that run overlapped with action j + 1 (DualPipe's
    F&B: one micro-batch's forward beside another's backward): the pair starts once both
    actions' inputs are there and takes both passes' time (``simulator.pipeline_sim``);
    empty for schedules without pairs."""

    @property
    def num_vstages(self) -> int:
        """Virtual stages: num_stages * num_chunks."""
        return self.num_stages * self.num_chunks

    def rank_of_vstage(self) -> dict[int, tuple[int, int]]:
        """Map virtual stage -> (rank, chunk)."""
        return {vs: (r, c) for r, row in enumerate(self.vstage) for c, vs in enumerate(row)}

    def validate(self) -> None:
        """Check that every (virtual stage, micro-batch) has exactly one F and exactly one
        backward (a BW, or one B and one W), each on the rank that owns the chunk; that
        ``vstage`` places every virtual stage on exactly one (rank, chunk); that the
        schedule stays within :data:`MAX_ACTIONS`; and that its point-to-point messages
        match per ordered pair of ranks (``simulator.schedules.p2p.check_p2p``: the n-th
        send of rank a to rank b is the n-th receive b posts from a, as NCCL requires).

        Raises ScheduleError naming the first missing/duplicated/misplaced action, the bad
        placement, or the pair of ranks and the first message that do not match. A
        schedule that passed is not checked again (its fields are immutable tuples). The
        per-action checks run vectorised over the actions' integer columns
        (``simulator.schedules.columns``, kept on the schedule for the engine's plan); the
        plain walk (:meth:`_check_actions`) runs only to name a defect."""
        if self.__dict__.get("_validated"):
            return
        p, m, v = self.num_stages, self.num_microbatches, self.num_chunks
        if len(self.actions) != p or len(self.vstage) != p:
            raise ScheduleError(f"{self.name}: expected {p} ranks, got {len(self.actions)}")
        check_size(self.name, p, m, v)
        placed = sorted(vs for row in self.vstage for vs in row)
        if any(len(row) != v for row in self.vstage) or placed != list(range(p * v)):
            raise ScheduleError(f"{self.name}: vstage must place each virtual stage 0..{p * v - 1} on "
                                f"exactly one (rank, chunk), {v} per rank; got {self.vstage!r}")
        cols = columns(self.actions)  # None below columns.MIN_ACTIONS or for a malformed action
        if cols is not None and actions_complete(cols, p, m, v):
            object.__setattr__(self, "_columns", cols)  # read by check_p2p and the engine's plan
        else:  # the plain walk names the first bad action
            self._check_actions()
        check_p2p(self)
        self._check_pairs()
        object.__setattr__(self, "_validated", True)

    def _check_pairs(self) -> None:
        """Each pair is an F followed by a backward of another chunk or micro-batch on the
        same rank (DualPipe's F&B). Raises ScheduleError naming the first bad pair."""
        if not self.pairs:
            return
        if len(self.pairs) != self.num_stages:
            raise ScheduleError(f"{self.name}: pairs must give one set per rank, got {len(self.pairs)}")
        for r, js in enumerate(self.pairs):
            row = self.actions[r]
            for j in js:
                ok = 0 <= j < len(row) - 1 and row[j].kind == "F" and row[j + 1].kind in ("B", "BW") \
                    and (row[j].chunk, row[j].microbatch) != (row[j + 1].chunk, row[j + 1].microbatch)
                if not ok:
                    raise ScheduleError(f"{self.name}: rank {r} action {j} does not open an F&B pair")

    def _check_actions(self) -> None:
        """The per-action checks of :meth:`validate` one action at a time (kind, rank,
        chunk and micro-batch ranges, duplicates, a complete backward per F); raises
        ScheduleError naming the first bad action."""
        m, v = self.num_microbatches, self.num_chunks
        code_of = _KIND_CODE
        bad = None
        for r, row in enumerate(self.actions):
            seen = bytearray(4 * v * m)  # [kind code][chunk][micro-batch] of rank r
            for a in row:
                kind, stage, mb, c = a
                code = code_of.get(kind) if isinstance(kind, str) else None
                if code is None:
                    raise ScheduleError(f"{self.name}: unknown action kind {kind!r} in {a}")
                if stage != r or not 0 <= c < v or not 0 <= mb < m:
                    raise ScheduleError(f"{self.name}: action {a} misplaced on rank {r}")
                key = (code * v + c) * m + mb
                if seen[key]:
                    raise ScheduleError(f"{self.name}: duplicated action {a}")
                seen[key] = 1
            if bad is None:
                has = np.frombuffer(bytes(seen), dtype=np.uint8).reshape(4, v * m).astype(bool)
                f, b, w, bw = has
                ok = f & np.where(bw, ~b & ~w, b & w)
                if not ok.all():
                    c, mb = divmod(int(np.argmin(ok)), m)
                    bad = (r, c, mb)
        if bad is not None:
            r, c, mb = bad
            raise ScheduleError(
                f"{self.name}: rank {r} chunk {c} micro-batch {mb} lacks an F or a "
                f"complete backward (BW, or B and W)"
            )

    def with_meta(self, **meta: Any) -> Schedule:
        """A copy with ``meta`` replaced by ``meta`` (same actions and placement), validated
        already when this one is."""
        out = Schedule(self.name, self.num_stages, self.num_microbatches, self.num_chunks,
                       self.actions, self.vstage, dict(meta), self.pairs)
        for key in ("_validated", "_columns", "_p2p_in_order", "_p2p_plan"):
            if key in self.__dict__:
                object.__setattr__(out, key, self.__dict__[key])
        return out

    def send_plan(self) -> tuple:
        """Per rank, per action: the ``(receiver, Message)`` sends issued right after it
        (``simulator.schedules.p2p.send_plan``: each peer's messages in the order it
        consumes them)."""
        return send_plan(self)


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
    """Shared argument checks (integers, p >= 1, m >= 1, v >= 1, within :data:`MAX_ACTIONS`)."""
    for label, val in (("num_stages", p), ("num_microbatches", m), ("num_chunks", v)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ScheduleError(f"{name}: {label} must be a positive integer, got {val!r}")
    check_size(name, p, m, v)


def check_size(name: str, p: int, m: int, v: int) -> None:
    """Refuse a schedule of more than :data:`MAX_ACTIONS` passes (3 p v m: an F, a B and a
    W per virtual stage and micro-batch), naming the sizes; the complexity guard that keeps
    building and simulating a schedule within about a minute."""
    if 3 * p * v * m > MAX_ACTIONS:
        raise ScheduleError(f"{name}: {p} stages x {v} chunks x {m} micro-batches is "
                            f"{3 * p * v * m} passes, above the limit of {MAX_ACTIONS} "
                            f"(simulator.schedules.base.MAX_ACTIONS)")


def check_time(name: str, what: str, seconds: Any, positive: bool = False) -> float:
    """``seconds`` as a float, refused unless finite, >= 0 (> 0 with ``positive``) and at
    most :data:`MAX_TIME_S`; the message names ``what``."""
    try:
        val = float(seconds)
    except (TypeError, ValueError, OverflowError):
        raise ScheduleError(f"{name}: {what} must be a number of seconds, got {seconds!r}") from None
    if isinstance(seconds, bool) or not math.isfinite(val) or val < 0 or (positive and val == 0):
        raise ScheduleError(f"{name}: {what} must be a finite number of seconds "
                            f"{'> 0' if positive else '>= 0'}, got {seconds!r}")
    if val > MAX_TIME_S:
        raise ScheduleError(f"{name}: {what} is {val:g} s, above the limit of {MAX_TIME_S:g} s "
                            f"(simulator.schedules.base.MAX_TIME_S)")
    return val


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
        secs = tuple(float(st[k]) for k in "FBW")
        comm_s = float(comm_time)
    except (TypeError, ValueError, OverflowError):
        raise ScheduleError(f"{name}: stage_times/comm_time must be numbers of seconds") from None
    if not all(math.isfinite(x) for x in (*secs, comm_s)) or min(secs) <= 0 or comm_s < 0:
        raise ScheduleError(f"{name}: stage times must be finite and > 0 and comm_time >= 0, "
                            f"got {st!r}, {comm_time!r}")
    for k, x in zip("FBW", secs, strict=True):
        check_time(name, f"stage_times[{k}]", x)
    check_time(name, "comm_time", comm_s)
    vals = tuple(round(x * 1e9) for x in secs)
    if min(vals) <= 0:
        raise ScheduleError(f"{name}: stage times must be at least 1 ns, got {st!r}")
    return vals, round(comm_s * 1e9)


def interleaved_vstages(p: int, v: int) -> tuple[tuple[int, ...], ...]:
    """Megatron interleaving: chunk k of rank r is virtual stage k*p + r."""
    return tuple(tuple(k * p + r for k in range(v)) for r in range(p))


def v_shape_vstages(p: int) -> tuple[tuple[int, ...], ...]:
    """ZB-V: rank i holds virtual stages i (chunk 0) and 2p-1-i (chunk 1)."""
    return tuple((r, 2 * p - 1 - r) for r in range(p))


def make_schedule(name: str, p: int, m: int, v: int, rows: list[list[Action]], vstage,
                  pairs: tuple[frozenset[int], ...] = (), **meta) -> Schedule:
    """Freeze per-rank lists into a validated Schedule (``pairs``: :attr:`Schedule.pairs`)."""
    s = Schedule(name, p, m, v, tuple(tuple(r) for r in rows), vstage, dict(meta), pairs)
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
        ScheduleError: unknown name, an illegal (p, m, v, memory_limit) combination, more
            than :data:`MAX_ACTIONS` passes, a time that is not finite or above
            :data:`MAX_TIME_S`, or a memory limit above :data:`MAX_MEMORY_LIMIT`.
    """
    builder = SCHEDULES.get(name)
    if builder is None:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    check_common(name, num_stages, num_microbatches, num_chunks)
    if memory_limit is not None and name != "ZB":
        raise ScheduleError(f"{name}: memory_limit applies only to the ZB schedule")
    if memory_limit is not None:
        try:
            lim = float(memory_limit)
        except (TypeError, ValueError, OverflowError):
            raise ScheduleError(f"ZB: memory_limit must be a number (M_B units), got {memory_limit!r}") from None
        if isinstance(memory_limit, bool) or not math.isfinite(lim) or lim > MAX_MEMORY_LIMIT:
            raise ScheduleError(f"ZB: memory_limit must be a finite number of M_B units at most "
                                f"{MAX_MEMORY_LIMIT:g} (simulator.schedules.base.MAX_MEMORY_LIMIT), "
                                f"got {memory_limit!r}")
    if options and (name not in TIME_AWARE or set(options) - {"stage_times", "comm_time"}):
        raise ScheduleError(f"{name}: unexpected options {sorted(options)}")
    if name == "ZB":
        options["memory_limit"] = memory_limit
    key = _build_key(name, num_stages, num_microbatches, num_chunks, options)
    sched = _BUILT.get(key)
    if sched is None:
        with gc_paused():  # the build allocates a tuple per action and frees none of them
            sched = builder(num_stages, num_microbatches, num_chunks, **options)
        _BUILT[key] = sched
        if len(_BUILT) > _BUILT_MAX:
            _BUILT.pop(next(iter(_BUILT)))
    return sched


#: Schedules built by :func:`build_schedule`, by their arguments (name, p, m, v, memory
#: limit and, for the time-aware builders, the stage times and T_comm): a search builds and
#: validates each schedule once. Bounded (oldest dropped first).
_BUILT: dict[tuple, Schedule] = {}
_BUILT_MAX = 256


def _build_key(name: str, p: int, m: int, v: int, options: Mapping[str, Any]) -> tuple | None:
    def norm(x: Any) -> Any:
        if isinstance(x, Mapping):
            return tuple(sorted((k, norm(val)) for k, val in x.items()))
        return x if isinstance(x, (int, float, str, type(None))) else repr(x)

    return (name, p, m, v, norm(dict(options)))


def clear_schedule_cache() -> None:
    """Forget every schedule :func:`build_schedule` built (benchmarks time cold builds)."""
    _BUILT.clear()
