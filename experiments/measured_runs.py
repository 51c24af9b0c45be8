"""``measured_runs``: predicted vs measured step time (and peak memory) of the published
training runs in ``shared/data/measured_runs.csv`` -- the feedback loop of the cost model.

Rows measured after the CSV was frozen (``experiments.measured_rows.EXTRA_CSVS``: the
mixture-of-experts rows of ``experiments/data/measured_runs_moe.csv``, Megatron-Bridge's
Qwen3-30B-A3B on DGX-H100) are read beside it and form their own source in the tables.
Every row is parsed by :func:`experiments.measured_rows.parse_row` into a model
(``ModelConfig``), a catalog cluster and node count, and a ``Strategy`` that carries the
row's own layout, framework profile (``megatron-2021``, ``megatron-core``, ``fsdp2``,
``llm-foundry``) and attention kernel; rows meshplan cannot express today (context
parallelism: ``experiments.measured_rows.UNSUPPORTED``; rows whose cells leave a figure
unstated) are listed with
the reason. Each expressible row is predicted with
``meshplan.engine.Engine(model, cluster, strategy, nodes=..., seq_len=...).simulate()``; an
exception from the Engine is that row's error, not the experiment's.

Outputs (beside the runner's ``measured_runs.csv`` / ``.md``, the per-row table):

- ``measured_runs_by_source.csv`` / ``.md``: per source n, MAPE, mean signed error, the worst
  row and its error, plus an ``all`` line, and the same on the rows not used for fitting;
- ``measured_runs.png``: predicted vs measured step time, log-log, one colour per source,
  y = x and the +-15 % band;
- ``measured_runs_not_expressible.csv`` / ``.md``: counts by reason, then every refused row;
- ``measured_runs_sweeps.csv`` / ``.md``: per sweep (rows that differ only in layout: the
  same source, model, GPU type and count, sequence, tokens per step, framework and
  precision, :data:`SWEEP_KEYS`) the layout pairs in the measured order and the regret of
  the predicted-fastest layout (``experiments.ranking``), totals in the notes.

Fitted constants are recorded in :data:`FITS` (constant, device, value, rows fitted on);
the rows named there are marked ``fitted`` and the error on the other rows is reported
separately.

``python -m experiments.measured_runs [--quick]`` runs it into ``reports/experiments/`` and
prints the by-source table.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.base import (
    ExperimentError,
    ExperimentResult,
    agg_pyplot,
    register_experiment,
    require,
    save_figure,
)
from experiments.fit_constants import FIT_ROWS
from experiments.tables import to_markdown

if __name__ == "__main__":
    # ``python -m experiments.measured_runs``: run the copy the package registers (importing
    # ``experiments`` registers it); executing this file's own copy would register the
    # experiment a second time.
    from experiments.measured_runs import main

    raise SystemExit(main())

NAME = "measured_runs"
TITLE = "Measured training runs: predicted vs measured step time"
#: quick mode (CI): 1-2 rows per source, small and fast to cost (1001: the MoE rows file)
QUICK_ROWS = (15, 368, 60, 130, 296, 1001)
#: the band drawn around y = x, and counted in the notes
BAND = 0.15
#: rows that share these differ only in layout (a sweep, ``experiments.ranking``); the
#: framework and precision are software, not layout
SWEEP_KEYS = ("source", "model", "cluster", "gpus", "seq_len", "tokens_per_step", "framework",
              "precision")
GIB = 2**30


@dataclass(frozen=True)
class Fit:
    """A constant fitted on measured rows.

    Attributes:
        constant: what was fitted (e.g. ``device.efficiency.gemm``, or a profile field).
        device: the cluster catalog name (or device) it belongs to.
        value: the fitted value (recorded where it is used: the cluster YAML or profile).
        rows: ``row_id`` of the rows it was fitted on (their error is not a prediction).
        note: how it was fitted.
    """

    constant: str
    device: str
    value: float
    rows: tuple[int, ...]
    note: str = ""


#: Constants fitted on rows of measured_runs.csv by ``python -m experiments.fit_constants``
#: (two per device type; values recorded in the cluster YAMLs of that device).
FITS: list[Fit] = [
    Fit("device.efficiency.gemm", "A100", 0.7621, FIT_ROWS["A100"],
        "GEMM plateau of the wave model (tile stores exposed: gemm_epilogue_exposed); golden-section on MAPE, alternating with triton"),
    Fit("device.efficiency.attention_kernels.triton", "A100", 0.306, FIT_ROWS["A100"],
        "llm-foundry Triton FlashAttention; the same rows"),
    Fit("device.efficiency.gemm", "H100", 0.6418, FIT_ROWS["H100"],
        "GEMM plateau of the wave model (tile stores exposed: gemm_epilogue_exposed); golden-section on MAPE, alternating with triton"),
    Fit("device.efficiency.attention_kernels.triton", "H100", 0.1708, FIT_ROWS["H100"],
        "llm-foundry Triton FlashAttention; the same rows"),
]


def fitted_rows(fits: list[Fit] | None = None) -> set[int]:
    """Row ids any fit in ``fits`` (default :data:`FITS`) was fitted on."""
    return {r for f in (FITS if fits is None else fits) for r in f.rows}


def predict(spec: Any) -> dict[str, Any]:
    """Predict one :class:`experiments.measured_rows.RunSpec`: ``{"predicted_s",
    "predicted_mem_bytes", "status"}``. An exception from the Engine becomes
    ``status = "error: <type>: <message>"`` with NaN predictions. Also ``usable_bytes``
    (the memory of the GPU the row ran on, ``device.usable_bytes``, which its peak fitted)
    and ``memory_breakdown`` (``StepResult.memory_breakdown``)."""
    engine_cls = require(NAME, "meshplan.engine", "Engine")
    try:
        engine = engine_cls(spec.model, spec.cluster, spec.strategy, nodes=spec.nodes,
                            seq_len=spec.seq_len)
        res = engine.simulate()
        return {"predicted_s": float(res.step_time),
                "predicted_mem_bytes": float(res.max_memory_bytes),
                "usable_bytes": float(engine.cluster.device.usable_bytes),
                "memory_breakdown": dict(res.memory_breakdown), "status": "ok"}
    except Exception as e:  # one row's failure is that row's error, never the experiment's
        msg = " ".join(str(e).split())[:300]
        return {"predicted_s": math.nan, "predicted_mem_bytes": math.nan, "usable_bytes": math.nan,
                "memory_breakdown": {}, "status": f"error: {type(e).__name__}: {msg}"}


def compared_memory(pred: dict[str, Any], convention: str) -> float:
    """The predicted bytes that match how a row measured its peak (``convention`` from
    ``experiments.measured_rows.read_peak_memory``): PyTorch's max *reserved* memory holds
    the caching allocator's lines (``simulator.step_memory.ALLOCATOR_LINES``: tensors,
    cuBLAS workspace, fragmentation) but not the CUDA context or NCCL's buffers; max
    *allocated* memory also leaves out the fragmentation; otherwise (nvidia-smi, not
    stated) the whole total. NaN without a prediction."""
    b = pred.get("memory_breakdown") or {}
    if not b:
        return math.nan
    lines = require(NAME, "simulator.step_memory", "ALLOCATOR_LINES")
    if "reserved" in convention:
        return float(sum(b.get(k, 0) for k in lines))
    if "allocated" in convention:
        return float(sum(b.get(k, 0) for k in lines if k != "fragmentation"))
    return float(b.get("total", pred["predicted_mem_bytes"]))


def row_record(spec: Any, pred: dict[str, Any], fitted: set[int]) -> dict[str, Any]:
    """One line of the per-row table: identity, layout, measured and predicted step time
    (s), signed error (%), peak memory measured / predicted (GiB) where measured (the
    predicted lines the row's convention measures: :func:`compared_memory`), and the
    predicted peak as a share of the GPU's usable memory (``mem_of_gpu_pct``: every row
    ran, so above 100 the model says a plan that ran does not fit)."""
    meas, got = spec.step_time_s, pred["predicted_s"]
    mem_meas = spec.peak_mem_bytes
    mem_pred = compared_memory(pred, spec.peak_mem_convention) if mem_meas is not None else math.nan
    has_mem = mem_meas is not None and not math.isnan(mem_pred)
    s = spec.strategy
    return {
        "row_id": spec.row_id, "source": spec.source_id, "model": spec.model_name,
        "cluster": spec.cluster, "gpus": spec.num_gpus, "layout": spec.layout,
        "seq_len": spec.seq_len, "tokens_per_step": s.global_batch_size * spec.seq_len,
        "precision": s.dtype + (f"+fp8-{s.fp8}" if s.fp8 else ""),
        "framework": spec.strategy.framework, "attention": spec.strategy.attention,
        "measured_s": meas, "predicted_s": got, "error_pct": 100 * (got / meas - 1),
        "mem_measured_GiB": mem_meas / GIB if mem_meas is not None else math.nan,
        "mem_predicted_GiB": mem_pred / GIB if mem_meas is not None else math.nan,
        "mem_error_pct": 100 * (mem_pred / mem_meas - 1) if has_mem else math.nan,
        "mem_convention": spec.peak_mem_convention,
        "mem_of_gpu_pct": 100 * pred["predicted_mem_bytes"] / pred["usable_bytes"],
        "fitted": spec.row_id in fitted, "status": pred["status"],
        "measured_from": spec.step_time_origin,
        "approximations": "; ".join(spec.approximations),
        "assumptions": "; ".join(spec.assumptions),
    }


def _summary(group: pd.DataFrame) -> dict[str, Any]:
    """n, failed, MAPE %, mean signed %, worst row and its error of a group of rows."""
    ok = group[group["status"] == "ok"]
    err = ok["error_pct"]
    if len(ok) == 0:
        return {"n": 0, "failed": len(group), "MAPE_pct": math.nan, "signed_pct": math.nan,
                "worst_row": math.nan, "worst_error_pct": math.nan}
    worst = err.abs().idxmax()
    return {"n": len(ok), "failed": len(group) - len(ok), "MAPE_pct": float(err.abs().mean()),
            "signed_pct": float(err.mean()), "worst_row": int(ok.loc[worst, "row_id"]),
            "worst_error_pct": float(err.loc[worst])}


def by_source(df: pd.DataFrame) -> pd.DataFrame:
    """Per source (and ``all``): n predicted, failed, MAPE %, mean signed error %, worst row
    and its signed error %, then ``held_out_n`` / ``held_out_MAPE_pct`` on the rows not
    fitted (:data:`FITS`)."""
    recs = []
    groups = [(s, df[df["source"] == s]) for s in sorted(df["source"].unique())] + [("all", df)]
    for source, g in groups:
        rec = {"source": source, **_summary(g)}
        held = _summary(g[~g["fitted"]])
        rec["held_out_n"], rec["held_out_MAPE_pct"] = held["n"], held["MAPE_pct"]
        recs.append(rec)
    out = pd.DataFrame.from_records(recs)
    return out.astype({"worst_row": "Int64"})


def not_expressible(refused: list[Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(counts by reason combination, every refused row) of the refused rows."""
    counts = Counter(r.reason_key for r in refused)
    grouped = pd.DataFrame([{"reasons": k, "rows": v} for k, v in counts.most_common()],
                           columns=["reasons", "rows"])
    rows = pd.DataFrame([{"row_id": r.row_id, "source": r.source_id, "model": r.model_name,
                          "reasons": r.reason_key, "why": r.why} for r in refused],
                        columns=["row_id", "source", "model", "reasons", "why"])
    return grouped, rows


