"""Error bands (``simulator.error_band``): quantiles of measured / predicted over comparable
measured runs, the fallback through coarser groupings, ties, the shipped residual table
against fresh predictions, and the band in ``cost`` and ``compare``."""

from __future__ import annotations

import csv
import json

import pytest

from experiments.measured_rows import parse_measured
from meshplan.engine import Engine
from simulator.error_band import (
    MIN_ROWS,
    RESIDUALS,
    Band,
    ErrorBandError,
    Regime,
    band,
    load_residuals,
    tied,
)
from tests._cli import run_main

MEG = Regime("megatron", False, "scale", "large")
FSDP = Regime("fsdp", False, "node", "small")


def test_band_is_the_empirical_quantiles_of_the_regime():
    # ratios 0.90, 0.95, ..., 1.35 (10 rows): the 10th percentile by linear interpolation is
    # 0.90 + 0.9 x 0.05 = 0.945, the 90th 1.30 + 0.1 x 0.05 = 1.305
    rows = [(MEG, 0.90 + 0.05 * i) for i in range(10)] + [(FSDP, 5.0)] * 10
    b = band(MEG, 0.8, rows)
    assert (b.low, b.high, b.n, b.basis) == (pytest.approx(0.945), pytest.approx(1.305), 10,
                                             "family, experts, scale, size")
    assert b.interval(2.0) == (pytest.approx(1.89), pytest.approx(2.61))
    assert band(MEG, 0.5, rows).low == pytest.approx(0.90 + 2.25 * 0.05)


def test_band_falls_back_to_coarser_groupings():
    other_scale = Regime("megatron", False, "pod", "large")
    rows = [(other_scale, 1.0)] * MIN_ROWS + [(FSDP, 2.0)] * MIN_ROWS
    b = band(MEG, 0.8, rows)  # no megatron row at scale: family and experts
    assert (b.basis, b.n, b.low, b.high) == ("family, experts", MIN_ROWS, 1.0, 1.0)
    b = band(Regime("deepspeed", False, "scale", "large"), 0.8, rows)  # no deepspeed row
    assert (b.basis, b.n) == ("experts", 2 * MIN_ROWS)
    b = band(Regime("megatron", True, "pod", "small"), 0.8, rows)  # no mixture of experts
    assert (b.basis, b.n) == ("all runs", 2 * MIN_ROWS)


def test_ties_are_overlapping_intervals():
    b = Band(0.9, 1.1, 0.8, 10, "x")
    assert tied((10.0, b), (12.0, b))  # 9-11 and 10.8-13.2 overlap
    assert not tied((10.0, b), (12.3, b))  # 11 < 11.07
    with pytest.raises(ErrorBandError, match="coverage must be in"):
        band(MEG, 1.0, [(MEG, 1.0)])


def test_shipped_table_matches_fresh_predictions():
    with RESIDUALS.open() as f:
        rows = {int(r["row_id"]): r for r in csv.DictReader(f)}
    assert len(rows) == len(load_residuals()) >= 80
    specs = {s.row_id: s for s in parse_measured() if s.row_id in (61, 130, 16)}
    for rid, spec in specs.items():
        got = Engine(spec.model, spec.cluster, spec.strategy, nodes=spec.nodes,
                     seq_len=spec.seq_len).simulate().step_time
        assert float(rows[rid]["predicted_s"]) == pytest.approx(got, rel=1e-6), rid
        assert float(rows[rid]["measured_s"]) == pytest.approx(spec.step_time_s)


def test_cost_and_compare_show_the_band(capsys):
    args = ("--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--dp", "8", "--global-batch", "16")
    rc, out, _ = run_main(capsys, "cost", *args, "--json")
    d = json.loads(out)
    b = d["step_time_band"]
    from meshplan.strategy import Strategy
    from simulator.error_band import band_of
    engine = Engine("llama2-7b", "dgx-a100-80g", Strategy(dp=8, global_batch_size=16))
    assert rc == 0 and b == pytest.approx(band_of(engine).to_dict(d["step_time_ms"] / 1e3))
    assert b["coverage"] == 0.8 and b["comparable_runs"] >= MIN_ROWS and b["low_ms"] < b["high_ms"]
    rc, out, _ = run_main(capsys, "cost", *args)
    assert rc == 0 and "error band:" in out
    rc, out, _ = run_main(capsys, "compare", *args, "--zero", "0,1", "--micro-batch-size", "1,2", "--json")
    rows = json.loads(out)
    best = min(rows, key=lambda r: r["step_time_ms"])
    assert best["tied_with_best"] is True
    for r in rows:
        lo, hi = r["step_time_band"]["low_ms"], r["step_time_band"]["high_ms"]
        blo, bhi = best["step_time_band"]["low_ms"], best["step_time_band"]["high_ms"]
        assert r["tied_with_best"] == (lo <= bhi and blo <= hi)
