"""FP8 as a tuner dimension (issue 17: each feature "all the way through ... tuner
dimension"): the space, the Optuna and exhaustive paths, the CLI and its refusals."""

from __future__ import annotations

import pytest

from meshplan.engine import Engine
from meshplan.tuning import make_scorer, search_problem, template_kinds, to_strategy
from tests._cli import one_line_error, run_main
from tuner.exhaustive import run_exhaustive
from tuner.space import Candidate, SearchSpace, SpaceError, iter_base_candidates, parse_fix
from tuner.study import TuneConfig, open_study
from tuner.suggest import enumerate_candidates

SC = {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32,
      "seq_len": 2048, "num_layers": 4}


def _problem():
    return search_problem("llama2-7b", "dgx-h100", 1, 32, 2048, False, 4)


def test_space_adds_fp8_only_when_asked_and_fix_pins_it():
    p = _problem()
    plain = list(iter_base_candidates(SearchSpace(p)))
    both = list(iter_base_candidates(SearchSpace(p, fp8_recipes=(None, "te-delayed"))))
    assert {c.fp8 for c in plain} == {None}
    assert len(both) == 2 * len(plain)
    assert {c.fp8 for c in both} == {None, "te-delayed"}
    assert sum(c.fp8 == "te-delayed" for c in both) == len(plain)
    pinned = SearchSpace(p, fix=parse_fix("fp8=te-delayed"), fp8_recipes=(None, "te-delayed"))
    assert pinned.fp8_choices() == ["te-delayed"]
    assert SearchSpace(p, fix=parse_fix("fp8=none")).fp8_choices() == [None]
    with pytest.raises(SpaceError, match="unknown fp8 recipe"):
        SearchSpace(p, fp8_recipes=(None, "fp4"))
    with pytest.raises(SpaceError, match="fp8='fp4' is not one of"):
        SearchSpace(p, fix=parse_fix("fp8=fp4"))


def test_records_of_bf16_plans_and_spaces_are_unchanged():
    """A study stored before the FP8 dimension resumes: fp8 is absent when unset."""
    c = Candidate(8, 1, 1)
    assert "fp8" not in c.to_dict()
    f = c.replace(fp8="te-delayed")
    assert f.to_dict()["fp8"] == "te-delayed" and Candidate.from_dict(f.to_dict()) == f
    assert f.key() != c.key()
    s = SearchSpace(_problem())
    assert "fp8_recipes" not in s.to_dict()
    s2 = SearchSpace(_problem(), fp8_recipes=(None, "te-delayed"))
    assert SearchSpace.from_dict(s2.to_dict()) == s2


def test_strategy_of_an_fp8_candidate_runs_the_recipe():
    c = Candidate(8, 1, 1, micro_batch_size=1, fp8="te-delayed")
    s = to_strategy(c, 32, "llama2-7b", 2048)
    assert s.fp8 == "te-delayed" and s.dtype == "bfloat16"
    assert to_strategy(c.replace(fp8=None), 32, "llama2-7b", 2048).fp8 is None


def test_exhaustive_over_bf16_and_fp8_is_the_better_of_the_two_optima():
    """The proven optimum of the union space equals the minimum of the proven optima of
    its BF16 half and its FP8 half (each searched alone), and it is simulated again from
    its strategy to the same step time."""
    p = _problem()
    kinds = template_kinds("llama2-7b", 2048)

    def best(recipes, name):
        space = SearchSpace(p, fix={"tp": 1}, fp8_recipes=recipes)
        cands = enumerate_candidates(space, "pattern-based", kinds)
        cfg = TuneConfig(space, mode="pattern-based", template_kinds=kinds, sampler="exhaustive",
                         scorer_config=SC)
        study, _ = open_study(cfg, name, None, None)
        rep = run_exhaustive(study, cands, make_scorer(SC), {})
        assert rep.proven and rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == len(cands)
        return rep.best_time_s, cands[rep.best_index]

    t_bf16, _ = best((None,), "bf16")
    t_fp8, _ = best(("te-delayed",), "fp8")
    t_both, c_both = best((None, "te-delayed"), "both")
    assert t_both == min(t_bf16, t_fp8)
    assert t_fp8 < t_bf16 and c_both.fp8 == "te-delayed"  # H100: FP8 GEMMs at 2x the BF16 peak
    res = Engine("llama2-7b", "dgx-h100", to_strategy(c_both, 32, "llama2-7b", 2048), nodes=1,
                 seq_len=2048, num_layers=4).simulate()
    assert res.step_time == pytest.approx(t_both, rel=1e-9)


ARGS = ("tune", "--model", "llama2-7b", "--global-batch-size", "32", "-s", "2048",
        "--layers", "4", "--nodes", "1", "--storage", "memory", "--no-progress")


def test_cli_search_fp8_writes_the_recipe_and_refuses_what_cannot_run(capsys, tmp_path):
    import pandas as pd

    rc, out, err = run_main(capsys, *ARGS, "--cluster", "dgx-h100", "--search-fp8", "--trials", "8",
                            "--fix", "tp=1,pp=1", "--output", str(tmp_path / "h"))
    assert rc == 0, err
    hist = pd.read_csv(tmp_path / "h" / "history.csv")
    assert set(hist["fp8"].dropna()) <= {"none", "te-delayed"} and "fp8" in hist.columns
    # the top table names each plan's recipe when one of them has one (it did not: an FP8
    # plan and its BF16 twin read alike); report.txt has the whole name
    report = (tmp_path / "h" / "report.txt").read_text()
    top = report.split("Top plans", 1)[1].split("best plan", 1)[0]
    assert ("FP8" in top) == ("te-delayed" in top) == ("te-delayed" in set(hist["fp8"].dropna()))
    line = one_line_error(*run_main(capsys, *ARGS, "--cluster", "dgx-a100-80g", "--search-fp8",
                                    "--output", str(tmp_path / "a")))
    assert "dgx-a100-80g's device A100-SXM-80GB has no FP8 peak" in line
    line = one_line_error(*run_main(capsys, *ARGS, "--cluster", "dgx-h100", "--search-fp8",
                                    "--dtype", "fp8-delayed", "--output", str(tmp_path / "d")))
    assert "--dtype fp8-delayed already fixes one" in line
    line = one_line_error(*run_main(capsys, *ARGS, "--cluster", "dgx-h100", "--search-fp8",
                                    "--framework", "deepspeed", "--output", str(tmp_path / "s")))
    assert "framework deepspeed runs no FP8 recipe" in line
