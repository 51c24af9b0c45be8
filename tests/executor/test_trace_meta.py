"""The checks of an executor trace's metadata (``executor.trace_meta``): each bad field is
refused naming the file and the field; the set of rank traces is checked for duplicates
and missing ranks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from executor.trace_calibrate import TraceError
from executor.trace_meta import check_meta, check_ranks

GOOD = {"rank": 1, "world_size": 2, "step_times_s": [0.2, 0.3], "paired_steps_s": [0.1],
        "span_steps_s": [0.11], "paired_cpu_s": [0.0], "span_cpu_s": [0.05], "span_event_s": 1.5e-6,
        "profiler_event_s": 2e-5, "span_count": 700, "span_origin_ns": 123, "span_offset_us": 4.5,
        "host": "vm"}


def test_a_well_formed_metadata_passes_as_it_is():
    assert check_meta(dict(GOOD), "rank1.json") == GOOD
    assert check_meta({"rank": 0}, "rank0.json") == {"rank": 0}  # an older trace: only the rank


@pytest.mark.parametrize("field, value", [
    ("rank", -1), ("rank", True), ("rank", 2), ("world_size", 0), ("world_size", "2"),
    ("span_steps_s", [0.1, math.nan]), ("span_steps_s", [0.1, -0.2]), ("paired_steps_s", [0.0]),
    ("paired_steps_s", 0.1), ("step_times_s", ["0.1"]), ("span_cpu_s", [-1e-3]), ("span_cpu_s", [None]),
    ("span_event_s", -1e-4), ("span_event_s", 2e-4), ("span_event_s", "1e-6"), ("profiler_event_s", math.inf),
    ("span_count", 1.5), ("span_count", -1), ("span_origin_ns", "12"), ("span_offset_us", "4"),
    ("host", 7)])
def test_each_bad_field_is_refused_naming_the_file_and_field(field, value):
    meta = {**GOOD, field: value}
    with pytest.raises(TraceError, match=rf"rank1\.json: metadata field '{field}'"):
        check_meta(meta, "rank1.json")


def test_the_set_of_rank_traces():
    """Two files of rank 0 are refused naming both; world sizes must agree; a missing rank
    of the world is a warning naming it."""
    files = [Path("a/rank0.json"), Path("b/rank0.json")]
    with pytest.raises(TraceError, match="both are traces of rank 0"):
        check_ranks([{"rank": 0, "world_size": 2}, {"rank": 0, "world_size": 2}], files)
    with pytest.raises(TraceError, match=r"disagree on world_size: \[2, 4\]"):
        check_ranks([{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 4}], files)
    assert check_ranks([{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}], files) == []
    (line,) = check_ranks([{"rank": 0, "world_size": 3}], files[:1])
    assert "no trace of rank(s) [1, 2] of world size 3" in line
    assert check_ranks([{"rank": 0}], files[:1]) == []  # an older trace: no world size to check