def by_reason(refused: list[Any]) -> pd.DataFrame:
    """Per single reason: rows it blocks (alone or with others) and rows it alone blocks
    (those that lifting it would make expressible)."""
    keys = list(dict.fromkeys(k for r in refused for k in r.reasons))
    return pd.DataFrame([{"reason": k, "rows_blocked": sum(k in r.reasons for r in refused),
                          "blocked_by_it_alone": sum(r.reasons == (k,) for r in refused)}
                         for k in keys], columns=["reason", "rows_blocked", "blocked_by_it_alone"])


def plot(df: pd.DataFrame, path: Path) -> Path:
    """Predicted vs measured step time (log-log), one colour per source, y = x and the
    +-:data:`BAND` band; writes a PNG to ``path``."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    ok = df[df["status"] == "ok"]
    lo = min(ok["measured_s"].min(), ok["predicted_s"].min(), 1.0) / 1.5 if len(ok) else 0.1
    hi = max(ok["measured_s"].max(), ok["predicted_s"].max(), 1.0) * 1.5 if len(ok) else 10.0
    xs = [lo, hi]
    ax.fill_between(xs, [x * (1 - BAND) for x in xs], [x * (1 + BAND) for x in xs],
                    color="0.85", label=f"±{BAND:.0%}")
    ax.plot(xs, xs, color="0.3", lw=1, label="y = x")
    for source in sorted(ok["source"].unique()):
        g = ok[ok["source"] == source]
        ax.scatter(g["measured_s"], g["predicted_s"], s=18, label=f"{source} ({len(g)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("measured_runs: predicted vs measured")
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def ranking(df: pd.DataFrame, out: Path) -> list[str]:
    """Write the per-sweep ranking table (``experiments.ranking.sweeps`` over
    :data:`SWEEP_KEYS` of the predicted rows) and return its note lines: the totals over the
    dense CSV's rows (row ids below 1000) and over all."""
    rk = require(NAME, "experiments.ranking")
    ok = df[df["status"] == "ok"].rename(columns={"measured_s": "measured", "predicted_s": "predicted"})
    table = rk.sweeps(ok, SWEEP_KEYS, layout="layout")
    _write_table(table, out / f"{NAME}_sweeps.csv", f"{TITLE}: layouts ranked per sweep")
    dense = table[table["measured_best"].map(lambda i: int(ok.loc[i, "row_id"]) < 1000)]
    return [rk.summary_line("ranking, dense rows (the CSV)", rk.ranking_summary(dense)),
            rk.summary_line("ranking, all rows", rk.ranking_summary(table))]


