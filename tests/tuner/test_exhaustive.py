"""``--sampler exhaustive`` (issue 18 item 3): branch and bound equals brute force, the
bound stays a bound, and a killed search resumes without simulating again."""

from __future__ import annotations

import math

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.tuning import SCORER_FACTORY, make_scorer, search_problem, template_kinds
from tuner.exhaustive import plan_key, prove_best, run_exhaustive
from tuner.result import TuneResult
from tuner.search import search
from tuner.space import SearchSpace
from tuner.study import Score, TuneConfig, history_cache, open_study
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)
SC = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "global_batch_size": 32,
      "seq_len": 4096, "num_layers": 4}


# -- the algorithm on random spaces ---------------------------------------------------------
point = st.tuples(st.floats(0.01, 100.0), st.floats(0.0, 1.0), st.integers(1, 100),
                  st.floats(0.0, 1.0), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(point, min_size=1, max_size=40), st.integers(1, 100))
def test_prove_best_equals_brute_force(points, limit):
    """Random times/memories with random bounds below them (slack factors in [0, 1]) and
    random refusals: the proven best is the brute-force minimum over feasible points, and
    the counts add up to the space size."""
    t = [p[0] for p in points]
    t_lb = [p[0] * p[1] for p in points]
    mem = [p[2] for p in points]
    m_lb = [p[2] * p[3] for p in points]
    refused = [p[4] and i % 3 == 0 for i, p in enumerate(points)]
    calls = []

    def evaluate(i):
        calls.append(i)
        return None if refused[i] else (t[i], mem[i], limit)

    rep = prove_best(t_lb, m_lb, [limit] * len(points), evaluate)
    feasible = [t[i] for i in range(len(t)) if not refused[i] and mem[i] <= limit]
    if feasible:
        assert rep.best_time_s == min(feasible)
        assert t[rep.best_index] == min(feasible) and mem[rep.best_index] <= limit
    else:
        assert rep.best_index is None and rep.best_time_s is None
    assert rep.proven
    assert rep.simulated + rep.pruned_memory + rep.pruned_time == len(points)
    assert rep.simulated == len(calls) == len(set(calls))
    assert rep.refused == sum(refused[i] for i in calls)
    # simulated in bound order
    assert [t_lb[i] for i in calls] == sorted(t_lb[i] for i in calls)


def test_prove_best_prunes_by_memory_and_time():
    """Hand example: point 2 cannot fit (bound 9 > 8); point 0 (bound 1, time 2) is
    simulated first; point 1 (bound 3 >= 2) and point 3 (bound 5) are pruned by time."""
    calls = []

    def evaluate(i):
        calls.append(i)
        return ((2.0, 1, 8), (4.0, 1, 8), (0.1, 9, 8), (6.0, 1, 8))[i]

    rep = prove_best([1.0, 3.0, 0.0, 5.0], [1, 1, 9, 1], [8, 8, 8, 8], evaluate)
    assert calls == [0]
    assert (rep.simulated, rep.pruned_memory, rep.pruned_time) == (1, 1, 2)
    assert rep.best_index == 0 and rep.best_time_s == 2.0


def test_prove_best_refuses_nan_and_ragged_bounds():
    from tuner.errors import TunerError

    with pytest.raises(TunerError, match="NaN"):
        prove_best([math.nan], [0], [1], lambda i: None)
    with pytest.raises(TunerError, match="shapes"):
        prove_best([1.0, 2.0], [0], [1], lambda i: None)


# -- the cost model's bound --------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 4096, num_layers=4)
    space = SearchSpace(prob, schedules=("1F1B", "VPP", "ZBH1", "ZB", "ZBVPP"), vpp_degrees=(2,),
                        micro_batch_sizes=(1, 2), recompute=("none", "full"), zero_stages=(0, 3))
    kinds = template_kinds("llama2-7b", 4096)
    return space, kinds, enumerate_candidates(space, "pattern-based", kinds), make_scorer(SC)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.randoms(use_true_random=False))
