"""``meshplan demo`` (``make demo``, ``python -m meshplan.demo``): the main job end to end.

1. the cluster catalog (one table);
2. a pattern-based strategy search for llama2-7b on 4 x dgx-a100-80g (32 GPUs), global
   batch 512 x 4096 tokens, 300 trials, seed 0 (``meshplan tune``'s search, in memory);
   prints the top plans;
3. writes ``reports/demo/`` (recreated each run): README.md (question, setup, best plan and
   why, top-10 table, validation, files), trials.csv, plan.json, the best plan's Gantt PNG
   and Chrome trace, and the step time vs peak memory PNG (:mod:`meshplan.demo_report`);
4. measures this machine (``meshplan calibrate --nproc 2``, about 20 s, written to
   ``local.yaml`` in the report directory), then validates a small plan on 2 local ranks
   with ``meshplan validate`` (a 2-layer LLaMA-style model, hidden 256, tp=2 Megatron
   layout, on gloo) predicting on that measured spec, and prints predicted vs measured.

:func:`run_demo` runs it; the command line (``meshplan.commands.demo``) has the options
``--trials N``, ``--seed S``, ``--output DIR``, ``--steps S`` (measured steps of the
validation), ``--cluster FILE.yaml`` (the validation's prediction on a calibrated spec, e.g.
from an earlier ``meshplan calibrate``: no new calibration), ``--no-calibrate`` (predict on
the catalog's uncalibrated ``cpu-local``), ``--no-validate``. Exit code 0 on success, 1 when
the validation failed (the report is still written), 2 for bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from meshplan.cluster_tables import make_console, render_catalog
from meshplan.demo_markdown import annotation_label, readme_text
from meshplan.demo_report import (
    FILES,
    GIB,
    DemoSetup,
    SearchOutcome,
    best_plan,
    prepare_dir,
    ranked,
    run_search,
    write_artifacts,
)

#: The validated model: issue 9's 2-layer LLaMA-style validation model (fp32 on CPU).
VALIDATION_MODEL = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
                    "num_attention_heads": 4, "num_key_value_heads": 4,
                    "intermediate_size": 688, "vocab_size": 1000, "max_position_embeddings": 64}
VALIDATION_STRATEGY = {"tp": 2, "micro_batch_size": 2, "global_batch_size": 8,
                       "dtype": "float32", "optimizer": "sgd"}
VALIDATION_LABEL = ("2-layer LLaMA-style model (hidden 256, 4 heads, seq 64, vocabulary 1000, "
                    "fp32), tp=2 Megatron layout, global batch 8 in 4 micro-batches of 2, SGD")
VALIDATION_NOTE = ("Predictions use the catalog's `cpu-local` spec, which is not calibrated to "
                   "this machine; `meshplan calibrate --output local.yaml` measures it and "
                   "`meshplan demo --cluster local.yaml` (or `meshplan validate ... "
                   "--cluster local.yaml`) predicts with the measured numbers.")


def write_validation_plan(out_dir: Path) -> Path:
    """Write the small model's config.json and its 2-rank plan.json; returns the plan."""
    from meshplan.plan import Plan
    from meshplan.strategy import Strategy

    cfg = out_dir / "validation_model.json"
    cfg.write_text(json.dumps(VALIDATION_MODEL, indent=2) + "\n")
    plan = Plan(str(cfg.resolve()), "cpu-local", Strategy(**VALIDATION_STRATEGY), seq_len=64)
    return plan.save(out_dir / "validation_plan.json")


def run_validation(plan_path: Path, out_dir: Path, steps: int = 5,
                   cluster: str | None = None) -> dict[str, Any]:
    """``meshplan validate PLAN --nproc 2 --json`` in a subprocess (its own ranks, its own
    error handling), predicting on ``cluster`` (a calibrated YAML; default the plan's
    ``cpu-local``); its JSON plus ``label``, ``command`` and ``note``, or ``error``."""
    args = ["validate", str(plan_path), "--nproc", "2", "--steps", str(steps), "--json",
            "--csv", str(out_dir / "validation.csv")] + (["--cluster", cluster] if cluster else [])
    cmd = "meshplan " + " ".join(a if "/" not in a else Path(a).name for a in args)
    try:
        proc = subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True,
                              text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "meshplan validate did not finish within 600 s", "command": cmd}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"meshplan validate exited with {proc.returncode}: {' / '.join(tail)}",
                "command": cmd}
    try:
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as e:
        return {"error": f"meshplan validate printed no JSON ({e})", "command": cmd}
    note = f"Predictions use the cluster spec {cluster}." if cluster else VALIDATION_NOTE
    return {**got, "label": VALIDATION_LABEL, "command": cmd, "note": note}