def _write_table(df: pd.DataFrame, path: Path, title: str, float_format: str = ".2f") -> None:
    """``path`` (.csv) and its Markdown twin (.md, a heading and the pipe table)."""
    df.to_csv(path, index=False)
    path.with_suffix(".md").write_text(f"# {title}\n\n{to_markdown(df, float_format)}\n")


def _fits_text() -> str:
    """One line describing :data:`FITS`."""
    if not FITS:
        return "Fitted constants (`FITS`): none -- every row is a prediction."
    lines = ["Fitted constants (`FITS`):"]
    lines += [f"`{f.constant}` on `{f.device}` = {f.value:g}, fitted on {_rows_text(f.rows)}"
              f"{' (' + f.note + ')' if f.note else ''};" for f in FITS]
    return " ".join(lines)


def _rows_text(rows: tuple[int, ...]) -> str:
    """``rows 15, 18`` for a few rows; for a device's ``fit_constants.FIT_ROWS`` its name
    and count (the list is in that module and in the cluster YAMLs)."""
    for dev, named in FIT_ROWS.items():
        if tuple(rows) == tuple(named):
            return (f"the {len(rows)} rows of `fit_constants.FIT_ROWS['{dev}']` (every second "
                    f"row of each source of the device; the others are held out)")
    return "rows " + ", ".join(map(str, rows))


