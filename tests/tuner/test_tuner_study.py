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
from tuner.study import TuneConfig, TuneError, distinct_plans, open_study, optimize, resolve_factory
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)
DIMS = ModelDims("toy", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=4,
                 ffn_hidden_size=4096, vocab_size=32000)
PROB = SearchProblem(DIMS, world_size=16, devices_per_node=8, global_batch_size=64, seq_len=1024)
FACTORY = "tests.tuner_analytic:make_analytic"


def cfg(mode="semi-auto", sampler="tpe", pareto=False, cap_gib=80, space=None, **sc):
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


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_every_draw_is_legal_and_no_repeat_is_a_trial(sampler):
    """The sampler draws only legal plans (tuner.legal_draw): no trial is pruned, every
    plan scored is legal (before, a random search of this space drew B=64 with dp*mbs=16*8
    and other illegal points, each a trial), and the search ends with 120 distinct plans
    scored; the repeats it drew are cached trials, scored once."""
    study, rec = run(cfg(sampler=sampler), 120)
    assert rec.seen and all(L.is_legal(x, PROB) for x in rec.seen)
    assert {t.state for t in study.trials} == {optuna.trial.TrialState.COMPLETE}
    keys = [x.key() for x in rec.seen]
    assert len(keys) == len(set(keys)) == distinct_plans(study) == 120
    assert len(study.trials) == 120 + sum(bool(t.user_attrs.get("cached")) for t in study.trials)


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


@pytest.mark.slow
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
    assert distinct_plans(r1.study) == 30
    r2 = search(c, "res", study_dir=tmp_path, n_trials=70)
    ts = r2.trials()
    assert distinct_plans(r2.study) == 70 and sorted(t.number for t in ts) == list(range(len(ts)))
    n1 = len(first)
    assert {t.number: (t.params, t.state) for t in ts if t.number < n1} == first
    # resuming reseeds the sampler (seed + n1): it does not replay the first points
    assert [t.params for t in ts[n1:n1 + 10]] != [first[i][0] for i in range(10)]
    with pytest.raises(TuneError, match="different search"):
        search(cfg(sampler="tpe"), "res", study_dir=tmp_path, n_trials=80)


def test_two_local_workers_share_one_study(tmp_path):
    calls = tmp_path / "calls.txt"
    # 0.1 s per score: 6 s of work for one worker, so the second worker (a new process that
    # imports the scorer first, seconds on a loaded 2-core host) takes part too
    c = cfg(sampler="random", sleep_s=0.1, calls_file=str(calls))
    res = search(c, "w2", study_dir=tmp_path / "study", n_trials=60, workers=2)
    ts = res.trials()
    finished = [t for t in ts if t.state.name in ("COMPLETE", "PRUNED")]
    assert 60 <= distinct_plans(res.study) <= 62  # each worker may finish the plan in its hands
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


# -- issue 16 items 9, 10 and the flaky resume ------------------------------------------------

_TWO_PROCS = """
import sys, time
sys.path.insert(0, {root!r})
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
from tests.tuner.test_tuner_study import cfg, tiny_space
from tuner.search import search
start = float(sys.argv[2])
while time.time() < start:  # both processes open the study at the same moment
    time.sleep(0.001)
search(cfg(sampler={sampler!r}, sleep_s=0.02, calls_file=sys.argv[3], space=tiny_space()),
       "shared", storage=sys.argv[1], n_trials=40)
"""