def calibrate_local(path: Path, console: Any) -> str | None:
    """``meshplan calibrate --nproc 2 --output PATH`` in a subprocess; returns the YAML
    path, or None (with a printed reason) when calibration failed, in which case the
    validation predicts on the catalog's ``cpu-local``."""
    cmd = [sys.executable, "-m", "meshplan", "calibrate", "--nproc", "2", "--output", str(path)]
    console.print("measuring this machine: " + " ".join(["meshplan", *cmd[3:]]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        console.print("[red]calibration did not finish within 300 s[/red]; predicting on cpu-local")
        return None
    if proc.returncode != 0 or not path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        console.print(f"[red]calibration failed[/red] ({tail[0]}); predicting on cpu-local")
        return None
    return str(path)


def _top_table(outcome: SearchOutcome, k: int = 10) -> Any:
    from rich.table import Table

    tab = Table(title=f"Top {k} plans (distinct, fitting in memory)")
    for col in ("#", "dp-tp-pp", "schedule", "vpp", "mbs", "recompute", "ZeRO", "SP",
                "annotation", "step s", "tokens/s", "MFU", "peak GiB", "bubble"):
        tab.add_column(col, justify="left" if col in ("schedule", "annotation") else "right")
    for i, t in enumerate(ranked(outcome.result, k), 1):
        p, ua = t.user_attrs["plan"], t.user_attrs
        m = ua.get("metrics", {})
        tab.add_row(str(i), f"{p['dp']}-{p['tp']}-{p['pp']}", p["schedule"], str(p["vpp"]),
                    str(p["micro_batch_size"]), p["recompute"], str(p["zero"]),
                    "y" if p["sequence_parallel"] else "n", annotation_label(p),
                    f"{ua['time_s']:.3f}", f"{m.get('tokens_per_s', 0.0):,.0f}",
                    f"{m.get('mfu', 0.0):.3f}", f"{ua['memory_bytes'] / GIB:.1f}",
                    f"{m.get('bubble_ratio', 0.0):.3f}")
    return tab


def _validation_table(v: dict[str, Any]) -> Any:
    from rich.table import Table

    tab = Table(title="predicted vs measured (2 gloo ranks)")
    for col in ("quantity", "predicted", "measured", "rel. error"):
        tab.add_column(col, justify="left" if col == "quantity" else "right")
    for r in v["rows"]:
        p, m = r["predicted"], r["measured"]
        err = "" if p is None or not m else f"{(p - m) / m:+.1%}"
        tab.add_row(r["quantity"], "-" if p is None else f"{p:.3f}", f"{m:.3f}", err)
    return tab


def run_demo(output: str | Path, *, trials: int, seed: int, steps: int, cluster: str | None,
             calibrate: bool, validate: bool) -> int:
    """Run the demo (module docstring), writing the report to ``output``; returns the exit
    code (0, or 1 when the validation failed; the report is still written).

    ``calibrate``: measure this machine for the validation's prediction unless ``cluster``
    names a spec; ``validate``: run the 2-rank validation at all. Raises DemoError (an
    output directory the demo did not write) or ValueError (bad search settings) before
    anything runs."""
    t0 = time.perf_counter()
    console = make_console()
    out = prepare_dir(output)
    setup = DemoSetup(trials=trials, seed=seed)
    setup.tune_config()  # bad arguments fail before anything runs
    render_catalog(console)
    console.rule(f"search: {setup.command()}")
    outcome = run_search(setup, progress=True)
    best = best_plan(outcome)
    console.print(f"{outcome.result.counts_text()} in {outcome.seconds:.1f} s")
    console.print(_top_table(outcome))
    from simulator.step import MFU_NOTE

    console.print(MFU_NOTE.split(" (--json")[0])
    files = write_artifacts(out, outcome, best)
    validation = None
    if validate:
        console.rule("validate a small plan on 2 local ranks: meshplan validate")
        files["validation_plan.json"] = write_validation_plan(out)
        files["validation_model.json"] = out / "validation_model.json"
        if cluster is None and calibrate:
            cluster = calibrate_local(out / "local.yaml", console)
            if cluster is not None:
                files["local.yaml"] = out / "local.yaml"
        console.print(VALIDATION_LABEL)
        validation = run_validation(files["validation_plan.json"], out, steps, cluster)
        if validation.get("error"):
            console.print(f"[red]validation failed:[/red] {validation['error']}")
        else:
            files["validation.csv"] = out / "validation.csv"
            console.print(_validation_table(validation))
            console.print(validation["note"])
    names = ["README.md", *[f for f in FILES if f in files]]
    (out / "README.md").write_text(readme_text(outcome, best, names, validation))
    console.rule("report")
    if best is not None:
        console.print(f"best plan: {best.record['time_s']:.3f} s, "
                      f"{best.record['memory_bytes'] / GIB:.1f} GiB (see {out / 'README.md'})")
    for name in names:
        console.print(f"  {out / name}")
    console.print(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return 1 if validation is not None and validation.get("error") else 0
