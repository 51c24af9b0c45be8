"""A pinned knob is honoured or the candidate is illegal, never silently changed (found by
a new-user trial: `tune --sequence-parallel` ran tp = 2 and tp = 4 plans with SP off)."""

from __future__ import annotations

import optuna

from meshplan.tuning import search_problem, template_kinds
from tuner.legal_draw import draw_candidate, legal_tree
from tuner.space import SearchSpace, parse_fix
from tuner.suggest import enumerate_candidates, tp_choices

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _space(fix: str) -> SearchSpace:
    return SearchSpace(search_problem("llama2-7b", "dgx-a100-80g", 1, 32, 1024, False, 4),
                       fix=parse_fix(fix))


def test_enumeration_with_sp_pinned_holds_only_sp_plans():
    kinds = template_kinds("llama2-7b", 1024)
    on = enumerate_candidates(_space("sp=true"), "pattern-based", kinds)
    assert on and all(c.sequence_parallel and c.tp > 1 for c in on)
    off = enumerate_candidates(_space("sp=false"), "pattern-based", kinds)
    assert off and not any(c.sequence_parallel for c in off)
    both = enumerate_candidates(_space(""), "pattern-based", kinds)
    assert {c.key() for c in on} | {c.key() for c in off} == {c.key() for c in both}
    assert 1 not in tp_choices(_space("sp=true")) and 1 in tp_choices(_space(""))


def test_drawn_candidates_with_sp_pinned_are_all_sp():
    """The sampler draws only legal plans (tuner.legal_draw): with SP pinned on, every one
    of 40 random draws runs SP (before, a quarter were drawn and pruned)."""
    space, kinds = _space("sp=true"), template_kinds("llama2-7b", 1024)
    tree = legal_tree(space, "pattern-based", kinds)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    got = []
    for _ in range(40):
        t = study.ask()
        got.append(draw_candidate(tree, t, "pattern-based"))
        study.tell(t, 1.0)
    assert len(got) == 40 and all(c.sequence_parallel and c.tp > 1 for c in got)


def test_repeated_fix_flags_pin_together(capsys, tmp_path):
    """`--fix tp=1 --fix pp=2` kept only pp=2 (click keeps the last value of an option);
    both are pinned now, and a knob pinned twice is refused."""
    import pandas as pd

    from tests._cli import one_line_error, run_main

    base = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "16",
            "--layers", "4", "--trials", "6", "--no-progress")
    rc, out, err = run_main(capsys, *base, "--output", str(tmp_path / "a"), "--fix", "tp=1", "--fix", "pp=2")
    assert rc == 0, err
    hist = pd.read_csv(tmp_path / "a" / "history.csv")
    plans = hist[hist.state == "COMPLETE"]
    assert len(plans) and set(plans.tp) == {1} and set(plans.pp) == {2}
    line = one_line_error(*run_main(capsys, *base, "--output", str(tmp_path / "b"),
                                    "--fix", "tp=1", "--fix", "tp=2"))
    assert "knob 'tp' is given twice" in line


def test_a_search_stops_when_its_space_is_exhausted(capsys, tmp_path):
    """A bad-input hunt: every knob pinned (one plan) and --trials 10,000,000 ran on at
    ~60 trials/s, writing a journal of cache hits for two days. The sampler draws from the
    enumerated legal plans, so with every plan scored the search ends: one trial."""
    from tests._cli import run_main

    rc, out, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                            "--global-batch", "16", "--layers", "4", "--trials", "10000000",
                            "--sampler", "tpe", "--storage", "memory", "--no-progress",
                            "--output", str(tmp_path / "a"),
                            "--fix", "dp=8,tp=1,pp=1,cp=1,micro_batch_size=1,recompute=none,zero=1,"
                                     "schedule=1F1B,sequence_parallel=false,vpp=1")
    assert rc == 0, err
    flat = " ".join(out.split())
    assert "1 trials: 1 complete" in flat and "the proven optimum of the space" in flat


def test_a_pinned_pp_that_does_not_divide_the_layers_is_refused_before_the_search(capsys, tmp_path):
    """A hunt pinned pp=2 on 7 layers: all 20 trials were pruned and the report advised
    raising --trials, which cannot help. Under Megatron-LM's even split
    (``--layers-per-stage even``) the pin is refused up front, naming the flag as typed, and
    no output folder is made; the default balanced split runs it (4 + 3 layers)."""
    from tests._cli import run_main

    base = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--global-batch", "32", "--seq-len", "2048", "--trials", "2", "--storage", "memory",
            "--no-progress")
    rc, out, err = run_main(capsys, *base, "--layers", "7", "--fix", "pp=2", "--output", str(tmp_path / "ok"))
    assert rc == 0, err
    import re

    assert re.search(r"best plan: dp=\d+ tp=\d+ pp=2 ", " ".join(out.split())), out
    base = (*base, "--layers-per-stage", "even")
    rc, out, err = run_main(capsys, *base, "--layers", "7", "--fix", "pp=2", "--output", str(tmp_path / "a"))
    assert rc == 2 and "--fix: pp=2 does not divide the model's 7 layers" in err
    assert not (tmp_path / "a").exists()
    rc, out, err = run_main(capsys, *base, "--layers", "8", "--pp", "2", "--vpp", "3",
                            "--output", str(tmp_path / "b"))
    assert rc == 2 and "--pp 2 x --vpp 3 = 6 virtual stages do not divide the model's 8 layers" in err
