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


import time  # noqa: E402

import pytest  # noqa: E402

from tests._cli import one_line_error  # noqa: E402

COST = ["cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g"]


@pytest.mark.parametrize("argv, match", [
    ([*SIM, "--tw", "1e308"], "--tw must be a finite number >= 0 and at most 1e+09"),
    ([*SIM, "--tcomm", "inf"], "--tcomm must be a finite number"),
    ([*SIM, "--tw", "nan"], "--tw must be a finite number"),
    ([*SIM[:-4], "--tf", "0", "--tb", "1"], "--tf must be a finite number > 0"),
    ([*SIM[:1], "--schedule", "ZB", *SIM[3:], "--tw", "1", "--memory-limit", "1e308"],
     "--memory-limit must be a finite number >= 1"),
    ([*SIM[:1], "--schedule", "ZB", *SIM[3:], "--tw", "1", "--memory-limit", "nan"],
     "--memory-limit must be a finite number"),
    (["simulate", "--schedule", "1F1B", "--stages", "1000000", "--microbatches", "2", "--tf", "1",
      "--tb", "1"], "'--stages'"),
    (["simulate", "--schedule", "1F1B", "--stages", str(10**20), "--microbatches", "2", "--tf", "1",
      "--tb", "1"], "'--stages'"),
    (["simulate", "--schedule", "1F1B", "--stages", "2", "--microbatches", str(10**12), "--tf", "1",
      "--tb", "1"], "'--microbatches'"),
    (["simulate", "--schedule", "VPP", "--stages", "64", "--microbatches", "4096", "--tf", "1",
      "--tb", "1", "--chunks", "4"], "passes, above the limit of 524288"),
    ([*COST, "--global-batch", "1000000000"], "--global-batch is 1000000000, above the limit"),
    ([*COST, "--global-batch", "16777216", "--pp", "2"], "passes, above the limit"),
    ([*COST, "--global-batch", "8", "--seq-len", "1000000000"], "'--seq-len'"),
    ([*COST, "--global-batch", "8", "--nodes", str(10**9)], "num_nodes 1000000000 x 8 devices"),
    ([*COST, "--global-batch", "8", "--dp", str(10**7)], "--dp is 10000000"),
    (["program", "show", "--model", "llama2-7b", "--layers", "1000000"], "'--layers'"),
    # found by the fuzz run: a mesh of 1e9 ranks was allocated until the kernel killed it
    (["complete", "--model", "llama2-7b", "--layers", "1", "--dp", "1000000000", "--summary-only"],
     "has 1000000000 ranks, above the limit of 1048576"),
    (["complete", "--model", "llama2-7b", "--layers", "1", "--mesh", "dp=100000,tp=100000"],
     "has 10000000000 ranks"),
    (["program", "show", "--model", "llama2-7b", "--batch-size", str(10**9)], "'--batch-size'"),
    (["clusters", "time", "dgx-a100-80g", "all_reduce", "--ranks", "0-99999999999"],
     "--ranks names 100000000000 ranks"),
    (["clusters", "time", "dgx-a100-80g", "all_reduce", "--nbytes", "1e300"], "--nbytes '1e300'"),
])
def test_unbounded_sizes_and_times_are_refused_at_once(capsys, argv, match):
    """Issue 16 item 8: OverflowError on 1e308 times, minutes-long runs on huge sizes; now
    one ``error:`` line naming the option, in well under a second of work."""
    t0 = time.monotonic()
    line = one_line_error(main(argv), *capsys.readouterr())
    assert match in line, line
    assert time.monotonic() - t0 < 20
