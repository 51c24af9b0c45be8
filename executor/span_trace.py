"""A lightweight span recorder: ``time.perf_counter_ns`` around each plan op the executor
runs, written as Chrome-trace complete events, the timings ``meshplan calibrate
--from-trace`` fits.

Why not the profiler's spans: on this project's 2-core host, two gloo ranks under
``torch.profiler.profile(record_shapes=True)`` spent 12% to 34% more CPU time of their own
threads per step than the same steps unprofiled (from ``/proc/self/task``, which other
processes' load does not add to; issue 19), while the per-event probe of
``executor.profile`` put the profiler's cost at 3% to 7%: the recorded ops are not the ops
a timed step runs. A recorded span costs two clock reads, one small object and one list
append (:func:`span_cost` measures it in the same run: 1 to 2 microseconds per span on that
host under load, 0.2% to 0.5% of the loop plan's step), and the aten ops inside run
unobserved, exactly as in a timed step.

Events (:meth:`SpanRecorder.events`): ``{"ph": "X", "cat": SPAN_CAT, "name", "pid",
"tid", "ts", "dur"}``, ``ts`` and ``dur`` in microseconds (the Chrome trace format's
unit), ``ts`` relative to the recorder's first span plus the ``offset`` given. Names are
the ones the profiler spans had (``executor.profile.item_label`` ...), so
``executor.trace_match`` matches either.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

from executor.errors import ExecutorError

#: ``cat`` of every event the recorder writes (``executor.trace_match`` keeps them apart
#: from the profiler's ``cpu_op`` / ``user_annotation`` events of the same thread)
SPAN_CAT = "meshplan_span"
#: spans per timing of :func:`span_cost`, and timings (the fastest kept)
COST_SPANS, COST_REPEATS = 2000, 7


class _Span:
    __slots__ = ("rec", "name", "t0")

    def __init__(self, rec: SpanRecorder, name: str) -> None:
        self.rec, self.name = rec, name

    def __enter__(self) -> None:
        self.t0 = self.rec.clock()

    def __exit__(self, *exc: Any) -> bool:
        rec = self.rec
        t1 = rec.clock()
        rec.names.append(self.name)
        rec.times.append(self.t0)
        rec.times.append(t1)
        return False


class SpanRecorder:
    """Collects the name, start and end (integer nanoseconds of ``clock``,
    ``time.perf_counter_ns``: the clock ``time`` documents for short durations) of every
    :meth:`span`, in the order the spans end. The names go to a list and the times to an
    ``array('q')``: no object the garbage collector tracks outlives a span (2 net
    allocations per 1000 spans), so recording hardly moves when the collector runs (a
    tuple per span would add one tracked object per span)."""

    def __init__(self, clock: Any = time.perf_counter_ns) -> None:
        self.names: list[str] = []
        self.times = array("q")
        self.clock = clock

    @property
    def spans(self) -> list[tuple[str, int, int]]:
        """``(name, start_ns, end_ns)`` of every recorded span, in the order they ended."""
        t = self.times
        return [(n, t[2 * i], t[2 * i + 1]) for i, n in enumerate(self.names)]

    def span(self, name: str) -> _Span:
        """A context manager recording the time from its entry to its exit as ``name``
        (also when the body raises)."""
        return _Span(self, name)

    def clear(self) -> None:
        """Forget every recorded span."""
        self.names.clear()
        del self.times[:]

    @property
    def origin_ns(self) -> int | None:
        """``clock`` time (ns) of the earliest recorded span's start, the time :meth:`events`
        counts ``ts`` from; None when nothing was recorded. With the default clock
        (``perf_counter_ns``: CLOCK_MONOTONIC on Linux) it is comparable between processes of
        one host, so ``origin_ns + ts * 1e3 - offset`` lines up the spans of several ranks."""
        return min((self.times[2 * i] for i in range(len(self.names))), default=None)

    def events(self, pid: int, tid: int, offset_us: float = 0.0) -> list[dict[str, Any]]:
        """The spans as Chrome-trace complete events (module docstring), sorted by start;
        [] when nothing was recorded."""
        spans = self.spans
        if not spans:
            return []
        t_first = min(t0 for _, t0, _ in spans)
        return [{"ph": "X", "cat": SPAN_CAT, "name": n, "pid": pid, "tid": tid,
                 "ts": offset_us + (t0 - t_first) / 1e3, "dur": (t1 - t0) / 1e3}
                for n, t0, t1 in sorted(spans, key=lambda s: (s[1], -s[2]))]


def _noop() -> None:
    return None


def span_cost(spans: int = COST_SPANS, repeats: int = COST_REPEATS) -> float:
    """Seconds one recorded span adds to the time around it: the fastest of ``repeats``
    timings of ``spans`` calls of a no-op wrapped in a span, as the executor wraps an op
    (a closure entering a :class:`SpanRecorder` span), less the same calls unwrapped, over
    ``spans``; >= 0. Raises ValueError for ``spans`` or ``repeats`` < 1."""
    if spans < 1 or repeats < 1:
        raise ExecutorError(f"span_cost needs spans >= 1 and repeats >= 1, got {spans}, {repeats}")
    rec = SpanRecorder()

    def wrapped(f: Any) -> None:
        with rec.span("meshplan::probe"):
            f()

    def best(call: Any) -> float:
        times = []
        for _ in range(repeats):
            rec.clear()
            t0 = time.perf_counter()
            for _ in range(spans):
                call()
            times.append(time.perf_counter() - t0)
        return min(times)  # other work on the core only ever adds time

    cost = (best(lambda: wrapped(_noop)) - best(_noop)) / spans
    rec.clear()
    return max(0.0, cost)
