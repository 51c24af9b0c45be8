"""SimPy discrete-event engine that plays a pipeline schedule on p devices.

Model (Qi et al. 2024, sec. 5.3, and shared/reference/formulas.md "Pipeline schedules"):
one compute stream per rank executes that rank's actions strictly in schedule order; an
action starts when the stream is free and its inputs have arrived:

* F of virtual stage s, micro-batch i: F(s-1, i) done, plus one p2p hop if s-1 is on
  another rank;
* B (or fused BW) of (s, i): its own F(s, i) and B(s+1, i) (+ one p2p hop if on another rank);
* W of (s, i): only its own B(s, i), no communication.

A p2p hop is a pure delay on the p2p stream (T_comm); it never occupies the compute
stream and transfers do not contend (the paper's simulation model). Inside the event loop
all times are integer nanoseconds; the API takes and returns seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import simpy

from simulator.errors import SimulatorError
from simulator.result import SimResult, TimelineEvent
from simulator.schedules.base import Schedule, ScheduleError

_CODE = {"F": 0, "B": 1, "W": 2, "BW": 1}


def _ns(seconds: Any, what: str) -> int:
    try:
        val = float(seconds)
    except (TypeError, ValueError):
        raise SimulatorError(f"{what} must be a number of seconds, got {seconds!r}") from None
    if not val >= 0 or val == float("inf"):
        raise SimulatorError(f"{what} must be finite and >= 0 seconds, got {seconds!r}")
    return round(val * 1e9)


def _triple(entry: Any, what: str, split: int) -> tuple[int, int, int, int]:
    """(F, B, W, BW) ns of one stage entry divided over ``split`` chunks; BW (a fused
    backward action) defaults to B + W, and may be less when its B and W overlap."""
    if not isinstance(entry, Mapping):
        raise SimulatorError(f"{what} must be a mapping with keys F, B, W (seconds), got {entry!r}")
    unknown = set(entry) - {"F", "B", "W", "BW"}
    if unknown or "F" not in entry or "B" not in entry:
        raise SimulatorError(f"{what} needs keys F and B (and optionally W, BW), got {sorted(entry)}")
    f, b, w = (_ns(float(entry.get(k, 0.0)) / split, f"{what}[{k}]") for k in "FBW")
    bw = _ns(float(entry["BW"]) / split, f"{what}[BW]") if "BW" in entry else b + w
    return f, b, w, bw


def normalize_stage_times(schedule: Schedule, stage_times: Any) -> list[list[tuple[int, int, int, int]]]:
    """Per (rank, chunk) durations (F, B, W, BW) in integer ns.

    ``stage_times`` is a mapping ``{"F": s, "B": s, "W": s}`` for every stage, a list of p
    such mappings (one per stage), or a list of p*v (one per virtual stage, model order).
    A per-stage time is the whole stage; each of its v chunks takes 1/v of it. ``W`` may
    be omitted (0) for schedules with fused BW; ``BW`` (a fused backward action's time,
    default B + W) may be given where B and W overlap. Raises ValueError on bad shapes/values."""
    p, v = schedule.num_stages, schedule.num_chunks
    if isinstance(stage_times, Mapping):
        t = _triple(stage_times, "stage_times", v)
        return [[t] * v for _ in range(p)]
    if not isinstance(stage_times, Sequence) or isinstance(stage_times, str):
        raise SimulatorError(f"stage_times must be a mapping or a list of mappings, got {type(stage_times).__name__}")
    if len(stage_times) == p:
        return [[_triple(stage_times[r], f"stage_times[{r}]", v)] * v for r in range(p)]
    if len(stage_times) == p * v:
        return [
            [_triple(stage_times[vs], f"stage_times[{vs}]", 1) for vs in schedule.vstage[r]] for r in range(p)
        ]
    raise SimulatorError(f"stage_times has {len(stage_times)} entries; expected 1 mapping, {p} (per stage) or {p * v} (per virtual stage)")


def _hop_ns(schedule: Schedule, comm_time: float, cluster: Any, p2p_bytes: float | None):
    """Return hop(src_rank, dst_rank) -> ns; same rank costs 0."""
    base = _ns(comm_time, "comm_time")
    if cluster is None:
        return lambda a, b: 0 if a == b else base
    if p2p_bytes is None or not hasattr(cluster, "p2p_time"):
        raise SimulatorError("cluster needs p2p_bytes and a cluster object with p2p_time(nbytes, src, dst)")
    cache: dict[tuple[int, int], int] = {}

    def hop(a: int, b: int) -> int:
        if a == b:
            return 0
        if (a, b) not in cache:
            cache[(a, b)] = _ns(cluster.p2p_time(p2p_bytes, a, b), "cluster.p2p_time")
        return cache[(a, b)]

    return hop


def _plan(schedule: Schedule, times, hop, p2p_sync: bool = False) -> list[list[tuple]]:
    """Precompute per action: (action, vs, done_keys, duration, deps, post) -- ``post``:
    ns the rank stays busy after the action with its synchronous sends (``p2p_sync``)."""
    m, nvs = schedule.num_microbatches, schedule.num_vstages
    where = schedule.rank_of_vstage()

    def key(code: int, vs: int, mb: int) -> int:
        return (code * nvs + vs) * m + mb

    plan = []
    for r, row in enumerate(schedule.actions):
        out = []
        for a in row:
            vs = schedule.vstage[r][a.chunk]
            tf, tb, tw, tbw = times[r][a.chunk]
            post = 0
            if a.kind == "F":
                deps = [] if vs == 0 else [(key(0, vs - 1, a.microbatch), hop(where[vs - 1][0], r))]
                dur, done = tf, (key(0, vs, a.microbatch),)
                if p2p_sync and vs < nvs - 1:
                    post = hop(r, where[vs + 1][0])
            elif a.kind == "W":
                deps = [(key(1, vs, a.microbatch), 0)]
                dur, done = tw, (key(2, vs, a.microbatch),)
            else:
                deps = [(key(0, vs, a.microbatch), 0)]
                if vs < nvs - 1:
                    deps.append((key(1, vs + 1, a.microbatch), hop(where[vs + 1][0], r)))
                dur = tbw if a.kind == "BW" else tb
                done = (key(1, vs, a.microbatch),) + ((key(2, vs, a.microbatch),) if a.kind == "BW" else ())
                if p2p_sync and vs > 0:
                    post = hop(r, where[vs - 1][0])
            out.append((a, vs, done, dur, deps, post))
        plan.append(out)
    return plan


def simulate_pipeline(
    schedule: Schedule,
    stage_times: Any,
    comm_time: float = 0.0,
    memory: Mapping[str, float] | None = None,
    cluster: Any = None,
    p2p_bytes: float | None = None,
    p2p_sync: bool = False,
) -> SimResult:
    """Simulate one training step of ``schedule`` and return a SimResult.

    Args:
        schedule: from ``build_schedule`` (or any validated Schedule, e.g. a peer's order).
        stage_times: seconds of F, B, W; see ``normalize_stage_times``.
        comm_time: seconds of one p2p hop between different ranks (T_comm).
        memory: optional ``{"M_B": x, "M_W": y, "static": z}`` per micro-batch and stage in
            any unit (split over chunks like the times): +M_B at an F's start, -(M_B - M_W)
            at a B's end, -M_W at a W's end, -M_B at a BW's end; ``static`` is added to
            every rank. Peaks are reported in that unit.
        cluster: optional object with ``p2p_time(nbytes, src, dst)`` (seconds), e.g.
            ``clusters.Cluster``; with ``p2p_bytes`` it replaces ``comm_time`` per hop
            (rank = pipeline stage index).
        p2p_sync: synchronous sends (Megatron-LM 2021: ``batch_isend_irecv`` then
            ``cuda.synchronize``): the sender stays busy for the hop after each action
            whose result goes to another rank; asynchronous (default): a send is only a
            delay on the receiver's dependency. Either way the receiver's input arrives
            one hop after the producer's end.

    Raises:
        ValueError: bad times/memory; ScheduleError: an invalid schedule or a deadlock
        (the message lists each stuck rank's waiting action and the input it waits for).
    """
    schedule.validate()
    times = normalize_stage_times(schedule, stage_times)
    plan = _plan(schedule, times, _hop_ns(schedule, comm_time, cluster, p2p_bytes), p2p_sync)
    return SimResult.from_timeline(schedule, _play(schedule, plan), memory)


def _play(schedule: Schedule, plan: list[list[tuple]]) -> list[TimelineEvent]:
    """Run the SimPy event loop over ``plan`` (from ``_plan``): one process per rank that
    executes its actions in order, each waiting for its dependencies' finish times plus
    their hop delays (integer ns). Returns the timeline; raises ScheduleError on a deadlock."""
    env = simpy.Environment()
    finish: dict[int, int] = {}
    waiters: dict[int, simpy.Event] = {}
    timeline: list[TimelineEvent] = []
    stuck: dict[int, tuple] = {}

    def run_rank(r: int, actions: list[tuple]):
        for a, vs, done, dur, deps, post in actions:
            ready = env.now
            for dkey, delay in deps:
                fin = finish.get(dkey)
                if fin is None:
                    stuck[r] = (a, dkey)
                    ev = waiters.get(dkey)
                    if ev is None:
                        ev = waiters[dkey] = env.event()
                    yield ev
                    fin = finish[dkey]
                if fin + delay > ready:
                    ready = fin + delay
            stuck.pop(r, None)
            start = ready if ready > env.now else env.now
            end = start + dur
            for k in done:
                finish[k] = end
                ev = waiters.pop(k, None)
                if ev is not None:
                    ev.succeed()
            timeline.append(TimelineEvent(r, a.kind, a.microbatch, a.chunk, vs, start, end + post))
            yield env.timeout(end + post - env.now)

    for r, actions in enumerate(plan):
        env.process(run_rank(r, actions))
    env.run()
    if stuck:
        raise ScheduleError(_deadlock_message(schedule, stuck))
    return timeline


def _deadlock_message(schedule: Schedule, stuck: dict[int, tuple]) -> str:
    nvs, m = schedule.num_vstages, schedule.num_microbatches
    parts = []
    for r in sorted(stuck):
        a, dkey = stuck[r]
        code, rest = divmod(dkey, nvs * m)
        vs, mb = divmod(rest, m)
        parts.append(f"rank {r} waits at {a} for {'FBW'[code]} of virtual stage {vs} micro-batch {mb}")
    return f"{schedule.name}: deadlock, inputs that can never arrive: " + "; ".join(parts)
