"""Experiments: ``meshplan report --quick`` writes every registered experiment's CSV and
Markdown; zb_bubbles reproduces Zero Bubble Table 5 (read back from the CSV and compared
with shared/reference/published_tables.md); the Markdown writer and failure reporting."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments import EXPERIMENTS, Experiment, ExperimentResult, require, to_markdown
from meshplan.cli import main
from tests.conftest import SHARED, once_per_run


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory, quick_calibration):
    """``meshplan report --quick``, once per test run (``tests.conftest.once_per_run``:
    the xdist workers share it); local_validation takes the run's calibrated YAML through
    ``MESHPLAN_CLUSTER`` (its own quick calibration is the same command)."""
    def make(out):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MESHPLAN_CLUSTER", str(quick_calibration[0]))
            assert main(["report", "--quick", "--output", str(out)]) == 0

    return once_per_run(tmp_path_factory, "quick_report", make)


def published(table: str, until: str) -> list[dict[str, str]]:
    """Rows of a table in shared/reference/published_tables.md (independent of
    experiments/): the first pipe table after the line naming ``table``."""
    text = (SHARED / "reference" / "published_tables.md").read_text()
    section = text.split(table, 1)[1].split(until, 1)[0]
    rows = [ln.strip().strip("|").split("|") for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in rows[0]]
    return [dict(zip(header, (c.strip() for c in cells), strict=True)) for cells in rows[2:]]


def published_table5() -> dict[tuple[str, int], dict[str, float]]:
    out = {}
    for rec in published("Table 5", "Table 4"):
        out[(rec["model"], int(rec["m"]))] = {k: float(v) for k, v in list(rec.items())[3:]}
    return out


@pytest.mark.slow
def test_every_experiment_writes_csv_and_markdown(quick_report):
    assert {"zb_bubbles", "schedule_tradeoffs", "zb_throughput", "megatron_table1",
            "search_quality"} <= set(EXPERIMENTS)
    readme = (quick_report / "README.md").read_text()
    for name, exp in EXPERIMENTS.items():
        df = pd.read_csv(quick_report / f"{name}.csv")
        assert len(df) > 0
        md = (quick_report / f"{name}.md").read_text()
        assert md.startswith(f"# {exp.title}")
        assert "| " + " | ".join(df.columns) + " |" in md
        assert md.count("\n| ") == len(df) + 1  # header + one line per row (after |---|)
        assert f"## {exp.title}" in readme
    png = (quick_report / "schedule_tradeoffs.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_zb_bubbles_csv_matches_table5(quick_report):
    df = pd.read_csv(quick_report / "zb_bubbles.csv")
    published = published_table5()
    assert sorted(published) == [("1.5B", 24), ("1.5B", 32), ("1.5B", 64)]
    tolerance = {"1F1B": 0.003, "ZB-H1": 0.003, "ZB-H2": 0.003, "1F1B-I": 0.01}  # issue 6
    checked = 0
    for (model, m), rates in published.items():
        for label, paper in rates.items():
            row = df[(df["model"] == model) & (df["m"] == m) & (df["schedule"] == label)]
            assert len(row) == 1, (model, m, label)
            ours = float(row["bubble_ours"].iloc[0])
            assert abs(ours - paper) <= tolerance[label], (model, m, label, ours, paper)
            assert float(row["bubble_paper"].iloc[0]) == paper
            assert float(row["abs_error"].iloc[0]) == pytest.approx(abs(ours - paper), abs=1e-12)
            checked += 1
    assert checked == 12
    # rows without a published rate carry ours only
    big = df[df["model"] == "28.3B"]
    assert len(big) > 0 and big["bubble_paper"].isna().all()
    assert big["bubble_ours"].between(0, 1).all()


def test_schedule_tradeoffs_memory_hand_computed(quick_report):
    df = pd.read_csv(quick_report / "schedule_tradeoffs.csv")
    # M_B per stage: 3 layers x s b (34 h + 5 a s), s=1024, b=6, h=2304, a=24 (ZB paper)
    m_b = 3 * 1024 * 6 * (34 * 2304 + 5 * 24 * 1024) / 2**30
    assert m_b == pytest.approx(3.4541, abs=1e-4)
    one = df[df["schedule"] == "1F1B"]
    assert one["peak_activation_GiB"].tolist() == pytest.approx([8 * m_b] * len(one))
    gpipe = df[df["schedule"] == "FThenB"]
    assert gpipe["peak_activation_GiB"].tolist() == pytest.approx((gpipe["m"] * m_b).tolist())
    # interleaved: first stage holds (1 + (p-1)/(p v)) x the 1F1B activations (m >= 2p)
    vpp = df[(df["schedule"] == "VPP") & (df["m"] >= 16)]
    assert vpp["peak_activation_GiB"].tolist() == pytest.approx([8 * m_b * (1 + 7 / 24)] * len(vpp))


def test_zb_throughput_paper_ratios_from_table4(quick_report):
    df = pd.read_csv(quick_report / "zb_throughput.csv")
    rows = [r for r in published("Table 4", "Megatron") if r["model"] == "1.5B"]
    checked = 0
    for rec in rows:
        for label in ("ZB-2p", "ZB-1p", "1F1B-I"):
            got = df[(df["m"] == int(rec["m"])) & (df["schedule"] == label)]
            if len(got) == 0:
                continue
            got = got.iloc[0]
            assert got["samples_per_gpu_s_paper"] == float(rec[label])
            assert got["throughput_vs_1F1B_paper"] == pytest.approx(
                float(rec[label]) / float(rec["1F1B"]))
            assert got["memory_vs_1F1B_paper"] == pytest.approx(
                float(rec[f"mem {label}"]) / float(rec["mem 1F1B"]))
            assert got["throughput_ratio_error"] == pytest.approx(
                got["throughput_vs_1F1B"] - got["throughput_vs_1F1B_paper"])
            checked += 1
    assert checked >= 3  # quick: m = 24
    assert (df[df["schedule"] == "1F1B"]["throughput_vs_1F1B"] == 1.0).all()


def test_megatron_table1_fitted_row_and_published_values(quick_report):
    """The quick rows (1.7B, 3.6B, 7.5B) carry the paper's TFLOP/s, the row that a constant
    was fitted on is marked, and the error is the ratio of the two columns."""
    df = pd.read_csv(quick_report / "megatron_table1.csv").set_index("row_id")
    pub = {f"Megatron GPT {r['params']}": float(r["TFLOP/s/GPU"])
           for r in published("Megatron-LM 2021", "Micro-batch size")}
    assert pub == dict(zip(df["model"], df["tflops_paper"], strict=True))
    # the A100 constants are fitted on every second row of each source (FIT_ROWS): 15, 17
    assert (df.loc[[15, 17], "role"] == "fitted").all() and df.loc[16, "role"] == "held out"
    assert df.loc[15, "micro_batch"] == 16 and df.loc[15, "framework"] == "megatron-2021-torch-ddp"
    err = df["tflops_pred"] / df["tflops_paper"] - 1
    assert err.tolist() == pytest.approx(df["rel_error"].tolist())
    assert (df["rel_error"].abs() < 0.15).all()


def test_search_quality_exhaustive_is_the_floor(quick_report):
    df = pd.read_csv(quick_report / "search_quality.csv").set_index("method")
    optimum = df.loc["exhaustive (brute force)", "best_step_time_s"]
    assert df.loc["exhaustive (brute force)", "gap_to_exhaustive"] == 0.0
    tpe = df.loc["pattern-based (TPE)"]  # same space as the exhaustive search
    assert tpe["best_step_time_s"] >= optimum
    assert tpe["gap_to_exhaustive"] == pytest.approx(tpe["best_step_time_s"] / optimum - 1)
    assert (df["complete"] <= df["trials"]).all()


def test_to_markdown_by_hand():
    df = pd.DataFrame({"name": ["a|b", "c"], "x": [1.23456, math.nan], "ok": [True, False]})
    assert to_markdown(df, ".2f") == (
        "| name | x | ok |\n|---|---:|---|\n| a\\|b | 1.23 | yes |\n| c | n/a | no |"
    )
    with pytest.raises(ValueError, match="no columns"):
        to_markdown(pd.DataFrame())


def test_missing_prerequisite_fails_loudly(tmp_path, monkeypatch, capsys):
    def needs_engine(quick, out_dir):
        require("needs_piece", "meshplan.no_such_piece", "Engine", issue="issue 7")
        return ExperimentResult("needs_piece", "t", pd.DataFrame({"a": [1]}))

    monkeypatch.setitem(EXPERIMENTS, "needs_piece",
                        Experiment("needs_piece", "needs a piece", needs_engine))
    rc = main(["report", "--quick", "--output", str(tmp_path), "--only", "needs_piece"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "needs_piece" in err and "meshplan.no_such_piece" in err and "issue 7" in err
    assert "needs_piece" in (tmp_path / "README.md").read_text()
    assert not (tmp_path / "needs_piece.csv").exists()


def test_unknown_experiment_is_an_error(tmp_path, capsys):
    assert main(["report", "--output", str(tmp_path), "--only", "nope"]) == 2
    assert "unknown experiment(s) nope; known: zb_bubbles" in capsys.readouterr().err


def test_vtrain_quick_report_tables(quick_report):
    """The quick vtrain_single_node run predicts its sweep and rows and writes the regime and
    sweep tables."""
    from experiments import vtrain_single_node as vt

    df = pd.read_csv(quick_report / f"{vt.NAME}.csv")
    assert (df["status"] == "ok").all()
    assert set(vt.QUICK_ROWS) <= set(df["row_id"])
    regimes = pd.read_csv(quick_report / f"{vt.NAME}_by_regime.csv").set_index("regime")
    assert regimes.loc["all", "n"] == len(df)
    sw = pd.read_csv(quick_report / f"{vt.NAME}_sweeps.csv")
    key = dict(zip(vt.SWEEP_KEYS, vt.QUICK_SWEEP, strict=True))
    assert len(sw[(sw[list(key)] == pd.Series(key)).all(axis=1)]) == 1
