"""executor.quiet_stderr: Kineto's progress lines are dropped, everything else on fd 2 kept."""

from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from executor.quiet_stderr import drop_kineto_lines, kineto_quiet

USDT = "USDT:2026-12-01 21:54:16 10258:10258 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
STAGE = "STAGE:2026-12-01 21:57:09 11579:11579 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n"


def test_drop_kineto_lines_keeps_the_rest_in_order():
    text = "a warning\n" + USDT + "USDT is a word here\n" + STAGE + "last"
    assert drop_kineto_lines(text) == "a warning\nUSDT is a word here\nlast"


def _session() -> None:
    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(3) + 1


def test_a_profiled_block_prints_no_kineto_line_but_keeps_real_stderr(capfd):
    """At the file-descriptor level (capfd): a torch.profiler session prints libkineto's
    ``profiler_start`` line to fd 2 (what the wrapper exists to remove); inside
    kineto_quiet() it does not, while the C-level writes around it inside the block still
    reach stderr, in order, and a Python write too."""
    _session()
    assert "profiler_start" in capfd.readouterr().err
    with kineto_quiet():
        os.write(2, b"first c-level line\n")
        _session()
        os.write(2, b"second c-level line\n")
        print("python line", file=sys.stderr)
    err = capfd.readouterr().err
    assert "USDT:" not in err and "STAGE:" not in err and "python line" in err
    assert 0 <= err.index("first c-level line") < err.index("second c-level line")
