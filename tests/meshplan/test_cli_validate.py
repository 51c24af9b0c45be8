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
    assert "needs dp*tp*pp = 2*1*1 = 2 ranks but --nproc is 3" in capsys.readouterr().err


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
    # issue 19 item 5: 3 repeats, their median and spread, host load, numerics verified
    times = got["repeat_step_times_ms"]
    assert got["repeats"] == 3 and len(times) == 3
    assert got["measured_step_time_ms"] == pytest.approx(sorted(times)[1])
    assert got["step_time_spread"] == pytest.approx((max(times) - min(times)) / sorted(times)[1])
    load = got["host_load"]
    assert load["cores"] >= 1 and load["before"] >= 0 and load["after"] >= 0
    assert (got["load_warning"] is not None) == (max(load["before"], load["after"]) > load["cores"])
    assert got["numerics"]["checked"] and got["numerics"]["ok"], got["numerics"]
    assert got["numerics"]["summary"].startswith("OK: loss rel err")


def test_load_warning_and_spread():
    from meshplan.validation_launch import load_warning, spread

    assert load_warning(1.5, 2.0, 2) is None  # at most the cores: no warning
    msg = load_warning(1.0, 4.5, 2)
    assert msg.startswith("host load 4.50 exceeds its 2 cores (before 1.00, after 4.50)")
    assert load_warning(None, None, 2) is None
    assert spread([10.0, 12.0, 11.0]) == pytest.approx(2.0 / 11.0)
    assert spread([5.0]) == 0.0


def test_a_zero_2_plan_is_predicted_as_the_executor_runs_it(tmp_path, capsys):
    """Found by a bad-input hunt: validate compared a ZeRO-2/3 prediction (gradients and
    parameters sharded) with the executor's run, which keeps them whole, and printed the gap
    (-13% / -24% peak memory) as prediction error. The prediction is now the executor's
    (ZeRO-1 memory, validation.EXECUTOR_MAX_ZERO), with a note; a --csv that is a directory
    is refused before any rank runs."""
    from meshplan.validation import predict, zero_note

    z1 = Plan(MLP, "cpu-local", Strategy(dtype="float32", optimizer="adamw", dp=2, micro_batch_size=2,
                                         global_batch_size=8, zero=1))
    z1_mem = predict(z1)[0]["max_memory_bytes"]
    for z in (2, 3):
        plan = Plan(MLP, "cpu-local", z1.strategy.replace(zero=z))
        assert predict(plan)[0]["max_memory_bytes"] == z1_mem
        assert zero_note(plan).startswith(f"the plan is ZeRO-{z}; the executor keeps gradients")
    assert zero_note(z1) is None
    plan = _plan(tmp_path, dp=2, micro_batch_size=2, global_batch_size=4)
    assert main(["validate", plan, "--csv", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--csv '{tmp_path}' is a directory" in err


def test_the_rank_count_is_checked_before_the_memory(tmp_path, capsys):
    """A dp=8 llama2-7b plan on --nproc 2 used to be refused for the host memory two ranks
    of it would need; the count of ranks is what is wrong, and is named first."""
    p = tmp_path / "p8.json"
    Plan("llama2-7b", "dgx-a100-80g", Strategy(dp=8, micro_batch_size=1, global_batch_size=8),
         num_layers=4).save(p)
    assert main(["validate", str(p), "--nproc", "2", "--csv", str(tmp_path / "v.csv")]) == 2
    assert capsys.readouterr().err.strip() == "error: plan needs dp*tp*pp = 8*1*1 = 8 ranks but --nproc is 2"
