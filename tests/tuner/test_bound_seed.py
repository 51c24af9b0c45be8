"""``--seed-from-bound K`` (issue 18 item 4): TPE / random start from the K plans of lowest
step-time bound, and the report's open bound is a true lower bound on every unexplored
plan of the enumerable part."""

from __future__ import annotations

import math

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.tuning import SCORER_FACTORY, make_scorer, search_problem, template_kinds
from tests._cli import one_line_error, run_main
from tuner.bound_seed import (
    AUTO_K,
    AUTO_MAX_CANDIDATES,
    BoundGap,
    auto_k,
    enumerable_part,
    seeds_in_order,
)
from tuner.exhaustive import plan_key
from tuner.legal_draw import LegalTree, draw_candidate
from tuner.search import search
from tuner.space import SearchSpace
from tuner.study import TuneConfig, history_cache
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)
SC = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "global_batch_size": 32,
      "seq_len": 4096, "num_layers": 4}
KINDS = template_kinds("llama2-7b", 4096)
PROB = search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 4096, num_layers=4)


@pytest.fixture(scope="module")
def small():
    """The tp = 1 slice of llama2-7b (4 layers) on one DGX A100 with two schedule families,
    its candidates, their bounds and their simulated scores (computed here, independently
    of the seeding code)."""
    space = SearchSpace(PROB, fix={"tp": 1}, schedules=("1F1B", "ZBH1"), micro_batch_sizes=(1, 2),
                        recompute=("none", "full"), zero_stages=(0, 1))
    cands = enumerate_candidates(space, "pattern-based", KINDS)
    scorer = make_scorer(SC)
    return space, cands, [scorer.bound(c) for c in cands], [scorer(c) for c in cands]


def _cfg(space, mode="pattern-based", sampler="tpe"):
    return TuneConfig(space, mode=mode, template_kinds=KINDS, sampler=sampler,
                      scorer_factory=SCORER_FACTORY, scorer_config=SC)


def test_first_trials_are_the_lowest_bounds_and_the_gap_is_a_bound(small):
    """The first K trials are the K candidates of lowest time bound that may fit, in that
    order; after the search, every unexplored candidate's simulated step is at least the
    reported open bound (checked against brute force), the open bound is the minimum
    bound over them, and the gap is (best - open) / best."""
    space, cands, bounds, scores = small
    k = 5
    res = search(_cfg(space), "seeded", storage="memory", n_trials=12, seed_from_bound=k)
    order = sorted((i for i, b in enumerate(bounds) if b.memory_bytes <= b.memory_limit_bytes),
                   key=lambda i: bounds[i].time_s)
    trials = res.study.trials
    assert [t.user_attrs["plan_key"] for t in trials[:k]] == [plan_key(cands[i]) for i in order[:k]]
    assert [t.user_attrs["bound_seed"] for t in seeds_in_order(res.study)] == list(range(k))
    gap = res.bound_gap
    done = set(history_cache(res.study))
    unexplored = [i for i, c in enumerate(cands) if plan_key(c) not in done]
    open_ = [i for i in unexplored if bounds[i].memory_bytes <= bounds[i].memory_limit_bytes]
    assert gap.size == len(cands) and gap.evaluated == len(cands) - len(unexplored) and gap.seeded == k
    assert gap.open_bound_s == min(bounds[i].time_s for i in open_)
    # the claim: no unexplored plan can beat the open bound (and none pruned by memory fits)
    assert all(scores[i].time_s >= gap.open_bound_s for i in open_)
    assert not any(scores[i].feasible for i in unexplored if i not in open_)
    best = min(t.user_attrs["time_s"] for t in trials if t.user_attrs.get("feasible"))
    assert gap.best_s == best
    assert gap.gap == (0.0 if gap.open_bound_s >= best else (best - gap.open_bound_s) / best)
    if gap.gap == 0.0:  # then the best found is the brute-force optimum
        assert best == min(s.time_s for s in scores if s.feasible)


def test_gap_summary_by_hand():
    """best 100 ms, open bound 90 ms: gap (100 - 90) / 100 = 10.0%; open 120 ms: optimum."""
    g = BoundGap(size=10, bounded=10, evaluated=4, seeded=2, what="every legal plan",
                 best_s=0.100, open_bound_s=0.090)
    assert g.gap == pytest.approx(0.1)
    assert "best found 100.0 ms; no unexplored plan of the enumerable part can beat 90.0 ms: gap 10.0%" \
        in g.summary()
    g.open_bound_s = 0.120
    assert g.gap == 0.0 and "is the optimum of the enumerable part" in g.summary()
    g.open_bound_s = -math.inf
    assert g.gap is None and "no gap known" in g.summary()
    g.bounded = 3
    assert "only 3 bounded" in g.summary()


