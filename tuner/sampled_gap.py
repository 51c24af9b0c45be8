"""The answer of a sampled search (TPE, random, bruteforce): its best plan and the lower
bound a branch and bound over the plans it scored proves (issue 36; :mod:`tuner.gap` holds
the answer type). A module of its own: it runs the branch and bound, which itself reports
per-shape bounds through :mod:`tuner.gap`."""

from __future__ import annotations

import math
from typing import Any

from tuner.bound_seed import enumerable_part
from tuner.exhaustive import run_exhaustive
from tuner.exhaustive_shared import study_best
from tuner.gap import SearchAnswer, from_report
from tuner.result import history_cache


def sampled_gap(study: Any, cfg: Any, scorer: Any, seconds: float, elapsed_s: float = 0.0) -> SearchAnswer:
    """The answer of a sampled search (TPE, random, bruteforce) on ``study``: its best
    feasible plan and the lower bound the branch and bound reaches over the enumerable part
    of ``cfg``'s space when only the plans the study scored may be evaluated
    (``tuner.exhaustive.run_exhaustive(only_cached=True)``: nothing is simulated), within
    ``seconds``. ``elapsed_s``: the sampler's own time (added to ``seconds``). A scorer
    without ``bound`` gives an answer with no lower bound."""
    history = history_cache(study)
    best = study_best(study)
    best_s = best if math.isfinite(best) else None
    scored = len(history)
    refused = sum("error" in r for r in history.values())
    if getattr(scorer, "bound", None) is None:
        return SearchAnswer(cfg.sampler_name, best_s, None, False, None, scored=scored,
                            refused=refused, seconds=elapsed_s)
    cands, what = enumerable_part(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    part = dict(history)  # evaluations read back, never written as new trials
    rep = run_exhaustive(study, cands, scorer, part, seconds, only_cached=True)
    ans = from_report(rep, cfg.sampler_name, "trial or time budget", what, best_s=best_s,
                      scored=scored, seconds=elapsed_s + rep.seconds)
    if ans.proven and best_s is not None and rep.best_time_s is not None and rep.best_time_s > best_s:
        ans.proven = False  # the part's optimum is slower than a plan outside it (full_random)
        ans.lower_bound_s = rep.best_time_s
    ans.refused = refused
    return ans


__all__ = ["sampled_gap"]
