"""``search_quality_time`` (issue 18 item 7): the quick run's traces and table against values
recomputed here -- the exhaustive optimum equals a brute force over the space built by the
CLI's own config (``meshplan.commands.tune._tune_config``), best-so-far never increases,
every gap and time in the table equals the one recomputed from the traces; the summary
functions against a plain numpy implementation (hypothesis); the spaces are those
``meshplan tune`` searches; bad input is refused naming the field."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import experiments.search_quality_time as sqt
from experiments.base import ExperimentError
from experiments.search_traces import SpaceSpec, Trace, run_trace, tune_config
from meshplan.cli import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The README's quick command: (table, traces, output dir)."""
    out = tmp_path_factory.mktemp("sqt")
    assert main(["report", "--quick", "--only", "search_quality_time", "--output", str(out)]) == 0
    return pd.read_csv(out / f"{sqt.NAME}.csv"), pd.read_csv(out / f"{sqt.NAME}_traces.csv"), out


def brute_force_optimum(spec: SpaceSpec) -> float:
    """Smallest simulated step time of a fitting plan over every candidate of the space
    ``meshplan tune`` builds for ``spec`` (no bound, no pruning)."""
    from meshplan.commands.tune import _tune_config
    from tuner.study import resolve_factory
    from tuner.suggest import enumerate_candidates

    cfg = _tune_config(spec.model, spec.cluster, spec.nodes, spec.global_batch, spec.seq_len,
                       "pattern-based", 0, False, spec.fix, "exhaustive", spec.layers, False,
                       all_schedules=True)
    score = resolve_factory(cfg.scorer_factory)(cfg.scorer_config)
    times = []
    for c in enumerate_candidates(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation):
        try:
            s = score(c)
        except ValueError:
            continue
        if s.memory_bytes <= s.memory_limit_bytes:
            times.append(s.time_s)
    return min(times)


def test_exhaustive_is_the_brute_force_optimum(quick):
    df, _, _ = quick
    ex = df[df["method"] == "exhaustive (bounds)"].iloc[0]
    opt = brute_force_optimum(sqt.QUICK)
    assert ex["optimum"] == "proven"
    assert ex["best_ms"] == pytest.approx(opt * 1e3, rel=1e-12)
    assert (df["optimum_ms"] == ex["optimum_ms"]).all()
    # no method beats the proven optimum; 30 candidates, so every method reaches it in 1 s
    assert (df["best_ms"] >= ex["optimum_ms"] * (1 - 1e-12)).all()
    assert len(df) == 1 + 2 * len(sqt.SEEDS)


def test_best_so_far_never_increases(quick):
    _, tr, _ = quick
    assert set(tr["method"]) == {"exhaustive", "tpe", "random"}
    for _, g in tr.groupby(["method", "seed"]):
        t, b = g["t_s"].to_numpy(), g["best_s"].to_numpy()
        assert (t[1:] >= t[:-1]).all() and (b[1:] <= b[:-1]).all()
        assert np.isfinite(b[-1])


def test_table_is_recomputed_from_the_traces(quick):
    df, tr, _ = quick
    opt = df["optimum_ms"].iloc[0] / 1e3
    label = {v: k for k, v in sqt.METHOD_LABELS.items()}
    for _, row in df.iterrows():
        m = label[row["method"]]
        g = tr[(tr["method"] == m) & ((tr["seed"] == row["seed"]) if m != "exhaustive" else True)]
        assert len(g) >= 1
        t, b = g["t_s"].to_numpy(), g["best_s"].to_numpy()
        assert row["best_ms"] == pytest.approx(b[-1] * 1e3)
        assert row["gap_pct"] == pytest.approx((b[-1] - opt) / opt * 100, abs=1e-9)
        within, exact = t[b <= opt * 1.01], t[b <= opt * (1 + 1e-12)]
        assert row["to_1pct_s"] == pytest.approx(within[0]) if len(within) else math.isnan(row["to_1pct_s"])
        assert row["to_optimum_s"] == pytest.approx(exact[0]) if len(exact) else math.isnan(row["to_optimum_s"])
        at = b[t <= row["budget_s"]]
        if len(at) and math.isfinite(at[-1]):
            assert row["gap_at_budget_pct"] == pytest.approx((at[-1] - opt) / opt * 100, abs=1e-9)
        else:
            assert math.isnan(row["gap_at_budget_pct"])
        if m != "exhaustive":  # the samplers stop at the budget: no trial starts after it
            # (one point per finished trial; the last trial starts where the one before ended
            # and runs to its end, however long a loaded host makes it; 0.5 s for the set-up
            # between the trace's clock and Optuna's)
            assert len(g) < 2 or t[-2] <= row["budget_s"] + 0.5
            assert row["seconds"] == pytest.approx(t[-1])
            assert row["trials"] == len(g)
    ex = df[df["method"] == "exhaustive (bounds)"].iloc[0]
    assert ex["trials"] == len(tr[tr["method"] == "exhaustive"]) - 1  # one point per simulation + the end


