"""``meshplan compare`` (issue 20 item 6): comma lists of strategy options, their cross
product costed as ``meshplan cost`` would, one table that fits the terminal, a
side-by-side timeline PNG, one-line errors."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import pytest

from meshplan.engine import Engine
from meshplan.strategy import Strategy
from tests._cli import one_line_error, run_main

BASE = ["compare", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--pp", "2", "--global-batch", "8", "--seq-len", "512"]


def test_cross_product_as_json_matches_cost(capsys):
    rc, out, err = run_main(capsys, *BASE, "--schedules", "1F1B,VPP", "--mp", "1,2", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    # dp varies slowest, then tp, ..., schedule (options.FLAGS order); VPP runs 2 chunks
    assert [(r["tp"], r["schedule"], r["vpp"]) for r in rows] == [
        (1, "1F1B", 1), (1, "VPP", 2), (2, "1F1B", 1), (2, "VPP", 2)]
    s = Strategy(tp=2, pp=2, vpp=2, schedule="VPP", global_batch_size=8)
    res = Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=512).simulate()
    assert rows[3]["step_time_ms"] == pytest.approx(res.step_time * 1e3, rel=1e-12)
    assert rows[3]["max_memory_bytes"] == res.max_memory_bytes
    assert rows[3]["bubble_ratio"] == pytest.approx(res.sim.bubble_ratio)
    assert all(r["error"] is None and r["fits_in_memory"] for r in rows)


def test_table_fits_80_columns_and_names_refused_plans(capsys, monkeypatch):
    """``--vpp 2`` with 1F1B is refused (one chunk per rank), the VPP plan is costed."""
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, err = run_main(capsys, *BASE, "--schedule", "1F1B,VPP", "--vpp", "2",
                            "--recompute", "none,full")
    assert rc == 0, err
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert "megatron-1.7b on dgx-a100-80g: 4 plans" in out
    assert sum("refused" in x for x in lines) == 2
    notes = " ".join(x.strip() for x in lines if not x.startswith(("│", "┃", "┏", "┡", "└")))
    assert "[1] --vpp is 2 but schedule '1F1B' runs one chunk per rank" in notes
    body = [x for x in lines if x.startswith("│ VPP")]
    assert len(body) == 2 and all("yes" in x for x in body)


def test_side_by_side_png(tmp_path, capsys):
    png = tmp_path / "cmp.png"
    rc, out, _ = run_main(capsys, *BASE, "--schedules", "1F1B,ZB-2p", "--plot", str(png))
    assert rc == 0 and f"wrote {png}" in out
    # two panels of 2 ranks: 12 x (0.4 * 4 + 1.5 + 0.9) inches at 100 dpi
    assert mpimg.imread(png).shape[:2] == (400, 1200)


@pytest.mark.parametrize("extra,needle", [
    (["--tp", "2,x"], "--tp: 'x' is not an integer"),
    (["--recompute", "none,most"], "--recompute: 'most' is not one of"),
    (["--schedules", "1F1B,,VPP"], "--schedule: empty item"),
    (["--dp", "1,2,4,8,16", "--tp", "1,2,4,8,16", "--zero", "0,1,2"], "75 plans, at most 64"),
    (["--tp", "5,7"], "10 ranks exceeds cluster"),  # every plan refused: the first reason
])
def test_bad_lists_are_one_line_errors(capsys, extra, needle):
    line = one_line_error(*run_main(capsys, *BASE, *extra))
    assert needle in line


def test_help_lists_the_comma_options_and_plain_flags(capsys):
    rc, out, _ = run_main(capsys, "compare", "--help")
    assert rc == 0
    assert "--schedule" in out and "comma list" in out and "--json" in out
    from typer.main import get_command

    from meshplan.cli import app

    opts = {o for p in get_command(app).commands["compare"].params for o in p.opts}
    assert {"--schedules", "--schedule", "--mp", "--tp", "--recompute"} <= opts
    assert "<bool>" not in out  # flags take no value (meshplan.cli._flag_type)
    rc, out, _ = run_main(capsys, "cost", "--help")
    assert "--json" in out and "--plot" in out and "<bool>" not in out


def test_cost_plot_draws_the_step(tmp_path, capsys):
    """``meshplan cost --plot``: one panel of 2 ranks, 12 x (0.4 * 2 + 1.5) inches."""
    png = tmp_path / "step.png"
    rc, _, err = run_main(capsys, "cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g",
                          "--nodes", "1", "--pp", "2", "--dp", "2", "--global-batch", "8",
                          "--seq-len", "512", "--plot", str(png))
    assert rc == 0, err
    img = mpimg.imread(png)
    assert img.shape[:2] == (230, 1200) and img[..., :3].std() > 0.05


def test_plans_on_different_gpu_counts_show_a_gpus_column_and_a_note(capsys, monkeypatch):
    """tp 4 and tp 8 at dp 2 pp 2 use 16 and 32 of the 32 GPUs of 4 nodes: a GPUs column and
    a note say so (tokens/s is per plan); a new-user trial found them compared unmarked."""
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, err = run_main(capsys, "compare", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                            "--nodes", "4", "--dp", "2", "--tp", "4,8", "--pp", "2",
                            "--global-batch", "16", "--layers", "4")
    assert rc == 0, err
    rows = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert [ln.split("│")[2].strip() for ln in rows] == ["16", "32"]
    assert "note: the plans use 16, 32 of the 32 GPUs" in out


def test_hsdp_shard_groups_compare_as_cost_costs_them(capsys):
    """compare lacked --fsdp-shard-size / --hsdp (a hunt: HSDP plans could not be compared
    though the README says compare takes cost's options): a comma list of shard groups (0:
    all of dp), each plan equal to the Engine's."""
    rc, out, err = run_main(capsys, "compare", "--model", "llama2-7b", "--cluster", "dgx-h100",
                            "--nodes", "2", "--dp", "16", "--global-batch", "32", "--zero", "3",
                            "--framework", "fsdp2", "--layers", "4", "--hsdp", "0,4", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["fsdp_shard_size"] for r in rows] == [0, 4]
    for r, n in zip(rows, (None, 4), strict=True):
        s = Strategy(dp=16, zero=3, fsdp_shard_size=n, global_batch_size=32, framework="fsdp2")
        res = Engine("llama2-7b", "dgx-h100", s, nodes=2, num_layers=4).simulate()
        assert r["step_time_ms"] == pytest.approx(res.step_time * 1e3, rel=1e-12)
        assert r["max_memory_bytes"] == res.max_memory_bytes
    assert rows[0]["max_memory_bytes"] < rows[1]["max_memory_bytes"]  # shards over 16, then 4
    rc, out, err = run_main(capsys, "compare", "--model", "llama2-7b", "--cluster", "dgx-h100",
                            "--nodes", "2", "--dp", "16", "--global-batch", "32", "--zero", "1",
                            "--layers", "4", "--hsdp", "4")
    assert rc != 0 and "needs zero 3" in err
