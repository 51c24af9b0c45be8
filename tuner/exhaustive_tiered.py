"""Branch and bound with two bounds: a cheap one for every candidate, the tight one on demand.

The tight bound of :mod:`tuner.exhaustive` (``scorer.bound``) needs the candidate's layout
costed (a completion per distinct layer layout, 0.15-0.4 s). A scorer may also carry
``cheap_bound`` (``meshplan.bounds.tier0.Tier0Bound``: no completion, microseconds) whose time and
memory are also lower bounds on the simulated ones, usually looser. :func:`prove_tiered`
runs a best-first search over both:

1. every candidate is cheap-bounded; one whose cheap memory bound exceeds its limit is
   pruned (``pruned_cheap``) without costing its layout;
2. a heap holds each open candidate under its best known time bound (cheap, then
   ``max(cheap, tight)`` once tight-bounded). The smallest entry is taken: a cheap one is
   tight-bounded (memory over the limit: ``pruned_memory``; else back on the heap under
   its tight bound), a tight one is simulated;
3. once the smallest entry is at least the best feasible time found (or the
   ``incumbent``), every entry left is at least it: those still cheap are pruned by the
   cheap bound (``pruned_cheap``: their layouts are never costed), the others by time.

Why the answer is the optimum: every entry's key is a lower bound on its candidate's
simulated time (both bounds are, so is their max), and a candidate leaves the heap only
when simulated, pruned by a memory bound (it cannot fit), or when its key is at least a
feasible time found -- so no pruned candidate is faster than the best found. Until a
feasible plan is known, a candidate is simulated as soon as it is tight-bounded (a dive:
the best cheap candidates give the first incumbent, which then prunes, and a search
stopped by its timeout has a plan to report); after that, in key order, except that
once :data:`READY_EVERY` tight bounds went without a simulation the tight-bounded plan of
smallest key is simulated out of turn (a better incumbent early, :class:`_Dive`).
The counts ``simulated + pruned_memory + pruned_time + pruned_cheap`` add up to the space.

An optional middle bound (``middle``: a layout-level bound, cheap once the layout is costed)
adds a tier between the two: once a feasible plan is known, a cheap entry taken from the
heap goes back under ``max(cheap, middle)`` and is tight-bounded only when it comes up
again; the argument above holds unchanged (every key is still a lower bound).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from tuner.errors import TunerError
from tuner.exhaustive_report import Evaluate, ExhaustiveReport, bound_arrays

#: tight(i) -> (time_s, memory_bytes, memory_limit_bytes) lower bounds of candidate i
Tight = Callable[[int], "tuple[float, float, float]"]


def prove_tiered(cheap_time: Sequence[float], cheap_memory: Sequence[float], memory_limit: Sequence[float],
                 tight: Tight, evaluate: Evaluate, deadline: float | None = None,
                 incumbent: Callable[[], float] | None = None,
                 middle: Callable[[int], float] | None = None,
                 stop: Callable[[], bool] | None = None,
                 can_evaluate: Callable[[int], bool] | None = None) -> ExhaustiveReport:
    """Best-first branch and bound over candidates ``0 .. n-1`` (module docstring).

    Args:
        cheap_time, cheap_memory, memory_limit: per candidate its cheap bounds and limit.
        tight: the tight bounds of candidate i (a time of -inf: unbounded, simulated next).
        evaluate: scores candidate i (``tuner.exhaustive.Evaluate``).
        deadline, incumbent: as :func:`tuner.exhaustive.prove_best`.
        middle: an optional time bound of candidate i between the cheap and the tight one
            (``meshplan.bounds.layout.SharedLayoutBound.layout_time``: cheap once its layout
            is costed). Once a feasible plan is known, a cheap entry taken from the heap
            gets it first and goes back under ``max(cheap, middle)``; only when that
            entry comes up again is it tight-bounded. An entry pruned while at this tier
            counts as pruned by time.
        stop: called before each step; True stops the search unproven (a trial budget).
        can_evaluate: whether candidate i may be evaluated now (None: every one); the
            search stops unproven at the first one that may not (a sampled search's gap:
            only the plans it scored are evaluated, :mod:`tuner.gap`).
    Returns an :class:`ExhaustiveReport` (``resumed`` left 0). When it stops unproven,
    ``open_bound_s`` is the smallest key still on the heap: a lower bound on the step time
    of every candidate not decided (``open`` of them), so the optimum is at least
    ``min(best, open_bound_s)``. ``rep.lower`` (not serialised) holds each candidate's
    final lower bound: its key when it was not evaluated, inf when a memory bound proved
    it cannot fit, NaN when evaluated. Raises TunerError on arrays of different shapes or
    a NaN bound."""
    t0, m0, cap = bound_arrays(cheap_time, cheap_memory, memory_limit, "a cheap lower bound")
    rep = ExhaustiveReport(space_size=len(t0))
    lower = t0.copy()
    fits = m0 <= cap
    lower[~fits] = math.inf
    rep.lower = lower
    rep.pruned_cheap = int((~fits).sum())
    heap: list[tuple[float, int, int]] = [(float(t0[i]), 0, int(i)) for i in np.flatnonzero(fits)]
    heapq.heapify(heap)
    dive = _Dive(t0, m0, cap, fits) if can_evaluate is None else None
    best = math.inf

    def tightened(i: int) -> tuple[float, float, float]:
        """``tight(i)``, counted for the dives, refused when NaN."""
        if dive is not None:
            dive.tightened[i] = True
            dive.tight_count += 1
        t, m, c = tight(i)
        if math.isnan(t) or math.isnan(m):
            raise TunerError(f"the tight lower bound of candidate {i} is NaN")
        return t, m, c

    while True:
        while heap and dive is not None and dive.done[heap[0][2]]:
            heapq.heappop(heap)  # evaluated by a dive meanwhile
        if not heap:
            break
        key, tier, i = heap[0]
        bar = best if incumbent is None else min(best, incumbent())
        if key >= bar:
            live = [e for e in heap if dive is None or not dive.done[e[2]]]
            cheap_left = sum(1 for e in live if e[1] == 0)
            rep.pruned_cheap += cheap_left
            rep.pruned_time += len(live) - cheap_left
            break
        if ((deadline is not None and time.monotonic() > deadline) or (stop is not None and stop())
                or (tier == 2 and can_evaluate is not None and not can_evaluate(i))):
            rep.open_bound_s = key
            rep.open = sum(1 for e in heap if dive is None or not dive.done[e[2]])
            rep.pruned_cheap = int((~fits).sum())  # memory prunes stand
            rep.pruned_time = 0
            rep.best_time_s = None if rep.best_index is None else best  # the best so far
            return rep
        j = None if dive is None else dive.pick(bar, lower)
        if j is not None:  # a dive: a plan likely to fit, simulated before its turn
            i = j
            if not dive.tightened[i]:
                t, m, c = tightened(i)
                if m > c:  # its tight memory bound proves it cannot fit: never simulated
                    rep.pruned_memory += 1
                    lower[i], dive.done[i] = math.inf, True
                    continue
        else:
            heapq.heappop(heap)
            known = math.isfinite(bar)
            if tier == 0 and middle is not None and known:
                t = middle(i)
                if math.isnan(t):
                    raise TunerError(f"the layout lower bound of candidate {i} is NaN")
                lower[i] = max(key, t)
                heapq.heappush(heap, (lower[i], 1, i))
                continue
            if tier <= 1:
                t, m, c = tightened(i)
                if m > c:
                    rep.pruned_memory += 1
                    lower[i] = math.inf
                    continue
                lower[i] = max(key, t)
                if known or (can_evaluate is not None and not can_evaluate(i)):
                    heapq.heappush(heap, (lower[i], 2, i))
                    if dive is not None:
                        dive.ready(lower[i], i)
                    continue
                # no feasible plan known yet: simulate it now (a dive) for a first incumbent
        rec = evaluate(i)
        lower[i] = math.nan
        rep.simulated += 1
        if dive is not None:
            dive.scored(i, rec)
        if rec is None:
            rep.refused += 1
            continue
        ts, mem, limit = rec
        if mem <= limit and ts < best:
            best, rep.best_index = ts, i
    rep.best_time_s = None if rep.best_index is None else best
    rep.proven = True
    return rep


#: once a feasible plan is known, the tight-bounded plan of smallest bound is simulated out of
#: turn when this many tight bounds were computed since the last simulation (:class:`_Dive`)
READY_EVERY = 8


class _Dive:
    """Which candidate to simulate out of bound order, for a good feasible incumbent early.

    The best-first order simulates first the plans of smallest time bound, which are often
    the ones that hold the most memory (no recompute, large micro-batches) and, where the
    memory bound is loose, do not fit: a search stopped by its budget then has no plan, or
    a poor one. While no feasible plan is known, a dive takes instead the candidate of
    smallest cheap time bound whose cheap memory bound, scaled by the largest peak /
    cheap-bound ratio seen on a plan that did not fit (``rho``, learned as plans are
    simulated), still fits -- every second dive the lightest plan left instead. A dive
    candidate is tight-bounded first (its tight memory bound may still prune it), as every
    candidate is before it is simulated.

    Once a feasible plan is known, the best-first order simulates nothing until every
    cheap entry below the next tight one is tight-bounded: where the cheap bound is loose
    (Llama-3.1-405B on 2,048 GPUs: thousands of cheap bounds below the optimum, 30-80 ms
    per tight bound) a search stopped by its budget keeps its first plan. A dive then takes
    the tight-bounded plan of smallest key below the best found (``ready``) once
    :data:`READY_EVERY` tight bounds were computed without a simulation: the plan the
    best-first order would simulate first among those it has tight-bounded, simulated
    before the cheap entries below it are. The order of simulation does not change what is
    proven (every evaluated plan is a plan of the space; the heap's keys stay lower
    bounds), only how soon a good plan is found."""

    def __init__(self, t0: np.ndarray, m0: np.ndarray, cap: np.ndarray, fits: np.ndarray) -> None:
        self.m0, self.cap = m0, cap
        idx = np.flatnonzero(fits)
        self.order = idx[np.argsort(t0[idx], kind="stable")]
        self.lean = idx[np.lexsort((t0[idx], m0[idx] / cap[idx]))]  # lightest first, then fastest
        self.done = np.zeros(len(t0), dtype=bool)
        self.tightened = np.zeros(len(t0), dtype=bool)
        self.rho, self.at, self.lean_at, self.count = 1.0, 0, 0, 0
        self.heap: list[tuple[float, int]] = []  # tight-bounded plans not simulated, by key
        self.tight_count = self.tight_at_sim = 0

    def ready(self, key: float, i: int) -> None:
        """Record that candidate ``i`` is tight-bounded, under ``key``, and not simulated."""
        heapq.heappush(self.heap, (key, i))

    def pick(self, bar: float, lower: np.ndarray) -> int | None:
        """The next dive candidate (None: not a dive's turn, or none left below ``bar``).
        While no feasible plan is known, every second one is the lightest plan left by its
        cheap memory bound (it fits if anything does, where the bound orders plans as their
        peaks do), the others the fastest likely to fit; then the ready plan of smallest
        key once :data:`READY_EVERY` tight bounds went without a simulation."""
        if math.isfinite(bar):
            if self.tight_count - self.tight_at_sim < READY_EVERY:
                return None
            while self.heap and (self.done[self.heap[0][1]] or math.isinf(lower[self.heap[0][1]])):
                heapq.heappop(self.heap)
            return self.heap[0][1] if self.heap and self.heap[0][0] < bar else None
        if self.count % 2:
            while self.lean_at < len(self.lean):
                j = int(self.lean[self.lean_at])
                if not self.done[j] and not math.isinf(lower[j]):
                    return j
                self.lean_at += 1
        while self.at < len(self.order):
            j = int(self.order[self.at])
            if not self.done[j] and not math.isinf(lower[j]) and float(self.m0[j]) * self.rho <= self.cap[j]:
                return j
            self.at += 1  # evaluated, pruned, or too heavy for the ratio (it only grows)
        return None

    def scored(self, i: int, rec: tuple[float, int, int] | None) -> None:
        """Record that candidate ``i`` was simulated (``rec``: its time, peak, limit)."""
        self.done[i] = True
        self.count += 1
        self.tight_at_sim = self.tight_count
        if rec is not None and rec[1] > rec[2] and self.m0[i] > 0:
            # a peak over a cheap bound near 0 makes the ratio unbounded: no heavier plan dives
            ratio = rec[1] / float(self.m0[i])
            self.rho = max(self.rho, ratio)


__all__ = ["READY_EVERY", "Tight", "prove_tiered"]
