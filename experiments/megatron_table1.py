"""``megatron_table1``: predicted TFLOP/s per GPU vs Megatron-LM 2021 Table 1, its ten
rows as ``shared/data/measured_runs.csv`` holds them (``narayanan2021_table1``).

Setup per row (``experiments.measured_rows``, the row's own figures): the GPT size, tensor
/ pipeline / interleaving degrees, micro-batch and global batch as
``examples/sc21/run_table_1.sh`` at Megatron-LM commit 6985e58 ran them, sequence 2048,
vocabulary 51200, full recompute, fp16, Selene (DGX A100, ``selene``); the architecture as
Megatron-LM 2021 ran it (unfused attention, dropout 0.1: ``completion.models.MEGATRON_2021``)
under the ``megatron-2021`` framework profile (``megatron-2021-torch-ddp`` for the rows
without pipeline parallelism, which ran with ``--DDP-impl torch``).

Calibration: none of its own. The device constants are the catalog's A100 values, two of
them fitted once for all A100 rows of the file (``experiments.fit_constants``; recorded in
``experiments.measured_runs.FITS``); the rows they were fitted on are marked ``fitted``,
the others ``held out``. Predicted TFLOP/s = published TFLOP/s x measured step time /
predicted step time (the same eq. 3 FLOPs on both sides).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.base import ExperimentError, ExperimentResult, register_experiment, require

NAME = "megatron_table1"
SOURCE = "narayanan2021_table1"
#: quick mode: the rows without pipeline parallelism (cheap to cost)
QUICK_ROWS = (15, 16, 17)


def table1_specs(quick: bool) -> list:
    """The ``RunSpec`` of every Table 1 row (quick: :data:`QUICK_ROWS`)."""
    parse_all = require(NAME, "experiments.measured_rows", "parse_all")
    run_spec = require(NAME, "experiments.measured_rows", "RunSpec")
    specs = [s for s in parse_all() if isinstance(s, run_spec) and s.source_id == SOURCE]
    if not specs:
        raise ExperimentError(f"experiment {NAME!r}: no {SOURCE} rows in measured_runs.csv")
    return [s for s in specs if s.row_id in QUICK_ROWS] if quick else specs


def published_tflops(row_id: int) -> float:
    """The row's published TFLOP/s per GPU (``tflops_per_gpu`` of measured_runs.csv)."""
    load_rows = require(NAME, "experiments.measured_rows", "load_rows")
    for r in load_rows():
        if int(r["row_id"]) == row_id:
            return float(r["tflops_per_gpu"])
    raise ExperimentError(f"experiment {NAME!r}: row {row_id} not in measured_runs.csv")


@register_experiment(NAME, "Megatron-LM 2021 Table 1: TFLOP/s per GPU")
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Predict every Table 1 row with the catalog constants (quick: three rows)."""
    predict = require(NAME, "experiments.measured_runs", "predict")
    fitted = require(NAME, "experiments.measured_runs", "fitted_rows")()
    records = []
    for s in table1_specs(quick):
        got = predict(s)
        if got["status"] != "ok":
            raise ExperimentError(f"experiment {NAME!r}: row {s.row_id}: {got['status']}")
        st = s.strategy
        paper = published_tflops(s.row_id)
        pred = paper * s.step_time_s / got["predicted_s"]
        records.append({
            "row_id": s.row_id, "model": s.model_name, "TP": st.tp, "PP": st.pp, "VPP": st.vpp,
            "GPUs": s.num_gpus, "micro_batch": st.micro_batch_size, "batch": st.global_batch_size,
            "framework": st.framework, "tflops_paper": paper, "tflops_pred": pred,
            "rel_error": pred / paper - 1,
            "role": "fitted" if s.row_id in fitted else "held out",
        })
    df = pd.DataFrame.from_records(records)
    held = df[df["role"] == "held out"]
    mape = 100 * df["rel_error"].abs().mean()
    notes = [f"MAPE over the {len(df)} rows: {mape:.1f}% (mean signed "
             f"{100 * df['rel_error'].mean():+.1f}%); held out ({len(held)} rows): "
             f"{100 * held['rel_error'].abs().mean():.1f}%; worst "
             f"{100 * df['rel_error'].abs().max():.1f}%."]
    desc = (
        "Narayanan et al. 2021, Table 1 (TFLOP/s per GPU, eq. 3 FLOPs with recompute, peak "
        "312), each row from `shared/data/measured_runs.csv` with its micro-batch and "
        "interleaving as `examples/sc21/run_table_1.sh` ran them "
        "(`experiments.measured_rows`). Ours: `Engine(model, 'selene', strategy)."
        "simulate()` under the `megatron-2021` profile; the A100 constants are the catalog's "
        "(fitted rows marked)."
    )
    return ExperimentResult(NAME, "Megatron-LM 2021 Table 1: TFLOP/s per GPU", df, desc, notes,
                            float_format=".3f")
