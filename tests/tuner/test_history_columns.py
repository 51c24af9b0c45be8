"""history.csv and ``TuneResult.to_dataframe()`` speak the project's names (issue 40 item 4):
the plan's knobs as ``Strategy`` names them, the metrics as ``meshplan cost --json`` and
``sizes.csv`` name them; PaddlePaddle's auto-tuner names only through ``paddle_view``."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd

from completion.strategy import Strategy
from meshplan.cli import main
from tuner.result import HISTORY_COLUMNS, PADDLE_NAMES, paddle_view
from tuner.search import load_result
from tuner.sizing import SizeOutcome

#: the columns that are the search's own (no Strategy field or cost key says them)
SEARCH_OWN = {"trial", "state", "templates", "oom", "feasible", "cached", "pruned_reason"}
#: Paddle 2.6 auto-tuner history names (python/paddle/distributed/auto_tuner/recorder.py)
PADDLE = {"job_id", "dp_degree", "mp_degree", "pp_degree", "vpp_degree", "sharding_degree",
          "sharding_stage", "use_recompute", "recompute_granularity", "schedule_mode", "time",
          "max_mem_usage", "acc_steps", "cp_degree", "ep_degree"}


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(cls.model_fields)


def test_every_history_column_is_a_name_strategy_cost_json_or_sizes_csv_uses(capsys, tmp_path):
    assert main(["cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--dp", "8",
                 "--global-batch", "64", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    strategy, sizes = _names(Strategy), _names(SizeOutcome)
    cols = set(HISTORY_COLUMNS)
    assert len(cols) == len(HISTORY_COLUMNS)
    plan_cols = cols & strategy
    assert plan_cols == {"dp", "tp", "pp", "vpp", "cp", "ep", "micro_batch_size", "zero",
                         "fsdp_shard_size", "recompute", "sequence_parallel", "schedule", "fp8",
                         "annotation"}
    assert plan_cols <= set(cost["strategy"]) | {"annotation", "fsdp_shard_size", "fp8"}
    metric_cols = cols - strategy - SEARCH_OWN
    assert metric_cols == {"num_microbatches", "tokens_per_s", "mfu", "bubble_ratio",
                           "memory_limit_bytes", "step_time_s", "peak_memory_bytes"}
    assert metric_cols - set(cost) == {"step_time_s", "peak_memory_bytes"}  # cost: ms, max_...
    assert {"step_time_s", "peak_memory_bytes"} <= sizes  # the names sizes.csv uses
    assert not cols & PADDLE


def test_the_csv_header_and_the_paddle_view(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["tune", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
                 "--global-batch", "8", "--seq-len", "512", "--layers", "2", "--trials", "3",
                 "--sampler", "random", "--output", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    header = (out / "history.csv").read_text().splitlines()[0].split(",")
    assert header == list(HISTORY_COLUMNS)
    df = load_result(out).to_dataframe()
    plan = json.loads((out / "plan.json").read_text())["strategy"]
    best = df[df.feasible].sort_values(["step_time_s", "peak_memory_bytes"]).iloc[0]
    for k in ("dp", "tp", "pp", "zero", "recompute", "schedule", "micro_batch_size"):
        assert best[k] == plan[k], k
    assert best.num_microbatches == 8 // (plan["dp"] * plan["micro_batch_size"])
    pad = load_result(out).to_dataframe(names="paddle")
    assert set(PADDLE_NAMES.values()) <= set(pad.columns) and not set(PADDLE_NAMES) & set(pad.columns)
    row = pad.loc[best.name]
    assert (row.dp_degree, row.mp_degree, row.sharding_stage, row.time, row.max_mem_usage) == (
        best.dp, best.tp, best.zero, best.step_time_s, best.peak_memory_bytes)
    assert row.use_recompute == (best.recompute != "none")
    assert row.sharding_degree == (best.dp if best.zero else 1)


def test_paddle_view_by_hand():
    """Two rows worked by hand: ZeRO-3 over an HSDP group of 4 with full recompute, and a
    plain data-parallel plan without ZeRO or recompute; a pruned row stays empty."""
    rows = [dict.fromkeys(HISTORY_COLUMNS) for _ in range(3)]
    rows[0].update(trial=0, dp=8, tp=2, zero=3, fsdp_shard_size=4, recompute="full", schedule="1F1B",
                   step_time_s=1.5, peak_memory_bytes=10)
    rows[1].update(trial=1, dp=4, tp=1, zero=0, recompute="none", schedule="VPP")
    rows[2].update(trial=2, state="PRUNED")
    df = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS)).astype(
        {c: "Int64" for c in ("trial", "dp", "tp", "zero", "fsdp_shard_size")})
    pad = paddle_view(df)
    assert list(pad.sharding_degree[:2]) == [4, 1] and pd.isna(pad.sharding_degree[2])
    assert list(pad.use_recompute[:2]) == [True, False] and pd.isna(pad.use_recompute[2])
    assert pad.recompute_granularity[0] == "full" and pd.isna(pad.recompute_granularity[1])
    assert (pad.job_id[0], pad.mp_degree[0], pad.schedule_mode[1], pad.time[0], pad.max_mem_usage[0]) == (
        0, 2, "VPP", 1.5, 10)
