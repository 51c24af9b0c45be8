"""Every action of a simulated step on the stream it runs on: the Chrome trace of
``meshplan cost --trace``, the step Gantt chart and ``StepResult.to_frame()``.

One process per pipeline rank (the dp x tp ranks of a stage run the same timeline) and one
thread per stream (:data:`STREAMS`):

* ``compute``: the pipeline's F / B / W / BW actions as the SimPy engine played them
  (``SimResult.timeline``);
* ``tp_comm``: the in-stage collectives' share of each action (tensor / context parallel:
  the virtual stage's ``comm`` seconds per micro-batch less its ZeRO-3 part,
  ``StageTimer.stage_time``, split over the micro-batch's actions by duration), drawn at
  the end of the action: those collectives interleave with the action's kernels, so the
  trace shows how much of the action they take, not exactly when;
* ``pp_comm``: each p2p hop between ranks (one ``comm_time`` from the producing action's
  end, ``simulator.pipeline_sim``'s model), a ``send`` on the producer and a ``recv`` on
  the consumer;
* ``dp_sync``: under ZeRO-3 the time its per-block gathers and reduces add to each action
  (``fsdp``, at the action's start, same split), the gradient buckets reduced on the dp stream
  (``simulator.dp_stream.grad_reduce_intervals``), then the per-step weight-gradient
  collectives after the rank's dp stream is done, and the parameter all_gather after the
  optimizer (ZeRO 1-2); without a framework profile the one-piece gradient sync;
* ``optimizer``: the optimizer step with the fixed per-step work
  (``simulator.grad_sync.optimizer_time`` + ``fixed_time``).

The last event of the critical rank ends at the step time (``StepModel._rank``: last action
+ dp wait + collectives + optimizer + exposed gather). Times are integer nanoseconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from simulator import chrome_trace

#: stream key -> (thread id, thread name)
STREAMS: dict[str, tuple[int, str]] = {
    "compute": (0, "compute"),
    "tp_comm": (1, "TP comm (in-stage collectives)"),
    "pp_comm": (2, "PP send/recv"),
    "dp_sync": (3, "DP/FSDP sync"),
    "optimizer": (4, "optimizer"),
}
_BACKWARD = ("B", "BW")


class StepEvent(NamedTuple):
    """One action of the step: pipeline rank, stream (a key of :data:`STREAMS`), label,
    kind (F, B, W, BW, tp, fsdp, send, recv, grad_reduce, grad_sync, tail_collectives,
    param_gather, optimizer), micro-batch and chunk (-1 where none), start and end in
    integer ns."""

    rank: int
    stream: str
    name: str
    kind: str
    microbatch: int
    chunk: int
    start: int
    end: int


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def action_label(kind: str, microbatch: int, chunk: int, num_chunks: int) -> str:
    """``F3`` or, with more than one chunk per rank, ``F3.c1``."""
    return f"{kind}{microbatch}" + (f".c{chunk}" if num_chunks > 1 else "")


def _shares(result: Any, key: str, stream: str, kind: str, prefix: str,
            at_start: bool) -> list[StepEvent]:
    """Each action's share of its virtual stage's ``stage_parts[vs][key]`` seconds per
    micro-batch, split over the micro-batch's actions (F, B, W or BW) in proportion to
    their durations, drawn at each action's start (``at_start``) or end; per rank they
    add up to m x that part of its virtual stages."""
    out = []
    parts, v = result.stage_parts, result.sim.num_chunks
    per_mb: dict[tuple[int, int], int] = {}
    for e in result.sim.timeline:
        per_mb[(e.vstage, e.microbatch)] = per_mb.get((e.vstage, e.microbatch), 0) + e.end - e.start
    for e in result.sim.timeline:
        if e.vstage >= len(parts) or not per_mb[(e.vstage, e.microbatch)]:
            continue
        secs = _part(parts[e.vstage], key)
        share = (e.end - e.start) / per_mb[(e.vstage, e.microbatch)]
        dur = min(e.end - e.start, round(share * secs * 1e9))
        if dur > 0:
            start = e.start if at_start else e.end - dur
            out.append(StepEvent(e.rank, stream, prefix + action_label(e.kind, e.microbatch, e.chunk, v),
                                 kind, e.microbatch, e.chunk, start, start + dur))
    return out


def _part(p: dict[str, float], key: str) -> float:
    """Seconds of ``key`` in a stage's parts: ``tp`` is comm less the ZeRO-3 ``fsdp``."""
    if key == "tp":
        return p["comm"] - p.get("fsdp", 0.0)
    return p.get(key, 0.0)


def _tp_events(result: Any) -> list[StepEvent]:
    """The in-stage tensor / context parallel collectives' share of each action, at its end."""
    return _shares(result, "tp", "tp_comm", "tp", "TP comm ", at_start=False)


def _fsdp_events(result: Any) -> list[StepEvent]:
    """ZeRO-3 / FSDP: the time its per-block parameter gathers and gradient reduces add to
    each action (exposed, not the whole collectives), at its start, on the DP/FSDP thread."""
    return _shares(result, "fsdp", "dp_sync", "fsdp", "FSDP gather/reduce ", at_start=True)


