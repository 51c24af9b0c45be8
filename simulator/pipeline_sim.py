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

import gc
from collections.abc import Mapping, Sequence
from typing import Any

import simpy
from simpy.events import NORMAL, Event

from completion.gc_pause import gc_paused
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


def simulate_pipeline(
    schedule: Schedule,
    stage_times: Any,
    comm_time: float = 0.0,
    memory: Mapping[str, float] | None = None,
    cluster: Any = None,
    p2p_bytes: float | None = None,
    p2p_sync: bool = False,
    pair_hidden: Mapping[tuple[int, int, int], float] | None = None,
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
        pair_hidden: seconds each overlapped F&B pair (``Schedule.pairs``) hides, by
            (rank, forward chunk, backward chunk): the pair's backward is that much shorter
            (``simulator.step.StepModel.pair_hidden``: one micro-batch's all-to-all beside
            the other's compute); None: none.

    Raises:
        ValueError: bad times/memory; ScheduleError: an invalid schedule or a deadlock
        (the message lists each stuck rank's waiting action and the input it waits for).
    """
    with gc_paused():  # per-action tuples from the validation to the summary (completion.gc_pause)
        return _simulate(schedule, stage_times, comm_time, memory, cluster, p2p_bytes, p2p_sync, pair_hidden)


def _simulate(schedule: Schedule, stage_times: Any, comm_time: float, memory: Mapping[str, float] | None,
              cluster: Any, p2p_bytes: float | None, p2p_sync: bool,
              pair_hidden: Mapping[tuple[int, int, int], float] | None = None) -> SimResult:
    """The body of :func:`simulate_pipeline` (same arguments)."""
    schedule.validate()
    times = normalize_stage_times(schedule, stage_times)
    hidden = {k: _ns(v, "pair_hidden") for k, v in (pair_hidden or {}).items()} if schedule.pairs else {}
    key = None
    if cluster is None:  # the play is a function of the actions, their placement, the ns
        # times and the hop: a copy of a schedule with other ``meta`` (``with_meta``, which
        # shares the action and placement tuples) replays the same
        acts, vst = schedule.actions, schedule.vstage
        key = (id(acts), id(vst), tuple(map(tuple, times)), _ns(comm_time, "comm_time"), bool(p2p_sync),
               tuple(sorted(hidden.items())))
        hit = _PLAYED.get(key)
        if hit is not None and hit[0].actions is acts and hit[0].vstage is vst:
            timeline, stats = hit[1]
            return SimResult.from_timeline(schedule, list(timeline), memory, stats)
    plan = _plan(schedule, times, _hop_ns(schedule, comm_time, cluster, p2p_bytes), p2p_sync)
    timeline, stats = _play(schedule, plan, hidden)
    if key is not None and len(timeline) <= _PLAYED_EVENTS // 8:
        _PLAYED[key] = (schedule, (tuple(timeline), stats))
        _PLAYED_SIZE[0] += len(timeline)
        while len(_PLAYED) > _PLAYED_MAX or _PLAYED_SIZE[0] > _PLAYED_EVENTS:
            _PLAYED_SIZE[0] -= len(_PLAYED.pop(next(iter(_PLAYED)))[1][0])
    return SimResult.from_timeline(schedule, timeline, memory, stats)


#: Plays by (schedule's actions and placement, per-chunk ns times, T_comm ns, p2p_sync): a
#: search plays a pipeline once per distinct schedule and stage times (plans that differ
#: only in dp-side knobs such as the ZeRO stage repeat it; a time-aware builder's own play
#: of the order it returns is not repeated). The entry holds the schedule, so the ids of
#: its tuples stay their own.
_PLAYED: dict[tuple, tuple] = {}
_PLAYED_MAX = 128
#: Most timeline events the memo holds in all (about 100 bytes each); a play of more
#: than an eighth of it is not kept.
_PLAYED_EVENTS = 1_000_000
_PLAYED_SIZE = [0]


def clear_play_cache() -> None:
    """Forget the memoised plays of :func:`simulate_pipeline` (benchmarks time cold runs)."""
    _PLAYED.clear()
    _PLAYED_SIZE[0] = 0


def _plan(schedule: Schedule, times, hop, p2p_sync: bool = False) -> list[list[dict[str, tuple]]]:
    """Per rank, per chunk, per action kind one template ``(dur, post, k1, d1, k2, d2, o1,
    o2, vs)``: the action's duration, ``post`` (ns the rank stays busy after it with its
    synchronous sends, ``p2p_sync``), up to two inputs (finish key ``k`` and hop delay
    ``d``; -1: none), up to two outputs (finish keys it completes; -1: none) and its
    virtual stage. A key is ``(code * nvs + vs) * m + mb`` with code 0/1/2 for F/B/W done;
    the template holds it for micro-batch 0 and the play adds the action's micro-batch
    (so the plan costs per (rank, chunk), not per action):

    * F of (vs, i): T_F, sends to the rank of vs+1; input F(vs-1, i) after the hop from its
      rank (none at vs = 0); output F(vs, i);
    * B / BW of (vs, i): T_B / T_BW, sends to the rank of vs-1; inputs F(vs, i) (same rank)
      and B(vs+1, i) after the hop from its rank (none at the last virtual stage); outputs
      B(vs, i) (and W(vs, i) for BW);
    * W of (vs, i): T_W; input B(vs, i); output W(vs, i)."""
    m, nvs = schedule.num_microbatches, schedule.num_vstages
    owner = [0] * nvs
    for r, row in enumerate(schedule.vstage):
        for vs in row:
            owner[vs] = r
    bstride, wstride = nvs * m, 2 * nvs * m
    plan = []
    for r, place in enumerate(schedule.vstage):
        chunks = []
        for c, vs in enumerate(place):
            tf, tb, tw, tbw = times[r][c]
            base = vs * m
            has_prev, has_next = vs > 0, vs < nvs - 1
            prev_hop = hop(owner[vs - 1], r) if has_prev else 0
            next_hop = hop(owner[vs + 1], r) if has_next else 0
            send_up = hop(r, owner[vs + 1]) if p2p_sync and has_next else 0
            send_down = hop(r, owner[vs - 1]) if p2p_sync and has_prev else 0
            k2 = bstride + base + m if has_next else -1
            chunks.append({
                "F": (tf, send_up, base - m if has_prev else -1, prev_hop, -1, 0, base, -1, vs),
                "B": (tb, send_down, base, 0, k2, next_hop, bstride + base, -1, vs),
                "BW": (tbw, send_down, base, 0, k2, next_hop, bstride + base, wstride + base, vs),
                "W": (tw, 0, bstride + base, 0, -1, 0, wstride + base, -1, vs),
            })
        plan.append(chunks)
    return plan


def dependency_templates(schedule: Schedule, stage_times: Any, comm_time: float = 0.0,
                         p2p_sync: bool = False) -> list[list[dict[str, tuple]]]:
    """The play's templates (:func:`_plan`: per rank, per chunk, per action kind its
    duration, synchronous-send time, inputs with their hop delays and outputs, in integer
    ns) of ``schedule`` with ``stage_times`` (:func:`normalize_stage_times`) and a hop of
    ``comm_time`` seconds between ranks: the dependency graph a replay with other durations
    (``simulator.goodput.jitter``) plays. Raises as :func:`simulate_pipeline` does for bad
    times."""
    schedule.validate()
    times = normalize_stage_times(schedule, stage_times)
    return _plan(schedule, times, _hop_ns(schedule, comm_time, None, None), p2p_sync)


class _Stream(Event):
    """A rank's compute stream in the play: one SimPy event that the rank re-arms for each
    action (``callbacks = []``, then ``Environment.schedule(stream, NORMAL, delay)``, what
    a Timeout's constructor does) and yields; processed like a Timeout of that delay, without
    allocating one per action (about a fifth of a bare loop's time here). Only its own rank
    yields it, and only once it was processed (SimPy sets ``callbacks`` to None then)."""

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok = True
        self._value = None


def _play(schedule: Schedule, plan: list[list[dict[str, tuple]]],
          hidden: Mapping[tuple[int, int, int], int] | None = None) -> tuple[list[TimelineEvent], tuple]:
    """Run the SimPy event loop over the schedule's actions with the templates of ``plan``
    (from ``_plan``): one process per rank that executes its actions in order, each
    waiting for its dependencies' finish times plus their hop delays (integer ns;
    :class:`_Player`). Returns the timeline (events in the order the loop started them)
    and ``(busy, span, makespan)`` ns for ``SimResult.from_timeline``; raises
    ScheduleError on a deadlock. The garbage collector is paused while the loop runs (it
    would only scan live objects)."""
    player = _Player(schedule, len(plan), hidden)
    for r, actions in enumerate(schedule.actions):
        player.env.process(player.run_rank(r, actions, plan[r]))
    enabled = gc.isenabled()
    gc.disable()
    try:
        player.env.run()
        if player.stuck:
            raise ScheduleError(_deadlock_message(schedule, player.stuck))
    finally:
        if enabled:
            gc.enable()
    first, last = player.first, player.last
    span = [last[r] - first[r] if schedule.actions[r] else 0 for r in range(len(plan))]
    return player.timeline, (player.busy, span, max(last, default=0))


class _Player:
    """The state of one play (:func:`_play`): finish times (ns, -1 until done) and waiting
    Events of the dense keys of ``_plan``, the timeline, each rank's first start, last end
    and busy ns, and ``stuck`` (rank -> (action index, key) while it waits). An action that
    opens an overlapped pair (``Schedule.pairs``, DualPipe's F&B) starts only when its
    partner's inputs are there too: the pair runs as one unit of both passes' time.

    The hot loop (:meth:`run_rank`) allocates only what SimPy needs: each action is one
    scheduled event (the rank's :class:`_Stream`, re-armed ``end - now`` ns ahead, where a
    bare loop yields a new Timeout), and one Event per input a rank has to wait for; each
    rank tracks its own clock (the delays it schedules are exact) and appends each
    TimelineEvent as the action starts."""

    def __init__(self, schedule: Schedule, ranks: int,
                 hidden: Mapping[tuple[int, int, int], int] | None = None) -> None:
        self.env = simpy.Environment()
        nkeys = 3 * schedule.num_vstages * schedule.num_microbatches
        self.finish = [-1] * nkeys
        self.waiters: list = [None] * nkeys
        self.timeline: list[TimelineEvent] = []
        self.stuck: dict[int, tuple[int, int]] = {}
        self.first, self.last, self.busy = [0] * ranks, [0] * ranks, [0] * ranks
        self.pairs = getattr(schedule, "pairs", ()) or ()
        self.hidden = hidden or {}
        self.partner = 0

    def _partner_ready(self, r: int, j: int, partner: tuple, chunk: dict[str, tuple]):
        """Wait until every input of ``partner`` (the action after action j of rank r,
        the other half of an overlapped pair, ``Schedule.pairs``) is done; leave in
        :attr:`partner` the time (ns) the last of them arrives."""
        kind, _, mb, _ = partner
        _, _, k1, d1, k2, d2, *_ = chunk[kind]
        self.partner = 0
        for k, d in ((k1, d1), (k2, d2)):
            if k < 0:
                continue
            if self.finish[k + mb] < 0:
                yield from self.wait(r, j, k + mb)
            self.partner = max(self.partner, self.finish[k + mb] + d)

    def wait(self, r: int, j: int, key: int):
        """Block rank r (at its action j) until ``key`` finishes."""
        self.stuck[r] = (j, key)
        ev = self.waiters[key]
        if ev is None:
            ev = self.waiters[key] = self.env.event()
        yield ev
        del self.stuck[r]

    def run_rank(self, r: int, actions: tuple, chunks: list[dict[str, tuple]]):
        """The SimPy process of rank r: its actions in order, each after its inputs."""
        env, finish, waiters, wait = self.env, self.finish, self.waiters, self.wait
        arm, record = env.schedule, self.timeline.append
        make = tuple.__new__  # TimelineEvent(...) without the NamedTuple constructor's call
        clock = _Stream(env)
        single = chunks[0] if len(chunks) == 1 else None
        paired = self.pairs[r] if self.pairs else None
        now = busy_r = 0
        j = 0
        for kind, _, mb, c in actions:
            dur, post, k1, d1, k2, d2, o1, o2, vs = (single or chunks[c])[kind]
            o1 += mb
            ready = now
            if paired is not None and j in paired:  # an overlapped pair starts on both inputs
                yield from self._partner_ready(r, j, actions[j + 1], single or chunks[actions[j + 1][3]])
                now = env.now
                ready = max(ready, self.partner)
            elif paired is not None and j - 1 in paired:  # its backward: less what the pair hides
                dur = max(0, dur - self.hidden.get((r, actions[j - 1][3], c), 0))
            if k1 >= 0:
                k1 += mb
                fin = finish[k1]
                if fin < 0:
                    yield from wait(r, j, k1)
                    now = env.now
                    fin = finish[k1]
                if fin + d1 > ready:
                    ready = fin + d1
            if k2 >= 0:
                k2 += mb
                fin = finish[k2]
                if fin < 0:
                    yield from wait(r, j, k2)
                    now = env.now
                    fin = finish[k2]
                if fin + d2 > ready:
                    ready = fin + d2
            start = ready if ready > now else now
            end = start + dur
            finish[o1] = end
            ev = waiters[o1]
            if ev is not None:
                waiters[o1] = None
                ev.succeed()
            if o2 >= 0:
                o2 += mb
                finish[o2] = end
                ev = waiters[o2]
                if ev is not None:
                    waiters[o2] = None
                    ev.succeed()
            if j == 0:
                self.first[r] = start
            j += 1
            end += post
            busy_r += end - start
            record(make(TimelineEvent, (r, kind, mb, c, vs, start, end)))
            clock.callbacks = []  # re-armed: the action's end, ``end - now`` ns from now
            arm(clock, NORMAL, end - now)
            yield clock
            now = end
        self.last[r] = now
        self.busy[r] = busy_r


def _deadlock_message(schedule: Schedule, stuck: dict[int, tuple[int, int]]) -> str:
    nvs, m = schedule.num_vstages, schedule.num_microbatches
    parts = []
    for r in sorted(stuck):
        j, dkey = stuck[r]
        code, rest = divmod(dkey, nvs * m)
        vs, mb = divmod(rest, m)
        parts.append(f"rank {r} waits at {schedule.actions[r][j]} for {'FBW'[code]} of virtual "
                     f"stage {vs} micro-batch {mb}")
    return f"{schedule.name}: deadlock, inputs that can never arrive: " + "; ".join(parts)

