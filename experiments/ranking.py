"""Ranking as a measure: does the model order the layouts of a sweep as they measured?

A *sweep* is a set of measured runs that differ only in layout (issue 37): the same
source, model, GPU type and count, sequence length and tokens per step (callers name the
columns that make the key, :func:`sweeps`). Per sweep:

- *pairs in order*: of the pairs of its runs whose measured step times differ by more than
  :data:`PAIR_MARGIN` (``max / min - 1 > 3 %``: closer pairs are within the noise of a
  measurement and any order is right), the share the predictions order the same way
  (a predicted tie is not in order);
- *regret*: the measured step time of the layout the model predicts fastest over the
  measured best, minus 1 (0 when the model picks the measured-fastest layout; a tie in
  the prediction takes the first row of the sweep).

Totals (:func:`ranking_summary`): all compared pairs pooled (pairs in order / pairs), the
mean regret over the sweeps with at least two runs, and the worst sweep.

Input: a DataFrame with ``measured`` and ``predicted`` step times (any unit, the same for
both) and the key columns; rows whose prediction is not finite are left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from experiments.base import ExperimentError

#: measured step times closer than this (relative, larger over smaller minus 1) are a tie
PAIR_MARGIN = 0.03


def pairs_in_order(measured: Sequence[float], predicted: Sequence[float],
                   margin: float = PAIR_MARGIN, layouts: Sequence[Any] | None = None) -> tuple[int, int]:
    """``(pairs compared, pairs the prediction orders as measured)`` over every pair
    ``i < j`` whose measured times differ by more than ``margin`` (``max / min - 1``) and,
    given ``layouts``, whose layouts differ (two measurements of one layout are no layout
    pair). Raises ValueError for lists of different lengths or a non-positive measured
    time."""
    if len(measured) != len(predicted) or (layouts is not None and len(layouts) != len(measured)):
        raise ExperimentError(f"pairs_in_order: {len(measured)} measured times, {len(predicted)} predicted")
    if any(not m > 0 for m in measured):
        raise ExperimentError("pairs_in_order: measured times must be > 0")
    compared = right = 0
    n = len(measured)
    for i in range(n):
        for j in range(i + 1, n):
            mi, mj = measured[i], measured[j]
            if max(mi, mj) / min(mi, mj) - 1.0 <= margin or (layouts is not None and layouts[i] == layouts[j]):
                continue
            compared += 1
            di = predicted[i] - predicted[j]
            right += (di < 0) == (mi < mj) and di != 0
    return compared, right


def regret(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Measured time of the predicted-fastest run over the measured-fastest, minus 1 (the
    first of predicted ties). Raises ValueError for empty or unequal lists."""
    if not measured or len(measured) != len(predicted):
        raise ExperimentError(f"regret: needs equal non-empty lists, got {len(measured)} and {len(predicted)}")
    pick = min(range(len(predicted)), key=lambda i: predicted[i])
    return measured[pick] / min(measured) - 1.0


def sweeps(df: pd.DataFrame, keys: Sequence[str], measured: str = "measured",
           predicted: str = "predicted", layout: str | None = None) -> pd.DataFrame:
    """One line per sweep (the rows sharing ``keys``) with at least two predicted runs of
    different layouts (``layout``: the column naming a run's layout; None: every run its
    own):
    the keys, ``runs``, ``pairs`` (compared), ``in_order``, ``in_order_pct`` (NaN without
    a compared pair), ``regret_pct`` and ``predicted_best`` / ``measured_best`` (the
    index label of that row in ``df``)."""
    ok = df[df[predicted].map(lambda v: isinstance(v, (int, float)) and math.isfinite(v))]
    recs: list[dict[str, Any]] = []
    for key, g in ok.groupby(list(keys), sort=True):
        lays = g[layout].tolist() if layout is not None else None
        if len(g) < 2 or (lays is not None and len(set(lays)) < 2):
            continue
        m, p = g[measured].tolist(), g[predicted].tolist()
        compared, right = pairs_in_order(m, p, layouts=lays)
        rec = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        rec.update(runs=len(g), pairs=compared, in_order=right,
                   in_order_pct=100.0 * right / compared if compared else math.nan,
                   regret_pct=100.0 * regret(m, p),
                   predicted_best=int(g.index[min(range(len(p)), key=lambda i: p[i])]),
                   measured_best=int(g.index[min(range(len(m)), key=lambda i: m[i])]))
        recs.append(rec)
    cols = [*keys, "runs", "pairs", "in_order", "in_order_pct", "regret_pct", "predicted_best",
            "measured_best"]
    return pd.DataFrame.from_records(recs, columns=cols)


def ranking_summary(table: pd.DataFrame) -> dict[str, float]:
    """Totals of a :func:`sweeps` table: ``sweeps``, ``pairs``, ``in_order``,
    ``in_order_pct`` (pooled), ``mean_regret_pct``, ``worst_regret_pct`` and the share of
    sweeps whose predicted-fastest layout is the measured-fastest (``best_picked_pct``)."""
    if table.empty:
        return {"sweeps": 0, "pairs": 0, "in_order": 0, "in_order_pct": math.nan,
                "mean_regret_pct": math.nan, "worst_regret_pct": math.nan, "best_picked_pct": math.nan}
    pairs, right = int(table["pairs"].sum()), int(table["in_order"].sum())
    return {"sweeps": len(table), "pairs": pairs, "in_order": right,
            "in_order_pct": 100.0 * right / pairs if pairs else math.nan,
            "mean_regret_pct": float(table["regret_pct"].mean()),
            "worst_regret_pct": float(table["regret_pct"].max()),
            "best_picked_pct": 100.0 * float((table["regret_pct"] == 0).mean())}


def summary_line(name: str, s: dict[str, float]) -> str:
    """One note line of :func:`ranking_summary`."""
    if not s["sweeps"]:
        return f"{name}: no sweep of two or more runs"
    return (f"{name}: {s['sweeps']} sweeps, {s['in_order']} of {s['pairs']} layout pairs "
            f"(measured > {PAIR_MARGIN:.0%} apart) in the measured order ({s['in_order_pct']:.1f} %); "
            f"regret of the predicted-fastest layout: mean {s['mean_regret_pct']:.2f} %, worst "
            f"{s['worst_regret_pct']:.1f} %; measured-fastest picked in {s['best_picked_pct']:.0f} % of sweeps")


__all__ = ["PAIR_MARGIN", "pairs_in_order", "ranking_summary", "regret", "summary_line", "sweeps"]
