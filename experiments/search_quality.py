"""``search_quality``: pattern-based (TPE) vs full_random (random sampler) vs exhaustive
(brute force over the pattern-based space) on a small space: best feasible step time
against the number of trials.

Space: llama2-7b (seq 4096, global batch 32) on one node of ``dgx-a100-80g`` (8 GPUs);
all (dp, tp, pp) meshes; schedules 1F1B, ZBH1, VPP (vpp 2); micro-batch 1 or 2;
recompute none or full; ZeRO 0 or 1; no sequence parallel; pattern templates as
``meshplan.tuning.template_kinds`` gives them. Quick mode: 1F1B only, micro-batch 1, full
recompute, ZeRO 0, and templates varying for attention and MLP only.
Every trial is scored by ``Engine.simulate()`` through ``meshplan.tuning.make_scorer``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd

from experiments.base import (
    ExperimentError,
    ExperimentResult,
    agg_pyplot,
    register_experiment,
    require,
    save_figure,
)

NAME = "search_quality"
MODEL, CLUSTER, NODES, BATCH, SEQ = "llama2-7b", "dgx-a100-80g", 1, 32, 4096
METHODS = (  # label, annotation mode, sampler
    ("pattern-based (TPE)", "pattern-based", "tpe"),
    ("full_random (random)", "full_random", "random"),
    ("exhaustive (brute force)", "pattern-based", "bruteforce"),
)
CHECKPOINTS = (10, 25, 50, 100)


def _config(quick: bool):
    """(TuneConfig factory taking (mode, sampler, seed)) for the experiment's space."""
    tuning = require(NAME, "meshplan.tuning", issue="issue 8")
    space_mod = require(NAME, "tuner.space", issue="issue 8")
    tune_config = require(NAME, "tuner.study", "TuneConfig", issue="issue 8")
    prob = tuning.search_problem(MODEL, CLUSTER, NODES, BATCH, SEQ)
    kinds = tuning.template_kinds(MODEL, SEQ)
    if quick:
        space = space_mod.SearchSpace(prob, schedules=("1F1B",), micro_batch_sizes=(1,),
                                      recompute=("full",), zero_stages=(0,),
                                      sequence_parallel=(False,))
        kinds = {k: v if k in ("attention", "mlp") else v[:1] for k, v in kinds.items()}
    else:
        space = space_mod.SearchSpace(prob, schedules=("1F1B", "ZBH1", "VPP"), vpp_degrees=(2,),
                                      micro_batch_sizes=(1, 2), recompute=("none", "full"),
                                      zero_stages=(0, 1), sequence_parallel=(False,))
    scorer_config = {"model": MODEL, "cluster": CLUSTER, "nodes": NODES,
                     "global_batch_size": BATCH, "seq_len": SEQ, "dtype": "bfloat16"}

    def make(mode: str, sampler: str, seed: int):
        return tune_config(space, mode=mode, template_kinds=kinds, sampler=sampler, seed=seed,
                           scorer_factory=tuning.SCORER_FACTORY, scorer_config=scorer_config)

    return make


def best_curve(history: pd.DataFrame) -> list[float]:
    """Best feasible step time (s) after each trial (NaN until one is feasible)."""
    best, out = math.inf, []
    for _, row in history.sort_values("trial").iterrows():
        if row["state"] == "COMPLETE" and bool(row["feasible"]):
            best = min(best, float(row["step_time_s"]))
        out.append(best if best < math.inf else math.nan)
    return out


def _search(make, mode: str, sampler: str, trials: int) -> pd.DataFrame:
    search = require(NAME, "tuner.search", "search", issue="issue 8")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():  # BruteForceSampler is marked experimental by Optuna
        warnings.simplefilter("ignore")
        res = search(make(mode, sampler, 0), f"{NAME}-{mode}-{sampler}", storage="memory",
                     n_trials=trials)
    return res.to_dataframe()


def _summary(label: str, hist: pd.DataFrame, curve: list[float], optimum: float) -> dict:
    rec = {"method": label, "trials": len(hist),
           "complete": int((hist["state"] == "COMPLETE").sum()),
           "oom": int(hist["oom"].fillna(False).sum()),
           "best_step_time_s": curve[-1] if curve else math.nan}
    for k in CHECKPOINTS:
        rec[f"best_after_{k}_s"] = curve[k - 1] if len(curve) >= k else math.nan
    rec["gap_to_exhaustive"] = rec["best_step_time_s"] / optimum - 1
    within = [i + 1 for i, t in enumerate(curve) if t <= optimum * 1.02]
    rec["trials_to_within_2pct"] = within[0] if within else math.nan
    return rec


def plot(curves: dict[str, list[float]], optimum: float, path: Path) -> Path:
    """Best feasible step time (ms) vs trials, one line per method, the optimum dashed."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for label, curve in curves.items():
        ax.step(range(1, len(curve) + 1), [c * 1e3 for c in curve], where="post", label=label)
    ax.axhline(optimum * 1e3, color="black", linestyle="--", linewidth=1,
               label="exhaustive optimum")
    ax.set_xscale("log")
    ax.set(xlabel="trials (log scale)", ylabel="best feasible step time (ms)",
           title=f"Search quality: {MODEL} on {NODES} x {CLUSTER} (8 GPUs)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


@register_experiment(NAME, "Search quality: pattern-based vs full_random vs exhaustive")
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Run the three searches (quick: a tiny space, 15 trials for the samplers) and tabulate
    the best feasible step time against trials. Raises ExperimentError when the tuner is
    missing or no method finds a feasible plan."""
    make = _config(quick)
    trials = 15 if quick else 100
    hists = {label: _search(make, mode, sampler, 10**6 if sampler == "bruteforce" else trials)
             for label, mode, sampler in METHODS}
    curves = {label: best_curve(h) for label, h in hists.items()}
    optimum = curves[METHODS[2][0]][-1] if curves[METHODS[2][0]] else math.nan
    if math.isnan(optimum):
        raise ExperimentError(f"experiment {NAME!r}: the exhaustive search found no feasible plan")
    df = pd.DataFrame.from_records([_summary(k, hists[k], curves[k], optimum) for k in hists])
    df["trials_to_within_2pct"] = df["trials_to_within_2pct"].astype("Int64")
    png = plot(curves, optimum, Path(out_dir) / f"{NAME}.png")
    desc = (f"{MODEL}, seq {SEQ}, global batch {BATCH}, on {NODES} x {CLUSTER}. Samplers seeded "
            "with 0; exhaustive = Optuna BruteForceSampler over the pattern-based space until "
            "exhausted. Times are Engine predictions (s); gap = best / exhaustive optimum - 1.")
    notes = [f"Exhaustive optimum {optimum * 1e3:.1f} ms over {len(hists[METHODS[2][0]])} trials."]
    return ExperimentResult(NAME, "Search quality: pattern-based vs full_random vs exhaustive",
                            df, desc, notes, [png], float_format=".4f")
