"""What a search can say about its answer: the best plan found and a proven lower bound on
the optimum, i.e. the gap (issue 36 item 1).

Every answer of ``meshplan tune`` is an interval: the best feasible plan found (an upper
bound on the optimum: its step time ``X``) and a lower bound ``Y`` on the step time of
every plan of the space that was not scored and may fit. The optimum lies in
``[min(X, Y), X]``; the gap is ``(X - Y) / Y``, how much slower than the optimum the
answer can at most be (0 when ``Y >= X``: ``X`` is the proven optimum; "best 71.7 s, no
plan faster than 57.3 s: within 25.1% of the optimum"). Where ``Y`` comes from:

- the branch-and-bound search (the default, ``tuner.exhaustive``): every candidate not
  evaluated stays on its heap under a lower bound (the tier-0 bound, then the layout and
  the tight bounds of ``meshplan.tuning.make_scorer``); when the search stops unproven
  (``--time-budget``, ``--trials``) the smallest key left is ``Y``;
- a sampled search (TPE, random): :func:`tuner.sampled_gap.sampled_gap` runs the same branch and bound over
  the enumerable space with the plans the sampler scored as its only evaluations (nothing
  is simulated): it refines the smallest bounds until the smallest one belongs to a plan
  the sampler did not score, or until its own time is up; that key is ``Y``.

A plan the engine refuses after the legality rules has no step time, and no bound covers
it: the proof then does not hold (:attr:`SearchAnswer.refused`). Per mesh shape
(:func:`shape_bounds`) the same bound is kept, so that the report can say of each shape
whether its best plan is proven, bounded, or cannot fit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: the study user attr holding the answer of the last search that ran on it
ANSWER_ATTR = "answer"


def shape_key(c: Any) -> str:
    """The mesh shape of a candidate (``dp4 cp2 tp4 pp2 ep4``: cp and ep only when > 1),
    as the report names it (``tuner.result.mesh_words``)."""
    from tuner.result import mesh_words

    return mesh_words({"dp": c.dp, "cp": c.cp, "tp": c.tp, "pp": c.pp, "ep": c.ep})


def open_min(values: np.ndarray) -> tuple[int, float | None]:
    """(count, smallest) of the lower bounds of candidates not evaluated that may fit
    (not NaN: evaluated, not inf: cannot fit); the smallest is None when there is none
    or one is unbounded (-inf)."""
    live = values[~np.isnan(values) & ~np.isposinf(values)]
    if not len(live):
        return 0, None
    low = float(live.min())
    return len(live), (None if math.isinf(low) else low)


def shape_bounds(candidates: Sequence[Any], lower: Any) -> dict[str, dict[str, Any]]:
    """Per mesh shape (:func:`shape_key`) of ``candidates``: ``candidates`` (count),
    ``cannot_fit`` (a memory bound exceeds the limit: ``lower`` inf), ``unscored`` (not
    evaluated and may fit) and ``lower_bound_s``, the smallest lower bound on their step
    time (None when none is unscored or one of them has no bound). ``lower``: per
    candidate its final lower bound (``ExhaustiveReport.lower``: NaN evaluated, inf cannot
    fit); None gives an empty mapping."""
    if lower is None:
        return {}
    lower = np.asarray(lower, dtype=float)
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(candidates):
        groups.setdefault(shape_key(c), []).append(i)
    out = {}
    for key, idx in groups.items():
        vals = lower[idx]
        n, low = open_min(vals)
        out[key] = {"candidates": len(idx), "cannot_fit": int(np.isposinf(vals).sum()),
                    "unscored": n, "lower_bound_s": low}
    return out


def merge_shapes(parts: Iterable[Mapping[str, Mapping[str, Any]] | None]) -> dict[str, dict[str, Any]]:
    """The union of :func:`shape_bounds` mappings over disjoint parts of a space (the slices
    of a shared search): counts add up, the bound is the smallest (None when a part with
    unscored candidates of that shape has none)."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for key, b in (part or {}).items():
            m = out.setdefault(key, {"candidates": 0, "cannot_fit": 0, "unscored": 0,
                                     "lower_bound_s": math.inf})
            for f in ("candidates", "cannot_fit", "unscored"):
                m[f] += int(b[f])
            if b["unscored"]:
                low = b["lower_bound_s"]
                m["lower_bound_s"] = None if low is None or m["lower_bound_s"] is None else min(
                    m["lower_bound_s"], float(low))
    for m in out.values():
        if m["unscored"] == 0:
            m["lower_bound_s"] = None
    return out


