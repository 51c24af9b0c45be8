"""tuner: search space, sharding patterns, Optuna study, history and resume.

    >>> from tuner import TuneResult, search, SearchSpace   # doctest: +SKIP

The tuner never imports ``meshplan``; plans are scored by an injected scorer (see
:mod:`tuner.study`); ``meshplan.tuning.make_scorer`` is the Engine-backed one.
"""

from tuner.legality import (
    RULES,
    RULES_BY_NAME,
    Violation,
    check_legality,
    first_violation,
    is_legal,
)
from tuner.result import HISTORY_COLUMNS, TuneResult
from tuner.search import search
from tuner.space import Candidate, ModelDims, SearchProblem, SearchSpace, SpaceError, parse_fix
from tuner.study import Score, TuneConfig, TuneError, open_study, optimize, run_worker

__all__ = [
    "HISTORY_COLUMNS", "RULES", "RULES_BY_NAME", "Candidate", "ModelDims", "Score",
    "SearchProblem", "SearchSpace", "SpaceError", "TuneConfig", "TuneError", "TuneResult",
    "Violation", "check_legality", "first_violation", "is_legal", "open_study", "optimize",
    "parse_fix", "run_worker", "search",
]
