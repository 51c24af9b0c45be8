"""``tune --sampler exhaustive`` resumed with stdout not a terminal (captured, as in a pipe
or a file): every run prints the same summary lines and exits 0 -- stopped by its timeout,
resumed to the proof, and rerun once everything is finished."""

from __future__ import annotations

import re

from tests._cli import run_main

ARGS = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1", "--global-batch", "32",
        "--layers", "4", "--sampler", "exhaustive", "--fix", "tp=1", "--all-schedules")
SUMMARY = re.compile(r"exhaustive: (\d+) candidates = (\d+) simulated \((\d+) resumed.*?\+ (\d+) pruned by memory "
                     r"\+ (\d+) pruned by time \+ (\d+) pruned by the cheap bound", re.S)


def _counts(out: str) -> tuple[int, ...]:
    m = SUMMARY.search(" ".join(out.split()))
    assert m, out[:2000]
    return tuple(int(x) for x in m.groups())


def test_resumed_exhaustive_prints_its_summary_when_not_a_terminal(capsys, tmp_path):
    out_dir = str(tmp_path / "run")
    rc, out, err = run_main(capsys, *ARGS, "--timeout", "1e-3", "--output", out_dir)
    assert rc in (0, 1) and "Traceback" not in err
    assert "NOT proven" in " ".join(out.split()) and "rerun to resume" in " ".join(out.split())
    for _ in range(2):  # the resume that proves it, then a rerun of the finished search
        rc, out, err = run_main(capsys, *ARGS, "--output", out_dir)
        assert rc == 0 and "Traceback" not in err
        flat = " ".join(out.split())
        n, sim, _, mem, tim, cheap = _counts(out)
        assert sim + mem + tim + cheap == n  # the counts add up to the space
        assert "proven optimum of the model over the space" in flat
        assert "best plan: dp=" in flat and "wrote " in flat