def test_report_files(quick):
    _, _, out = quick
    assert (out / f"{sqt.NAME}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / f"{sqt.NAME}.md").read_text()
    assert "proven optimum of the model over the space" in md
    assert "--fix tp=1,zero=0 --sampler exhaustive" in md


def _points(draw_t, draw_b):
    t = np.cumsum(draw_t)
    b = np.minimum.accumulate(np.asarray(draw_b, dtype=float))
    return [(float(a), float(c)) for a, c in zip(t, b, strict=True)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 10), min_size=1, max_size=30).flatmap(
    lambda ts: st.tuples(st.just(ts), st.lists(st.floats(1.0, 5.0), min_size=len(ts), max_size=len(ts)))),
    st.floats(0.0, 100.0), st.floats(1.0, 5.0))
def test_summary_functions_match_numpy(tb, at, target):
    pts = _points(*tb)
    t, b = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    before = b[t <= at]
    assert sqt.best_at(pts, at) == (before[-1] if len(before) else math.inf)
    hit = t[b <= target]
    got = sqt.first_time(pts, target)
    assert (math.isnan(got) and not len(hit)) or got == hit[0]
    assert sqt.gap_pct(b[-1], target) == pytest.approx((b[-1] - target) / target * 100)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1.0, 5.0), min_size=1, max_size=4), st.floats(0.5, 6.0), st.booleans())
def test_reference_of_an_unproven_space(bests, open_bound, finite):
    ex_best = bests[0]
    traces = [Trace("s", "exhaustive", 0, 1.0, [(1.0, ex_best)], report={
        "proven": False, "best_time_s": ex_best, "open_bound_s": open_bound if finite else None})]
    traces += [Trace("s", "tpe", i, 1.0, [(0.5, v)]) for i, v in enumerate(bests[1:])]
    ref = sqt.reference(traces)
    assert not ref.proven and ref.optimum_s == min(bests)
    if finite:
        assert ref.lower_bound_s == min(open_bound, min(bests))
        assert sqt.open_bound_gap_pct(traces[0].report) == pytest.approx(
            max(0.0, (ex_best - open_bound) / ex_best * 100))
    else:
        assert math.isnan(ref.lower_bound_s) and math.isnan(sqt.open_bound_gap_pct(traces[0].report))


def test_proven_reference_and_its_errors():
    rep = {"proven": True, "best_time_s": 2.0, "open_bound_s": None}
    assert sqt.reference([Trace("s", "exhaustive", 0, 1.0, [(1.0, 2.0)], report=rep),
                          Trace("s", "tpe", 0, 1.0, [(0.5, 2.5)])]) == sqt.Reference(2.0, True, 2.0)
    with pytest.raises(ExperimentError, match="exactly one exhaustive run"):
        sqt.reference([Trace("s", "tpe", 0, 1.0, [(0.5, 2.5)])])
    with pytest.raises(ExperimentError, match="no run found a feasible plan"):
        sqt.reference([Trace("s", "exhaustive", 0, 1.0, [(1.0, math.inf)],
                             report={"proven": False, "best_time_s": None, "open_bound_s": 1.0})])


def test_spaces_are_meshplan_tunes():
    """The experiment's spaces are ``meshplan tune --all-schedules``'s: search quality over
    every schedule the tuner knows, not one framework's."""
    from meshplan.commands.tune import _tune_config

    for s in (*sqt.SPACES, sqt.QUICK):
        for sampler in ("exhaustive", "tpe"):
            ours = tune_config(s, sampler, 1).to_dict()
            cli = _tune_config(s.model, s.cluster, s.nodes, s.global_batch, s.seq_len, "pattern-based",
                               1, False, s.fix, sampler, s.layers, False, all_schedules=True).to_dict()
            assert ours == cli
    gpus = {s.label: s.nodes * 8 for s in sqt.SPACES}
    assert list(gpus.values()) == [32, 1024, 1024]
    assert sqt.SPACES[2].global_batch == 1536 and sqt.SPACES[1].global_batch == 1024


def test_bad_input_is_named():
    with pytest.raises(ExperimentError, match="unknown method 'grid'"):
        run_trace(sqt.QUICK, "grid")
    with pytest.raises(ExperimentError, match="space 'x': need 0 < budget_s <= proof_cap_s"):
        SpaceSpec("x", "llama2-7b", "dgx-a100-80g", 1, 16, 1024, budget_s=5, proof_cap_s=1)


@pytest.mark.slow
def test_full_command_on_a_small_space(tmp_path, monkeypatch):
    """The README's full command, its runs in fresh processes (the full mode's path), on the
    quick space with one seed."""
    small = SpaceSpec("small", "llama2-7b", "dgx-a100-80g", 1, 16, 1024, budget_s=0.5,
                      proof_cap_s=60, layers=2, fix="tp=1,zero=0")
    monkeypatch.setattr(sqt, "SPACES", (small,))
    monkeypatch.setattr(sqt, "SEEDS", (0,))
    rc = main(["report", "--only", "search_quality_time", "--output", str(tmp_path)])
    assert rc == 0
    df = pd.read_csv(tmp_path / f"{sqt.NAME}.csv")
    assert list(df["method"]) == ["exhaustive (bounds)", "TPE", "random"]
    assert df["optimum"].iloc[0] == "proven"
    assert (tmp_path / f"{sqt.NAME}.png").exists()

