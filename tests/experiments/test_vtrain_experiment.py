"""The vTrain one-node rows (``experiments.vtrain_rows``) as a user states them, the
``vtrain_single_node`` experiment's tables, and one row through ``meshplan cost`` itself."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments import vtrain_rows as vr
from experiments import vtrain_single_node as vt
from meshplan.cli import main
from tests.conftest import SHARED

CSV = SHARED / "data" / "vtrain_single_node.csv"


def test_rows_read_as_the_file_states_them():
    runs = vr.load()
    assert len(runs) == 1440
    first = runs[0]  # "2,16,8,1024,16,24,1024,1,1,2,372.160408"
    assert (first.row_id, first.gpus, first.global_batch, first.micro_batch, first.hidden, first.heads,
            first.layers, first.seq, first.tp, first.dp, first.pp) == (1, 2, 16, 8, 1024, 16, 24, 1024, 1, 1, 2)
    assert first.measured_ms == pytest.approx(372.160408)
    assert all(r.tp * r.pp * r.dp == r.gpus for r in runs)


def test_bad_rows_file_names_the_line(tmp_path):
    bad = tmp_path / "v.csv"
    bad.write_text(CSV.read_text(encoding="utf-8-sig").splitlines()[0] + "\n2,16,8,1024,16,24,1024,1,1,4,1.0\n")
    with pytest.raises(Exception, match="data line 1: tp x pp x dp = 4 != 2 GPUs"):
        vr.load(bad)
    with pytest.raises(FileNotFoundError, match="not found"):
        vr.load(tmp_path / "none.csv")


def test_model_and_strategy_of_a_row():
    run = vr.load()[3]  # "8,8,2,2048,16,20,1024,4,1,2,160.6027"
    cfg = vr.model(run)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size, cfg.vocab_size) == (
        20, 2048, 16, 8192, 50257)
    assert cfg.attention == "unfused" and cfg.attention_dropout == 0.1 and cfg.hidden_dropout == 0.1
    assert cfg.tie_word_embeddings and cfg.family == "gpt"
    s = vr.strategy(run)
    assert (s.tp, s.pp, s.dp, s.micro_batch_size, s.global_batch_size) == (4, 2, 1, 2, 8)
    assert s.layers_per_stage == (10, 10) and s.recompute == "full" and s.dtype == "float16"
    assert s.framework == "megatron-deepspeed" and s.zero == 1


def test_one_row_through_meshplan_cost(tmp_path, capsys):
    """The experiment predicts a row as ``meshplan cost --model config.json ...`` does."""
    run = next(r for r in vr.load() if r.row_id == 4)
    cfg = tmp_path / "gpt.json"
    cfg.write_text(json.dumps(vr.hf_config(run)))
    capsys.readouterr()
    assert main([*vr.cost_args(run, str(cfg)), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    pred, status = vt.predict(run)
    assert status == "ok"
    assert got["step_time_ms"] == pytest.approx(pred, rel=1e-9)
    assert got["framework"] == "megatron-deepspeed" and got["attention"] == "unfused"


def test_by_regime_by_hand():
    df = pd.DataFrame({"row_id": [1, 2, 3], "tp": [1, 1, 2], "micro_batch": [1, 2, 1],
                       "hidden": [1024, 1024, 2048], "pp": [1, 1, 1],
                       "error_pct": [10.0, -30.0, 5.0], "status": ["ok"] * 3})
    t = vt.by_regime(df).set_index("regime")
    assert t.loc["tp=1", "MAPE_pct"] == 20.0 and t.loc["tp=1", "worst_row"] == 2
    assert t.loc["tp=2", "signed_pct"] == 5.0
    assert t.loc["all", "n"] == 3 and t.loc["all", "within_25_pct"] == pytest.approx(200 / 3)
