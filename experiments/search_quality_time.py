"""``search_quality_time``: best-so-far feasible step time against wall time for the
exhaustive search with bounds, TPE and random, against the proven optimum (issue 18 item 7).

Spaces (:data:`SPACES`; each the default pattern-based space ``meshplan tune`` searches
for the options, :func:`experiments.search_traces.tune_config`):

* llama2-7b on 4 x dgx-a100-80g (32 GPUs), global batch 512, seq 4096: issue 18's
  benchmark space (``benchmarks/bench_tune.py``);
* llama2-70b on 128 x dgx-h100 (1,024 H100), global batch 1024, seq 4096: issue 18's 70B
  command;
* gpt3-175b on 128 x selene (1,024 A100 80GB, Megatron 2021's cluster), global batch 1536,
  seq 2048: the batch of Megatron-LM's GPT-3 175B example
  (``examples/gpt3/train_gpt3_175b_distributed.sh`` at commit d98e8a6,
  ``--global-batch-size 1536``), which Table 1 of Narayanan et al. 2021 also uses (39.1B
  row, ``run_table_1.sh``).

Per space every method gets the same wall budget (``budget_s``): TPE and random (seeds
:data:`SEEDS`) stop there; the exhaustive run may go on to ``proof_cap_s`` to prove its
optimum, and its best at the budget is what compares with the samplers. Each run is its
own fresh process (:func:`experiments.search_traces.traced`) and runs alone, one after the
other.

Reference (:func:`reference`): the exhaustive run's optimum when it is proven; otherwise
the best plan any run found ("best known", not proven), with the exhaustive run's
smallest open bound as a lower bound on the optimum (open bound gap = (X - Y) / X, X the
exhaustive run's best, Y its open bound, as ``meshplan tune`` reports it). Gap =
(best - reference) / reference; "to 1%": first second at which the best so far is within
1% of the reference; "to optimum": first second it equals it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
from experiments.search_traces import SpaceSpec, Trace

NAME = "search_quality_time"
TITLE = "Search quality against wall time: exhaustive with bounds, TPE and random vs the optimum"
#: seeds of TPE and random per space
SEEDS = (0, 1)
#: "within 1%" of the reference
WITHIN = 0.01
#: relative tolerance of "equals the optimum" (the same simulator gives the same float)
EXACT = 1e-12

SPACES = (
    SpaceSpec("llama2-7b 32 GPUs", "llama2-7b", "dgx-a100-80g", 4, 512, 4096, budget_s=45,
              proof_cap_s=540, source="issue 18's benchmark space (`benchmarks/bench_tune.py`)"),
    SpaceSpec("llama2-70b 1,024 H100", "llama2-70b", "dgx-h100", 128, 1024, 4096, budget_s=60,
              proof_cap_s=180, source="issue 18's 70B command"),
    SpaceSpec("gpt3-175b 1,024 A100", "gpt3-175b", "selene", 128, 1536, 2048, budget_s=45,
              proof_cap_s=45, source="global batch 1536: Megatron-LM `examples/gpt3/"
              "train_gpt3_175b_distributed.sh` at d98e8a6; Narayanan et al. 2021 Table 1 (39.1B row)"),
)
#: quick mode: llama2-7b cut to 2 layers on one node, tp and ZeRO pinned (30 candidates)
QUICK = SpaceSpec("quick 7b-2L 8 GPUs", "llama2-7b", "dgx-a100-80g", 1, 16, 1024,
                  budget_s=1.0, proof_cap_s=60, layers=2, fix="tp=1,zero=0")
METHOD_LABELS = {"exhaustive": "exhaustive (bounds)", "tpe": "TPE", "random": "random"}


@dataclass(frozen=True)
class Reference:
    """The step time (s) gaps are measured against: the proven optimum, or the best known
    plan (``proven`` False) with ``lower_bound_s`` (NaN: none) below the optimum."""

    optimum_s: float
    proven: bool
    lower_bound_s: float


def reference(traces: list[Trace]) -> Reference:
    """The :class:`Reference` of one space's traces (module docstring). Raises
    ExperimentError when there is no exhaustive trace or no run found a feasible plan."""
    ex = [t for t in traces if t.method == "exhaustive"]
    if len(ex) != 1 or ex[0].report is None:
        raise ExperimentError(f"experiment {NAME!r}: a space needs exactly one exhaustive run")
    rep = ex[0].report
    if rep["proven"]:
        if rep["best_time_s"] is None:
            raise ExperimentError(f"experiment {NAME!r}: space {ex[0].space!r} has no feasible plan")
        return Reference(float(rep["best_time_s"]), True, float(rep["best_time_s"]))
    best = min(t.best_s for t in traces)
    if not math.isfinite(best):
        raise ExperimentError(f"experiment {NAME!r}: no run found a feasible plan of {ex[0].space!r}")
    ob = rep.get("open_bound_s")
    lb = min(float(ob), best) if ob is not None and math.isfinite(ob) else math.nan
    return Reference(best, False, lb)


def best_at(points: list[tuple[float, float]], t: float) -> float:
    """Best so far (s) at second ``t``: the last point at or before ``t`` (inf: none)."""
    out = math.inf
    for ti, bi in points:
        if ti > t:
            break
        out = bi
    return out


def first_time(points: list[tuple[float, float]], target: float) -> float:
    """First second at which the best so far is <= ``target`` (NaN: never)."""
    return next((ti for ti, bi in points if bi <= target), math.nan)


def gap_pct(best: float, optimum: float) -> float:
    """(best - optimum) / optimum in percent (NaN when nothing feasible was found)."""
    return (best - optimum) / optimum * 100 if math.isfinite(best) else math.nan


def open_bound_gap_pct(report: dict) -> float:
    """An unproven exhaustive run's gap (X - Y) / X in percent, X its best, Y its smallest
    open bound (NaN: proven, no plan found, or stopped before every candidate was bounded)."""
    x, y = report.get("best_time_s"), report.get("open_bound_s")
    if report["proven"] or x is None or y is None or not math.isfinite(y):
        return math.nan
    return max(0.0, (x - y) / x * 100)


def summary_row(tr: Trace, ref: Reference) -> dict:
    """One table row: a trace's best at its end and at the budget, against ``ref``."""
    opt = ref.optimum_s
    rep = tr.report or {}
    return {"space": tr.space, "method": METHOD_LABELS[tr.method],
            "seed": tr.seed if tr.method != "exhaustive" else pd.NA,
            "budget_s": tr.budget_s, "seconds": tr.seconds,
            "cpu_s": tr.cpu_s, "load": f"{tr.load[0]:.1f}-{tr.load[1]:.1f}", "trials": tr.trials,
            "best_ms": tr.best_s * 1e3, "optimum_ms": opt * 1e3,
            "optimum": "proven" if ref.proven else "best known",
            "gap_pct": gap_pct(tr.best_s, opt),
            "gap_at_budget_pct": gap_pct(best_at(tr.points, tr.budget_s), opt),
            "to_1pct_s": first_time(tr.points, opt * (1 + WITHIN)),
            "to_optimum_s": first_time(tr.points, opt * (1 + EXACT)),
            "open_bound_ms": (rep["open_bound_s"] * 1e3 if rep.get("open_bound_s") is not None
                              and not rep.get("proven") else math.nan),
            "open_bound_gap_pct": open_bound_gap_pct(rep) if rep else math.nan}


