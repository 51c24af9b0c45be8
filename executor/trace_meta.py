"""Checks of an executor trace's metadata (the top-level ``meshplan`` object that
``executor.profile`` writes) before ``meshplan calibrate --from-trace`` reads it: every
field it uses has its type and range, so a hand-edited or foreign trace is refused with
the file and field named instead of failing deep inside the fit or printing NaN."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from executor.trace_calibrate import TraceError

#: per-step series of seconds: each step ran, so each is > 0 (the CPU-time series may be 0)
STEP_SERIES = ("step_times_s", "profiled_steps_s", "paired_steps_s", "span_steps_s")
CPU_SERIES = ("paired_cpu_s", "span_cpu_s")
#: the most a recorder span (``span_event_s``, 1-2 us measured on a CPU host) or a profiler
#: event (``profiler_event_s``, tens of us) may cost, seconds: above it the figure is no
#: measurement of the recorder
MAX_EVENT_S = {"span_event_s": 1e-4, "profiler_event_s": 1e-3}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_meta(meta: dict, path: Path | str) -> dict:
    """``meta`` when every field ``calibrate --from-trace`` reads is well formed (module
    docstring): ``rank`` an integer >= 0 below ``world_size`` (an integer >= 1 when
    present); the step series lists of finite seconds > 0 and the CPU-time series >= 0;
    ``span_event_s`` / ``profiler_event_s`` finite, >= 0 and at most
    :data:`MAX_EVENT_S`; ``span_count`` an integer >= 0; ``span_origin_ns`` an integer and
    ``span_offset_us`` a number when present; ``host`` a string. Raises TraceError naming
    ``path`` and the field."""
    def bad(field: str, what: str) -> TraceError:
        return TraceError(f"{path}: metadata field {field!r} = {meta.get(field)!r}: {what}")

    rank, world = meta.get("rank"), meta.get("world_size")
    if not _int(rank) or rank < 0:
        raise bad("rank", "must be an integer >= 0")
    if world is not None and (not _int(world) or world < 1):
        raise bad("world_size", "must be an integer >= 1")
    if world is not None and rank >= world:
        raise bad("rank", f"must be below world_size {world}")
    for key in STEP_SERIES + CPU_SERIES:
        v = meta.get(key)
        if v is None:
            continue
        cpu = key in CPU_SERIES  # CPU time may be 0, a step that ran may not
        if not isinstance(v, list) or not all(_number(x) and (x >= 0 if cpu else x > 0) for x in v):
            raise bad(key, "must be a list of finite seconds " + (">= 0" if cpu else "> 0"))
    for key, most in MAX_EVENT_S.items():
        v = meta.get(key)
        if v is not None and not (_number(v) and 0 <= v <= most):
            raise bad(key, f"must be a number of seconds in [0, {most:g}] (the cost of one event)")
    if meta.get("span_count") is not None and not (_int(meta["span_count"]) and meta["span_count"] >= 0):
        raise bad("span_count", "must be an integer >= 0")
    if meta.get("span_origin_ns") is not None and not _int(meta["span_origin_ns"]):
        raise bad("span_origin_ns", "must be an integer (nanoseconds)")
    if meta.get("span_offset_us") is not None and not _number(meta["span_offset_us"]):
        raise bad("span_offset_us", "must be a number (microseconds)")
    if meta.get("host") is not None and not isinstance(meta["host"], str):
        raise bad("host", "must be a string")
    return meta


def check_ranks(metas: list[dict], files: list[Path]) -> list[str]:
    """Warnings for the set of rank traces ``files`` (their ``metas``, checked by
    :func:`check_meta`): a rank the world has that no file holds. Raises TraceError for
    two files of one rank or ranks that disagree on ``world_size``."""
    seen: dict[int, Path] = {}
    for m, f in zip(metas, files, strict=True):
        if m["rank"] in seen:
            raise TraceError(f"{f} and {seen[m['rank']]}: both are traces of rank {m['rank']}")
        seen[m["rank"]] = f
    worlds = {m.get("world_size") for m in metas} - {None}
    if len(worlds) > 1:
        raise TraceError(f"the traces disagree on world_size: {sorted(worlds)} ({', '.join(map(str, files))})")
    if not worlds:
        return []
    missing = sorted(set(range(next(iter(worlds)))) - set(seen))
    if not missing:
        return []
    return [f"no trace of rank(s) {missing} of world size {next(iter(worlds))}: each collective is taken "
            f"at its shortest over the traced ranks only, and a replica not traced cannot be the slowest"]


__all__ = ["CPU_SERIES", "MAX_EVENT_S", "STEP_SERIES", "check_meta", "check_ranks"]
