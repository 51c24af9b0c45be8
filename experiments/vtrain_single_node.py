"""``vtrain_single_node``: predicted vs measured iteration time of the 1,440 one-node runs
of ``shared/data/vtrain_single_node.csv`` (small kernels: hidden 1,024-2,048, tp 1-8,
micro-batch 1-8), and how the model ranks their layouts.

Each row is stated as a user states it to ``meshplan cost`` (``experiments.vtrain_rows``:
a GPT-2 config.json, ``dgx-a100-80g``, the row's layout under the ``megatron-deepspeed``
profile) and predicted with ``meshplan.engine.Engine(model, cluster, strategy, nodes=1,
seq_len=...).simulate()`` -- the Engine ``cost`` builds (tests/experiments/test_vtrain_experiment.py
checks one row against the command). Outputs beside the per-row table:

- ``vtrain_single_node_by_regime.csv`` / ``.md``: MAPE, mean signed error and the worst row
  by tp, by micro-batch, by hidden size, by pp and overall;
- ``vtrain_single_node_sweeps.csv`` / ``.md``: per sweep (runs with the same GPUs, global
  batch, model; they differ only in tp, pp, dp and micro-batch) the layout pairs in the
  measured order and the regret of the predicted-fastest layout (``experiments.ranking``).

One constant is fitted on half of these rows: the ``megatron-deepspeed`` profile's host
seconds per launch (``experiments.fit_constants.host_fit_rows``: every second sweep); the
rows it was fitted on are marked ``fitted`` and the notes give the error on the others.
``--quick`` (CI): the rows of :data:`QUICK_SWEEP` and :data:`QUICK_ROWS`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.base import ExperimentError, ExperimentResult, register_experiment, require
from experiments.ranking import ranking_summary, summary_line, sweeps
from experiments.tables import to_markdown

if __name__ == "__main__":
    from experiments.vtrain_single_node import main

    raise SystemExit(main())

NAME = "vtrain_single_node"
TITLE = "vTrain one-node runs: predicted vs measured iteration time, layouts ranked"
#: quick mode: one whole sweep (GPUs, global batch, hidden, layers) ...
QUICK_SWEEP = (4, 8, 1024, 12)
#: ... and a few rows of other regimes (tp 8 at micro-batch 1 and 8, hidden 2048, pp 4)
QUICK_ROWS = (1096, 688, 342, 1198)
#: the sweep key: runs that differ only in layout
SWEEP_KEYS = ("gpus", "global_batch", "hidden", "layers")
#: the regimes the errors are broken down by
REGIMES = ("tp", "micro_batch", "hidden", "pp")


def predict(run: Any) -> tuple[float, str]:
    """(predicted ms, status) of one ``experiments.vtrain_rows.VtrainRun``; an Engine
    exception is that row's status, never the experiment's."""
    engine_cls = require(NAME, "meshplan.engine", "Engine")
    rows = require(NAME, "experiments.vtrain_rows")
    try:
        eng = engine_cls(rows.model(run), rows.CLUSTER, rows.strategy(run), nodes=1, seq_len=run.seq)
        return float(eng.simulate().step_time) * 1e3, "ok"
    except Exception as e:  # one row's failure is that row's error
        return math.nan, f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


def row_record(run: Any, fitted: frozenset[int] | set[int] = frozenset()) -> dict[str, Any]:
    """One line of the per-row table (``fitted``: the row ids a constant was fitted on)."""
    pred, status = predict(run)
    return {"row_id": run.row_id, "gpus": run.gpus, "global_batch": run.global_batch,
            "hidden": run.hidden, "layers": run.layers, "tp": run.tp, "pp": run.pp, "dp": run.dp,
            "micro_batch": run.micro_batch, "measured_ms": run.measured_ms, "predicted_ms": pred,
            "error_pct": 100.0 * (pred / run.measured_ms - 1.0), "fitted": run.row_id in fitted,
            "status": status}


def _stats(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[g["status"] == "ok"]
    if ok.empty:
        return {"n": 0, "MAPE_pct": math.nan, "signed_pct": math.nan, "worst_row": pd.NA,
                "worst_error_pct": math.nan, "within_25_pct": math.nan}
    err = ok["error_pct"]
    worst = err.abs().idxmax()
    return {"n": len(ok), "MAPE_pct": float(err.abs().mean()), "signed_pct": float(err.mean()),
            "worst_row": int(ok.loc[worst, "row_id"]), "worst_error_pct": float(err.loc[worst]),
            "within_25_pct": 100.0 * float((err.abs() <= 25).mean())}


def by_regime(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE, signed error, worst row and the share within 25 % per value of each of
    :data:`REGIMES`, then ``all``."""
    recs = [{"regime": f"{col}={v}", **_stats(g)} for col in REGIMES
            for v, g in df.groupby(col, sort=True)]
    recs.append({"regime": "all", **_stats(df)})
    return pd.DataFrame.from_records(recs).astype({"worst_row": "Int64"})