def test_bound_never_exceeds_the_simulated_step(small, rnd):
    """For random candidates of a space with every schedule family, ZeRO 0 and 3, full
    recompute and pipelines of 1-8 stages: Engine.lower_bound() <= Engine.simulate() in
    both step time and peak memory."""
    _, _, cands, scorer = small
    c = rnd.choice(cands)
    b = scorer.bound(c)
    s = scorer(c)
    assert b.time_s <= s.time_s, (c, b, s)
    assert b.memory_bytes <= s.memory_bytes, (c, b, s)
    assert b.memory_limit_bytes == s.memory_limit_bytes


def test_bound_is_tight_without_a_pipeline(small):
    """pp = 1: no bubble and no warm-up, so the bound is the step less the exposed dp
    stream only; for dp = 1 (nothing to reduce) it is within 1 ns per action."""
    _, _, cands, scorer = small
    c = next(c for c in cands if c.pp == 1 and c.dp == 1)
    b, s = scorer.bound(c), scorer(c)
    assert b.time_s <= s.time_s <= b.time_s + 1e-6


# -- the search ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """A space small enough to brute-force in the test: tp = 1 (no completion), every
    schedule family, two micro-batch sizes, recompute none/full, ZeRO 0/1."""
    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 4096, num_layers=4)
    space = SearchSpace(prob, fix={"tp": 1}, schedules=("1F1B", "VPP", "ZBH1", "ZB", "ZBVPP"),
                        vpp_degrees=(2,), micro_batch_sizes=(1, 2), recompute=("none", "full"),
                        zero_stages=(0, 1))
    kinds = template_kinds("llama2-7b", 4096)
    return space, kinds, enumerate_candidates(space, "pattern-based", kinds)


def _cfg(space, kinds):
    return TuneConfig(space, mode="pattern-based", template_kinds=kinds, sampler="exhaustive",
                      scorer_factory=SCORER_FACTORY, scorer_config=SC)


def test_exhaustive_equals_brute_force(tiny):
    space, kinds, cands = tiny
    scorer = make_scorer(SC)
    scores = [scorer(c) for c in cands]
    optimum = min(s.time_s for s in scores if s.feasible)
    res = search(_cfg(space, kinds), "ex", storage="memory")
    rep = res.exhaustive
    assert rep.proven and rep.space_size == len(cands)
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == len(cands)
    assert rep.best_time_s == optimum
    _, rec = TuneResult(res.study, 32).best()
    assert rec["time_s"] == optimum
    # Optuna's own best trial (it honours the memory constraint) is the proven optimum too
    assert res.study.best_trial.value == res.best_trial().value == rep.best_time_s
    # every simulated candidate is one COMPLETE (or PRUNED: refused) trial, carrying the
    # Optuna path's named constraint and the feasible flag (issue 20 item 4)
    assert len(res.study.trials) == rep.simulated
    for t in res.study.trials:
        if t.state.name == "COMPLETE":
            ua = t.user_attrs
            assert t.constraints == {"memory": ua["memory_bytes"] / ua["memory_limit_bytes"] - 1}
            assert ua["feasible"] == (ua["memory_bytes"] <= ua["memory_limit_bytes"])


class _Killed(BaseException):
    pass


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pp=st.sampled_from([None, 1, 2, 4]),
       schedules=st.sets(st.sampled_from(["1F1B", "VPP", "ZBH1", "ZB", "ZBVPP"]), min_size=1),
       mbs=st.sets(st.sampled_from([1, 2, 4]), min_size=1),
       recompute=st.sets(st.sampled_from(["none", "selective", "full"]), min_size=1),
       zero=st.sets(st.sampled_from([0, 1, 2, 3]), min_size=1))
def test_exhaustive_equals_brute_force_on_random_spaces(pp, schedules, mbs, recompute, zero):
    """Random small spaces (tp = 1 so that each plan costs milliseconds): the proven
    optimum is the brute-force minimum over every candidate's simulated step."""
    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 4096, num_layers=4)
    fix = {"tp": 1} | ({} if pp is None else {"pp": pp})
    space = SearchSpace(prob, fix=fix, schedules=tuple(sorted(schedules)), vpp_degrees=(2,),
                        micro_batch_sizes=tuple(sorted(mbs)), recompute=tuple(sorted(recompute)),
                        zero_stages=tuple(sorted(zero)))
    kinds = template_kinds("llama2-7b", 4096)
    cands = enumerate_candidates(space, "pattern-based", kinds)
    if not cands:
        return
    scorer = make_scorer(SC)
    brute = []
    for c in cands:
        try:
            brute.append(scorer(c))
        except ValueError:
            pass
    feasible = [s.time_s for s in brute if s.feasible]
    study, _ = open_study(_cfg(space, kinds), "rnd", None, None)
    rep = run_exhaustive(study, cands, scorer, {})
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == len(cands)
    assert rep.best_time_s == (min(feasible) if feasible else None)


