"""The candidates, scorer and tier-0 bound of one scorer config, for the tests that check a
bound against the simulated step on random candidates (tests/meshplan/test_tier0_memory.py,
test_tier0_zero3.py, tests/tuner/test_tier0_bound.py)."""

from __future__ import annotations

from typing import Any

from meshplan.bounds.tier0 import Tier0Bound
from meshplan.tuning import make_scorer, search_problem, template_kinds
from tuner.space import SearchSpace
from tuner.suggest import enumerate_candidates


def bound_space(sc: dict[str, Any], modes: tuple[str, ...] = ("pattern-based", "semi-auto"),
                **space: Any) -> tuple[list[Any], Any, Tier0Bound]:
    """(candidates of ``modes`` over the SearchSpace of ``sc``'s problem with ``space``'s
    fields, the scorer of ``sc``, the tier-0 bound of ``sc``); ``sc``: a scorer config with
    model, cluster, nodes, global_batch_size, seq_len and num_layers."""
    prob = search_problem(sc["model"], sc["cluster"], sc["nodes"], sc["global_batch_size"],
                          sc["seq_len"], num_layers=sc["num_layers"])
    ss = SearchSpace(prob, **space)
    kinds = template_kinds(sc["model"], sc["seq_len"])
    cands = [c for mode in modes for c in enumerate_candidates(ss, mode, kinds)]
    return cands, make_scorer(sc), Tier0Bound(sc)
