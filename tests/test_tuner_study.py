"""Study mechanics with a small analytic scorer (tests/tuner_analytic.py): pruning of
illegal points, OOM as a constraint, caching, Pareto, exhaustive search, resume, workers."""

from __future__ import annotations

import itertools
from collections import Counter

import optuna
import pytest

from tests.tuner_analytic import analytic_time_memory
from tuner import legality as L
from tuner.search import search
from tuner.space import ModelDims, SearchProblem, SearchSpace, iter_base_candidates
from tuner.storage import WORKER_ATTR
from tuner.study import TuneConfig, TuneError, open_study, optimize, resolve_factory
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)
DIMS = ModelDims("toy", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=4,
                 ffn_hidden_size=4096, vocab_size=32000)
PROB = SearchProblem(DIMS, world_size=16, devices_per_node=8, global_batch_size=64, seq_len=1024)
FACTORY = "tests.tuner_analytic:make_analytic"


def cfg(mode="semi-auto", sampler=None, pareto=False, cap_gib=80, space=None, **sc):
    scfg = {"global_batch_size": 64, "memory_limit_gib": cap_gib} | sc
    return TuneConfig(space or SearchSpace(PROB), mode=mode, sampler=sampler, seed=1,
                      pareto=pareto, scorer_factory=FACTORY, scorer_config=scfg)


class Recorder:
    """Wraps the analytic scorer; records what it was asked to score."""

    def __init__(self, c: TuneConfig):
        self.inner = resolve_factory(c.scorer_factory)(c.scorer_config)
        self.seen = []

    def __call__(self, cand):
        self.seen.append(cand)
        return self.inner(cand)


def run(c: TuneConfig, n: int):
    study, c = open_study(c, "s", None, None)
    rec = Recorder(c)
    optimize(study, c, rec, n)
    return study, rec


def test_illegal_points_pruned_and_never_scored():
    study, rec = run(cfg(sampler="random"), 120)
    assert rec.seen and all(L.is_legal(x, PROB) for x in rec.seen)
    states = {t.state for t in study.trials}
    assert states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned  # B=64 with dp*mbs=16*8 is illegal, for one
    for t in pruned:
        rule = t.user_attrs["illegal"].split(":")[0]
        assert rule in L.RULES_BY_NAME or rule == "mesh_matches_world"
        assert "time_s" not in t.user_attrs


def test_oom_is_a_constraint_not_a_failure():
    study, rec = run(cfg(sampler="random", cap_gib=10), 80)
    oom = [t for t in study.trials if t.user_attrs.get("memory_bytes", 0) > 10 * 2**30]
    assert oom
    for t in oom:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.constraints["memory"] > 0 and t.value == t.user_attrs["time_s"]
        assert t.constraints["memory"] == pytest.approx(t.user_attrs["memory_bytes"] / (10 * 2**30) - 1)
    best = study.best_trial  # Optuna picks the best among feasible trials
    assert best.user_attrs["memory_bytes"] <= 10 * 2**30
    feas = [t.value for t in study.trials if t.state.name == "COMPLETE" and t.constraints["memory"] <= 0]
    assert best.value == min(feas)


def test_identical_plans_scored_once():
    study, rec = run(cfg(), 150)  # TPE revisits points of this small space
    keys = [x.key() for x in rec.seen]
    assert len(keys) == len(set(keys))
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    cached = [t for t in complete if t.user_attrs.get("cached")]
    assert cached and len(complete) == len(rec.seen) + len(cached)
    for t in cached:
        again = [u for u in complete if u.user_attrs["plan_key"] == t.user_attrs["plan_key"]]
        assert len({u.value for u in again}) == 1


def test_exhaustive_bruteforce_covers_exactly_the_legal_space():
    space = SearchSpace(PROB, schedules=("1F1B", "VPP", "ZBVPP"), vpp_degrees=(2, 4),
                        micro_batch_sizes=(1, 2, 4), recompute=("none", "full"),
                        zero_stages=(0, 1))
    c = cfg(sampler="bruteforce", space=space)
    study, rec = run(c, 100000)
    legal = {x.replace(annotation="megatron").key() for x in iter_base_candidates(space)
             if L.is_legal(x, PROB)}
    got = {x.key() for x in rec.seen}
    assert got == legal
    # and the exhaustive optimum is the analytic minimum over the enumerated legal points
    best = min(analytic_time_memory(x, 64)[0] for x in iter_base_candidates(space)
               if L.is_legal(x, PROB))
    assert study.best_value == pytest.approx(best)