def _write(df: pd.DataFrame, path: Path, title: str) -> None:
    df.to_csv(path, index=False)
    path.with_suffix(".md").write_text(f"# {title}\n\n{to_markdown(df, '.2f')}\n")


def selected(runs: list[Any], quick: bool) -> list[Any]:
    """Every run, or in quick mode those of :data:`QUICK_SWEEP` and :data:`QUICK_ROWS`."""
    if not quick:
        return runs
    return [r for r in runs if (r.gpus, r.global_batch, r.hidden, r.layers) == QUICK_SWEEP
            or r.row_id in QUICK_ROWS]


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Predict the rows (quick: :func:`selected`), write the regime and sweep tables."""
    rows_mod = require(NAME, "experiments.vtrain_rows")
    try:
        runs = selected(rows_mod.load(), quick)
    except FileNotFoundError as e:
        raise ExperimentError(f"experiment {NAME!r}: {e}") from None
    fitted, _ = require(NAME, "experiments.fit_constants", "host_fit_rows")()
    df = pd.DataFrame.from_records([row_record(r, fitted) for r in runs])
    if df.empty:
        raise ExperimentError(f"experiment {NAME!r}: no row to predict")
    out = Path(out_dir)
    regimes = by_regime(df)
    _write(regimes, out / f"{NAME}_by_regime.csv", f"{TITLE}: by regime")
    table = sweeps(df.rename(columns={"measured_ms": "measured", "predicted_ms": "predicted"}),
                   SWEEP_KEYS)
    _write(table, out / f"{NAME}_sweeps.csv", f"{TITLE}: per sweep")
    total = ranking_summary(table)
    overall = regimes.iloc[-1]
    notes = [f"{int(overall['n'])} rows: MAPE {overall['MAPE_pct']:.1f} %, mean signed "
             f"{overall['signed_pct']:+.1f} %, worst row {overall['worst_row']} "
             f"({overall['worst_error_pct']:+.1f} %), {overall['within_25_pct']:.0f} % within 25 %.",
             summary_line("ranking", total)]
    for label, part in (("fitted rows", df[df["fitted"]]), ("held-out rows", df[~df["fitted"]])):
        st = _stats(part)
        if st["n"]:
            notes.append(f"{label} (megatron-deepspeed host.kernel_launch_s, fit_constants."
                         f"host_fit_rows): n={st['n']}, MAPE {st['MAPE_pct']:.1f} %")
    notes += [f"{r.regime}: MAPE {r.MAPE_pct:.1f} %, signed {r.signed_pct:+.1f} %, worst row "
              f"{r.worst_row} ({r.worst_error_pct:+.1f} %)" for r in regimes.iloc[:-1].itertuples()]
    failed = df[df["status"] != "ok"]
    if len(failed):
        notes.append(f"{len(failed)} row(s) failed: " + "; ".join(
            f"{r.row_id}: {r.status}" for r in failed.head(5).itertuples()))
    desc = (f"{'Quick mode: one sweep and rows ' + ', '.join(map(str, QUICK_ROWS)) + '. ' if quick else ''}"
            "Rows of `shared/data/vtrain_single_node.csv` (vTrain's one-node ground truth, "
            "Megatron-DeepSpeed on A100 SXM; shared/reference/measured_runs.md), each stated as "
            "`meshplan cost` takes it (`experiments.vtrain_rows`: a GPT-2 config.json with "
            "eager attention and dropout 0.1, `dgx-a100-80g`, fp16, full recompute, ZeRO-1, "
            "the `megatron-deepspeed` profile, an even layer split) and predicted by "
            "`Engine(...).simulate().step_time`. error_pct = 100 (predicted / measured - 1). "
            "`fitted`: the rows the profile's host time per launch was fitted on (every second "
            "sweep; `python -m experiments.fit_constants --host`). "
            f"By regime: `{NAME}_by_regime.md`; ranking per sweep (same GPUs, global batch and "
            f"model; `experiments.ranking`): `{NAME}_sweeps.md`.")
    return ExperimentResult(NAME, TITLE, df, desc, notes, float_format=".2f")


def main(argv: list[str] | None = None) -> int:
    """Run the experiment (``--quick`` for the CI subset) into ``reports/experiments/`` (or
    ``--output DIR``) and print its notes."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[args.index("--output") + 1]) if "--output" in args else Path("reports/experiments")
    out.mkdir(parents=True, exist_ok=True)
    from experiments.runner import write_outputs

    res = run("--quick" in args, out)
    write_outputs(res, out)
    for note in res.notes:
        print(f"- {note}")
    return 0
