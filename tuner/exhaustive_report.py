"""The records of an exhaustive search (:mod:`tuner.exhaustive`): a candidate's lower
:class:`Bound`, the :class:`ExhaustiveReport` of counts and answer, and the ``Evaluate``
callback type. Apart so that the searches (``tuner.exhaustive``,
``tuner.exhaustive_tiered``, ``tuner.exhaustive_shared``) share them without importing
each other."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tuner.errors import TunerError


class Bound(NamedTuple):
    """Lower bounds of one candidate: ``time_s`` (s) <= its simulated step time,
    ``memory_bytes`` <= its peak memory; ``memory_limit_bytes`` the device capacity."""

    time_s: float
    memory_bytes: int
    memory_limit_bytes: int


@dataclass
class ExhaustiveReport:
    """Counts of a branch-and-bound search (they add up to ``space_size``) and its answer.

    ``simulated`` counts every candidate decided by a score: scored here, ``resumed`` of
    them read back from the study, ``refused`` of them rejected by the scorer (an engine
    limit). ``best_index`` indexes the candidate list (None: nothing feasible);
    ``proven`` is False when a timeout stopped the search before the bound passed the best
    (``open_bound_s``: the smallest time bound still open then)."""

    space_size: int
    simulated: int = 0
    resumed: int = 0
    refused: int = 0
    pruned_memory: int = 0
    pruned_time: int = 0
    pruned_cheap: int = 0
    """Candidates pruned by the scorer's cheap (tier-0) bound, time or memory, before their
    layout was costed (``scorer.cheap_bound``; 0 without one)."""
    best_index: int | None = None
    best_time_s: float | None = None
    proven: bool = False
    open_bound_s: float | None = None
    seconds: float = 0.0
    bounded: int | None = None
    """Candidates bounded before a timeout (None: all were)."""
    slices: int | None = None
    """Slices the space was cut into for shared workers (None: one process, no slices)."""
    slices_done: int | None = None
    """Slices finished (== ``slices`` when proven)."""
    workers: int | None = None
    """Distinct worker processes that finished a slice."""
    open: int = 0
    refusal: str | None = None
    """The first refusal message of the scorer (``refused`` > 0)."""
    """Candidates still undecided when the search stopped unproven (their smallest bound
    is ``open_bound_s``); 0 when proven."""
    shapes: dict[str, Any] | None = None
    """Per mesh shape (``tuner.gap.shape_key``): the smallest lower bound on the step time
    of its candidates not evaluated that may fit (``lower_bound_s``, None: none), and how
    many of its candidates a memory bound proved cannot fit (``cannot_fit``) out of
    ``candidates`` (:func:`tuner.gap.shape_bounds`)."""
    lower: Any = None
    """Per candidate (the search's own order) its final lower bound (not serialised; see
    :func:`tuner.exhaustive_tiered.prove_tiered`)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (a non-finite ``open_bound_s`` becomes None)."""
        d = dict(self.__dict__)
        d.pop("lower", None)
        if d["open_bound_s"] is not None and not math.isfinite(d["open_bound_s"]):
            d["open_bound_s"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExhaustiveReport:
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def holds(self) -> bool:
        """The proof holds: every candidate decided (``proven``) and none refused by the
        engine (a refused plan has no step time and no bound: the optimum may be it)."""
        return self.proven and not self.refused

    @property
    def decided(self) -> int:
        """Candidates simulated or pruned by a proven bound."""
        return self.simulated + self.pruned_memory + self.pruned_time + self.pruned_cheap

    def summary(self) -> str:
        """One line for the tune report: the counts (they add up to the space: the
        candidates still ``open`` when a search stopped unproven are named), the best and
        whether the proof holds."""
        best = "no feasible plan" if self.best_time_s is None else f"best {self.best_time_s * 1e3:.1f} ms"
        if self.holds:
            state = "proven optimum of the model over the space"
        elif self.proven:
            state = (f"NOT a proof: the engine refused {self.refused} candidate(s) after the "
                     f"legality rules, which no bound covers (first: {self.refusal})")
        elif self.slices is not None:
            stop = ("" if self.open_bound_s is None or not math.isfinite(self.open_bound_s) else
                    f"; smallest open bound {self.open_bound_s * 1e3:.1f} ms")
            state = (f"NOT proven (stopped with {self.slices - (self.slices_done or 0)} of "
                     f"{self.slices} slices open{stop}; rerun to resume)")
        elif self.open_bound_s is None or not math.isfinite(self.open_bound_s):
            done = "" if self.bounded is None else f"; {self.bounded} bounded"
            state = f"NOT proven (stopped before every candidate was bounded{done})"
        else:
            state = f"NOT proven (stopped; smallest open bound {self.open_bound_s * 1e3:.1f} ms)"
        rate = self.decided / self.seconds if self.seconds > 0 else float("inf")
        shared = ("" if self.slices is None else
                  f"; {self.slices_done} of {self.slices} slices finished by {self.workers or 0} worker(s)")
        left = f" + {self.open} open" if self.open else ""
        return (f"exhaustive: {self.space_size} candidates = {self.simulated} simulated "
                f"({self.resumed} resumed from the study, {self.refused} refused by the engine) "
                f"+ {self.pruned_memory} pruned by memory + {self.pruned_time} pruned by time "
                f"+ {self.pruned_cheap} pruned by the cheap bound{left}; "
                f"{best}; {state}{shared}; {self.seconds:.1f} s ({rate:.0f} decided/s)")


#: evaluate(i) -> (time_s, memory_bytes, memory_limit_bytes), or None when the scorer
#: refused candidate i (it then never counts as the best)
Evaluate = Callable[[int], "tuple[float, int, int] | None"]


def bound_arrays(time_lb: Any, memory_lb: Any, memory_limit: Any,
                 what: str = "a lower bound") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-candidate time bounds, memory bounds and memory limits as float arrays of
    one length. Raises TunerError naming the shapes when they differ, or ``what`` when a
    bound is NaN."""
    t = np.asarray(time_lb, dtype=float)
    m = np.asarray(memory_lb, dtype=float)
    cap = np.asarray(memory_limit, dtype=float)
    if not t.shape == m.shape == cap.shape or t.ndim != 1:
        raise TunerError(f"bounds of different shapes: {t.shape}, {m.shape}, {cap.shape}")
    if np.isnan(t).any() or np.isnan(m).any():
        raise TunerError(f"{what} is NaN")
    return t, m, cap
