"""The default search of ``meshplan tune`` (``--sampler exhaustive``): the proven optimum of an
enumerable space, by branch and bound.

Every legal candidate of the space (``tuner.suggest.enumerate_candidates``) gets a lower
bound on its step time and on its peak memory (the scorer's ``bound`` attribute: for the
cost model ``meshplan.tuning.make_scorer``, ``simulator.bounds.step.step_lower_bound``,
from the stage times and the schedule's ideal warm-up bubble; no schedule is built or
played). Then (:func:`prove_best`):

1. a candidate whose memory bound exceeds the device memory cannot fit: pruned by memory;
2. the rest are simulated in increasing order of their time bound; as soon as the next
   bound is at least the best feasible time found, neither it nor any later candidate can
   be faster: all pruned by time.

The best feasible candidate found is then the optimum of the model over the space (ties:
the first in bound order), and ``simulated + pruned_memory + pruned_time`` is the space
size. Stopped earlier (a time or trial budget: ``meshplan tune``'s default search, issue
36) it reports the smallest bound still open, below which no undecided plan can be
(``tuner.gap``: the answer's gap); a plan the scorer refuses leaves the proof not holding
(``ExhaustiveReport.holds``). Each simulated candidate is one trial written in one storage call
(``Study.add_trial``) with the same record the Optuna path writes (``plan``, ``plan_key``,
``time_s``, ``memory_bytes``, ``memory_limit_bytes``, ``metrics``; ``error`` for a plan
the scorer refused), so a killed search resumes from the study's history without
simulating again what it finished (``resumed`` in the report).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.exhaustive_report import Bound, Evaluate, ExhaustiveReport, bound_arrays
from tuner.gap import shape_bounds
from tuner.result import MEMORY_CONSTRAINT, memory_constraint, record_attrs


def prove_best(time_lb: Sequence[float], memory_lb: Sequence[float], memory_limit: Sequence[float],
               evaluate: Evaluate, deadline: float | None = None,
               incumbent: Callable[[], float] | None = None,
               stop: Callable[[], bool] | None = None,
               can_evaluate: Callable[[int], bool] | None = None) -> ExhaustiveReport:
    """Branch and bound over candidates ``0 .. n-1`` (module docstring, steps 1-2).

    Args:
        time_lb, memory_lb, memory_limit: per candidate, its bounds and device capacity
            (arrays of equal length; a time bound of -inf: no bound, simulated first).
        evaluate: scores candidate i (see :data:`Evaluate`).
        deadline: ``time.monotonic()`` value after which the search stops unproven.
        incumbent: the step time (s) of the best feasible plan other searchers of the same
            space found so far (``inf``: none), read before each candidate; a candidate is
            pruned by time once its bound is at least ``min(local best, incumbent())``.
            Sound as long as the incumbent is the time of a feasible plan of the space (an
            upper bound on the optimum): a slice of the space pruned against it holds no
            plan faster than the best of the union (:mod:`tuner.exhaustive_shared`).
        stop: called before each candidate; True stops the search unproven.
        can_evaluate: whether candidate i may be evaluated (None: all); the search stops
            unproven at the first that may not (:func:`tuner.exhaustive_tiered.prove_tiered`).
    Returns an :class:`ExhaustiveReport` (``resumed`` left 0; ``lower`` and, when stopped,
    ``open_bound_s`` and ``open`` as :func:`tuner.exhaustive_tiered.prove_tiered` sets them).
    Raises TunerError on arrays of different lengths or a NaN bound."""
    t_lb, m_lb, cap = bound_arrays(time_lb, memory_lb, memory_limit)
    rep = ExhaustiveReport(space_size=len(t_lb))
    fits = m_lb <= cap
    rep.lower = np.where(fits, t_lb, math.inf)
    rep.pruned_memory = int((~fits).sum())
    idx = np.flatnonzero(fits)
    order = idx[np.argsort(t_lb[idx], kind="stable")]
    best = math.inf
    for pos, i in enumerate(order):
        if t_lb[i] >= (best if incumbent is None else min(best, incumbent())):
            rep.pruned_time = len(order) - pos
            break
        if ((deadline is not None and time.monotonic() > deadline) or (stop is not None and stop())
                or (can_evaluate is not None and not can_evaluate(int(i)))):
            rep.open_bound_s, rep.open = float(t_lb[i]), len(order) - pos
            rep.pruned_time = 0
            rep.best_time_s = None if rep.best_index is None else best  # the best so far
            return rep
        rec = evaluate(int(i))
        rep.lower[i] = math.nan
        rep.simulated += 1
        if rec is None:
            rep.refused += 1
            continue
        t, mem, limit = rec
        if mem <= limit and t < best:
            best, rep.best_index = t, int(i)
    rep.best_time_s = None if rep.best_index is None else best
    rep.proven = True
    return rep


def plan_key(candidate: Any) -> str:
    """The study's key of a candidate (the Optuna path's ``plan_key``)."""
    return json.dumps(candidate.to_dict(), sort_keys=True)


def _record_trial(study: optuna.Study, candidate: Any, key: str, rec: dict[str, Any], lb: float) -> None:
    """Write one finished trial (one storage call): COMPLETE with the score record
    (``tuner.study.record_attrs``: ``feasible`` and the memory figures too) and the
    ``memory`` constraint, or PRUNED with the scorer's error."""

    attrs = {"plan": candidate.to_dict(), "plan_key": key, "exhaustive_time_bound_s": lb}
    if "error" in rec:
        attrs["error"] = rec["error"]
        trial = optuna.trial.create_trial(state=TrialState.PRUNED, user_attrs=attrs)
    else:
        attrs.update(record_attrs(rec))
        n_obj = len(study.directions)
        values = [rec["time_s"], float(rec["memory_bytes"])][:n_obj]
        # the key trial.set_constraint writes (the Optuna path's constraint, by name)
        trial = optuna.trial.create_trial(
            state=TrialState.COMPLETE, values=values, user_attrs=attrs,
            system_attrs={f"constraints:{MEMORY_CONSTRAINT}": memory_constraint(rec)})
    study.add_trial(trial)