@pytest.fixture(scope="module")
def piped():
    """tp = 1, pp = 4: the bubble keeps bounds apart from the steps, so several plans are
    simulated before the bound passes the best."""
    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 4096, num_layers=4)
    space = SearchSpace(prob, fix={"tp": 1, "pp": 4}, schedules=("1F1B", "VPP", "ZBH1", "ZB", "ZBVPP"),
                        vpp_degrees=(2,), micro_batch_sizes=(1, 2), recompute=("none", "full"),
                        zero_stages=(0, 1))
    kinds = template_kinds("llama2-7b", 4096)
    return space, kinds, enumerate_candidates(space, "pattern-based", kinds)


def test_killed_search_resumes_without_simulating_again(piped, tmp_path):
    """A search killed after its first score (the scorer raises out of the loop) resumes
    from the journal: the finished candidate is read back, not scored, and the answer and
    the candidates decided by a score are those of an uninterrupted search."""
    space, kinds, cands = piped
    journal = str(tmp_path / "journal.log")
    base = make_scorer(SC)
    scored: list[str] = []

    def scorer(c):
        if len(scored) == 1:
            raise _Killed
        scored.append(plan_key(c))
        return base(c)

    scorer.bound, scorer.cheap_bound = base.bound, base.cheap_bound  # the two-tier search
    study, _ = open_study(_cfg(space, kinds), "resume", journal, None)
    with pytest.raises(_Killed):
        run_exhaustive(study, cands, scorer, history_cache(study))
    first = list(scored)
    assert len(first) == 1 and len(study.trials) == 1
    scored.clear()

    def scorer2(c):
        scored.append(plan_key(c))
        return base(c)

    scorer2.bound, scorer2.cheap_bound = base.bound, base.cheap_bound
    study, _ = open_study(_cfg(space, kinds), "resume", journal, None)
    rep = run_exhaustive(study, cands, scorer2, history_cache(study))
    assert not set(first) & set(scored)
    assert rep.resumed == 1 and rep.simulated == 1 + len(scored)
    ref = run_exhaustive(open_study(_cfg(space, kinds), "ref", None, None)[0], cands, base, {})
    assert ref.simulated >= 2  # the kill came before the search was done
    assert rep.best_time_s == ref.best_time_s and rep.simulated == ref.simulated
    assert ((rep.pruned_memory, rep.pruned_time, rep.pruned_cheap)
            == (ref.pruned_memory, ref.pruned_time, ref.pruned_cheap))


def test_exhaustive_needs_a_bound(tiny):
    from tuner.errors import TunerError

    space, kinds, cands = tiny
    study, _ = open_study(_cfg(space, kinds), "nobound", None, None)
    with pytest.raises(TunerError, match="lower bound"):
        run_exhaustive(study, cands, lambda c: Score(1.0, 1, 2), {})



def test_timeout_stops_unproven_and_says_so(piped):
    space, kinds, cands = piped
    study, _ = open_study(_cfg(space, kinds), "late", None, None)
    rep = run_exhaustive(study, cands, make_scorer(SC), {}, timeout=0.0)
    assert not rep.proven and rep.simulated == 0 and rep.best_time_s is None
    assert "NOT proven" in rep.summary()
