"""``meshplan validate PLAN.json --nproc N [--cluster FILE.yaml] [--steps S] [--json]
[--csv FILE]``: run a plan on N local ranks (gloo; ``--backend nccl`` on GPUs) and print the
simulator's prediction next to the measurement (step time, T_F / T_B / T_W per stage, peak
memory) with the relative error; append one row to a CSV for the experiment reports.

The run plays the schedule the simulator played for the prediction
(``meshplan.validation.run_plan``), so both describe the same order of work."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import typer

from meshplan.commands import options as opt

DEFAULT_CSV = "reports/validation.csv"
#: Most measured steps one ``validate`` runs
MAX_STEPS = 10_000


def _rows(plan: Any, meas: Any) -> list[tuple[str, float | None, float]]:
    """(quantity, predicted, measured) rows: step time, per-stage T_F/T_B/T_W, memory."""
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


def _append_csv(path: Path, plan_path: str, plan: Any, meas: Any) -> None:
    opt.ensure_dir(path.parent)
    new = not path.is_file()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["time", "plan", "model", "dp", "tp", "pp", "vpp", "schedule", "nproc",
                        "predicted_step_time_ms", "measured_step_time_ms", "relative_error",
                        "measured_peak_bytes", "predicted_peak_bytes"])
        s = plan.strategy
        err = meas.relative_error()
        w.writerow([time.strftime("%Y-%m-%dT%H:%M:%S"), plan_path, plan.model, s.dp, s.tp, s.pp,
                    s.vpp, s.schedule, meas.nproc, _ms(meas.predicted.get("step_time")),
                    meas.step_time * 1e3, err, meas.max_peak_memory,
                    meas.predicted.get("max_memory_bytes")])


def validate_cmd(
    plan_file: str = typer.Argument(..., help="Plan JSON (meshplan.Plan)."),
    nproc: int = typer.Option(..., "--nproc", min=1, max=opt.MAX_LOCAL_RANKS,
                              help="Ranks to launch (must equal dp*mp*pp)."),
    cluster: str = typer.Option("", "--cluster", help="Cluster YAML or name for the prediction."),
    steps: int = typer.Option(10, "--steps", min=1, max=MAX_STEPS, help="Measured steps (after 2 warmup)."),
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU) or nccl (GPU)."),
    csv_path: str = typer.Option(DEFAULT_CSV, "--csv", help="CSV to append a row to."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run a plan, print predicted vs measured with relative errors."""
    from meshplan.plan import Plan
    from meshplan.validation import run_plan

    plan = Plan.load(plan_file)
    meas = run_plan(plan, nproc, cluster=cluster or None, backend=backend, steps=steps,
                    warmup=2)
    _append_csv(Path(csv_path), plan_file, plan, meas)
    rows = _rows(plan, meas)
    if as_json:
        typer.echo(json.dumps({
            "predicted_step_time_ms": rows[0][1], "measured_step_time_ms": rows[0][2],
            "relative_error": meas.relative_error(), "losses": meas.losses,
            "peak_memory_bytes": meas.peak_memory,
            "rows": [{"quantity": q, "predicted": p, "measured": m} for q, p, m in rows]}))
        return
    typer.echo(f"{'quantity':<26}{'predicted':>12}{'measured':>12}{'rel. error':>12}")
    for q, p, m in rows:
        err = "" if p is None or m == 0 else f"{(p - m) / m:+.1%}"
        ps = "-" if p is None else f"{p:.3f}"
        typer.echo(f"{q:<26}{ps:>12}{m:>12.3f}{err:>12}")
    typer.echo(f"losses: {', '.join(f'{x:.4f}' for x in meas.losses)}")


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command to ``app``."""
    app.command("validate")(validate_cmd)
