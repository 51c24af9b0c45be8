"""``--sampler exhaustive --workers N`` (issue 18 item 5): slices of the enumeration shared
by workers on one study equal one worker and brute force, no plan is scored twice, the
counts add up to the space size, and a killed search is finished on resume."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from meshplan.tuning import make_scorer, search_problem, template_kinds
from tests.counted_scorer import SLEEP_ENV, make_analytic_bounded
from tuner.exhaustive import prove_best
from tuner.exhaustive_shared import SLICE_STUDY_SUFFIX, slice_members
from tuner.search import load_result, search
from tuner.space import Candidate, ModelDims, SearchProblem, SearchSpace
from tuner.study import TuneConfig
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[2]
SC = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "global_batch_size": 32,
      "seq_len": 4096, "num_layers": 4}

# -- the algorithm: slices pruned against a shared incumbent ----------------------------------
point = st.tuples(st.floats(0.01, 100.0), st.floats(0.0, 1.0), st.integers(1, 100), st.floats(0.0, 1.0))


@settings(max_examples=200, deadline=None)
@given(st.lists(point, min_size=1, max_size=40), st.integers(1, 100), st.integers(1, 6),
       st.randoms(use_true_random=False))
def test_slices_with_a_shared_incumbent_equal_brute_force(points, limit, n_slices, rnd):
    """Random times/memories with random bounds below them, cut into ``n_slices`` slices
    (index mod S) proven one after another in a random order, each pruning against the
    best any earlier slice found: the best over the slices is the brute-force minimum, no
    point is evaluated twice, and the counts add up to the number of points."""
    t = [p[0] for p in points]
    t_lb = [p[0] * p[1] for p in points]
    mem = [p[2] for p in points]
    m_lb = [p[2] * p[3] for p in points]
    calls: list[int] = []
    best = [float("inf")]
    total = collections.Counter()
    order = list(range(n_slices))
    rnd.shuffle(order)
    for k in order:
        idx = list(slice_members(k, n_slices, len(points)))
        if not idx:
            continue

        def evaluate(i, idx=idx):
            calls.append(idx[i])
            j = idx[i]
            if mem[j] <= limit:
                best[0] = min(best[0], t[j])
            return t[j], mem[j], limit

        rep = prove_best([t_lb[j] for j in idx], [m_lb[j] for j in idx], [limit] * len(idx),
                         evaluate, incumbent=lambda: best[0])
        assert rep.proven
        total.update(simulated=rep.simulated, pm=rep.pruned_memory, pt=rep.pruned_time)
    feasible = [t[i] for i in range(len(t)) if mem[i] <= limit]
    assert best[0] == (min(feasible) if feasible else float("inf"))
    assert len(calls) == len(set(calls)) == total["simulated"]
    assert total["simulated"] + total["pm"] + total["pt"] == len(points)


# -- the cost model on a journal study ----------------------------------------------------------
@pytest.fixture(scope="module")
def piped():
    """tp = 1, pp = 4 (the bubble keeps bounds apart from the steps: several plans are
    simulated), every schedule family, two micro-batch sizes, recompute none/full, ZeRO 0/1."""
    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 4096, num_layers=4)
    space = SearchSpace(prob, fix={"tp": 1, "pp": 4}, schedules=("1F1B", "VPP", "ZBH1", "ZB", "ZBVPP"),
                        vpp_degrees=(2,), micro_batch_sizes=(1, 2), recompute=("none", "full"),
                        zero_stages=(0, 1))
    kinds = template_kinds("llama2-7b", 4096)
    return space, kinds, enumerate_candidates(space, "pattern-based", kinds)


def _calls(path: Path) -> list[tuple[str, str]]:
    return [tuple(ln.split(" ", 1)) for ln in path.read_text().splitlines() if ln.strip()]


def test_two_local_workers_equal_one_worker_and_brute_force(piped, tmp_path):
    """The real cost model: ``workers=2`` on a journal study proves the brute-force optimum,
    the one a single in-memory process proves, with every plan scored at most once over
    both processes (counted in a shared calls file) and the counts adding up."""
    space, kinds, cands = piped
    base = make_scorer(SC)
    brute = min(s.time_s for s in map(base, cands) if s.feasible)
    one = search(TuneConfig(space, mode="pattern-based", template_kinds=kinds, sampler="exhaustive",
                            scorer_factory="meshplan.tuning:make_scorer", scorer_config=SC),
                 "one", storage="memory").exhaustive
    calls = tmp_path / "calls"
    calls.touch()
    cfg = TuneConfig(space, mode="pattern-based", template_kinds=kinds, sampler="exhaustive",
                     scorer_factory="tests.counted_scorer:make_counted",
                     scorer_config=SC | {"calls_file": str(calls)})
    res = search(cfg, "two", study_dir=tmp_path, workers=2)
    rep = res.exhaustive
    assert rep.proven and rep.slices == rep.slices_done == 8  # SLICES_PER_WORKER * 2
    assert rep.best_time_s == one.best_time_s == brute
    assert res.best()[1]["time_s"] == brute
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == rep.space_size == len(cands)
    keys = [k for _, k in _calls(calls)]
    assert len(keys) == len(set(keys)) == rep.simulated  # nothing scored twice
    # one trial per scored plan in the search's study; the slices live in their own study
    assert len(res.study.trials) == rep.simulated
    assert load_result(tmp_path).study.study_name == "two"  # the slice study is not a second search
    # a rerun resumes the finished proof: nothing scored again, the same answer
    again = search(cfg, "two", study_dir=tmp_path, workers=1).exhaustive
    assert again.proven and again.best_time_s == brute and len(_calls(calls)) == len(keys)


# -- two processes that overlap, and a kill ------------------------------------------------------
TOY = SearchProblem(ModelDims("toy", 8, 1024, 16, 4, 4096, 32000), 16, 8, 64, 1024)


def _toy_cfg(calls: Path, **extra) -> TuneConfig:
    return TuneConfig(SearchSpace(TOY), mode="semi-auto", sampler="exhaustive",
                      scorer_factory="tests.counted_scorer:make_analytic_bounded",
                      scorer_config={"global_batch_size": 64, "calls_file": str(calls)} | extra)


def _toy_brute() -> tuple[float, int]:
    cands = enumerate_candidates(SearchSpace(TOY), "semi-auto")
    sc = make_analytic_bounded({"global_batch_size": 64})
    return min(s.time_s for s in map(sc, cands) if s.feasible), len(cands)


@pytest.mark.slow
def test_two_workers_share_the_slices(tmp_path):
    """The analytic scorer with a rendezvous (each process's first score waits for the
    other's): both processes score plans, of disjoint slices, none twice; the proof is
    the brute-force optimum and the report names the two workers."""
    calls = tmp_path / "calls"
    calls.touch()
    res = search(_toy_cfg(calls, rendezvous=True), "toy", study_dir=tmp_path, workers=2)
    rep = res.exhaustive
    optimum, n = _toy_brute()
    assert rep.proven and rep.best_time_s == optimum and rep.space_size == n
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == n
    got = _calls(calls)
    by_pid = collections.Counter(pid for pid, _ in got)
    assert len(by_pid) == 2 and rep.workers == 2, by_pid
    assert len({k for _, k in got}) == len(got) == rep.simulated


LEAD = """
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
from tests.tuner.test_exhaustive_shared import _toy_cfg
from pathlib import Path
from tuner.search import search
d = Path(sys.argv[1])
search(_toy_cfg(d / "calls"), "kill", study_dir=d)
"""


@pytest.mark.slow
def test_killed_search_is_finished_on_resume(tmp_path):
    """SIGKILL a ``tune``-like process mid-proof, then rerun the search: the dead worker's
    slice is failed (``interrupted``) and redone, its finished plans are read back from the
    study (resumed), never scored again, and the proof equals brute force."""
    calls = tmp_path / "calls"
    calls.touch()
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{SLEEP_ENV: "0.03"})
    proc = subprocess.Popen([sys.executable, "-c", LEAD, str(tmp_path)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_calls(calls)) < 20 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_calls = len(_calls(calls))
    assert n_calls >= 20, proc.stderr.read()[-2000:]
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log")))
    # what the calls file writes for a plan: its Candidate.key() tuple
    before = {str(Candidate.from_dict(t.user_attrs["plan"]).key())
              for t in optuna.load_study(study_name="kill", storage=journal).trials}
    assert len(before) >= n_calls - 1  # at most the plan in hand was lost
    res = search(_toy_cfg(calls), "kill", study_dir=tmp_path)
    rep = res.exhaustive
    optimum, n = _toy_brute()
    assert rep.proven and rep.best_time_s == optimum
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == n
    assert rep.resumed >= 1  # the dead worker's finished plans of its slice, read back
    keys = [t.user_attrs["plan_key"] for t in res.study.trials]
    assert len(keys) == len(set(keys)) == rep.simulated  # one trial per plan, none repeated
    scored_after = {k for _, k in _calls(calls)[n_calls:]}
    assert scored_after and not scored_after & before  # nothing finished before the kill scored again
    slices = optuna.load_study(study_name="kill" + SLICE_STUDY_SUFFIX, storage=res.study._storage)
    assert any(t.user_attrs.get("interrupted") for t in slices.get_trials(states=(TrialState.FAIL,)))


def test_timeout_leaves_slices_open_and_a_rerun_proves(tmp_path):
    """A shared search stopped by its timeout says NOT proven with its open slices; the
    rerun finishes them from the study (what was scored is not scored again)."""
    calls = tmp_path / "calls"
    calls.touch()
    rep = search(_toy_cfg(calls), "late", study_dir=tmp_path, timeout=1e-6).exhaustive
    assert not rep.proven and rep.slices_done < rep.slices
    assert "NOT proven" in rep.summary() and "slices open" in rep.summary()
    rep = search(_toy_cfg(calls), "late", study_dir=tmp_path).exhaustive
    optimum, n = _toy_brute()
    assert rep.proven and rep.best_time_s == optimum and rep.slices_done == rep.slices
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == n
    keys = [k for _, k in _calls(calls)]
    assert len(keys) == len(set(keys))


JOIN = """
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
from tuner.study import run_worker
run_worker("peer", None, study_dir=sys.argv[1])
"""


@pytest.mark.slow
def test_a_killed_workers_slice_is_finished_by_the_lead(tmp_path):
    """A worker joins a running search (``run_worker``, as ``meshplan worker`` does), takes
    a slice and is SIGKILLed mid-slice; the lead, still running, fails the dead worker's
    slice (``interrupted``), takes it over and proves the brute-force optimum, without
    scoring again a plan the dead worker finished."""
    import threading

    calls = tmp_path / "calls"
    calls.touch()
    cfg = _toy_cfg(calls, rendezvous=True)
    # cut the slices first (a zero-budget start), so that the worker can join at once
    assert not search(cfg, "peer", study_dir=tmp_path, timeout=1e-6).exhaustive.proven
    out: dict = {}
    lead = threading.Thread(target=lambda: out.update(rep=search(cfg, "peer", study_dir=tmp_path).exhaustive))
    lead.start()
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{SLEEP_ENV: "0.05"})
    worker = subprocess.Popen([sys.executable, "-c", JOIN, str(tmp_path)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    me = str(os.getpid())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and worker.poll() is None and \
            sum(pid != me for pid, _ in _calls(calls)) < 5:
        time.sleep(0.02)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log")))
    lead.join(timeout=300)
    assert not lead.is_alive() and "rep" in out, worker.stderr.read()[-2000:]
    rep = out["rep"]
    optimum, n = _toy_brute()
    assert rep.proven and rep.best_time_s == optimum
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == n
    got = _calls(calls)
    assert sum(pid != me for pid, _ in got) >= 5  # the worker did score plans before it died
    study = optuna.load_study(study_name="peer", storage=journal)
    keys = [t.user_attrs["plan_key"] for t in study.trials]
    assert len(keys) == len(set(keys)) == rep.simulated  # one trial per plan, none repeated
    scored = collections.Counter(k for _, k in got)
    # a plan is scored twice at most when the kill came between its score and its trial
    assert sum(v - 1 for v in scored.values()) <= 1
    slices = optuna.load_study(study_name="peer" + SLICE_STUDY_SUFFIX, storage=journal)
    assert any(t.user_attrs.get("interrupted") for t in slices.get_trials(states=(TrialState.FAIL,)))


def test_the_first_turns_go_to_the_slices_of_smallest_cheap_bound():
    """Eight candidates in 4 slices (k, k + 4) with cheap times 5 1 9 3 | 4 7 2 8, candidate
    1 over its memory limit: the smallest bound that may fit is 4 in slice 0 (5, 4), 7 in
    slice 1 (1 cannot fit), 2 in slice 2 (9, 2), 3 in slice 3 (3, 8): order 2 3 0 1, the
    bounds kept for the turns. A claim takes the preferred slices first, then the rest in
    the order of their trials."""
    from types import SimpleNamespace

    from tuner.exhaustive import Bound
    from tuner.exhaustive_shared import claim, open_slices, slice_order

    times = [5.0, 1.0, 9.0, 3.0, 4.0, 7.0, 2.0, 8.0]
    scorer = SimpleNamespace(cheap_bound=lambda c: Bound(times[c], 2 if c == 1 else 0, 1), bound=None)
    memo: dict = {}
    assert slice_order(list(range(8)), 4, scorer, memo) == [2, 3, 0, 1]
    assert memo["cheap"][1] == (1.0, 2.0, 1.0) and len(memo["cheap"]) == 8
    assert slice_order(list(range(8)), 4, scorer, {}, deadline=time.monotonic() - 1) is None
    study = optuna.create_study()
    cs, s = open_slices(study, 4, 8)
    got = [claim(cs, s, [2, 3]).user_attrs["slice"], claim(cs, s, [3]).user_attrs["slice"],
           claim(cs, s).user_attrs["slice"], claim(cs, s).user_attrs["slice"]]
    assert got == [2, 3, 0, 1] and claim(cs, s) is None