def test_pareto_front_is_non_dominated():
    study, _ = run(cfg(sampler="random", pareto=True, cap_gib=40), 120)
    assert len(study.directions) == 2
    from tuner.result import TuneResult

    front = TuneResult(study, 64, pareto=True).pareto_front()
    pts = [(t.user_attrs["time_s"], t.user_attrs["memory_bytes"]) for t in front]
    feas = [(t.user_attrs["time_s"], t.user_attrs["memory_bytes"]) for t in study.trials
            if t.state.name == "COMPLETE" and t.user_attrs["memory_bytes"] <= 40 * 2**30]
    for a, b in itertools.product(pts, feas):
        assert not (b[0] <= a[0] and b[1] <= a[1] and b != a)
    # every feasible point is dominated by or equal to a front point
    assert all(any(a[0] <= b[0] and a[1] <= b[1] for a in pts) for b in feas)


def test_resume_in_process_keeps_trials(tmp_path):
    c = cfg(sampler="random")
    r1 = search(c, "res", study_dir=tmp_path, n_trials=30)
    first = {t.number: (t.params, t.state) for t in r1.trials()}
    r2 = search(c, "res", study_dir=tmp_path, n_trials=70)
    ts = r2.trials()
    assert len(ts) == 70 and sorted(t.number for t in ts) == list(range(70))
    assert {t.number: (t.params, t.state) for t in ts if t.number < 30} == first
    # resuming reseeds the sampler (seed + 30): it does not replay the first 30 points
    assert [t.params for t in ts[30:40]] != [first[i][0] for i in range(10)]
    with pytest.raises(TuneError, match="different search"):
        search(cfg(sampler="tpe"), "res", study_dir=tmp_path, n_trials=80)


def test_two_local_workers_share_one_study(tmp_path):
    calls = tmp_path / "calls.txt"
    c = cfg(sampler="random", sleep_s=0.02, calls_file=str(calls))
    res = search(c, "w2", study_dir=tmp_path / "study", n_trials=60, workers=2)
    ts = res.trials()
    finished = [t for t in ts if t.state.name in ("COMPLETE", "PRUNED")]
    assert 60 <= len(finished) <= 61  # the last trial may race between the two workers
    assert len({t.number for t in ts}) == len(ts)
    pids = {t.system_attrs[WORKER_ATTR]["pid"] for t in finished}
    assert len(pids) == 2
    lines = calls.read_text().split("\n")[:-1]
    assert len({ln.split(" ", 1)[0] for ln in lines}) == 2


def test_workers_need_shared_storage():
    with pytest.raises(TuneError, match="shared storage"):
        search(cfg(), "x", storage="memory", n_trials=5, workers=2)


def test_pattern_based_bruteforce_matches_enumeration():
    kinds = {"embedding": ("replicated", "vocab_parallel"), "attention": ("replicated", "megatron"),
             "mlp": ("replicated", "megatron"), "norm": ("replicated", "sequence_parallel"),
             "lm_head": ("replicated", "vocab_parallel"), "loss": ("follow_head",)}
    space = SearchSpace(PROB, schedules=("1F1B",), micro_batch_sizes=(1, 2),
                        recompute=("none",), zero_stages=(0,))
    c = TuneConfig(space, mode="pattern-based", template_kinds=kinds, sampler="bruteforce",
                   seed=0, scorer_factory=FACTORY, scorer_config={"global_batch_size": 64})
    study, rec = run(c, 100000)
    got = {x.key() for x in rec.seen}
    want = {x.key() for x in enumerate_candidates(space, "pattern-based", kinds)}
    assert got == want
    # tp in {1, 2, 4, 8} (16 heads, 4 kv heads -> tp <= 4 ... and <= 8 per node), pp | 8 layers
    per_mesh = Counter((x.dp, x.tp, x.pp) for x in rec.seen if x.micro_batch_size == 1)
    # tp > 1: 2^4 template sets + the sequence-parallel norm on the Megatron set = 17
    assert set(per_mesh.values()) == {1, 17}
    assert all(v == (1 if m[1] == 1 else 17) for m, v in per_mesh.items())
    sp = [x for x in rec.seen if x.sequence_parallel]
    assert sp and all(dict(x.templates)["attention"] == "megatron" for x in sp)
