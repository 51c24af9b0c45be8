"""``meshplan cost --tokens`` / ``--jitter-samples`` and ``meshplan tune --objective
time-to-train | cost-to-train | p90`` (issue 41): the breakdown against the library, the
deterministic output unchanged without the options, one-line errors, the search's objective
and its bound."""

from __future__ import annotations

import json

import pytest

from meshplan.engine import Engine
from meshplan.strategy import Strategy
from tests._cli import one_line_error, run_main

COST = ["cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "4", "--tp", "2",
        "--pp", "2", "--global-batch", "32", "--seq-len", "1024", "--layers", "4", "--zero", "1"]


def test_cost_tokens_adds_the_run_and_leaves_the_step_as_it_was(capsys):
    rc, plain, err = run_main(capsys, *COST, "--json")
    assert rc == 0, err
    base = json.loads(plain)
    assert "time_to_train" not in base and "jitter" not in base
    rc, out, err = run_main(capsys, *COST, "--json", "--tokens", "1B", "--price", "2.5", "--spares", "1")
    assert rc == 0, err
    got = json.loads(out)
    run = got.pop("time_to_train")
    assert got == base  # the step's figures are untouched
    from clusters.goodput_spec import goodput_sections
    from simulator.goodput.plan import TrainSettings, plan_run

    eng = Engine("llama2-7b", "dgx-h100", Strategy(dp=4, tp=2, pp=2, global_batch_size=32, zero=1),
                 nodes=2, seq_len=1024, num_layers=4)
    model = eng.step_model()
    want = plan_run(model, model.run(), TrainSettings(tokens=1e9, price=2.5, spares=1),
                    goodput_sections(eng.cluster))
    assert run["steps"] == want.steps == -(-10**9 // (32 * 1024))
    assert run["breakdown_s"]["total_s"] == pytest.approx(want.breakdown.total_s)
    # 16 GPUs and one 8-GPU spare node billed at $2.50 an hour
    assert run["cost_usd"] == pytest.approx(want.breakdown.total_s / 3600 * 24 * 2.5)
    assert run["restart_s"]["replace_s"] == 0 and run["checkpoint"]["mode"] == "async"
    rc, text, err = run_main(capsys, *COST, "--tokens", "1B", "--checkpoint", "sync", "--jitter-samples", "5")
    assert rc == 0, err
    assert "time to train 1e+09 tokens" in text and "sync saves every" in text and "P90" in text


@pytest.mark.parametrize("extra, what", [
    (["--price", "3"], "give --tokens too"),
    (["--tokens", "15Q"], "--tokens '15Q'"),
    (["--tokens", "1B", "--checkpoint", "async", "--framework", "deepspeed"], "saves synchronously"),
    (["--tokens", "1B", "--checkpoint", "later"], "checkpoint mode must be one of"),
    (["--tokens", "1B", "--price", "1", "--prices", "p.yaml"], "not both"),
])
def test_cost_run_options_refuse_bad_input_in_one_line(capsys, extra, what):
    line = one_line_error(*run_main(capsys, *COST, *extra))
    assert what in line


TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "32",
        "--layers", "4", "--seq-len", "1024", "--sampler", "exhaustive", "--fix", "tp=1,pp=1",
        "--storage", "memory", "--no-progress"]


