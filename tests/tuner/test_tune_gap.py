"""Every answer of ``tune`` states its gap (issue 36 items 1 and 5): the reported lower bound
is a true bound -- on random spaces the optimum (every candidate simulated) is never below
it -- the branch and bound stopped by its budget and a sampled search carry one, and the
gap reaches report.txt, plan.json, ``tune --json`` and the study."""

from __future__ import annotations

import json
import math

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.plan import Plan
from meshplan.tune_setup import tune_config
from meshplan.tuning import make_scorer
from tests._cli import run_main
from tuner.exhaustive_tiered import prove_tiered
from tuner.gap import ANSWER_ATTR, SearchAnswer, merge_shapes, shape_bounds
from tuner.search import search
from tuner.space import Candidate
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)


# -- the algorithm: a stopped branch and bound leaves a true bound ----------------------------
point = st.tuples(st.floats(0.01, 100.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
                  st.integers(1, 100), st.floats(0.0, 1.0))


@settings(max_examples=300, deadline=None)
@given(st.lists(point, min_size=1, max_size=40), st.integers(1, 100), st.integers(0, 40),
       st.sets(st.integers(0, 39)))
def test_a_stopped_search_leaves_a_lower_bound_on_every_undecided_plan(points, limit, budget, scored):
    """Random times and memories with a cheap and a tight bound below each (slack factors
    in [0, 1], the tight one above the cheap one), the search stopped after ``budget``
    evaluations (a trial budget) or at the first plan not in ``scored`` (a sampled
    search's gap): the open bound is at most the time of every candidate that was not
    evaluated and fits, so min(best, open bound) is at most the brute-force optimum; a
    finished search has the optimum itself."""
    t = [p[0] for p in points]
    tight_t = [p[0] * max(p[1], p[2]) for p in points]
    cheap_t = [p[0] * p[2] for p in points]
    mem = [p[3] for p in points]
    cheap_m = [p[3] * p[4] for p in points]
    done: list[int] = []

    def evaluate(i):
        done.append(i)
        return t[i], mem[i], limit

    for stop, can in ((lambda: len(done) >= budget, None), (None, lambda i: i in scored)):
        done.clear()
        rep = prove_tiered(cheap_t, cheap_m, [limit] * len(points),
                           lambda i: (tight_t[i], cheap_m[i], limit), evaluate, stop=stop,
                           can_evaluate=can)
        feasible = [t[i] for i in range(len(t)) if mem[i] <= limit]
        optimum = min(feasible, default=math.inf)
        if rep.proven:
            assert (rep.best_time_s or math.inf) == optimum
            continue
        undecided = [i for i in range(len(t)) if i not in done and mem[i] <= limit]
        assert all(t[i] >= rep.open_bound_s for i in undecided)
        best = rep.best_time_s if rep.best_time_s is not None else math.inf
        assert min(best, rep.open_bound_s) <= optimum
        assert rep.simulated + rep.pruned_memory + rep.pruned_cheap + rep.open == len(points)
        # the per-candidate bounds it keeps are bounds too (shape_bounds reads them)
        low = rep.lower
        assert all(math.isnan(low[i]) or low[i] <= t[i] or mem[i] > limit for i in range(len(t)))


def test_gap_by_hand():
    """The issue's example: best 71.7 s, no plan faster than 57.3 s: the best is at most
    (71.7 - 57.3) / 57.3 = 25.1% slower than the optimum."""
    a = SearchAnswer("exhaustive", 71.7, 57.3, False, stopped_by="time budget")
    assert a.gap == pytest.approx(14.4 / 57.3) and a.optimum_at_least_s == 57.3
    assert a.summary() == ("best 71.7 s (stopped by its time budget); no plan in the space is faster "
                           "than 57.3 s: within 25.1% of the optimum")
    assert SearchAnswer("tpe", 0.5, 0.6, False).gap == 0.0  # the bound is above the best
    proven = SearchAnswer("exhaustive", 0.4734, None, True)
    assert proven.gap == 0.0 and "the proven optimum of the space (gap 0%)" in proven.summary()
    assert SearchAnswer("exhaustive", 0.4, None, False).gap is None
    refused = SearchAnswer("exhaustive", 0.4, None, True, refused=2, refusal="PlanProgramError: x")
    assert not refused.holds and refused.optimum_at_least_s is None and "NOT a proof" in refused.summary()
    assert SearchAnswer.from_dict(json.loads(json.dumps(a.to_dict()))) == a


def test_per_shape_bounds_by_hand():
    """Two shapes: dp2 tp2 pp1 has one plan evaluated (NaN), one that cannot fit (inf) and
    one bounded at 3.0; dp4 tp1 pp1 one bounded at 2.0 and one unbounded (-inf); merging
    with a slice that bounds dp2 tp2 pp1 at 2.5 takes the smaller bound."""
    c = [Candidate(2, 2, 1), Candidate(2, 2, 1, micro_batch_size=2), Candidate(2, 2, 1, zero=1),
         Candidate(4, 1, 1), Candidate(4, 1, 1, zero=1)]
    got = shape_bounds(c, [math.nan, math.inf, 3.0, 2.0, -math.inf])
    assert got["dp2 tp2 pp1"] == {"candidates": 3, "cannot_fit": 1, "unscored": 1, "lower_bound_s": 3.0}
    assert got["dp4 tp1 pp1"] == {"candidates": 2, "cannot_fit": 0, "unscored": 2, "lower_bound_s": None}
    other = {"dp2 tp2 pp1": {"candidates": 2, "cannot_fit": 0, "unscored": 1, "lower_bound_s": 2.5}}
    both = merge_shapes([got, other])
    assert both["dp2 tp2 pp1"] == {"candidates": 5, "cannot_fit": 1, "unscored": 2, "lower_bound_s": 2.5}
    assert both["dp4 tp1 pp1"]["lower_bound_s"] is None


# -- the real cost model on random small spaces -------------------------------------------------
TINY = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
        "num_key_value_heads": 8, "intermediate_size": 1408, "vocab_size": 4096,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-layer LLaMA-style config (hidden 512) and a score cache shared by the examples."""
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(TINY))
    return str(d), {}


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 3]), mbs=st.sampled_from([1, 2]),
       headroom=st.sampled_from([0.05, 0.99]), cap=st.integers(1, 3), sampler=st.sampled_from([None, "random"]))
def test_the_reported_bound_never_exceeds_the_brute_force_optimum(tiny, tp, zero, mbs, headroom, cap, sampler):
    """Random small spaces of the real cost model (one node of H100, the default space with
    tp, ZeRO, micro-batch and the 1F1B schedule pinned: about 10-30 plans, pp, cp, SP and FP8
    free), searched by the default branch and bound or a random sampler stopped after 1-3
    plans: the optimum over every plan simulated is never below the reported lower bound,
    never above the best found, and a proven answer is the optimum."""
    model, cache = tiny
    cfg = tune_config(model, "dgx-h100", 1, 16, 1024, "framework", 0, False,
                      f"tp={tp},zero={zero},mbs={mbs},schedule=1F1B", sampler, None, False,
                      memory_headroom=headroom)
    cands = enumerate_candidates(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    scorer = make_scorer(cfg.scorer_config)
    scores = []
    for c in cands:
        key = (headroom, c.key())
        if key not in cache:
            cache[key] = scorer(c)
        scores.append(cache[key])
    optimum = min((s.time_s for s in scores if s.feasible), default=None)
    ans = search(cfg, "gap", storage="memory", n_trials=cap).answer
    if ans.best_s is not None:
        assert optimum is not None and ans.best_s >= optimum * (1 - 1e-12)
    low = ans.optimum_at_least_s
    if low is not None and optimum is not None:
        assert low <= optimum * (1 + 1e-12), (low, optimum, ans)
    if ans.holds:
        assert ans.best_s == optimum  # None when nothing fits
    assert ans.refused == 0


# -- where the gap is written -------------------------------------------------------------------
ARGS = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1", "--global-batch", "32",
        "--layers", "4", "--fix", "tp=1,schedule=1F1B", "--no-search-cp", "--no-progress")


def test_a_budget_stopped_default_search_reports_its_gap_everywhere(capsys, tmp_path):
    """The default search stopped after 2 plans (``--trials 2``): the terminal, report.txt,
    plan.json (``search``), ``--json`` and the study's user attr ``answer`` carry the same
    best, lower bound and gap, and say it is not proven."""
    out = tmp_path / "run"
    rc, text, err = run_main(capsys, *ARGS, "--trials", "2", "--json", "--output", str(out))
    assert rc == 0, err
    got = json.loads(text)  # stdout is one JSON object
    s = got["search"]
    assert s["sampler"] == "exhaustive" and s["proven"] is False and s["stopped_by"] == "trial budget"
    assert s["scored"] == 2 and got["step_time_s"] == s["best_s"] and got["peak_memory_bytes"] > 0
    assert s["optimum_at_least_s"] <= s["best_s"] and s["gap"] == pytest.approx(
        (s["best_s"] - s["optimum_at_least_s"]) / s["optimum_at_least_s"])
    assert sum(s["candidates"][k] for k in ("simulated", "pruned_memory", "pruned_time", "pruned_cheap",
                                           "open")) == s["candidates"]["space"]
    plan = Plan.load(out / "plan.json")
    assert plan.search["gap"] == s["gap"] and Plan.from_dict(got["plan"]) == plan
    report = (out / "report.txt").read_text()
    assert "stopped by its trial budget" in report and f"within {s['gap']:.1%} of the optimum" in report
    from tuner.search import load_result

    res = load_result(out)
    assert res.answer.to_dict()["gap"] == s["gap"] and ANSWER_ATTR in res.study.user_attrs
    # the rerun resumes the study and proves it (nothing scored twice)
    rc, text, err = run_main(capsys, *ARGS, "--output", str(out))
    assert rc == 0, err
    flat = " ".join(text.split())
    assert "the proven optimum of the space (gap 0%)" in flat
    assert Plan.load(out / "plan.json").search["proven"] is True
    keys = [t.user_attrs["plan_key"] for t in load_result(out).study.trials]
    assert len(keys) == len(set(keys))  # the two plans of the first run were read back, not scored again


def test_a_refused_plan_leaves_the_proof_not_holding():
    """A plan the scorer refuses after the legality rules (a ValueError: an engine limit no
    rule models) has no step time and no bound covers it: the search decides every other
    plan but does not call its best the optimum, counts the refusal and names it, and the
    answer has no lower bound (the optimum may be the refused plan)."""
    from tests.counted_scorer import make_analytic_bounded
    from tests.tuner.test_exhaustive_shared import TOY
    from tuner.exhaustive import run_exhaustive
    from tuner.gap import from_report
    from tuner.space import SearchSpace
    from tuner.study import TuneConfig, open_study

    space = SearchSpace(TOY)
    cands = enumerate_candidates(space, "semi-auto")
    base = make_analytic_bounded({"global_batch_size": 64})
    first = min(cands, key=lambda c: base.bound(c).time_s)  # the first the search simulates

    def score(c):
        if c == first:
            raise ValueError("PlanProgramError: refused for the test")
        return base(c)

    score.bound = base.bound
    study, _ = open_study(TuneConfig(space, mode="semi-auto"), "refused", None, None)
    rep = run_exhaustive(study, cands, score, {})
    assert rep.proven and not rep.holds and rep.refused == 1
    assert "NOT a proof: the engine refused 1 candidate(s)" in rep.summary()
    assert "refused for the test" in rep.summary()
    ans = from_report(rep)
    assert not ans.holds and ans.optimum_at_least_s is None and ans.gap is None
    assert "NOT a proof" in ans.summary()
