"""``local_validation``: ``meshplan validate`` over a set of 2-rank plans on this machine,
predicted vs measured step time, with the relative error.

First ``meshplan calibrate --nproc 2`` measures this machine (``--quick`` calibration in
quick mode) unless ``MESHPLAN_CLUSTER`` names a calibrated YAML already. Each plan then
runs in its own ``meshplan validate PLAN.json --nproc 2 --steps S --json --cluster YAML``
subprocess, which prints ``predicted_step_time_ms``, ``measured_step_time_ms`` and
``relative_error``; its CSV rows go to ``<out>/local_validation_plans/validate.csv``.
``--quick`` (CI) runs the dp=2 plan for 3 steps, one repeat (tensor-parallel plans run on the
executor in tests/meshplan/test_executor_verify.py); the full run all four for 10, with validate's repeats.

Plans (issue 9's validation set, as ``benchmarks/plans/``): a LLaMA-style model (hidden
256, 4 heads, seq 128, vocabulary 1000, fp32; 2 layers, 4 for ZBVPP which needs
pp * vpp = 4 chunks), global batch 8 in micro-batches of 2, SGD, on 2 gloo ranks: dp = 2,
mp = 2 (Megatron layout), pp = 2 with 1F1B, pp = 2 with ZBVPP (vpp = 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from experiments.base import ExperimentError, ExperimentResult, register_experiment, require

NAME = "local_validation"
SEQ = 128
CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
          "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 688,
          "vocab_size": 1000, "max_position_embeddings": SEQ}
PLANS = {  # label -> (layers, Strategy fields); global batch 8
    "dp=2": (2, {"dp": 2, "micro_batch_size": 2}),
    "tp=2": (2, {"tp": 2, "micro_batch_size": 2}),
    "pp=2 1F1B": (2, {"pp": 2, "schedule": "1F1B", "micro_batch_size": 2}),
    "pp=2 ZBVPP": (4, {"pp": 2, "vpp": 2, "schedule": "ZBVPP", "micro_batch_size": 2}),
}


def write_plans(out_dir: Path, cluster: str) -> dict[str, Path]:
    """Write the model config and one ``plan.json`` per entry of ``PLANS``."""
    plan_cls = require(NAME, "meshplan.plan", "Plan", issue="issue 7")
    strategy_cls = require(NAME, "meshplan.strategy", "Strategy", issue="issue 7")
    work = out_dir / f"{NAME}_plans"
    work.mkdir(parents=True, exist_ok=True)
    out = {}
    for label, (layers, fields) in PLANS.items():
        cfg = work / f"config_l{layers}.json"
        cfg.write_text(json.dumps({**CONFIG, "num_hidden_layers": layers}, indent=2))
        strat = strategy_cls(global_batch_size=8, dtype="float32", optimizer="sgd", **fields)
        path = work / ("plan_" + label.replace("=", "").replace(" ", "_") + ".json")
        plan_cls(model=str(cfg), cluster=cluster, strategy=strat, seq_len=SEQ).save(path)
        out[label] = path
    return out


QUICK_PLANS = ("dp=2",)


def validate(plan: Path, steps: int, cluster_yaml: str | None, repeats: int | None = None) -> dict:
    """Run ``meshplan validate PLAN --nproc 2 --json [--repeats R]`` in a subprocess; its
    JSON (``repeats`` None: validate's default)."""
    require(NAME, "executor", "run_plan", issue="issue 9")
    cmd = [sys.executable, "-m", "meshplan", "validate", str(plan), "--nproc", "2",
           "--steps", str(steps), "--json", "--csv", str(plan.parent / "validate.csv"), "--append"]
    if repeats is not None:
        cmd += ["--repeats", str(repeats)]
    if cluster_yaml:
        cmd += ["--cluster", cluster_yaml]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ExperimentError(f"experiment {NAME!r}: meshplan validate {plan.name} failed "
                              f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as e:
        raise ExperimentError(f"experiment {NAME!r}: meshplan validate printed no JSON: {e}") from e


def calibrate(out: Path, quick: bool) -> str:
    """``meshplan calibrate --nproc 2 [--quick] --output OUT`` in a subprocess; the YAML."""
    require(NAME, "executor", "run_plan", issue="issue 9")
    cmd = [sys.executable, "-m", "meshplan", "calibrate", "--nproc", "2", "--output", str(out)]
    proc = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0 or not out.is_file():
        raise ExperimentError(f"experiment {NAME!r}: meshplan calibrate failed "
                              f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return str(out)


@register_experiment(NAME, "Local validation: predicted vs measured step time (2 ranks)")
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Validate every plan of ``PLANS`` for 10 steps (quick: ``QUICK_PLANS``, 3 steps)."""
    cluster_yaml = os.environ.get("MESHPLAN_CLUSTER")
    if not cluster_yaml:
        (Path(out_dir) / f"{NAME}_plans").mkdir(parents=True, exist_ok=True)
        cluster_yaml = calibrate(Path(out_dir) / f"{NAME}_plans" / "calibrated.yaml", quick)
    plans = write_plans(Path(out_dir), cluster_yaml)
    records = []
    for label, path in plans.items():
        if quick and label not in QUICK_PLANS:
            continue
        got = validate(path, 3 if quick else 10, cluster_yaml, 1 if quick else None)
        pred, meas = float(got["predicted_step_time_ms"]), float(got["measured_step_time_ms"])
        records.append({"plan": label, "predicted_step_time_ms": pred,
                        "measured_step_time_ms": meas, "relative_error": pred / meas - 1})
    df = pd.DataFrame.from_records(records)
    notes = [f"Largest |relative error|: {df['relative_error'].abs().max():.1%} "
             f"(cluster: {cluster_yaml}, measured by `meshplan calibrate`"
             f"{' --quick' if quick else ''})."]
    desc = ("LLaMA-style model (hidden 256, 4 heads, seq 128, vocab 1000, fp32; 2 layers, "
            "4 for ZBVPP), global batch 8, SGD, on 2 gloo ranks, after `meshplan calibrate`; "
            "`meshplan validate --json`; error = predicted / measured - 1.")
    return ExperimentResult(NAME, "Local validation: predicted vs measured step time (2 ranks)",
                            df, desc, notes, float_format=".3f")