def test_tune_time_to_train_scores_and_bounds_the_run(capsys, tmp_path):
    rc, out, err = run_main(capsys, *TUNE, "--objective", "time-to-train", "--tokens", "10B",
                            "--output", str(tmp_path / "t"))
    assert rc == 0, err
    assert "days to train (goodput" in out and "proven optimum" in out
    plan = json.loads((tmp_path / "t" / "plan.json").read_text())["strategy"]
    # the objective's lower bound never exceeds its value, plan by plan
    from meshplan.tuning import make_scorer
    from tuner.space import Candidate

    cfg = {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32, "seq_len": 1024,
           "num_layers": 4, "objective": {"name": "time-to-train", "tokens": 1e10}}
    score = make_scorer(cfg)
    for zero in (0, 1, 2):
        c = Candidate(dp=8, tp=1, pp=1, vpp=1, schedule="1F1B", micro_batch_size=plan["micro_batch_size"],
                      recompute="none", zero=zero, sequence_parallel=False, annotation="templates")
        s = score(c)
        assert score.bound(c).time_s <= s.time_s and score.cheap_bound(c).time_s <= s.time_s
        steps = -(-10**10 // (32 * 1024))
        assert s.time_s == pytest.approx(s.metrics["time_to_train_s"] / steps)
        assert s.metrics["step_time_s"] < s.time_s


@pytest.mark.parametrize("extra, what", [
    (["--objective", "time-to-train"], "give the tokens to train"),
    (["--objective", "time", "--tokens", "1T", "--gpus", "8"], "--tokens: read by --objective time-to-train"),
    (["--objective", "cost-to-train", "--tokens", "1T", "--cluster", "cpu-local"], "no price for device"),
    (["--objective", "time-to-train", "--tokens", "1T", "--deadline", "soon"], "--deadline 'soon'"),
])
def test_tune_objective_refusals_are_one_line(capsys, tmp_path, extra, what):
    base = list(TUNE)
    if "--cluster" in extra:  # one --cluster (a repeated option is refused)
        i = base.index("--cluster")
        del base[i:i + 2]
    line = one_line_error(*run_main(capsys, *base, "--output", str(tmp_path / "x"), *extra))
    assert what in line


def _o(gpus, step, ttt, usd, cluster="a"):
    from tuner.sizing import SizeOutcome

    return SizeOutcome(gpus // 8, gpus, step, 1.0, 1024, f"p{gpus}", "s", time_to_train_s=ttt, cost_usd=usd,
                       objective_s=step, cluster=cluster)


def test_sizes_are_chosen_by_time_or_cost_to_train_within_a_deadline():
    from meshplan.tune_sizes import pareto
    from tuner.sizing import choose

    outs = [_o(8, 4.0, 40 * 86400, 100.0), _o(16, 2.2, 22 * 86400, 110.0), _o(32, 1.3, 13 * 86400, 130.0),
            _o(32, 1.5, 15 * 86400, 140.0, "b")]
    assert choose(outs, "time-to-train").gpus == 32 and choose(outs, "cost-to-train").gpus == 8
    assert choose(outs, "cost-to-train", deadline_s=30 * 86400).gpus == 16
    assert choose(outs, "time-to-train", deadline_s=10 * 86400) is None
    # b's 32 GPUs are slower and dearer than a's: off the front
    assert [(o.cluster, o.gpus) for o in pareto(outs)] == [("a", 32), ("a", 16), ("a", 8)]


@pytest.mark.slow
def test_tune_over_two_clusters_writes_the_pareto_front(capsys, tmp_path):
    import pandas as pd

    rc, out, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100,dgx-a100-80g",
                            "--gpus", "8,16", "--global-batch", "32", "--layers", "4", "--seq-len", "1024",
                            "--sampler", "exhaustive", "--fix", "tp=1,pp=1", "--storage", "memory",
                            "--no-progress", "--objective", "cost-to-train", "--tokens", "20B",
                            "--output", str(tmp_path))
    assert rc == 0, err
    df = pd.read_csv(tmp_path / "sizes.csv")
    assert sorted(zip(df.cluster, df.gpus, strict=True)) == [("dgx-a100-80g", 8), ("dgx-a100-80g", 16),
                                                             ("dgx-h100", 8), ("dgx-h100", 16)]
    front = pd.read_csv(tmp_path / "pareto.csv")
    assert (tmp_path / "pareto.png").is_file() and len(front) >= 1
    cheapest = df.loc[df.cost_usd.idxmin()]
    assert f"chosen: {cheapest.cluster}, {cheapest.gpus} GPUs" in out
