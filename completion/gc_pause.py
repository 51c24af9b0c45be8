"""Pause Python's cyclic garbage collector around an allocation-heavy step.

Completing and partitioning a program builds a graph of Values and Operations that point
at each other (cycles the collector must trace), and building, validating and playing a
pipeline schedule allocates one or more tuples per action (65,536 actions for 1F1B at
p = 64, m = 512); both free almost nothing until the step ends, so each generation-2
collection their allocations trigger scans every live object again, a cost that grows
with the program (15-30% of a 1F1B p = 64 m = 512 build + play here, benchmarks/RESULTS.md).
The collector only reclaims reference cycles: what a paused step leaves in cycles is
bounded by the step's own size and collected after it. Used as a context manager or as a
decorator (``@gc_paused()``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the ``with`` block and restore its previous state
    (nested uses leave it to the outermost; an exception inside still restores it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
