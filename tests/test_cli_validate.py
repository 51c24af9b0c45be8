"""``meshplan validate``: refuses a plan whose world size differs from --nproc before any
launch, and runs a 2-rank plan printing predicted and measured step time as JSON."""

from __future__ import annotations

import csv
import json

import pytest

from meshplan.cli import main
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests.conftest import SHARED

MLP = str(SHARED / "data" / "programs" / "mlp_sgd_no_dist_attrs.pir")


def _plan(tmp_path, **kw):
    p = tmp_path / "plan.json"
    Plan(MLP, "cpu-local", Strategy(dtype="float32", optimizer="sgd", **kw)).save(p)
    return str(p)


def test_validate_refuses_a_world_size_mismatch(tmp_path, capsys):
    plan = _plan(tmp_path, dp=2, micro_batch_size=2, global_batch_size=4)
    assert main(["validate", plan, "--nproc", "3", "--csv", str(tmp_path / "v.csv")]) == 2
    assert "needs dp*mp*pp = 2*1*1 = 2 ranks but nproc is 3" in capsys.readouterr().err


@pytest.mark.distributed
def test_validate_json_and_csv_row(tmp_path, capsys):
    plan = _plan(tmp_path, dp=2, micro_batch_size=2, global_batch_size=8)
    out_csv = tmp_path / "v.csv"
    assert main(["validate", plan, "--nproc", "2", "--steps", "2", "--json", "--csv", str(out_csv)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["measured_step_time_ms"] > 0 and got["predicted_step_time_ms"] > 0
    rel = (got["predicted_step_time_ms"] - got["measured_step_time_ms"]) / got["measured_step_time_ms"]
    assert got["relative_error"] == pytest.approx(rel)
    assert len(got["losses"]) == 2 and got["losses"][1] < got["losses"][0]  # SGD descends
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 1 and rows[0]["dp"] == "2"