def _source_line(rec: pd.Series) -> str:
    """One note line of a by-source record."""
    if not rec["n"]:
        return f"{rec['source']}: no row predicted ({rec['failed']} failed)"
    return (f"{rec['source']}: n={rec['n']}, MAPE {rec['MAPE_pct']:.1f} %, signed "
            f"{rec['signed_pct']:+.1f} %, worst row {rec['worst_row']} "
            f"({rec['worst_error_pct']:+.1f} %)"
            + (f", {rec['failed']} failed" if rec["failed"] else "")
            + (f"; held out n={rec['held_out_n']}, MAPE {rec['held_out_MAPE_pct']:.1f} %"
               if FITS else ""))


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Parse every row (the CSV and the repository's rows files,
    ``experiments.measured_rows.parse_measured``), predict the expressible ones (quick:
    :data:`QUICK_ROWS`), write the
    per-source table, the plot and the not-expressible list into ``out_dir``."""
    rows_mod = require(NAME, "experiments.measured_rows")
    try:
        parsed = rows_mod.parse_measured()
    except FileNotFoundError as e:
        raise ExperimentError(f"experiment {NAME!r}: {e}") from None
    specs = [p for p in parsed if p.expressible]
    refused = [p for p in parsed if not p.expressible]
    if quick:
        specs = [s for s in specs if s.row_id in QUICK_ROWS]
    fitted = fitted_rows()
    df = pd.DataFrame.from_records([row_record(s, predict(s), fitted) for s in specs])
    if df.empty:
        raise ExperimentError(f"experiment {NAME!r}: no expressible row to predict")
    out = Path(out_dir)
    table = by_source(df)
    _write_table(table, out / f"{NAME}_by_source.csv", f"{TITLE}: by source")
    grouped, each = not_expressible(refused)
    ne_path = out / f"{NAME}_not_expressible.csv"
    each.to_csv(ne_path, index=False)
    ne_path.with_suffix(".md").write_text(
        f"# {TITLE}: rows not expressible\n\n{len(refused)} of {len(parsed)} rows.\n\n"
        f"{to_markdown(grouped)}\n\n{to_markdown(by_reason(refused))}\n\n"
        f"{to_markdown(each)}\n")
    fig = plot(df, out / f"{NAME}.png")
    ranked = ranking(df, out)
    ok = df[df["status"] == "ok"]
    in_band = int((ok["error_pct"].abs() <= 100 * BAND).sum())
    notes = [_source_line(r) for _, r in table.iterrows()]
    notes.append(f"{in_band} of {len(ok)} predicted rows within ±{BAND:.0%} of the measurement.")
    notes += ranked
    notes.append(f"Not expressible: {len(refused)} of {len(parsed)} rows -- "
                 + ", ".join(f"{r.reasons}: {r.rows}" for r in grouped.itertuples())
                 + "; by single reason (rows blocked / blocked by it alone): "
                 + ", ".join(f"{r.reason} {r.rows_blocked}/{r.blocked_by_it_alone}"
                             for r in by_reason(refused).itertuples())
                 + f" (each row: {ne_path.name}, {ne_path.with_suffix('.md').name}).")
    mem = ok.dropna(subset=["mem_error_pct"])
    if len(mem):
        notes.append(f"Peak memory on {len(mem)} rows with a measurement ({mem['mem_convention'].iloc[0]}): "
                     f"mean |error| {mem['mem_error_pct'].abs().mean():.1f} %, signed "
                     f"{mem['mem_error_pct'].mean():+.1f} %.")
    over = ok[ok["mem_of_gpu_pct"] > 100]
    limit = 100 * (1 - require(NAME, "clusters.spec", "DEFAULT_MEMORY_HEADROOM"))
    near = ok[ok["mem_of_gpu_pct"] > limit]
    notes.append(f"Predicted peak memory above the usable memory of the GPU the row ran on: "
                 f"{len(over)} of {len(ok)} rows"
                 + (" (" + ", ".join(f"{r.row_id}: {r.mem_of_gpu_pct:.1f}%" for r in over.itertuples())
                    + ")" if len(over) else "")
                 + f"; above the tuner's default limit ({limit:.0f}% of it, --memory-headroom): "
                 + (", ".join(f"{r.row_id}" for r in near.itertuples()) or "none") + ".")
    failed = df[df["status"] != "ok"]
    if len(failed):
        notes.append(f"{len(failed)} row(s) failed in the Engine: "
                     + "; ".join(f"{r.row_id}: {r.status}" for r in failed.itertuples()))
    notes.append(_fits_text())
    desc = (
        f"{'Quick mode: rows ' + ', '.join(map(str, QUICK_ROWS)) + ' only. ' if quick else ''}"
        "Rows of `shared/data/measured_runs.csv` (see shared/reference/measured_runs.md) and "
        "of the repository's rows files (`experiments/data/measured_runs_moe.csv`: MoE runs, "
        "each row with its source URL and locator), "
        "parsed by `experiments.measured_rows.parse_row` into a `ModelConfig`, a catalog "
        "cluster with the row's node count and a `Strategy` with the row's layout, framework "
        "profile and attention kernel; predicted by `Engine(model, cluster, strategy, "
        "nodes=..., seq_len=...).simulate().step_time`. Measured: `step_time_s`, else "
        "`derived_step_time_s`, else global batch tokens / (tokens/s/GPU x GPUs) "
        "(`measured_from`). error_pct = 100 (predicted / measured - 1). Per-row "
        "approximations and assumptions are listed in the last two columns. By source: "
        f"`{NAME}_by_source.csv`; rows not expressible: `{NAME}_not_expressible.md`."
    )
    return ExperimentResult(NAME, TITLE, df, desc, notes, figures=[fig], float_format=".3f")


def main(argv: list[str] | None = None) -> int:
    """Run the experiment (``--quick`` for the CI subset) into ``reports/experiments/``
    (or the directory after ``--output``) and print the by-source table."""
    args = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in args
    out = Path(args[args.index("--output") + 1]) if "--output" in args else Path("reports/experiments")
    out.mkdir(parents=True, exist_ok=True)
    from experiments.runner import write_outputs

    res = run(quick, out)
    write_outputs(res, out)
    table = pd.read_csv(out / f"{NAME}_by_source.csv")
    print(to_markdown(table, ".1f"))
    for note in res.notes[len(table):]:
        print(f"- {note}")
    return 0

