"""The report of a measured plan that ``meshplan validate`` and the torchrun entry point
(``meshplan.executor.run``) both print and append: predicted vs measured rows, the table and
the CSV row (library code, so that the entry point does not import the CLI)."""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError

DEFAULT_CSV = "reports/validation.csv"


def report_rows(plan: Any, meas: Any) -> list[tuple[str, float | None, float]]:
    """(quantity, predicted, measured) rows of one :class:`executor.Measurement`: step time
    (ms), per-stage T_F/T_B/T_W (ms), peak memory (MiB)."""
    rows: list[tuple[str, float | None, float]] = [
        ("step time (ms)", _ms(meas.predicted.get("step_time")), meas.step_time * 1e3)]
    s = plan.strategy
    per_stage = s.dp * s.cp * s.tp  # ranks of one pipeline stage
    pred_stages = meas.predicted.get("rank_stage_times") or meas.predicted.get("stage_times") or []
    for st in range(s.pp):
        got = meas.phase_times[st * per_stage] if st * per_stage < len(meas.phase_times) else {}
        pred = pred_stages[st] if st < len(pred_stages) else {}
        for k in ("F", "B", "W"):
            m = got.get(k)
            if m is None and k in ("B", "W"):
                continue
            rows.append((f"stage {st} T_{k} (ms)", _ms(pred.get(k)), (m or 0.0) * 1e3))
        if "BW" in got:
            p = (pred.get("B") or 0.0) + (pred.get("W") or 0.0) if pred else None
            rows.append((f"stage {st} T_B+T_W (ms)", _ms(p), got["BW"] * 1e3))
    mem = meas.predicted.get("max_memory_bytes")
    rows.append(("peak memory (MiB)", None if mem is None else mem / 2**20, meas.max_peak_memory / 2**20))
    return rows


def _ms(x: float | None) -> float | None:
    return None if x is None else float(x) * 1e3


#: the columns of the validation CSV, its header line
CSV_COLUMNS = ["time", "plan", "model", "dp", "tp", "pp", "vpp", "schedule", "nproc",
               "predicted_step_time_ms", "measured_step_time_ms", "relative_error",
               "measured_peak_bytes", "predicted_peak_bytes"]


def append_csv(path: Path, plan_path: str, plan: Any, meas: Any, replace: bool = False) -> None:
    """Append one row (prediction, measurement, relative error, peaks) to CSV ``path``
    (``replace``: write it anew), writing the header :data:`CSV_COLUMNS` when the file is new;
    creates its directory (announced). Raises ValueError when an existing file's header is
    not :data:`CSV_COLUMNS` (the caller checked it before the run; this guards the
    executor's own ``--csv``)."""
    _ensure_dir(path.parent)
    new = replace or not path.is_file() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as f:
            if next(csv.reader(f), None) != CSV_COLUMNS:
                raise MeshplanError(f"--csv {str(path)!r}: its columns are not the validation CSV's; "
                                 f"give another file")
    with path.open("w" if new else "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(CSV_COLUMNS)
        s = plan.strategy
        err = meas.relative_error()
        w.writerow([time.strftime("%Y-%m-%dT%H:%M:%S"), plan_path, plan.model, s.dp, s.tp, s.pp,
                    s.vpp, s.schedule, meas.nproc, _ms(meas.predicted.get("step_time")),
                    meas.step_time * 1e3, err, meas.max_peak_memory,
                    meas.predicted.get("max_memory_bytes")])


def _ensure_dir(p: Path) -> None:
    """Create directory ``p`` when absent, saying so (``created DIR``) on stderr."""
    if not p.is_dir():
        p.mkdir(parents=True, exist_ok=True)
        print(f"created {p}", file=sys.stderr)


def print_table(rows: list[tuple[str, float | None, float]]) -> None:
    """The predicted vs measured table of :func:`report_rows`."""
    print(f"{'quantity':<26}{'predicted':>12}{'measured':>12}{'rel. error':>12}")
    for q, p, m in rows:
        err = "" if p is None or m == 0 else f"{(p - m) / m:+.1%}"
        ps = "-" if p is None else f"{p:.3f}"
        print(f"{q:<26}{ps:>12}{m:>12.3f}{err:>12}")