def _pp_events(result: Any) -> list[StepEvent]:
    hop = _ns(result.comm_time)
    if hop <= 0:
        return []
    sim = result.sim
    nvs = sim.num_stages * sim.num_chunks
    fwd = {(e.vstage, e.microbatch): e for e in sim.timeline if e.kind == "F"}
    bwd = {(e.vstage, e.microbatch): e for e in sim.timeline if e.kind in _BACKWARD}
    out = []
    for e in sim.timeline:
        if e.kind == "F" and e.vstage > 0:
            src = fwd.get((e.vstage - 1, e.microbatch))
        elif e.kind in _BACKWARD and e.vstage < nvs - 1:
            src = bwd.get((e.vstage + 1, e.microbatch))
        else:
            continue
        if src is None or src.rank == e.rank:
            continue
        what = "activation" if e.kind == "F" else "gradient"
        out.append(StepEvent(src.rank, "pp_comm", f"send {what} {e.microbatch} to rank {e.rank}",
                             "send", e.microbatch, src.chunk, src.end, src.end + hop))
        out.append(StepEvent(e.rank, "pp_comm", f"recv {what} {e.microbatch} from rank {src.rank}",
                             "recv", e.microbatch, e.chunk, src.end, src.end + hop))
    return out


def _tail_events(result: Any) -> list[StepEvent]:
    out = []
    for r, tail in enumerate(result.rank_tails):
        spans = result.dp_buckets[r] if r < len(result.dp_buckets) else []
        for i, (s, e) in enumerate(spans):
            out.append(StepEvent(r, "dp_sync", f"grad reduce bucket {i}", "grad_reduce", -1, -1, s, e))
        t = _ns(tail["end"])
        if "grad_sync" in tail:  # no framework profile: one gradient sync after the pipeline
            d = _ns(tail["grad_sync"])
            if d > 0:
                out.append(StepEvent(r, "dp_sync", "grad sync", "grad_sync", -1, -1, t, t + d))
            t += d
        else:
            t += _ns(tail["dp_wait"])
            d = _ns(tail.get("grad_reduce", 0.0))
            if d > 0:
                out.append(StepEvent(r, "dp_sync", "accumulated grad reduce_scatter", "grad_reduce",
                                     -1, -1, t, t + d))
            t += d
            d = _ns(tail["tail_collectives"])
            if d > 0:
                out.append(StepEvent(r, "dp_sync", "weight-grad collectives", "tail_collectives",
                                     -1, -1, t, t + d))
            t += d
        d = _ns(tail["optimizer"])
        out.append(StepEvent(r, "optimizer", "optimizer step", "optimizer", -1, -1, t, t + d))
        t += d
        d = _ns(tail.get("param_gather", 0.0))
        if d > 0:
            out.append(StepEvent(r, "dp_sync", "param all_gather", "param_gather", -1, -1, t, t + d))
    return out


def step_events(result: Any) -> list[StepEvent]:
    """Every action of ``result`` (a ``simulator.step.StepResult``) on its stream (module
    docstring), sorted by (start, rank, thread id)."""
    v = result.sim.num_chunks
    ev = [StepEvent(e.rank, "compute", action_label(e.kind, e.microbatch, e.chunk, v), e.kind,
                    e.microbatch, e.chunk, e.start, e.end) for e in result.sim.timeline]
    ev += _tp_events(result) + _fsdp_events(result) + _pp_events(result) + _tail_events(result)
    return sorted(ev, key=lambda x: (x.start, x.rank, STREAMS[x.stream][0], x.end))


def events_frame(events: list[StepEvent]) -> Any:
    """A pandas DataFrame of ``events``: rank, stream, name, kind, microbatch, chunk,
    start_ms, end_ms, dur_ms."""
    import pandas as pd

    df = pd.DataFrame(events, columns=list(StepEvent._fields))
    df["start_ms"] = df.pop("start") / 1e6
    df["end_ms"] = df.pop("end") / 1e6
    df["dur_ms"] = df["end_ms"] - df["start_ms"]
    return df


def trace_events(result: Any) -> list[dict[str, Any]]:
    """The step's Chrome trace events: metadata naming each rank's process and stream
    threads, one complete event per :func:`step_events` entry, and each rank's memory as a
    counter track (``simulator.memory_timeline.counter_events``)."""
    from simulator.memory_timeline import activation_curves, counter_events

    num_ranks = result.sim.num_stages
    out = chrome_trace.metadata(num_ranks, list(STREAMS.values()))
    for e in step_events(result):
        args = {"kind": e.kind}
        if e.microbatch >= 0:
            args.update(microbatch=e.microbatch, chunk=e.chunk)
        out.append(chrome_trace.complete(e.name, e.stream, e.rank, STREAMS[e.stream][0],
                                         e.start, e.end, args))
    if result.memory_per_stage:
        curves = activation_curves(result.sim.timeline, num_ranks, result.activation_per_chunk)
        out += counter_events(curves, result.memory_per_stage)
    return out


def write_trace(result: Any, path: str | Path) -> Path:
    """Write :func:`trace_events` of ``result`` as Chrome trace JSON; returns the path."""
    return chrome_trace.write(trace_events(result), path)
