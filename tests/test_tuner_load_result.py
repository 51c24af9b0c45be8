"""``tuner.search.load_result``: a finished ``meshplan tune --output DIR`` read back as a
TuneResult (the README's pandas view), and its errors."""

from __future__ import annotations

import pytest

from meshplan.cli import main
from tuner.search import load_result
from tuner.study import TuneError


def test_load_result_reads_the_journal_of_a_tune(tmp_path, capsys):
    out = tmp_path / "t"
    args = ["tune", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--global-batch", "8", "--seq-len", "512", "--layers", "2", "--trials", "3",
            "--sampler", "random", "--output", str(out), "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    res = load_result(out)
    df = res.to_dataframe()
    assert len(df) == len(res.trials()) == 3
    assert res.global_batch_size == 8
    # the same rows as the history.csv the tune wrote
    import pandas as pd

    csv = pd.read_csv(out / "history.csv")
    assert list(csv.job_id) == list(df.job_id)
    assert load_result(out / "journal.log").to_dataframe().equals(df)
    with pytest.raises(TuneError, match="holds no study 'nope'"):
        load_result(out, study="nope")


def test_load_result_without_a_journal(tmp_path):
    with pytest.raises(TuneError, match="no tune journal"):
        load_result(tmp_path)