@pytest.fixture(scope="module")
def wide():
    """A pattern-based space with tp > 1 layouts (templates), enumerated only (no bound)."""
    space = SearchSpace(PROB, fix={"pp": 2}, vpp_degrees=(2,), micro_batch_sizes=(1, 2),
                        zero_stages=(0, 1, 3), hsdp=True)
    return space, enumerate_candidates(space, "pattern-based", KINDS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.randoms(use_true_random=False))
def test_enqueued_params_suggest_exactly_that_candidate(wide, rnd):
    """For random candidates (tp 1-8, every template kind, schedules, HSDP shard groups):
    a trial enqueued with the legal tree's ``params_of(c)`` draws ``c`` itself."""
    space, cands = wide
    tree = LegalTree(cands, templates=True)
    c = rnd.choice(cands)
    study = optuna.create_study()
    study.enqueue_trial(tree.params_of(c))
    assert draw_candidate(tree, study.ask(), "pattern-based") == c


def test_full_random_seeds_its_tp1_plans(small):
    """full_random: the enumerable part is its tp = 1 plans (annotation 'random', no seed);
    the seeds run first and are those plans."""
    space, *_ = small
    wide = SearchSpace(PROB, fix={"pp": 4}, schedules=("1F1B",), micro_batch_sizes=(1,),
                       recompute=("none",), zero_stages=(0,))
    part, what = enumerable_part(wide, "full_random")
    assert part and all(c.tp == 1 and c.annotation == "random" for c in part) and "tp=1" in what
    assert len(part) == len([c for c in enumerate_candidates(wide, "semi-auto") if c.tp == 1])
    res = search(_cfg(wide, "full_random"), "fr", storage="memory", n_trials=3, seed_from_bound=1)
    assert res.study.trials[0].user_attrs["plan_key"] in {plan_key(c) for c in part}
    assert res.bound_gap.seeded == 1 and res.bound_gap.size == len(part)


def test_default_k():
    """On for pattern-based TPE up to AUTO_MAX_CANDIDATES candidates, off otherwise."""
    assert auto_k("pattern-based", "tpe", AUTO_MAX_CANDIDATES) == AUTO_K == 16
    assert auto_k("pattern-based", "tpe", AUTO_MAX_CANDIDATES + 1) == 0
    assert auto_k("pattern-based", "random", 10) == auto_k("semi-auto", "tpe", 10) == 0


TINY = ["--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1", "--global-batch", "32",
        "--layers", "4", "--fix", "tp=1", "--no-progress"]


def test_cli_default_seeds_a_small_space_and_prints_the_gap(tmp_path, capsys):
    """A small pattern-based TPE search is seeded by default and the report (terminal and
    report.txt) states the open bound."""
    tpe = ("--sampler", "tpe", "--mode", "pattern-based")
    rc, out, _ = run_main(capsys, "tune", *TINY, *tpe, "--trials", "20", "--storage", "memory",
                          "--output", str(tmp_path))
    assert rc == 0
    assert f"seed-from-bound: {AUTO_K} seeds" in out
    assert "no unexplored plan of the enumerable part can beat" in (tmp_path / "report.txt").read_text()
    rc, out, _ = run_main(capsys, "tune", *TINY, *tpe, "--trials", "3", "--storage", "memory",
                          "--seed-from-bound", "0", "--output", str(tmp_path / "off"))
    assert rc == 0 and "seed-from-bound" not in out


@pytest.mark.parametrize("sampler", ["exhaustive", "bruteforce"])
def test_cli_refuses_seeds_for_a_sampler_that_takes_none(tmp_path, capsys, sampler):
    line = one_line_error(*run_main(capsys, "tune", *TINY, "--sampler", sampler, "--seed-from-bound", "4",
                                    "--storage", "memory", "--output", str(tmp_path)))
    assert "--seed-from-bound applies to the tpe and random samplers; --sampler " + sampler in line
    assert not (tmp_path / "journal.log").exists()


def test_refused_exhaustive_pareto_leaves_no_output_directory(capsys, tmp_path):
    """``--sampler exhaustive --pareto`` is refused before ``--output`` is created (it left
    an empty directory behind: new-user trial)."""
    from tests._cli import one_line_error, run_main

    out = tmp_path / "runs" / "x"
    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster",
                                    "dgx-a100-80g", "--nodes", "1", "--global-batch", "32",
                                    "--layers", "4", "--sampler", "exhaustive", "--pareto",
                                    "--output", str(out)))
    assert "--pareto" in line and not out.exists() and not out.parent.exists()