def traces_frame(traces: list[Trace]) -> pd.DataFrame:
    """Every point of every trace, long format (space, method, seed, t_s, best_s)."""
    rows = [{"space": t.space, "method": t.method, "seed": t.seed, "t_s": ti, "best_s": bi}
            for t in traces for ti, bi in t.points]
    return pd.DataFrame(rows, columns=["space", "method", "seed", "t_s", "best_s"])


STYLES = {"exhaustive": ("black", 2.0), "tpe": ("C0", 1.3), "random": ("C1", 1.3)}
DASHES = ("-", "--", ":", "-.")


def plot(groups: dict[str, list[Trace]], refs: dict[str, Reference], path: Path) -> Path:
    """One panel per space: best so far / reference against wall time (log x), the 1%
    band, the budget and, when not proven, the open bound's ratio."""
    plt = agg_pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.4), squeeze=False)
    for ax, (space, traces) in zip(axes[0], groups.items(), strict=True):
        ref = refs[space]
        top = 1.05
        for tr in traces:
            pts = [(max(ti, 1e-3), bi / ref.optimum_s) for ti, bi in tr.points if math.isfinite(bi)]
            if not pts:
                continue
            top = max(top, min(max(r for _, r in pts), 1.6))
            color, width = STYLES[tr.method]
            lab = METHOD_LABELS[tr.method] + ("" if tr.method == "exhaustive" else f" seed {tr.seed}")
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color=color,
                    linewidth=width, linestyle=DASHES[tr.seed % len(DASHES)] if tr.method != "exhaustive"
                    else "-", label=lab)
            if tr.method == "exhaustive" and tr.report is not None:
                ax.plot(*pts[-1], marker="*" if tr.report["proven"] else "x", color=color,
                        markersize=10, linestyle="none",
                        label="proven" if tr.report["proven"] else "stopped unproven")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1 + WITHIN, color="gray", linewidth=0.8, linestyle="--", label="within 1%")
        if not ref.proven and math.isfinite(ref.lower_bound_s):
            ax.axhline(ref.lower_bound_s / ref.optimum_s, color="red", linewidth=0.8,
                       linestyle=":", label="open bound (optimum >= it)")
        ax.axvline(traces[0].budget_s, color="gray", linewidth=0.8, linestyle=":", label="budget")
        low = min(0.99, ref.lower_bound_s / ref.optimum_s - 0.01) if math.isfinite(ref.lower_bound_s) else 0.99
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # minor labels overlap on a short span
        ax.set_ylim(low, top * 1.02)
        state = "proven optimum" if ref.proven else "best known, not proven"
        ax.set(xlabel="wall time (s, log scale)", ylabel="best feasible step time / reference",
               title=f"{space}\nreference {ref.optimum_s * 1e3:.1f} ms ({state})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def plan_runs(quick: bool) -> list[tuple[SpaceSpec, str, int]]:
    """(space, method, seed) of every run, exhaustive first in each space."""
    spaces = (QUICK,) if quick else SPACES
    return [(s, m, seed) for s in spaces
            for m, seeds in (("exhaustive", (0,)), ("tpe", SEEDS), ("random", SEEDS))
            for seed in seeds]


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Run every (space, method, seed) of :func:`plan_runs` (quick: the 30-candidate space
    in this process, 1 s budgets; full: the three spaces, each run in a fresh process,
    about 20 minutes), tabulate and plot. Raises ExperimentError when the tuner is missing
    or a space has no feasible plan."""
    require(NAME, "tuner.exhaustive", "run_exhaustive", issue="issue 18")
    from experiments.search_traces import traced

    groups: dict[str, list[Trace]] = {}
    for spec, method, seed in plan_runs(quick):
        groups.setdefault(spec.label, []).append(traced(spec, method, seed, isolate=not quick))
    refs = {s: reference(ts) for s, ts in groups.items()}
    df = pd.DataFrame.from_records([summary_row(t, refs[s]) for s, ts in groups.items() for t in ts])
    out = Path(out_dir)
    traces_frame([t for ts in groups.values() for t in ts]).to_csv(out / f"{NAME}_traces.csv", index=False)
    png = plot(groups, refs, out / f"{NAME}.png")
    specs = {s.label: s for s in ((QUICK,) if quick else SPACES)}
    desc = [
        "Best feasible step time so far against wall time (Engine predictions). Every method "
        "of a space gets the same wall budget (`budget_s`); the exhaustive run may continue "
        "to its proof cap to prove the optimum (its `gap_at_budget_pct` is what compares). "
        "Each run is alone, one after the other"
        + (" (quick mode: in this process)" if quick else ", in a fresh process (cold caches)")
        + "; TPE and random seeds "
        + ", ".join(map(str, SEEDS)) + ". Gap = (best - reference) / reference; the reference "
        "is the proven optimum, or the best known plan when the exhaustive run did not prove "
        "(then `open_bound_gap_pct` = (X - Y) / X from its best X and smallest open bound Y). "
        "`n/a` in a gap or time column: no feasible plan by then, or never reached; `load`: "
        "the host's 1-minute load average at the start and the end of the run; `cpu_s`: the "
        "run's CPU seconds (wall seconds stretch with the load).",
        "", "Spaces (default pattern-based space of each command):", ""]
    desc += [f"- {s.label}: `{s.command('exhaustive')}`; budget {s.budget_s:g} s, proof cap "
             f"{s.proof_cap_s:g} s{'; ' + s.source if s.source else ''}" for s in specs.values()]
    notes = []
    for s, ts in groups.items():
        ex = next(t for t in ts if t.method == "exhaustive")
        from tuner.exhaustive_report import ExhaustiveReport

        notes.append(f"{s}: {ExhaustiveReport.from_dict(ex.report).summary()}")
    notes.append(f"Every point of every trace: `{NAME}_traces.csv`.")
    return ExperimentResult(NAME, TITLE, df, "\n".join(desc), notes, [png], float_format=".2f")