def tiny_space():
    """A space of a handful of plans, so that repeats are frequent."""
    from tuner.space import parse_fix

    return SearchSpace(PROB, fix=parse_fix("dp=2,tp=4,pp=2,zero=0"), schedules=("1F1B",),
                       micro_batch_sizes=(1, 2), recompute=("none", "full"))


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_two_processes_on_one_journal_never_score_a_plan_twice(tmp_path, sampler):
    """Issue 16 item 10: two searches started together on one journal file (same study,
    same seed) draw different startup points (each worker seeds its sampler with its own
    identity once it sees another live worker) and score each plan once between them (the
    cache covers plans another process scored, and a plan a live peer is scoring is
    waited for)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    journal, calls = tmp_path / "journal.log", tmp_path / "calls.txt"
    code = _TWO_PROCS.format(root=root, sampler=sampler)
    start = str(time.time() + 3.0)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(journal), start, str(calls)],
                              cwd=root, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    lines = calls.read_text().splitlines()
    keys = [ln.split(" ", 1)[1] for ln in lines]
    assert len(keys) == len(set(keys)), "a plan was scored twice"
    st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="shared", storage=st).get_trials(deepcopy=False)
    by_pid: dict[int, list] = {}
    for t in sorted(trials, key=lambda t: t.number):
        by_pid.setdefault(t.system_attrs[WORKER_ATTR]["pid"], []).append(t.params)
    assert len(by_pid) == 2
    first = [seq[:6] for seq in by_pid.values()]
    assert first[0] != first[1], "both workers drew the same startup points"
    scored_keys = {t.user_attrs["plan_key"] for t in trials
                   if t.state.name == "COMPLETE" and not t.user_attrs.get("cached")}
    assert len(scored_keys) == len(keys)  # every scored trial was one scorer call


def test_worker_seed_is_plain_alone_and_distinct_when_shared():
    from tuner.study import worker_seed

    assert worker_seed(5, 30, None) == 35  # alone: reproducible, shifted on resume
    a, b = worker_seed(5, 0, "vm:100:1"), worker_seed(5, 0, "vm:101:1")
    assert a != b and 0 <= a < 2**32 and worker_seed(5, 0, "vm:100:1") == a


def test_a_worker_alone_keeps_the_plain_seed(tmp_path):
    """Registrations of dead workers (an earlier run of the same search) do not change it."""
    from tuner.study import REGISTER_PREFIX

    c = cfg(sampler="random")
    study, _ = open_study(c, "alone", None, tmp_path)
    study._storage.set_study_system_attr(study._study_id, REGISTER_PREFIX + "vm:1:0",
                                         {"host": __import__("socket").gethostname(),
                                          "pid": 2**22 + 12345, "start": "0"})
    again, _ = open_study(c, "alone", None, tmp_path)
    plain = optuna.samplers.RandomSampler(seed=1)._rng.rng
    assert again.sampler._rng.rng.random_sample(4).tolist() == plain.random_sample(4).tolist()


def test_scorer_errors_are_cached_like_scores():
    """A plan the scorer refused is not scored again: later draws reuse the error."""
    c = cfg(sampler="random", space=tiny_space())
    study, c = open_study(c, "err", None, None)
    calls = []

    def scorer(cand):
        calls.append(cand.key())
        raise ValueError("cannot cost this plan")

    optimize(study, c, scorer, 30)
    assert len(calls) == len(set(calls))
    cached = [t for t in study.trials if t.user_attrs.get("cached")]
    assert cached and all("cannot cost" in t.user_attrs["error"] for t in cached)


_KILLED_AFTER_ASK = """
import os, signal, sys
sys.path.insert(0, {root!r})
import optuna
from tuner.storage import open_storage
from pathlib import Path
st = open_storage(None, Path(sys.argv[1]))
study = optuna.load_study(study_name="k", storage=st)
if sys.argv[2] == "enqueued":
    study.enqueue_trial({{}})
study.ask()  # the trial is RUNNING: killed before the objective could record anything
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["new", "enqueued"])
def test_trial_of_a_worker_killed_right_after_creating_it_is_recovered(tmp_path, how):
    """The flaky resume (149 of 150 trials): a worker SIGKILLed between creating a trial
    and naming itself left a RUNNING trial without an owner that no resume recovered and
    that counted as running forever. The owner is now written with the trial (or, for an
    enqueued trial, claimed before it is taken), so it is failed, retried, and the target
    is reached."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    c = cfg(sampler="random")
    study, c = open_study(c, "k", None, tmp_path)
    optimize(study, c, Recorder(c), 5)
    r = subprocess.run([sys.executable, "-c", _KILLED_AFTER_ASK.format(root=root), str(tmp_path), how],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr[-2000:]
    study, c = open_study(c, "k", None, tmp_path)
    orphan = [t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    assert len(orphan) == 1
    optimize(study, c, Recorder(c), 12)
    trials = study.get_trials(deepcopy=False)
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 12
    dead = [t for t in trials if t.number == orphan[0].number][0]
    assert dead.state.name == "FAIL" and dead.user_attrs.get("interrupted")
    assert [t.user_attrs.get("retry_of") for t in trials].count(dead.number) == 1


@pytest.mark.parametrize("name", ["../../../x", "a/b", ".hidden", "", "a b", "x" * 129, "é", "a\\b"])
def test_unsafe_study_names_are_refused(name):
    from tuner.study import check_study_name

    with pytest.raises(TuneError, match="is not allowed"):
        check_study_name(name)
    with pytest.raises(TuneError, match="is not allowed"):
        open_study(cfg(), name, None, None)


def test_safe_study_names_pass():
    from tuner.study import check_study_name

    for name in ("llama2-7b_pattern.v2", "x", "_a", "-b", "A1." + "z" * 120):
        assert check_study_name(name) == name
