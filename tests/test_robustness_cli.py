"""Robustness of the ``meshplan`` entry point: OS errors on output paths become a one-line
``error:`` with exit code 2, never a traceback (regressions found by a break-it review)."""

from __future__ import annotations

from meshplan.cli import main

SIM = ["simulate", "--schedule", "1F1B", "--stages", "2", "--microbatches", "2",
       "--tf", "1", "--tb", "1"]


def test_trace_path_that_is_a_directory_is_a_one_line_error(tmp_path, capsys):
    rc = main([*SIM, "--trace", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and str(tmp_path) in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_simulate_json_matches_1f1b_closed_form(capsys):
    # p=2, m=2, T_F = T_B = 1 ms, no comm: step (m+p-1)(T_F+T_B) = 6 ms and bubble ratio
    # (p-1)/(m+p-1) = 1/3 (Narayanan et al. 2021, 1F1B).
    import json

    assert main([*SIM, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["step_time_ms"] - 6.0) < 1e-9
    assert abs(out["bubble_ratio"] - 1 / 3) < 1e-12
