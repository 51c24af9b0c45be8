"""``meshplan simulate``: JSON output, Chrome trace and PNG."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from meshplan.commands import simulate


def _app() -> typer.Typer:
    app = typer.Typer()
    simulate.register(app)

    @app.callback()
    def _root() -> None:
        """test root"""

    return app


def test_cli_simulate_json_trace_plot(tmp_path):
    trace, plot = tmp_path / "out.json", tmp_path / "out.png"
    args = ["simulate", "--schedule", "1F1B", "--stages", "4", "--microbatches", "8", "--tf", "1",
            "--tb", "2", "--tw", "0", "--trace", str(trace), "--plot", str(plot), "--json"]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert abs(out["step_time_ms"] - (8 + 3) * 3.0) < 1e-9  # (m+p-1)(T_F+T_B)
    assert out["peak_memory"] == [4.0, 3.0, 2.0, 1.0]
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in range(4):
        names = sorted(e["name"] for e in events if e["pid"] == rank and e["tid"] == 0)
        assert names == sorted([f"F{i}" for i in range(8)] + [f"BW{i}" for i in range(8)])
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_cli_simulate_via_main_and_bad_input(capsys):
    from meshplan.cli import main

    rc = main(["simulate", "--schedule", "ZBVPP", "--stages", "8", "--microbatches", "24", "--tf", "18.5",
               "--tb", "18.1", "--tw", "9.3", "--tcomm", "0.6", "--chunks", "2", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["peak_memory"] == [8.0] * 8
    rc = main(["simulate", "--schedule", "VPP", "--stages", "4", "--microbatches", "6", "--tf", "1", "--tb", "1"])
    assert rc == 2
    assert "multiple of num_stages" in capsys.readouterr().err


def test_two_outputs_naming_one_file_are_refused_before_any_work(tmp_path, capsys):
    from meshplan.cli import main

    out = tmp_path / "step.png"
    rc = main(["simulate", "--schedule", "1F1B", "--stages", "2", "--microbatches", "4", "--tf", "1",
               "--tb", "1", "--trace", str(out), "--plot", f"{tmp_path}/./step.png"])
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err
    assert f"--trace and --plot name the same file '{tmp_path}/./step.png'" in err
    rc = main(["cost", "-m", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "8",
               "--trace", str(out), "--memory-png", str(out)])
    assert rc == 2 and not out.exists()
    assert "--trace and --memory-png name the same file" in capsys.readouterr().err


def test_simulate_takes_the_schedule_spellings_cost_takes(capsys):
    """ZB-1p / ZB-2p are the ZB heuristic at a memory limit of p / 2p M_B (Qi et al. 2024,
    sec. 4): the same result as ``--schedule ZB --memory-limit p`` / ``2p``; aliases and case
    as ``cost`` (canonical_schedule); an unknown name is refused naming --schedule."""
    from meshplan.cli import main

    base = ["--stages", "4", "--microbatches", "16", "--tf", "10", "--tb", "10", "--tw", "10", "--json"]

    def run(*extra):
        assert main(["simulate", *extra, *base]) == 0
        return json.loads(capsys.readouterr().out)

    assert run("--schedule", "ZB-1p") == run("--schedule", "ZB", "--memory-limit", "4")
    assert run("--schedule", "zb-2p") == run("--schedule", "ZB", "--memory-limit", "8")
    assert run("--schedule", "ZB-H1") == run("--schedule", "ZBH1")
    assert run("--schedule", "gpipe") == run("--schedule", "FThenB")
    assert max(run("--schedule", "ZB-1p")["peak_memory"]) <= 4.0
    assert main(["simulate", "--schedule", "ZB-3p", *base]) == 2
    err = capsys.readouterr().err
    assert "--schedule" in err and "'ZB-3p'" in err
    # ZB-1p is a memory limit already: another one beside it is refused, not silently dropped
    assert main(["simulate", "--schedule", "ZB-1p", "--memory-limit", "8", *base]) == 2
    assert "ZB-1p is ZB at a memory limit of 4 M_B" in capsys.readouterr().err
    assert main(["simulate", "--schedule", "ZB-2p", *base[:-1]]) == 0
    assert capsys.readouterr().out.startswith("ZB at a memory limit of 8 M_B p=4 m=16")


def test_output_options_that_cannot_be_written_are_named(capsys, tmp_path):
    """Found by a bad-input hunt: an image suffix matplotlib cannot write failed after the
    work (``Format 'xyz' is not supported``, no option named) and an unwritable --trace
    printed a bare errno line. Both now name the option and the path; the image is checked
    before anything runs, so no other output of the command is written."""
    from meshplan.cli import main

    base = ["--stages", "2", "--microbatches", "4", "--tf", "1", "--tb", "1"]
    assert main(["simulate", "--schedule", "1F1B", *base, "--plot", str(tmp_path / "g.xyz"),
                 "--trace", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "g.xyz" in err and ".png" in err
    assert not (tmp_path / "t.json").exists()
    assert main(["simulate", "--schedule", "1F1B", *base, "--trace", "/proc/nope/t.json"]) == 2
    # refused before the work now (issue 43): the folder is checked up front
    assert "--trace '/proc/nope/t.json': its folder /proc/nope does not exist" in capsys.readouterr().err
    assert main(["simulate", "--schedule", "1F1B", *base, "--plot", str(tmp_path / "g.gif")]) == 0
    assert (tmp_path / "g.gif").stat().st_size > 0  # any format matplotlib writes
    capsys.readouterr()
    assert main(["compare", "-m", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "8", "--tp", "1,2",
                 "--plot", str(tmp_path / "c.bmp")]) == 2
    assert "--plot" in capsys.readouterr().err
    assert main(["clusters", "time", "dgx-a100-80g", "all_reduce", "--nbytes", "1GiB", "--ranks", "5-2"]) == 2
    assert "range 5-2 runs backwards" in capsys.readouterr().err


def test_help_shows_the_limits_values_not_their_names():
    """--help used to print ``MAX_TIME_MS`` and ``MAX_ACTIONS`` (names, in backticks)."""
    from meshplan.cli import app

    out = CliRunner().invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"}).output
    assert "at most 1e9; at most 524,288 passes" in out  # 1e6 s in ms; 2**19
    assert "MAX_" not in out and "``" not in out
    root = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "Simulate one pipeline step of a schedule from given stage times." in root
    assert "MAX_" not in root


def test_writable_file_checks_the_file_it_would_write(tmp_path):
    """calibrate's --output check: an existing file is judged by its own permission (a
    writable file in a read-only folder is fine), a new one by its folder's; an empty name,
    a folder, a missing folder are refused naming the flag."""
    import os

    import pytest

    from meshplan.outputs import writable_file

    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "existing.yaml").write_text("x")
    os.chmod(ro, 0o555)
    try:
        writable_file("--output", str(ro / "existing.yaml"))  # rewritten in place: allowed
        if os.geteuid() != 0:  # root may write anywhere: os.access says so
            with pytest.raises(ValueError, match="cannot create a file in"):
                writable_file("--output", str(ro / "new.yaml"))
    finally:
        os.chmod(ro, 0o755)
    for bad, needle in (("", "--output is empty"), (str(tmp_path), "is a directory"),
                        (str(tmp_path / "no" / "x.yaml"), "does not exist")):
        with pytest.raises(ValueError, match=needle):
            writable_file("--output", bad)


def test_zero_bubble_schedules_without_a_weight_pass_are_named(capsys):
    """A hunt: ZB-2p without --tw failed with 'ZB: stage times must be ... > 0', naming no
    flag, and ZB-H1 without --tw silently ran 1F1B. The searched ZB schedules now name --tw;
    ZB-H1 says on stderr that its step takes 1F1B's time (33 ms for p 4,
    m 8, F 1, B 2: (m + p - 1)(F + B)); with W it is Qi et al.'s m(F+B+W) + (p-1)(F+B-W)."""
    from tests._cli import run_main

    base = ("simulate", "--stages", "4", "--microbatches", "8", "--tf", "1")
    for sched in ("ZB-2p", "ZB", "ZBVPP"):
        rc, out, err = run_main(capsys, *base, "--tb", "2", "--schedule", sched)
        assert rc == 2 and "'--tw'" in err and "needs --tw > 0" in err, err
    rc, out, err = run_main(capsys, *base, "--tb", "2", "--schedule", "ZBH1", "--json")
    assert rc == 0 and "note: --tw 0: ZBH1 has no weight-gradient pass" in err
    assert json.loads(out)["step_time_ms"] == pytest.approx((8 + 4 - 1) * (1 + 2))
    rc, out, err = run_main(capsys, *base, "--tb", "1", "--tw", "1", "--schedule", "ZBH1", "--json")
    assert rc == 0 and "note:" not in err
    assert json.loads(out)["step_time_ms"] == pytest.approx(8 * 3 + 3 * (1 + 1 - 1))
