"""Issue 20 item 4: a search speaks Optuna. Every scored trial carries ``feasible`` and its
memory figures as user attrs (what optuna-dashboard lists) beside the ``memory``
constraint; ``TuneResult.best`` / ``pareto_front`` come from Optuna's ``best_trial`` /
``best_trials`` (which honour constraints); no complete or no feasible trial -> None."""

from __future__ import annotations

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState, create_trial

from tests.tuner.test_tuner_study import cfg, run
from tuner.result import GIB, TuneResult

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _trial(time_s, mem, lim, key, state=TrialState.COMPLETE, n_obj=1):
    """A finished trial with the record the tuner writes (values, user attrs, constraint)."""
    if state != TrialState.COMPLETE:
        return create_trial(state=state, user_attrs={"plan_key": key, "illegal": "rule: why"})
    ua = {"plan_key": key, "plan": {"dp": 1, "tp": 1, "pp": 1}, "time_s": time_s,
          "memory_bytes": mem, "memory_limit_bytes": lim, "metrics": {}}
    return create_trial(state=state, values=[time_s, float(mem)][:n_obj], user_attrs=ua,
                        system_attrs={"constraints:memory": mem / lim - 1.0})


def _study(rows, n_obj=1):
    study = optuna.create_study(directions=["minimize"] * n_obj)
    for r in rows:
        study.add_trial(_trial(*r, n_obj=n_obj))
    return study


# (time_s, memory_bytes, memory_limit_bytes, plan_key): trial 0 is the fastest but does not
# fit; trials 1 and 2 tie on time, 2 is lighter; 3 is slower and lighter still; 4 is plan B
# again (a cached repeat)
ROWS = [(1.0, 50, 40, "X"), (2.0, 30, 40, "A"), (2.0, 20, 40, "B"), (3.0, 10, 40, "C"),
        (2.0, 20, 40, "B")]


def test_best_is_optunas_best_trial_with_the_lighter_of_equal_times():
    study = _study(ROWS)
    assert study.best_trial.number == 1  # Optuna: the first feasible trial of the best value
    best = TuneResult(study, 64).best_trial()
    assert best.value == study.best_trial.value == 2.0
    assert best.number == 2  # as fast, 20 < 30 bytes: the lighter plan
    # the front of a single-objective study over (time, memory): B (2.0, 20), C (3.0, 10)
    assert [t.user_attrs["plan_key"] for t in TuneResult(study, 64).pareto_front()] == ["B", "C"]


def test_pareto_front_is_optunas_best_trials():
    study = _study(ROWS, n_obj=2)
    res = TuneResult(study, 64, pareto=True)
    assert {t.number for t in study.best_trials} == {2, 3, 4}  # X infeasible, A dominated by B
    front = res.pareto_front()
    assert [t.number for t in front] == [2, 3]  # one trial per plan, fastest first
    assert res.best_trial().number == 2 and [t.number for t in res.top(5)] == [2, 3]


@pytest.mark.parametrize("rows", [
    [],                                                    # no trial at all
    [(0, 0, 0, "P", TrialState.PRUNED)],                   # only pruned: Optuna raises ValueError
    [(1.0, 50, 40, "X"), (2.0, 41, 40, "Y")],              # complete, none fits
])
@pytest.mark.parametrize("n_obj", [1, 2])
def test_no_complete_or_no_feasible_trial_gives_none(rows, n_obj):
    res = TuneResult(_study(rows, n_obj), 64, pareto=n_obj == 2)
    assert res.best_trial() is None and res.best() is None and res.pareto_front() == []


row = st.tuples(st.integers(1, 6), st.integers(1, 12), st.sampled_from([8, 10]))


@settings(max_examples=60, deadline=None)
@given(st.lists(row, max_size=14))
def test_best_and_front_equal_brute_force(rows):
    """Against the definitions, by brute force: best = min (time, memory, number) over trials
    with memory <= limit; the front = the feasible plans no other feasible plan dominates.
    A plan's key names its score (as plan_key does), so repeats are cached trials."""
    rows = [(float(t), m, lim, f"{t}/{m}/{lim}") for t, m, lim in rows]
    feas = [(t, m, i, k) for i, (t, m, lim, k) in enumerate(rows) if m <= lim]
    front = {k for t, m, _, k in feas
             if not any(u <= t and v <= m and (u, v) != (t, m) for u, v, _, _ in feas)}
    for n_obj in (1, 2):
        res = TuneResult(_study(rows, n_obj), 64, pareto=n_obj == 2)
        best = res.best_trial()
        if not feas:
            assert best is None and res.pareto_front() == []
            continue
        t, m, i, _ = min(feas)
        assert (best.user_attrs["time_s"], best.user_attrs["memory_bytes"], best.number) == (t, m, i)
        got = [x.user_attrs["plan_key"] for x in res.pareto_front()]
        assert len(got) == len(set(got)) and set(got) == front
        times = [x.user_attrs["time_s"] for x in res.pareto_front()]
        assert times == sorted(times)


def test_every_scored_trial_says_whether_it_fits():
    """Analytic scorer, 10 GiB devices: each COMPLETE trial carries feasible (= peak <=
    limit = the memory constraint <= 0) and the figures in bytes and GiB."""
    study, _ = run(cfg(sampler="random", cap_gib=10), 60)
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert {t.user_attrs["feasible"] for t in done} == {True, False}  # both kinds occur
    for t in done:
        ua = t.user_attrs
        assert ua["feasible"] == (ua["memory_bytes"] <= 10 * GIB) == (t.constraints["memory"] <= 0)
        assert ua["memory_gib"] == round(ua["memory_bytes"] / GIB, 3)
        assert ua["memory_limit_gib"] == 10.0 and ua["memory_limit_bytes"] == 10 * GIB
    res = TuneResult(study, 64)
    assert res.best_trial().value == study.best_trial.value
    assert res.best_trial().user_attrs["feasible"]
