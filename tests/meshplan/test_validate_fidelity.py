"""``meshplan calibrate --quick`` then ``meshplan validate`` of a small 2-rank plan (from
benchmarks/plans/) reports a finite predicted and measured step time and their relative
error, and the calibrated YAML carries every constant the cost model reads, with
provenance. (How close the prediction is belongs to benchmarks/bench_validate.py.)"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import yaml

from meshplan.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.distributed
def test_calibrate_then_validate_reports_a_finite_error(quick_calibration, tmp_path, capsys, monkeypatch):
    cal, _ = quick_calibration  # `meshplan calibrate --nproc 2 --quick` (tests/conftest.py)
    raw = yaml.safe_load(cal.read_text())
    eff = raw["device"]["efficiency"]
    for key in ("kernel_overhead_s", "gemm_half_flops", "attention", "memory_kernels"):
        assert eff[key]["provenance"].startswith("measured on "), key
    assert 0 < eff["attention"]["value"] <= 1 and 0 < eff["memory_kernels"]["value"] <= 1
    # per op and phase: every traced memory-bound / attention op of the layer, with provenance
    for key in ("rms_norm:F", "rms_norm_grad:W", "flash_attention:F", "flash_attention_grad:B"):
        assert eff["by_op"][key]["provenance"].startswith("measured on "), key
        assert eff["by_op"][key]["value"] > 0
    capsys.readouterr()
    monkeypatch.chdir(ROOT)  # the plan names its model config relative to the repo root
    rc = main(["validate", "benchmarks/plans/dp2.json", "--nproc", "2", "--steps", "2",
               "--cluster", str(cal), "--json", "--csv", str(tmp_path / "v.csv")])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    pred, meas = got["predicted_step_time_ms"], got["measured_step_time_ms"]
    assert math.isfinite(pred) and pred > 0 and math.isfinite(meas) and meas > 0
    assert got["relative_error"] == pytest.approx((pred - meas) / meas)
