"""``search_quality_default``: what ``meshplan tune`` answers by default, against TPE at the
same time and against the proven optimum (issue 36 item 6).

Per case (:data:`CASES`: dense and mixture-of-experts models on 8 to 2,048 GPUs), three
runs of the search ``meshplan tune`` builds for the case's options
(``meshplan.tune_setup.tune_config``: the framework's space, megatron-core, BF16), each in a
fresh process, one after the other:

1. **default**: ``tune`` with no sampler option -- the branch and bound on its journal study
   (as the CLI stores it) under the default ``--time-budget`` (:data:`BUDGET_S`): the
   proven optimum, or the best plan found and the proven lower bound (the gap);
2. **TPE**: ``--sampler tpe`` (seed 0, legal plans only) stopped after the default run's
   wall seconds (equal time), with the lower bound its own bounding pass leaves;
3. **proof**: the default run resumed on its study without a budget (up to
   :data:`PROOF_CAP_S`): the proven optimum, or (cap reached) the best known plan and its
   bound.

Each row: the space size, each run's best step (ms), its gap as the run itself reports it
(at most how much slower than the optimum its best can be, ``tuner.gap.SearchAnswer``),
its distance to the optimum (best known when not proven) and its wall seconds.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.base import ExperimentError, ExperimentResult, register_experiment, require

NAME = "search_quality_default"
TITLE = "Search quality: the default answer (proof or gap) against TPE at equal time and the optimum"
CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
#: the default ``--time-budget`` of ``meshplan tune`` (``meshplan.commands.tune``)
BUDGET_S = 120.0
#: the longest the proof run may take (s)
PROOF_CAP_S = 900.0


@dataclass(frozen=True)
class Case:
    """One ``meshplan tune`` command line: model (built-in name or config file), cluster,
    nodes, global batch, sequence, optional ``--layers`` / ``--fix``, and where it comes
    from (Markdown)."""

    label: str
    model: str
    cluster: str
    nodes: int
    global_batch: int
    seq_len: int
    layers: int | None = None
    fix: str | None = None
    source: str = ""

    def command(self) -> str:
        """The ``meshplan tune`` command line of the default run."""
        model = self.model if "/" not in self.model else os.path.relpath(self.model, Path.cwd())
        cmd = (f"meshplan tune --model {model} --cluster {self.cluster} --nodes {self.nodes} "
               f"--global-batch {self.global_batch} --seq-len {self.seq_len}")
        cmd += f" --layers {self.layers}" if self.layers else ""
        return cmd + (f" --fix {self.fix}" if self.fix else "")


def _cfg(name: str) -> str:
    return str(CONFIGS / f"{name}.json")


CASES = (
    Case("Llama 2 7B, 8 H100", "llama2-7b", "dgx-h100", 1, 64, 4096,
         source="one node, the README's model"),
    Case("Llama 3.1 70B, 64 H100", _cfg("llama-3.1-70b"), "dgx-h100", 8, 512, 8192,
         source="issue 36's new-user trial (TPE answered 21-72% above the optimum)"),
    Case("Mixtral 8x22B, 256 H100", _cfg("mixtral-8x22b"), "dgx-h100", 32, 1024, 4096,
         source="issue 36 item 5 (its proof was unsound: 2,070 engine refusals)"),
    Case("Qwen3 235B-A22B, 256 H100", _cfg("qwen3-235b-a22b"), "dgx-h100", 32, 1024, 4096,
         source="issue 36 item 5"),
    Case("GPT-3 175B, 1,024 A100", "gpt3-175b", "selene", 128, 1536, 2048,
         source="Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh at d98e8a6 (global batch 1536)"),
    Case("Llama 3.1 405B, 2,048 H100", _cfg("llama-3.1-405b"), "dgx-h100", 256, 1024, 8192,
         source="issue 36 item 5 / issue 37 (the Llama 3 report trained it on tp8 pp16)"),
)
#: quick mode: two small spaces (a dense and a MoE model, 2 layers, 8 GPUs) and 2 s budgets
QUICK = (
    Case("quick Llama 2 7B (2 layers), 8 H100", "llama2-7b", "dgx-h100", 1, 16, 1024, layers=2,
         fix="tp=1"),
    Case("quick Qwen3 30B-A3B (2 layers), 8 H100", "qwen3-30b-a3b", "dgx-h100", 1, 16, 1024, layers=2,
         fix="pp=1,mbs=1"),
)
QUICK_BUDGET_S, QUICK_PROOF_CAP_S = 2.0, 120.0


def tune_config(case: Case, sampler: str | None, seed: int = 0) -> Any:
    """The ``tuner.study.TuneConfig`` of ``meshplan tune`` with ``case``'s options and
    ``--sampler sampler`` (None: the default), every other option at its default."""
    from meshplan.tune_setup import tune_config as build

    return build(case.model, case.cluster, case.nodes, case.global_batch, case.seq_len,
                 "framework", seed, False, case.fix, sampler, case.layers, False)


def run_one(case: Case, method: str, folder: str, budget_s: float) -> dict[str, Any]:
    """One run of ``case`` (``default``, ``proof``: the default's study resumed, ``tpe``)
    in this process; returns its answer (``tuner.gap.SearchAnswer.to_dict``), the space
    size and the wall seconds."""
    import optuna

    from tuner.search import MEMORY, search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = "tpe" if method == "tpe" else None
    cfg = tune_config(case, sampler)
    t0 = time.monotonic()
    if method == "tpe":
        res = search(cfg, "sq-tpe", storage=MEMORY, n_trials=10**7, timeout=budget_s)
    else:  # the CLI's storage: the journal in the output folder; the proof resumes it
        res = search(cfg, "sq-default", study_dir=folder, timeout=budget_s)
    ans = res.answer.to_dict()
    ans.pop("shapes", None)
    return {"answer": ans, "seconds": time.monotonic() - t0,
            "space": None if res.exhaustive is None else res.exhaustive.space_size}


def _isolated(case: Case, method: str, folder: str, budget_s: float, isolate: bool) -> dict[str, Any]:
    if not isolate:
        return run_one(case, method, folder, budget_s)
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(run_one, case, method, folder, budget_s).result()


def _pct(x: float | None, ref: float | None) -> float:
    """(x - ref) / ref in percent (NaN when either is missing)."""
    return math.nan if x is None or ref is None else (x - ref) / ref * 100


def row(case: Case, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The table row of one case from its three runs (module docstring). The optimum is the
    proof run's best when proven, else the best any run found (``optimum`` says which)."""
    d, t, p = (runs[k]["answer"] for k in ("default", "tpe", "proof"))
    bests = [a["best_s"] for a in (d, t, p) if a["best_s"] is not None]
    proven = bool(p["holds"])
    opt = p["best_s"] if proven else min(bests, default=None)

    def ms(v: float | None) -> float:
        return math.nan if v is None else v * 1e3

    def gap(a: dict[str, Any]) -> float:
        return math.nan if a["gap"] is None else a["gap"] * 100

    return {"case": case.label, "candidates": runs["default"]["space"],
            "default_ms": ms(d["best_s"]), "default_gap_pct": gap(d),
            "default_proven": bool(d["holds"]), "default_s": runs["default"]["seconds"],
            "default_vs_optimum_pct": _pct(d["best_s"], opt),
            "tpe_ms": ms(t["best_s"]), "tpe_gap_pct": gap(t), "tpe_vs_optimum_pct": _pct(t["best_s"], opt),
            "optimum_ms": ms(opt), "optimum": "proven" if proven else "best known",
            "optimum_at_least_ms": ms(p["optimum_at_least_s"]),
            "proof_s": runs["default"]["seconds"] + runs["proof"]["seconds"]}


def run_case(case: Case, budget_s: float, proof_cap_s: float, isolate: bool) -> dict[str, Any]:
    """The three runs of ``case`` (module docstring) and its table row."""
    with tempfile.TemporaryDirectory(prefix="sq-default-") as folder:
        runs = {"default": _isolated(case, "default", folder, budget_s, isolate)}
        runs["tpe"] = _isolated(case, "tpe", folder, max(1.0, runs["default"]["seconds"]), isolate)
        runs["proof"] = (runs["default"] if runs["default"]["answer"]["holds"] else
                         _isolated(case, "proof", folder, proof_cap_s, isolate))
        if runs["proof"] is runs["default"]:
            runs["proof"] = {**runs["default"], "seconds": 0.0}
    return row(case, runs)


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Run every case (quick: :data:`QUICK` in this process with 2 s budgets; full:
    :data:`CASES`, each run in a fresh process, up to an hour and a half on 2 cores) and
    tabulate. Raises ExperimentError when the tuner is missing or a case has no plan."""
    require(NAME, "tuner.gap", "SearchAnswer", issue="issue 36")
    cases = QUICK if quick else CASES
    budget, cap = (QUICK_BUDGET_S, QUICK_PROOF_CAP_S) if quick else (BUDGET_S, PROOF_CAP_S)
    rows = [run_case(c, budget, cap, isolate=not quick) for c in cases]
    df = pd.DataFrame.from_records(rows)
    if df.optimum_ms.isna().any():
        raise ExperimentError(f"experiment {NAME!r}: no run found a feasible plan of "
                              f"{list(df.case[df.optimum_ms.isna()])}")
    desc = [
        f"Per case: the default `tune` (branch and bound, `--time-budget {budget:g}`), TPE "
        "(seed 0) for the default run's wall seconds, and the proof (the default run resumed "
        f"without a budget, up to {cap:g} s; `optimum` says whether it finished). Gaps are what "
        "each run reports: at most how much slower than the optimum its best can be (from "
        "its proven lower bound); `..._vs_optimum_pct`: its distance to the optimum. Each "
        "run alone" + (" in this process (quick mode)." if quick else " in a fresh process."),
        "", "Cases:", ""]
    desc += [f"- {c.label}: `{c.command()}`" + (f"; {c.source}" if c.source else "") for c in cases]
    notes = [f"{r['case']}: default {r['default_ms']:.1f} ms in {r['default_s']:.0f} s ("
             + ("proven" if r["default_proven"] else "gap {:.1f}%".format(r["default_gap_pct"]))
             + f"), TPE {r['tpe_vs_optimum_pct']:+.1f}% from the optimum" for r in rows]
    return ExperimentResult(NAME, TITLE, df, "\n".join(desc), notes, [], float_format=".1f")


__all__ = ["BUDGET_S", "CASES", "Case", "PROOF_CAP_S", "QUICK", "row", "run", "run_case", "run_one",
           "tune_config"]
