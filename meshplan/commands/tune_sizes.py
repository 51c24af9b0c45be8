"""``meshplan tune --gpus 256-1024 [--objective cost|time] [--max-step-time S]``: one
search per cluster size, then the size whose best plan is cheapest (GPU-hours per
million tokens) or fastest, within a per-step deadline (``tuner.sizing``).

Each size is a study of its own, ``STUDY-gN`` (N GPUs), written to ``--output/gN/`` as a
plain ``tune`` writes it (plan.json, history.csv, report.txt, its journal), so rerunning
the command resumes every size. ``--output/sizes.csv`` has one row per size and
``--output/plan.json`` is the chosen size's plan.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import typer

from meshplan.errors import MeshplanError


def _outcome(result: Any, nodes: int, gpus: int, tokens: int, study: str) -> Any:
    from tuner.result import plan_label, scored
    from tuner.sizing import SizeOutcome

    best = result.best()
    ans = result.answer
    proof = {"optimum_at_least_s": None if ans is None else ans.optimum_at_least_s,
             "proven": ans is not None and ans.holds}
    if best is None:
        n = sum(t.state.name == "COMPLETE" and scored(t.user_attrs) for t in result.trials())
        return SizeOutcome(nodes, gpus, None, None, tokens, "no feasible plan", study, scored=n, **proof)
    cand, rec = best
    label = plan_label(cand.to_dict())
    return SizeOutcome(nodes, gpus, float(rec["time_s"]), float(rec["memory_bytes"]), tokens,
                       label, study, **proof)


def sizes_frame(outcomes: list[Any]) -> pd.DataFrame:
    """One row per size: gpus, nodes, best plan, step seconds, whether it is the size's
    proven optimum, the proven lower bound on any plan's step there and the gap (%), peak
    GiB, tokens/s and GPU-hours per million tokens (NaN without a feasible plan)."""
    return pd.DataFrame([{
        "gpus": o.gpus, "nodes": o.nodes, "best_plan": o.label,
        "step_time_s": o.step_time_s, "proven": o.proven,
        "lower_bound_s": o.optimum_at_least_s,
        "gap_pct": None if o.gap is None else 100.0 * o.gap,
        "peak_memory_GiB": None if o.peak_memory_bytes is None else o.peak_memory_bytes / 2**30,
        "tokens_per_s": o.tokens_per_s, "gpu_hours_per_mtok": o.gpu_hours_per_mtok,
        "study": o.study} for o in outcomes])


def tune_over_sizes(gpus_spec: str, objective: str, max_step_time: float | None,
                    cluster: str, name: str, out: Path,
                    run_one: Callable[[int | None, str, Path], Any],
                    tokens_per_step: int, as_json: bool = False) -> Any:
    """Search each size of ``gpus_spec`` with ``run_one(nodes, study, out_dir)`` (returns
    the ``TuneResult``), print the per-size table and the choice, write ``sizes.csv`` and
    the chosen ``plan.json``; returns the chosen ``tuner.sizing.SizeOutcome`` (None: no size
    qualifies; ``objective`` and ``max_step_time`` are checked by :func:`check_single`
    first). The choice line says whether it is proven: the chosen size's plan is its proven
    optimum and every other size's lower bound is no better (``tuner.sizing.choice_proven``).
    ``as_json``: the sizes and the choice as one JSON object on stdout instead of the text.
    Raises SizingError (a ValueError) for a bad range."""
    import json

    from tuner.sizing import choice_proven, choose, why_none

    gpn, sizes = check_sizes(gpus_spec, cluster)
    outcomes = []
    for nodes in sizes:
        g = nodes * gpn
        study, d = f"{name}-g{g}", out / f"g{g}"
        typer.echo(f"--- {g} GPUs ({nodes} node{'s' if nodes != 1 else ''}): study {study}")
        outcomes.append(_outcome(run_one(nodes, study, d), nodes, g, tokens_per_step, study))
    df = sizes_frame(outcomes)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "sizes.csv", index=False)
    say = (lambda *_a: None) if as_json else typer.echo
    say(df.drop(columns=["study"]).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    best = choose(outcomes, objective, max_step_time)
    rows = json.loads(df.to_json(orient="records"))
    if best is None:
        say(f"no size qualifies: {why_none(outcomes, max_step_time)}")
        if as_json:
            typer.echo(json.dumps({"sizes": rows, "chosen": None}, sort_keys=True))
        return None
    shutil.copyfile(out / f"g{best.gpus}" / "plan.json", out / "plan.json")
    what = ("lowest GPU-hours per million tokens" if objective == "cost" else "shortest step")
    deadline = f" within --max-step-time {max_step_time} s" if max_step_time is not None else ""
    nodes = f"{best.nodes} node" + ("s" if best.nodes != 1 else "")
    proven, doubts = choice_proven(best, outcomes, objective, max_step_time)
    proof = ("proven: no other size can do better by its lower bound" if proven else
             "NOT proven: " + "; ".join(doubts) + " (a longer --time-budget narrows the gaps)")
    say(f"chosen: {best.gpus} GPUs ({nodes}), {best.label}: step "
        f"{best.step_time_s:.3f} s, {best.gpu_hours_per_mtok:.4f} GPU-h per million tokens "
        f"({what}{deadline}); {proof}; wrote {out / 'plan.json'} and {out / 'sizes.csv'}")
    if as_json:
        typer.echo(json.dumps({"sizes": rows, "chosen": best.gpus, "proven": proven, "doubts": doubts},
                              sort_keys=True))
    return best


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
        raise ValueError(f"--gpus {gpus_spec!r}: {too_big[0]} GPUs is above meshplan's limit of "
                         f"{MAX_WORLD_SIZE} ranks (clusters.spec.MAX_WORLD_SIZE)")
    return gpn, sizes


def check_single(objective: str, max_step_time: float | None) -> None:
    """``--objective`` / ``--max-step-time`` without ``--gpus``: validate them; on one
    size the cheapest plan is the fastest, so the search itself is unchanged."""
    from tuner.sizing import choose

    try:
        choose([], objective, max_step_time)
    except ValueError as e:
        raise MeshplanError(str(e)) from None