def _memoised(store: dict[str, dict[int, Any]], name: str, candidates: Sequence[Any],
              fn: Callable[[Any], Any]) -> Callable[[int], Any]:
    """Candidate index -> ``fn(candidates[j])``, kept in ``store[name]`` (a search's bounds,
    reused when it comes round again)."""
    known = store.setdefault(name, {})

    def get(j: int) -> Any:
        v = known.get(j)
        if v is None:
            v = known[j] = fn(candidates[j])
        return v
    return get


def first_tier_bounds(scorer: Any, candidates: Sequence[Any], store: dict[str, dict[int, Any]]
                      ) -> Callable[[int], tuple[float, float, float]]:
    """Candidate index -> its first-tier bound (time s, memory bytes, limit bytes): the
    scorer's ``cheap_bound`` when it has one (kept in ``store["cheap"]``), else its
    ``bound`` (``store["tight"]``), as :func:`run_exhaustive` bounds every candidate first."""
    cheap = getattr(scorer, "cheap_bound", None)
    fn = cheap or scorer.bound
    return _memoised(store, "cheap" if cheap is not None else "tight", candidates,
                     lambda c: candidate_bounds(fn, c))


def candidate_bounds(bound: Callable[[Any], Bound], c: Any) -> tuple[float, float, float]:
    """(time, memory, limit) of ``bound(c)``; a ValueError (a plan the engine refuses)
    gives no bound: (-inf, 0, 1), simulated early and refused by the scorer the same way."""
    try:
        b = bound(c)
    except ValueError:
        return -math.inf, 0.0, 1.0
    return float(b.time_s), float(b.memory_bytes), float(b.memory_limit_bytes)


