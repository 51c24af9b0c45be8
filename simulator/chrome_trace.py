"""Chrome trace-event JSON building blocks (the format Perfetto and chrome://tracing open;
"Trace Event Format", Google, 2016: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).

A trace is ``{"traceEvents": [...], "displayTimeUnit": "ms"}``. Events used here:
complete events (``"ph": "X"``, ``ts`` start and ``dur`` duration in microseconds, ``pid``
process, ``tid`` thread), counter events (``"ph": "C"``, ``args`` the series values at
``ts``) and metadata events (``"ph": "M"``: ``process_name`` / ``thread_name`` with
``args.name``, ``process_sort_index`` / ``thread_sort_index`` with ``args.sort_index``).
meshplan draws one process per pipeline rank and one thread per stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: microseconds per nanosecond (the timelines are integer ns, trace times microseconds)
US_PER_NS = 1e-3


def metadata(num_ranks: int, threads: Sequence[tuple[int, str]],
             process_name: str = "pipeline rank {r}") -> list[dict[str, Any]]:
    """Metadata events naming process ``r`` (one per rank, ``process_name`` formatted with
    ``r``) and, in each, the threads ``(tid, name)``, sorted by rank and by tid."""
    out: list[dict[str, Any]] = []
    for r in range(num_ranks):
        out.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                    "args": {"name": process_name.format(r=r)}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0,
                    "args": {"sort_index": r}})
        for tid, name in threads:
            out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid,
                        "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": r, "tid": tid,
                        "args": {"sort_index": tid}})
    return out


def complete(name: str, cat: str, pid: int, tid: int, start_ns: int, end_ns: int,
             args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A complete event (``"ph": "X"``) from ``start_ns`` to ``end_ns`` (integer ns),
    written in microseconds."""
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
            "ts": start_ns * US_PER_NS, "dur": (end_ns - start_ns) * US_PER_NS,
            "args": dict(args or {})}


def write(events: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write ``events`` as a trace JSON file at ``path``; returns the path. Raises OSError
    when it cannot be written."""
    out = Path(path)
    out.write_text(json.dumps({"traceEvents": list(events), "displayTimeUnit": "ms"}))
    return out
