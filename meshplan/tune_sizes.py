"""``meshplan tune --gpus 256-1024 [--objective cost|time|time-to-train|cost-to-train|p90]
[--max-step-time S] [--deadline D]``: one search per cluster size, then the size whose best
plan is cheapest (GPU-hours per million tokens, or dollars to train), fastest (step, P90
step, or expected time to train), within a per-step deadline and a time-to-train deadline
(``tuner.sizing``). ``--cluster A,B`` searches every size of each cluster and prints the
Pareto front of time and cost to train (``pareto.csv``, ``pareto.png``).

Each size is a study of its own, ``STUDY-gN`` (N GPUs), written to ``--output/gN/`` as a
plain ``tune`` writes it (plan.json, history.csv, report.txt, its journal), so rerunning
the command resumes every size. ``--output/sizes.csv`` has one row per size and
``--output/plan.json`` is the chosen size's plan.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported when a frame is made: ``tune --help`` stays light
    import pandas as pd

from meshplan.errors import MeshplanError
from meshplan.terminal import echo


def step_of(rec: Any) -> float:
    """The simulated step (s) of a trial record: ``metrics.step_time_s`` where a run
    objective scores ``time_s`` per step (``meshplan.objective_scoring``), else ``time_s``."""
    return float((rec.get("metrics") or {}).get("step_time_s", rec["time_s"]))


def _outcome(result: Any, nodes: int, gpus: int, tokens: int, study: str, cluster: str = "") -> Any:
    """The best plan of one size's search as a ``tuner.sizing.SizeOutcome``: its step (the
    simulated one, ``metrics.step_time_s``, when the search minimised a run objective), its
    objective per step and, from its metrics, the expected time to train and dollars."""
    from tuner.result import plan_label, scored
    from tuner.sizing import SizeOutcome

    best = result.best()
    ans = result.answer
    proof = {"optimum_at_least_s": None if ans is None else ans.optimum_at_least_s,
             "proven": ans is not None and ans.holds}
    if best is None:
        n = sum(t.state.name == "COMPLETE" and scored(t.user_attrs) for t in result.trials())
        return SizeOutcome(nodes, gpus, None, None, tokens, "no feasible plan", study, scored=n,
                           cluster=cluster, **proof)
    cand, rec = best
    m = rec.get("metrics") or {}
    return SizeOutcome(nodes, gpus, step_of(rec), float(rec["memory_bytes"]),
                       tokens, plan_label(cand.to_dict()), study, time_to_train_s=m.get("time_to_train_s"),
                       cost_usd=m.get("cost_usd"), objective_s=float(rec["time_s"]), cluster=cluster, **proof)


def sizes_frame(outcomes: list[Any]) -> pd.DataFrame:
    """One row per size: gpus, nodes, best plan, step seconds, whether it is the size's
    proven optimum, the proven lower bound on the search's objective per step there and the
    gap (%), peak GiB, tokens/s and GPU-hours per million tokens (NaN without a feasible
    plan); with a run objective also the expected days to train and dollars; with several
    clusters, the cluster."""
    rows = []
    for o in outcomes:
        row = {"gpus": o.gpus, "nodes": o.nodes, "best_plan": o.label, "step_time_s": o.step_time_s,
               "proven": o.proven, "lower_bound_s": o.optimum_at_least_s,
               "gap_pct": None if o.gap is None else 100.0 * o.gap,
               "peak_memory_GiB": None if o.peak_memory_bytes is None else o.peak_memory_bytes / 2**30,
               "tokens_per_s": o.tokens_per_s, "gpu_hours_per_mtok": o.gpu_hours_per_mtok, "study": o.study}
        if any(x.time_to_train_s is not None for x in outcomes):
            row["days_to_train"] = None if o.time_to_train_s is None else o.time_to_train_s / 86400
            row["cost_usd"] = o.cost_usd
        if any(x.cluster for x in outcomes):
            row = {"cluster": o.cluster, **row}
        rows.append(row)
    import pandas as pd

    return pd.DataFrame(rows)


#: what the chosen size is the least of, per objective (the ``chosen:`` line)
_WHAT = {"cost": "lowest GPU-hours per million tokens", "time": "shortest step",
         "time-to-train": "shortest expected time to train", "cost-to-train": "lowest cost to train",
         "p90": "shortest P90 step"}


def tune_over_sizes(gpus_spec: str, objective: str, max_step_time: float | None,
                    cluster: str | list[str], name: str, out: Path,
                    run_one: Callable[..., Any],
                    tokens_per_step: int, deadline_s: float | None = None, as_json: bool = False) -> Any:
    """Search each size of ``gpus_spec`` with ``run_one(nodes, study, out_dir)`` (returns
    the ``TuneResult``), print the per-size table and the choice, write ``sizes.csv`` and
    the chosen ``plan.json``; returns the chosen ``tuner.sizing.SizeOutcome`` (None: no size
    qualifies; ``objective`` and ``max_step_time`` are checked by :func:`check_single`
    first). Several clusters (a list): each size of each, ``run_one(nodes, study, out_dir,
    cluster)``, studies and folders named by cluster too, and the Pareto front of time and
    cost to train (:func:`pareto`; ``pareto.csv``, ``pareto.png``). The choice line says
    whether it is proven: the chosen size's plan is its proven optimum and every other
    size's lower bound is no better (``tuner.sizing.choice_proven``). ``as_json``: the sizes
    and the choice as one JSON object on stdout instead of the text. Raises SizingError (a
    ValueError) for a bad range."""
    import json

    from tuner.sizing import choice_proven, choose, why_none

    many = isinstance(cluster, list)
    clusters = cluster if many else [cluster]
    plans = [(c, check_sizes(gpus_spec, c)) for c in clusters]  # every range first
    outcomes = []
    say = (lambda *_a: None) if as_json else echo
    for c, (gpn, sizes) in plans:
        for nodes in sizes:
            g = nodes * gpn
            tag = f"{_slug(c)}-g{g}" if many else f"g{g}"
            study, d = f"{name}-{tag}", out / tag
            say(f"--- {c + ': ' if many else ''}{g} GPUs ({nodes} node{'s' if nodes != 1 else ''}): "
                       f"study {study}")
            res = run_one(nodes, study, d, c) if many else run_one(nodes, study, d)
            outcomes.append(_outcome(res, nodes, g, tokens_per_step, study, c if many else ""))
    df = sizes_frame(outcomes)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "sizes.csv", index=False)
    say(df.drop(columns=["study"]).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if many:
        front = pareto(outcomes, max_step_time, deadline_s)
        _write_pareto(front, out, say)
    best = choose(outcomes, objective, max_step_time, deadline_s)
    rows = json.loads(df.to_json(orient="records"))
    if best is None:
        say(f"no size qualifies: {why_none(outcomes, max_step_time, deadline_s)}")
        if as_json:
            echo(json.dumps({"sizes": rows, "chosen": None}, sort_keys=True))
        return None
    src = out / (f"{_slug(best.cluster)}-g{best.gpus}" if many else f"g{best.gpus}") / "plan.json"
    shutil.copyfile(src, out / "plan.json")
    limits = "".join([f" within --max-step-time {max_step_time} s" if max_step_time is not None else "",
                      f" within --deadline {deadline_s / 86400:.2f} days" if deadline_s is not None else ""])
    nodes = f"{best.nodes} node" + ("s" if best.nodes != 1 else "")
    run = "" if best.time_to_train_s is None else f", {best.time_to_train_s / 86400:.2f} days to train" + (
        "" if best.cost_usd is None else f", ${best.cost_usd:,.0f}")
    proven, doubts = choice_proven(best, outcomes, objective, max_step_time)
    proof = ("proven: no other size can do better by its lower bound" if proven else
             "NOT proven: " + "; ".join(doubts) + " (a longer --time-budget narrows the gaps)")
    say(f"chosen: {best.cluster + ', ' if many else ''}{best.gpus} GPUs ({nodes}), {best.label}: step "
        f"{best.step_time_s:.3f} s, {best.gpu_hours_per_mtok:.4f} GPU-h per million tokens{run} "
        f"({_WHAT[objective]}{limits}); {proof}; wrote {out / 'plan.json'} and {out / 'sizes.csv'}")
    if as_json:
        echo(json.dumps({"sizes": rows, "chosen": best.gpus, "cluster": best.cluster or None,
                               "proven": proven, "doubts": doubts}, sort_keys=True))
    return best


def _slug(cluster: str) -> str:
    """A cluster name or YAML path as a folder / study name part."""
    stem = Path(cluster).stem if cluster.endswith((".yaml", ".yml")) else cluster
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.") else "_" for ch in stem)[:60] or "cluster"


def pareto(outcomes: list[Any], max_step_time: float | None = None,
           deadline_s: float | None = None) -> list[Any]:
    """The (cluster, size) outcomes no other beats on both expected time to train and cost
    (each at most, one less), among those that qualify (``tuner.sizing.qualifying``) and
    have both figures; by time to train."""
    from tuner.sizing import qualifying

    pts = sorted((o for o in qualifying(outcomes, max_step_time, deadline_s)
                  if o.time_to_train_s is not None and o.cost_usd is not None),
                 key=lambda o: (o.time_to_train_s, o.cost_usd))
    front, cheapest = [], float("inf")
    for o in pts:
        if o.cost_usd < cheapest:
            front.append(o)
            cheapest = o.cost_usd
    return front


def _write_pareto(front: list[Any], out: Path, say: Callable[..., Any] = echo) -> None:
    """Print the Pareto table (with ``say``), write ``pareto.csv`` and ``pareto.png`` (days
    vs dollars)."""
    if not front:
        say("Pareto front: no (cluster, size) has both a time and a cost to train (give a price)")
        return
    df = sizes_frame(front).drop(columns=["study"])
    df.to_csv(out / "pareto.csv", index=False)
    say("Pareto front (no other is both faster and cheaper to train):")
    say(df[["cluster", "gpus", "best_plan", "days_to_train", "cost_usd"]].to_string(
        index=False, float_format=lambda v: f"{v:,.4g}"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([o.time_to_train_s / 86400 for o in front], [o.cost_usd for o in front], "o-")
    for o in front:
        ax.annotate(f"{o.cluster} x{o.gpus}", (o.time_to_train_s / 86400, o.cost_usd), fontsize=7)
    ax.set_xlabel("expected days to train")
    ax.set_ylabel("cost to train ($)")
    ax.set_title("Pareto front: time vs cost to train")
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)


def check_sizes(gpus_spec: str, cluster: str) -> tuple[int, list[int]]:
    """``(GPUs per node, node counts)`` of ``--gpus`` on ``cluster``'s nodes; raises
    SizingError (a ValueError) for a bad range, a size that is not a whole number of nodes
    or one above ``clusters.spec.MAX_WORLD_SIZE`` (checked before anything is written)."""
    from clusters import load_cluster
    from clusters.spec import MAX_WORLD_SIZE
    from tuner.sizing import cluster_sizes

    gpn = load_cluster(cluster).spec.node.devices_per_node.value
    sizes = cluster_sizes(gpus_spec, gpn)
    too_big = [n * gpn for n in sizes if n * gpn > MAX_WORLD_SIZE]
    if too_big:
        raise MeshplanError(f"--gpus {gpus_spec!r}: {too_big[0]} GPUs is above meshplan's limit of "
                         f"{MAX_WORLD_SIZE} ranks (clusters.spec.MAX_WORLD_SIZE)")
    return gpn, sizes


def check_single(objective: str, max_step_time: float | None, deadline_s: float | None = None) -> None:
    """``--objective`` / ``--max-step-time`` / ``--deadline``: validate them (on one size
    ``time`` and ``cost`` pick the same plan: the search is the step time's)."""
    from tuner.sizing import choose

    try:
        choose([], objective, max_step_time, deadline_s)
    except ValueError as e:
        raise MeshplanError(str(e)) from None