def run_exhaustive(study: optuna.Study, candidates: Sequence[Any], scorer: Any,
                   history: dict[str, dict[str, Any]], timeout: float | None = None,
                   on_scored: Callable[[int], None] | None = None,
                   members: Sequence[int] | None = None,
                   incumbent: Callable[[], float] | None = None,
                   tick: Callable[[], None] | None = None,
                   max_simulated: int | None = None,
                   only_cached: bool = False,
                   quantum: float | None = None,
                   memo: dict[str, dict[int, Any]] | None = None) -> ExhaustiveReport:
    """Prove the best of ``candidates`` with ``scorer`` (which must carry ``bound``),
    reusing the records in ``history`` (plan_key -> record, ``tuner.result.history_cache``)
    and writing every new score to ``study`` as one trial. ``timeout`` (seconds) stops the
    search unproven, also while it is still bounding; so does ``max_simulated`` (a trial
    budget: at most that many candidates scored or read back). ``only_cached``: evaluate
    only the candidates ``history`` holds, stopping at the first other one (nothing is
    simulated: the bound a sampled search leaves, :func:`tuner.sampled_gap.sampled_gap`).
    ``quantum`` (seconds) stops the branch and bound that long after the bounding (a
    shared search's turn on one slice, :func:`tuner.exhaustive_shared.run_shared`).
    ``memo``: the bounds of earlier calls on the same ``candidates`` with the same scorer
    (``"cheap"``, ``"tight"``, ``"layout"``: candidate index -> its bounds), filled here:
    a slice taken again reuses them instead of bounding its members anew (the bounds are
    functions of the candidate, so the search is the same).

    A candidate the scorer refuses (a ValueError: an engine limit legality does not model)
    has no step time and no bound covers it: the report's proof then does not hold
    (``ExhaustiveReport.holds``; ``refused``, ``refusal`` the first message: the optimum may
    be among them).
    The report's ``shapes`` holds the bounds per mesh shape (:func:`tuner.gap.shape_bounds`).

    ``members`` (indices into ``candidates``; None: all) restricts the search to one slice
    of the space, ``incumbent`` is the best time other workers found (see
    :func:`prove_best`), and ``tick`` is called before each candidate is bounded or
    scored (a worker's heartbeat). The report's ``space_size`` is the number of members
    and ``best_index`` indexes ``candidates``.

    A scorer that also carries ``cheap_bound`` (a bound needing no layout costs) is
    searched best-first over both (:func:`tuner.exhaustive_tiered.prove_tiered`): every
    candidate cheap-bounded, ``bound`` computed only for those the cheap bound cannot prune
    (and, when ``bound`` has a ``layout_time`` -- ``meshplan.bounds.layout`` --, that
    layout-level bound in between).

    Raises TunerError when the scorer has no ``bound``; a ValueError of a bound marks the
    candidate unbounded (it is simulated, and the scorer refuses it the same way)."""
    bound = getattr(scorer, "bound", None)
    if bound is None:
        raise TunerError("--sampler exhaustive needs a scorer with a lower bound (a 'bound' attribute)")
    t0 = time.monotonic()
    deadline = None if timeout is None else t0 + timeout
    idx = list(range(len(candidates))) if members is None else [int(i) for i in members]
    cheap = getattr(scorer, "cheap_bound", None)
    store: dict[str, dict[int, Any]] = {} if memo is None else memo

    def memoised(name: str, fn: Callable[[Any], Any]) -> Callable[[int], Any]:
        return _memoised(store, name, candidates, fn)

    first = first_tier_bounds(scorer, candidates, store)
    t_lb, m_lb, cap, bounded = _bound_all(idx, first, deadline, tick, every=1 if cheap is None else 1024)
    ev = _Evaluator(study, candidates, idx, scorer, history, t_lb, on_scored, tick)
    turn_end = None if quantum is None else time.monotonic() + quantum

    def stop() -> bool:
        return ((max_simulated is not None and ev.evaluated >= max_simulated)
                or (turn_end is not None and time.monotonic() > turn_end))

    can = ev.cached if only_cached else None
    if cheap is None:
        rep = prove_best(t_lb, m_lb, cap, ev, deadline, incumbent, stop, can)
    else:
        from tuner.exhaustive_tiered import prove_tiered

        tight_of = memoised("tight", lambda c: candidate_bounds(bound, c))

        def tight(i: int) -> tuple[float, float, float]:
            if tick is not None:
                tick()
            return tight_of(idx[i])

        layout = getattr(bound, "layout_time", None)

        def layout_of(c: Any) -> float:
            try:
                return float(layout(c))
            except ValueError:  # the engine refuses it: no layout bound (its tight one says so)
                return -math.inf

        middle_of = memoised("layout", layout_of)

        rep = prove_tiered(t_lb, m_lb, cap, tight, ev, deadline, incumbent,
                           None if layout is None else (lambda i: middle_of(idx[i])), stop, can)
    if rep.best_index is not None:
        rep.best_index = idx[rep.best_index]
    rep.resumed, rep.bounded = ev.resumed, bounded
    if ev.refusals:  # no bound covers a refused plan: the proof does not hold (``holds``)
        rep.refusal = ev.refusals[0]
    rep.shapes = shape_bounds([candidates[j] for j in idx], rep.lower)
    rep.seconds = time.monotonic() - t0
    return rep


