"""``--seed-from-bound K``: an Optuna search (TPE, random) started from the bound's best
candidates, and the gap it leaves (issue 18 item 4).

When the space is too big to prove exhaustively, the lower bounds of
:mod:`tuner.exhaustive` still help twice:

1. **Seeds.** The *enumerable part* of the space (:func:`enumerable_part`) is bounded
   (``scorer.bound``: step time and peak memory lower bounds, ``simulator.bounds.step``);
   the ``K`` candidates with the lowest time bound whose memory bound fits are enqueued
   (``study.enqueue_trial`` with their parameters, lowest bound first), so the sampler's
   first trials are the plans that *could* be fastest, and TPE's model starts from them.
2. **Gap.** After the search, every enumerable candidate the study has not evaluated and
   whose memory bound fits is still *open*; the smallest time bound among them, ``Y``, is a
   lower bound on every unexplored plan of the enumerable part. With ``X`` the best
   feasible step found, no unexplored plan of that part can beat ``Y``; the report prints
   the relative gap ``(X - Y) / X`` (0 when ``Y >= X``: then ``X`` is the proven optimum of
   the enumerable part, the branch-and-bound argument of :mod:`tuner.exhaustive`).

Enumerable part: pattern-based and semi-auto: every legal candidate
(``tuner.suggest.enumerate_candidates``); full_random: only its tp = 1 plans (nothing is
sharded inside a rank, so no annotation seed is drawn) -- its tp > 1 plans draw a random
annotation per trial and are not covered by the gap, which the report says.

Default (``K`` None): :data:`AUTO_K` for pattern-based TPE when the enumerable part holds at
most :data:`AUTO_MAX_CANDIDATES` candidates, else off; ``0`` is off. Why the limit: bounding
needs each layer layout's block costs, one completion per layout; measured here (2 loaded
cores), the 396 tp=1 plans of llama2-7b (4 layers) on one DGX A100 bound in about 2 s, the
6,336 plans of its pp=2 slice (tp > 1 layouts) in about 120 s -- a default that bounded a
space of tens of thousands of plans would spend minutes before its first trial.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from tuner.errors import TunerError
from tuner.exhaustive import plan_key
from tuner.exhaustive_shared import study_best
from tuner.space import Candidate, SearchSpace
from tuner.suggest import PATTERN, RANDOM, SEMI, enumerate_candidates

#: the default K of pattern-based TPE (a search's first trials; TPE's startup is 20)
AUTO_K = 16
#: the largest enumerable part the default bounds before the first trial
AUTO_MAX_CANDIDATES = 1000
#: samplers that take seeds (BruteForce visits everything; exhaustive is the bound's own order)
SEEDABLE = ("tpe", "random")


def enumerable_part(space: SearchSpace, mode: str, kinds: Any = None,
                    annotation: str = "megatron") -> tuple[list[Candidate], str]:
    """(candidates, what they are) of the part of ``space`` that can be enumerated in
    ``mode`` (module docstring)."""
    if mode == RANDOM:
        cands = [c.replace(annotation="random") for c in enumerate_candidates(space, SEMI)
                 if c.tp == 1]
        return cands, "its tp=1 plans only: full_random's tp>1 plans draw a random annotation"
    return enumerate_candidates(space, mode, kinds, annotation), "every legal plan"


@dataclass
class BoundState:
    """The bounded enumerable part: per candidate its plan key and bounds (s, bytes)."""

    keys: list[str]
    time_lb: np.ndarray
    memory_lb: np.ndarray
    memory_limit: np.ndarray
    bounded: int
    what: str
    seeded: int


@dataclass
class BoundGap:
    """What the bounds say after a search: ``best_s`` the best feasible step found,
    ``open_bound_s`` the smallest time bound of an unexplored enumerable candidate that may
    fit (None: none is open; -inf: one has no bound), over ``size`` candidates (``bounded``
    of them bounded before a timeout), ``evaluated`` of them in the study."""

    size: int
    bounded: int
    evaluated: int
    seeded: int
    what: str
    best_s: float | None
    open_bound_s: float | None

    @property
    def gap(self) -> float | None:
        """``(best - open bound) / best`` (>= 0; 0 when nothing open can beat the best;
        None when there is no best or the open bound is unknown)."""
        if self.best_s is None or (self.open_bound_s is not None and not math.isfinite(self.open_bound_s)):
            return None
        if self.open_bound_s is None or self.open_bound_s >= self.best_s:
            return 0.0
        return (self.best_s - self.open_bound_s) / self.best_s

    def summary(self) -> str:
        """One line for the tune report."""
        head = (f"seed-from-bound: {self.seeded} seeds; enumerable part {self.size} candidates "
                f"({self.what}), {self.evaluated} evaluated")
        if self.bounded < self.size:
            return head + f"; only {self.bounded} bounded before the timeout: no gap known"
        best = "no feasible plan found" if self.best_s is None else f"best found {self.best_s * 1e3:.1f} ms"
        if self.open_bound_s is None:
            return head + f"; {best}; every candidate is evaluated or cannot fit: nothing open"
        if not math.isfinite(self.open_bound_s):
            return head + f"; {best}; an unexplored candidate has no bound (the engine refused it): no gap known"
        y = f"no unexplored plan of the enumerable part can beat {self.open_bound_s * 1e3:.1f} ms"
        if self.best_s is None:
            return head + f"; {best}; {y}"
        if self.gap == 0.0:
            return head + f"; {best}; {y}: the best found is the optimum of the enumerable part"
        return head + f"; {best}; {y}: gap {self.gap * 100:.1f}%"


def check_seed_option(sampler: str, k: int | None) -> None:
    """Raises TunerError for a ``k`` below 0, or a ``k`` > 0 with a sampler that takes no
    seeds (bruteforce visits every plan; exhaustive simulates in bound order already)."""
    if k is not None and k < 0:
        raise TunerError(f"--seed-from-bound must be >= 0, got {k}")
    if k and sampler not in SEEDABLE:
        why = ("already simulates in bound order" if sampler == "exhaustive" else
               "visits every plan")
        raise TunerError(f"--seed-from-bound applies to the {' and '.join(SEEDABLE)} samplers; "
                         f"--sampler {sampler} {why}")


def auto_k(mode: str, sampler: str, size: int) -> int:
    """The default K (module docstring)."""
    return AUTO_K if mode == PATTERN and sampler == "tpe" and size <= AUTO_MAX_CANDIDATES else 0


def _evaluated(study: optuna.Study) -> set[str]:
    from tuner.result import history_cache

    return set(history_cache(study))


def seed_study(study: optuna.Study, space: SearchSpace, mode: str, kinds: Any, annotation: str,
               sampler: str, scorer: Any, k: int | None, room: int,
               deadline: float | None = None, tree: Any = None) -> BoundState | None:
    """Bound the enumerable part and enqueue its ``k`` best open candidates (at most
    ``room``, the trials left) with the parameters under which the sampler's legal tree
    draws them (``tree``: ``tuner.legal_draw.LegalTree.params_of``; None: built here);
    ``k`` None: :func:`auto_k` (off too for a scorer without ``bound``). Returns None when
    seeding is off. Raises TunerError for a ``k`` below 0, a sampler that takes no seeds (a
    ``k`` > 0 given with bruteforce or exhaustive) or a scorer without ``bound``."""
    check_seed_option(sampler, k)
    if sampler not in SEEDABLE:
        return None
    bound = getattr(scorer, "bound", None)
    if k == 0 or (k is None and (bound is None or auto_k(mode, sampler, 0) == 0)):
        return None  # off, or a default search that the default does not seed
    if bound is None:
        raise TunerError("--seed-from-bound needs a scorer with a lower bound (a 'bound' attribute)")
    cands, what = enumerable_part(space, mode, kinds, annotation)
    if k is None:
        k = auto_k(mode, sampler, len(cands))
        if k == 0:
            return None
    n = len(cands)
    t_lb, m_lb, cap = np.full(n, -math.inf), np.zeros(n), np.ones(n)
    bounded = n
    for i, c in enumerate(cands):
        if deadline is not None and time.monotonic() > deadline:
            bounded = i
            break
        try:
            b = bound(c)
            t_lb[i], m_lb[i], cap[i] = b.time_s, b.memory_bytes, b.memory_limit_bytes
        except ValueError:
            pass  # unbounded: -inf, never a seed (the engine refuses it), open in the gap
    state = BoundState([plan_key(c) for c in cands], t_lb, m_lb, cap, bounded, what, 0)
    done = _evaluated(study)
    pick = [i for i in np.argsort(t_lb[:bounded], kind="stable")
            if math.isfinite(t_lb[i]) and m_lb[i] <= cap[i] and state.keys[i] not in done]
    if tree is None and pick:
        from tuner.legal_draw import legal_tree

        tree = legal_tree(space, mode, kinds, annotation)
    for rank, i in enumerate(pick[:max(0, min(k, room))]):
        study.enqueue_trial(tree.params_of(cands[i]), skip_if_exists=True,
                            user_attrs={"bound_seed": rank, "bound_time_s": float(t_lb[i])})
        state.seeded += 1
    return state


def gap_report(study: optuna.Study, state: BoundState) -> BoundGap:
    """The :class:`BoundGap` of ``study`` over the bounded enumerable part ``state``."""
    done = _evaluated(study)
    open_ = [i for i, key in enumerate(state.keys[:state.bounded])
             if key not in done and state.memory_lb[i] <= state.memory_limit[i]]
    best = study_best(study)
    return BoundGap(size=len(state.keys), bounded=state.bounded,
                    evaluated=sum(key in done for key in state.keys), seeded=state.seeded,
                    what=state.what, best_s=best if math.isfinite(best) else None,
                    open_bound_s=float(min(state.time_lb[i] for i in open_)) if open_ else None)


def seeds_in_order(study: optuna.Study) -> Sequence[optuna.trial.FrozenTrial]:
    """The study's trials that were bound seeds, in seed order."""
    ts = [t for t in study.get_trials(deepcopy=False) if "bound_seed" in t.user_attrs]
    return sorted(ts, key=lambda t: t.user_attrs["bound_seed"])


__all__ = ["AUTO_K", "AUTO_MAX_CANDIDATES", "BoundGap", "BoundState", "auto_k",
           "check_seed_option",
           "enumerable_part", "gap_report", "seed_study", "seeds_in_order"]