@dataclass
class SearchAnswer:
    """The answer of one search and what is proven about it (module docstring).

    Attributes:
        sampler: the search (``exhaustive``: branch and bound; ``tpe``, ``random``, ...).
        best_s: step time (s) of the best feasible plan found (None: none found).
        lower_bound_s: no plan of the bounded space that was not scored and may fit is
            faster than this (s); None: unknown (a candidate without a bound, or the
            bounding stopped before every candidate had one); absent of ``best_s``, None
            also when nothing is open.
        proven: the bounds decided every candidate of the bounded space: ``best_s`` is its
            optimum (or, with no best, no plan of it fits).
        space_size: candidates of the bounded space; what: which plans that is (every
            legal plan, or full_random's tp=1 part).
        scored: distinct plans scored (simulated or read back from the study);
            refused: of them, plans the engine refused after the legality rules (the
            proof does not hold over them: ``holds``).
        stopped_by: why an unproven search stopped (``time budget``, ``trial budget``).
        seconds: wall seconds of the search (and of its bounding).
        shapes: per mesh shape the bounds of :func:`shape_bounds`.
        refusal: the first refusal message.
    """

    sampler: str
    best_s: float | None
    lower_bound_s: float | None
    proven: bool
    space_size: int | None = None
    what: str = "every legal plan of the space"
    scored: int = 0
    refused: int = 0
    stopped_by: str | None = None
    seconds: float = 0.0
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusal: str | None = None

    @property
    def holds(self) -> bool:
        """The optimum is proven: every candidate decided and none refused by the engine."""
        return self.proven and not self.refused

    @property
    def optimum_at_least_s(self) -> float | None:
        """A proven lower bound on the optimum's step time (s): ``best_s`` when proven,
        else ``min(best_s, lower_bound_s)`` (None: unknown, or no plan found and nothing
        bounded)."""
        if self.refused:
            return None
        if self.proven:
            return self.best_s
        if self.lower_bound_s is None:
            return None
        return self.lower_bound_s if self.best_s is None else min(self.best_s, self.lower_bound_s)

    @property
    def gap(self) -> float | None:
        """``(best - lower) / lower``: at most how much slower than the optimum the best plan
        is (>= 0; 0 when proven); None when there is no best or no positive lower bound."""
        low = self.optimum_at_least_s
        if self.best_s is None or low is None or low <= 0:
            return None
        return max(0.0, (self.best_s - low) / low)

    def summary(self) -> str:
        """One line: ``best 71.7 s; no plan in the space is faster than 57.3 s: within
        25%`` (or proven, or why the gap is unknown)."""
        best = "no feasible plan found" if self.best_s is None else f"best {_s(self.best_s)}"
        where = "the space" if self.what.startswith("every") else f"the space ({self.what})"
        if self.refused:
            return (f"{best}; NOT a proof: the engine refused {self.refused} plan(s) that passed "
                    f"the legality rules (first: {self.refusal}); no bound covers them")
        if self.holds:
            if self.best_s is None:
                return f"no plan in {where} fits in memory (proven by the memory bounds)"
            return f"{best}: the proven optimum of {where} (gap 0%)"
        why = f" (stopped by its {self.stopped_by})" if self.stopped_by else ""
        if self.lower_bound_s is None:
            return (f"{best}{why}; no lower bound over the plans not scored yet: the gap to the "
                    "optimum is unknown")
        low = f"no plan in {where} is faster than {_s(self.optimum_at_least_s or self.lower_bound_s)}"
        if self.best_s is None:
            return f"{best}{why}; {low}"
        return f"{best}{why}; {low}: within {self.gap:.1%} of the optimum"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields and the derived ``gap`` and ``optimum_at_least_s``."""
        d = asdict(self)
        d["gap"] = self.gap
        d["optimum_at_least_s"] = self.optimum_at_least_s
        d["holds"] = self.holds
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SearchAnswer:
        """Inverse of :meth:`to_dict` (derived and unknown keys ignored)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _s(t: float) -> str:
    """A step time for the summary: ``71.7 s`` from a second up, else ``523.4 ms``."""
    return f"{t:,.1f} s" if t >= 1.0 else f"{t * 1e3:,.1f} ms"


def from_report(rep: Any, sampler: str = "exhaustive", stopped_by: str | None = None,
                what: str = "every legal plan of the space", best_s: float | None = None,
                scored: int | None = None, seconds: float | None = None) -> SearchAnswer:
    """The :class:`SearchAnswer` of an ``ExhaustiveReport`` (a branch-and-bound search, or
    the bounding pass of :func:`tuner.sampled_gap.sampled_gap`); ``best_s``, ``scored``, ``seconds``
    override the report's (a sampled search's own best, trials and time)."""
    open_bound = rep.open_bound_s
    if open_bound is not None and not math.isfinite(open_bound):
        open_bound = None  # an unbounded candidate is open: nothing is known below it
    proven = bool(rep.proven)
    low = None if proven else open_bound
    return SearchAnswer(sampler=sampler, best_s=rep.best_time_s if best_s is None else best_s,
                        lower_bound_s=low, proven=proven, space_size=rep.space_size, what=what,
                        scored=rep.simulated if scored is None else scored, refused=rep.refused,
                        stopped_by=None if proven else stopped_by,
                        seconds=rep.seconds if seconds is None else seconds,
                        shapes=dict(rep.shapes or {}), refusal=getattr(rep, "refusal", None))


#: seconds the bounding pass of a sampled search may take at least, and its share of the
#: search's own time budget beyond that (:func:`gap_seconds`)
GAP_MIN_S, GAP_SHARE = 5.0, 0.25


def gap_seconds(budget_s: float | None) -> float:
    """The time the bounding pass after a sampled search may take: ``GAP_MIN_S`` or
    ``GAP_SHARE`` of the search's budget, whichever is larger (30 s without a budget)."""
    return 30.0 if budget_s is None else max(GAP_MIN_S, GAP_SHARE * budget_s)


__all__ = ["ANSWER_ATTR", "GAP_MIN_S", "GAP_SHARE", "SearchAnswer", "from_report", "gap_seconds",
           "merge_shapes", "open_min", "shape_bounds", "shape_key"]
