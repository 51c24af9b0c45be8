"""``TuneResult.counts_text``: the report's trial counts with each subset inside its state
(the flat ``counts()`` dict, printed before, summed to more than the trials)."""

from __future__ import annotations

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from tuner.result import TuneResult

GIB = 2**30


def _trial(state: TrialState, **attrs) -> optuna.trial.FrozenTrial:
    value = 1.0 if state == TrialState.COMPLETE else None
    return create_trial(state=state, value=value, params={"x": 1},
                        distributions={"x": IntDistribution(0, 2)}, user_attrs=attrs)


def _scored(mem_gib: float, **extra) -> dict:
    return {"time_s": 1.0, "memory_bytes": int(mem_gib * GIB), "memory_limit_bytes": 80 * GIB, **extra}


def test_each_subset_is_counted_inside_its_state():
    study = optuna.create_study()
    for t in (_trial(TrialState.COMPLETE, **_scored(10)),
              _trial(TrialState.COMPLETE, **_scored(90)),              # over the 80 GiB limit
              _trial(TrialState.COMPLETE, **_scored(90, cached=True)),  # over and from the cache
              _trial(TrialState.COMPLETE, **_scored(20, cached=True)),
              _trial(TrialState.PRUNED, illegal="tp does not divide heads"),
              _trial(TrialState.PRUNED, illegal="pp > layers"),
              _trial(TrialState.PRUNED, error="ValueError: x", cached=True),
              _trial(TrialState.FAIL)):
        study.add_trial(t)
    res = TuneResult(study, global_batch_size=8)
    assert res.counts_text() == ("8 trials: 4 complete (2 over memory, 2 cached), "
                                 "3 pruned (2 illegal, 1 error, 1 cached), 1 failed")
    # the flat dict has the same figures, its subsets overlapping their states
    c = res.counts()
    assert (c["complete"], c["oom"], c["pruned"], c["illegal"], c["error"], c["fail"]) == (4, 2, 3, 2, 1, 1)


def test_an_empty_study_has_no_trials():
    assert TuneResult(optuna.create_study(), global_batch_size=8).counts_text() == "0 trials"
