"""Keep Kineto's progress lines off the user's terminal.

libkineto (the C++ side of ``torch.profiler``, torch 2.13) writes one line per profiler
start, stop and stage straight to file descriptor 2, e.g.
``USDT:2026-12-01 21:54:16 10258:10258 SyncActivityProfilerHandler.cpp:52] profiler_start``
and ``STAGE:... Completed Stage: Warm Up``; ``KINETO_LOG_LEVEL`` does not silence them.
:func:`kineto_quiet` sends fd 2 to a temporary file while a profiling session runs and
writes back every line that is not one of those, so real warnings and errors still reach
stderr, in their order.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

#: a libkineto progress line: ``USDT:`` / ``STAGE:``, date, time, pid:tid, ``File.cpp:N]``
KINETO_LINE = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\]")


def drop_kineto_lines(text: str) -> str:
    """``text`` without the lines :data:`KINETO_LINE` matches (other lines kept, in order,
    with their line ends)."""
    return "".join(line for line in text.splitlines(keepends=True) if not KINETO_LINE.match(line))


@contextmanager
def kineto_quiet() -> Iterator[None]:
    """Within the block, file descriptor 2 goes to a temporary file; on exit (also on an
    exception) the file's lines other than Kineto's progress lines are written back to the
    original stderr. Python's ``sys.stderr`` is flushed first so no earlier text is held
    back. If fd 2 cannot be duplicated (no such descriptor), the block runs unchanged."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = drop_kineto_lines(tmp.read().decode("utf-8", errors="replace"))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
