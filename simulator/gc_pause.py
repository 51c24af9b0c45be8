"""Pause Python's cyclic garbage collector around an allocation-heavy step.

Building, validating and playing a pipeline schedule allocates one or more tuples per
action (65,536 actions for 1F1B at p = 64, m = 512) and frees almost none of them until the
step ends; each generation-2 collection the allocations trigger scans every live object
again, which costs 15-30% of a build + play of that size here (benchmarks/RESULTS.md).
The collector only reclaims reference cycles: what a paused step leaves in cycles (SimPy's
processes and events) is bounded by the step's own size and collected after it."""

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
