"""Building blocks of ``make demo`` (:mod:`meshplan.demo`): run the strategy search, then
write the report directory (history CSV, plan.json, the best plan's Gantt PNG and Chrome
trace, the step time vs peak memory PNG); :mod:`meshplan.demo_markdown` writes its README.

Each block is usable at a small size (few trials, fewer layers), which is how
``tests/meshplan/test_demo.py`` checks the report without running the full demo.

Units: seconds and bytes in the API; figures print seconds and GiB (2**30 bytes).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusters import load_cluster
from meshplan.engine import Engine
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from simulator.step import StepResult
from tuner.result import TuneResult
from tuner.space import Candidate
from tuner.study import TuneConfig

GIB = 2**30
#: Written into the report directory; a non-empty directory without it is never removed.
MARKER = ".meshplan-demo"
FILES = {  # file name -> what it holds (the README lists them in this order)
    "README.md": "this summary",
    "trials.csv": "every trial of the search, one row each (the columns of history.csv: tuner.result.HISTORY_COLUMNS)",
    "plan.json": "the best plan (`meshplan.Plan`; `Plan.load` / `Engine.from_plan` read it)",
    "best_plan_timeline.png": "Gantt chart of the best plan's simulated step (one row per "
                              "pipeline stage)",
    "best_plan_trace.json": "the whole step as Chrome trace JSON (open in Perfetto): a "
                            "process per rank, a thread per stream, memory counters",
    "time_vs_memory.png": "step time vs peak memory of every scored trial, Pareto front "
                          "marked, device memory drawn",
    "validation_model.json": "config.json of the small model validated on 2 local ranks",
    "validation_plan.json": "the validated 2-rank plan",
    "local.yaml": "this machine's cluster spec measured by `meshplan calibrate` (the "
                  "validation's prediction uses it)",
    "validation.csv": "the row `meshplan validate --csv` appended (predicted vs measured)",
}


class DemoError(MeshplanError):
    """A demo request that cannot run (an output directory that is not the demo's)."""


@dataclass(frozen=True)
class DemoSetup:
    """The demo's question: train ``model`` on ``nodes`` nodes of catalog ``cluster`` with
    ``global_batch`` sequences of ``seq_len`` tokens per step; search ``trials`` trials in
    ``mode`` with sampler seed ``seed``. ``num_layers`` overrides the layer count (small
    tests only)."""

    model: str = "llama2-7b"
    cluster: str = "dgx-a100-80g"
    nodes: int = 4
    global_batch: int = 512
    seq_len: int = 4096
    trials: int = 300
    seed: int = 0
    mode: str = "pattern-based"
    num_layers: int | None = None

    def scorer_config(self) -> dict[str, Any]:
        """The config of ``meshplan.tuning.make_scorer`` (what ``meshplan tune`` stores)."""
        return {"model": self.model, "cluster": self.cluster, "nodes": self.nodes,
                "global_batch_size": self.global_batch, "seq_len": self.seq_len,
                "dtype": "bfloat16", "num_layers": self.num_layers}

    def tune_config(self) -> TuneConfig:
        """The search ``meshplan tune`` runs for the same arguments (its one builder,
        ``meshplan.tune_setup.tune_config``: megatron-core, bfloat16, no pins)."""
        from meshplan.tune_setup import tune_config

        return tune_config(self.model, self.cluster, self.nodes, self.global_batch, self.seq_len,
                           self.mode, self.seed, False, None, "tpe", self.num_layers, False)

    def command(self) -> str:
        """The equivalent ``meshplan tune`` command line."""
        cmd = (f"meshplan tune --model {self.model} --cluster {self.cluster} --nodes {self.nodes} "
               f"--global-batch {self.global_batch} --seq-len {self.seq_len} --mode {self.mode} "
               f"--sampler tpe --trials {self.trials} --seed {self.seed} --storage memory")
        return cmd + (f" --layers {self.num_layers}" if self.num_layers else "")


@dataclass
class SearchOutcome:
    """A finished search: the setup, its TuneConfig, the TuneResult and the wall seconds."""

    setup: DemoSetup
    config: TuneConfig
    result: TuneResult
    seconds: float


@dataclass
class BestPlan:
    """The fastest feasible plan: its candidate, trial record (``time_s``,
    ``memory_bytes``, ``metrics``), reproducible Plan and full simulation."""

    candidate: Candidate
    record: dict[str, Any]
    plan: Plan
    step: StepResult = field(repr=False)


def run_search(setup: DemoSetup, progress: bool = False) -> SearchOutcome:
    """Run the search in memory (nothing is stored; the same seed gives the same trials)."""
    import optuna

    from tuner.search import MEMORY, search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = setup.tune_config()
    t0 = time.perf_counter()
    from meshplan import terminal

    res = search(cfg, f"demo-{setup.model}", storage=MEMORY, n_trials=setup.trials,
                 progress=progress and terminal.progress_enabled(), progress_bar=terminal.Progress)
    return SearchOutcome(setup, cfg, res, time.perf_counter() - t0)


def ranked(result: TuneResult, k: int | None = None) -> list[Any]:
    """Distinct feasible trials, fastest first; equal step times go to the plan with less
    peak memory (then the earlier trial). ``k`` limits the list."""
    f = result.feasible()
    return f if k is None else f[:k]


def best_plan(outcome: SearchOutcome) -> BestPlan | None:
    """The best feasible plan (first of :func:`ranked`), re-simulated through
    ``Engine.from_plan`` after a plan.json round trip (so the timeline is the one a user
    reproduces from plan.json); None when no scored plan fits in memory."""
    from meshplan.tuning import to_plan

    top = ranked(outcome.result, 1)
    if not top:
        return None
    rec = dict(top[0].user_attrs)
    cand = Candidate.from_dict(rec["plan"])
    plan = Plan.from_json(to_plan(cand, outcome.config.scorer_config).to_json())
    return BestPlan(cand, rec, plan, Engine.from_plan(plan).simulate())


def prepare_dir(path: str | Path) -> Path:
    """Create ``path`` empty. An existing directory is removed only when it is empty or was
    written by the demo (holds :data:`MARKER`); otherwise DemoError names it."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise DemoError(f"demo output {p} exists and is not a directory")
        if any(p.iterdir()) and not (p / MARKER).is_file():
            raise DemoError(f"demo output {p} is not empty and was not written by the demo "
                            f"(no {MARKER}); pick another --output")
        shutil.rmtree(p)
    p.mkdir(parents=True)
    (p / MARKER).write_text("written by python -m meshplan.demo; recreated on every run\n")
    return p


def scored_points(result: TuneResult) -> list[dict[str, Any]]:
    """One point per distinct scored plan (cached repeats dropped): ``time_s``,
    ``memory_bytes``, ``feasible``, ``limit_bytes`` (the limit it was scored against),
    ``number`` (first trial) and ``plan`` (candidate dict)."""
    seen: set[str] = set()
    out = []
    for t in result.trials():
        ua = t.user_attrs
        if "time_s" not in ua or ua.get("plan_key") in seen:
            continue
        seen.add(ua.get("plan_key"))
        out.append({"time_s": float(ua["time_s"]), "memory_bytes": int(ua["memory_bytes"]),
                    "feasible": ua["memory_bytes"] <= ua["memory_limit_bytes"],
                    "limit_bytes": int(ua["memory_limit_bytes"]), "number": t.number,
                    "plan": ua.get("plan", {})})
    return out


def plot_time_vs_memory(result: TuneResult, capacity_bytes: float, path: str | Path,
                        title: str = "", best: tuple[float, int] | None = None) -> Path:
    """Write the scatter of step time (s) against peak memory per GPU (GiB) of every
    distinct scored plan: feasible plans, plans over the memory limit they were scored
    against (usable memory less the headroom, a dashed vertical line; the device's
    ``capacity_bytes`` dotted beside it), the Pareto front of the feasible ones (a staircase) and
    ``best`` = (time_s, memory_bytes) as a star. Log axes (the plans span decades).
    Raises DemoError when there is no scored plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    pts = scored_points(result)
    if not pts:
        raise DemoError("no scored trial to plot (every trial was pruned)")
    ok = [p for p in pts if p["feasible"]]
    oom = [p for p in pts if not p["feasible"]]
    front = sorted((t.user_attrs["memory_bytes"] / GIB, t.user_attrs["time_s"])
                    for t in result.pareto_front())
    fig, ax = plt.subplots(figsize=(10, 6.5))
    if ok:
        ax.scatter([p["memory_bytes"] / GIB for p in ok], [p["time_s"] for p in ok], s=22,
                   color="#4C72B0", alpha=0.6, label=f"fits in memory ({len(ok)} plans)")
    if oom:
        ax.scatter([p["memory_bytes"] / GIB for p in oom], [p["time_s"] for p in oom], s=26,
                   marker="x", color="#C44E52", alpha=0.7,
                   label=f"out of memory ({len(oom)} plans)")
    if front:
        xs, ys = zip(*front, strict=True)
        ax.step(xs, ys, where="post", color="black", linewidth=1.4)
        ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="black", linewidths=1.4,
                   label=f"Pareto front ({len(front)} plans)")
    limit_bytes = max(p["limit_bytes"] for p in pts)
    ax.axvline(limit_bytes / GIB, color="#DD8452", linestyle="--", linewidth=2,
               label=f"memory limit {limit_bytes / GIB:.1f} GiB (usable less headroom)")
    ax.axvline(capacity_bytes / GIB, color="#999999", linestyle=":", linewidth=1.5,
               label=f"device memory {capacity_bytes / GIB:.1f} GiB")
    if best is not None:
        ax.scatter([best[1] / GIB], [best[0]], s=320, marker="*", color="#FFC000",
                   edgecolors="black", zorder=5,
                   label=f"best plan: {best[0]:.2f} s, {best[1] / GIB:.1f} GiB")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, subs in ((ax.xaxis, (1.0, 2.0, 5.0)), (ax.yaxis, (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))):
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.tick_params(labelsize=10)
    ax.set_xlabel("peak memory per GPU (GiB, log scale)", fontsize=12)
    ax.set_ylabel("simulated step time (s, log scale)", fontsize=12)
    ax.set_title(title or "Step time vs peak memory over all trials", fontsize=13)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=10, framealpha=0.9)  # the emptiest corner, not over the plans
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_artifacts(out_dir: str | Path, outcome: SearchOutcome,
                    best: BestPlan | None) -> dict[str, Path]:
    """Write trials.csv, and (when a plan fits) plan.json, the best plan's Gantt PNG and
    Chrome trace, and the time vs memory PNG into ``out_dir``; returns name -> path."""
    out = Path(out_dir)
    files = {"trials.csv": outcome.result.write_history_csv(out / "trials.csv")}
    setup = outcome.setup
    cl = load_cluster(setup.cluster, setup.nodes)
    if best is not None:
        files["plan.json"] = best.plan.save(out / "plan.json")
        files["best_plan_timeline.png"] = best.step.sim.plot_timeline(out / "best_plan_timeline.png")
        from simulator.step_trace import write_trace

        # the whole step: a process per rank, a thread per stream, memory counters
        files["best_plan_trace.json"] = write_trace(best.step, out / "best_plan_trace.json")
    title = (f"{setup.model} on {setup.nodes} x {setup.cluster} ({cl.world_size} GPUs): "
             f"{len(outcome.result.trials())} trials")
    pt = None if best is None else (best.record["time_s"], best.record["memory_bytes"])
    files["time_vs_memory.png"] = plot_time_vs_memory(
        outcome.result, float(cl.device.memory_bytes.value), out / "time_vs_memory.png",
        title, pt)
    return files
