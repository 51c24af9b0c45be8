"""Write the residual table the error bands read (``simulator/data/residuals.csv``).

``python -m experiments.residuals`` predicts every expressible row of the measured runs
(``experiments.measured_runs.predict``) and writes, for each row no constant was fitted
on (``experiments.measured_runs.fitted_rows``), its row id, source, framework profile,
GPUs, hidden size, whether the model has experts, and the measured and predicted step
times (s). Rerun it whenever the model or the rows change; ``tests/meshplan/test_error_band.py``
checks the table against fresh predictions of a few rows.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from experiments.measured_rows import parse_measured
from experiments.measured_runs import fitted_rows, predict

OUT = Path(__file__).resolve().parent.parent / "simulator" / "data" / "residuals.csv"
COLUMNS = ("row_id", "source", "framework", "gpus", "hidden", "moe", "measured_s", "predicted_s")


def residual_rows() -> list[dict[str, object]]:
    """One dict per held-out expressible row that the Engine predicts (COLUMNS)."""
    fitted = fitted_rows()
    out = []
    for spec in parse_measured():
        if not spec.expressible or spec.row_id in fitted:
            continue
        pred = predict(spec)
        if pred["status"] != "ok":
            continue
        out.append({"row_id": spec.row_id, "source": spec.source_id, "framework": spec.strategy.framework,
                    "gpus": spec.num_gpus, "hidden": spec.model.hidden_size,
                    "moe": bool(spec.model.num_experts), "measured_s": spec.step_time_s,
                    "predicted_s": pred["predicted_s"]})
    return out


def write(path: Path = OUT) -> Path:
    """Write :func:`residual_rows` as CSV to ``path``; returns it."""
    rows = residual_rows()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


if __name__ == "__main__":
    print(write())
    sys.exit(0)