def _bound_all(idx: Sequence[int], bound: Callable[[int], tuple[float, float, float]], deadline: float | None,
               tick: Callable[[], None] | None, every: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int | None]:
    """(time bounds, memory bounds, limits, bounded) of the candidates ``idx``
    (``bound(j)``: :func:`candidate_bounds` of candidate j); past ``deadline`` the rest
    stay unbounded (-inf: the search stops before simulating them) and ``bounded`` counts
    those bounded (None: all); ``tick`` every ``every`` candidates."""
    n = len(idx)
    t_lb, m_lb, cap = np.full(n, -math.inf), np.zeros(n), np.ones(n)
    for i, j in enumerate(idx):
        if deadline is not None and time.monotonic() > deadline:
            return t_lb, m_lb, cap, i
        if tick is not None and i % every == 0:
            tick()
        t_lb[i], m_lb[i], cap[i] = bound(j)
    return t_lb, m_lb, cap, None


class _Evaluator:
    """``evaluate(i)`` of :func:`run_exhaustive` (an :data:`Evaluate`): member ``i``'s record
    from ``history`` (``resumed``) or scored now and written to the study as one trial;
    counts the evaluations and keeps the scorer's refusal messages."""

    def __init__(self, study: optuna.Study, candidates: Sequence[Any], idx: Sequence[int], scorer: Any,
                 history: dict[str, dict[str, Any]], t_lb: np.ndarray,
                 on_scored: Callable[[int], None] | None, tick: Callable[[], None] | None) -> None:
        self.study, self.candidates, self.idx, self.scorer = study, candidates, idx, scorer
        self.history, self.t_lb, self.on_scored, self.tick = history, t_lb, on_scored, tick
        self.resumed = self.evaluated = 0
        self.refusals: list[str] = []

    def cached(self, i: int) -> bool:
        """Whether member ``i`` has a record already (``only_cached``)."""
        return plan_key(self.candidates[self.idx[i]]) in self.history

    def _score(self, c: Any) -> dict[str, Any]:
        try:
            s = self.scorer(c)
        except ValueError as e:
            return {"error": f"{type(e).__name__}: {e}"}
        return {"time_s": float(s.time_s), "memory_bytes": int(s.memory_bytes),
                "memory_limit_bytes": int(s.memory_limit_bytes),
                "metrics": {k: float(v) for k, v in s.metrics.items()}}

    def __call__(self, i: int) -> tuple[float, int, int] | None:
        self.evaluated += 1
        if self.tick is not None:
            self.tick()
        c = self.candidates[self.idx[i]]
        key = plan_key(c)
        rec = self.history.get(key)
        if rec is not None:
            self.resumed += 1
        else:
            rec = self.history[key] = self._score(c)
            _record_trial(self.study, c, key, rec, float(self.t_lb[i]))
            if self.on_scored is not None:
                self.on_scored(self.idx[i])
        if "error" in rec:
            self.refusals.append(rec["error"])
            return None
        return rec["time_s"], rec["memory_bytes"], rec["memory_limit_bytes"]


__all__ = ["Bound", "ExhaustiveReport", "first_tier_bounds", "plan_key", "prove_best", "run_exhaustive"]
