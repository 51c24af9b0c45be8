"""Ranking as a measure (``experiments.ranking``): layout pairs in the measured order and
the regret of the predicted-fastest layout, by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.ranking import pairs_in_order, ranking_summary, regret, sweeps


def test_pairs_by_hand():
    # measured 100, 102, 110, 150: 100/102 are 2 % apart (a tie, skipped); the other five
    # pairs count. Predicted 1, 3, 2, 4 orders all but (102, 110) as measured.
    assert pairs_in_order([100, 102, 110, 150], [1, 3, 2, 4]) == (5, 4)
    # a predicted tie is not in order
    assert pairs_in_order([100, 200], [5, 5]) == (1, 0)
    assert pairs_in_order([100, 200], [6, 5]) == (1, 0)
    assert pairs_in_order([100, 200], [5, 6]) == (1, 1)
    # 2.5 % apart is a tie, 3.5 % is not
    assert pairs_in_order([100, 102.5], [1, 2]) == (0, 0)
    assert pairs_in_order([100, 103.5], [1, 2]) == (1, 1)
    # two measurements of one layout are no layout pair
    assert pairs_in_order([100, 150, 200], [1, 2, 3], layouts=["a", "a", "b"]) == (2, 2)
    with pytest.raises(ValueError, match="measured times"):
        pairs_in_order([1, 2], [1])
    with pytest.raises(ValueError, match="> 0"):
        pairs_in_order([0, 2], [1, 2])


def test_regret_by_hand():
    assert regret([100, 102, 110], [1, 3, 2]) == 0.0
    assert regret([100, 102, 110], [2, 1, 3]) == pytest.approx(0.02)
    assert regret([100, 102, 110], [3, 2, 1]) == pytest.approx(0.10)
    assert regret([120, 100], [1, 1]) == pytest.approx(0.2)  # a tie takes the first row
    with pytest.raises(ValueError, match="non-empty"):
        regret([], [])


def test_sweeps_and_summary_by_hand():
    df = pd.DataFrame({
        "key": ["a", "a", "a", "b", "b", "c"],
        "measured": [100.0, 110.0, 150.0, 10.0, 20.0, 5.0],
        "predicted": [2.0, 1.0, 3.0, 1.0, math.nan, 1.0],
    })
    t = sweeps(df, ["key"])
    # b keeps one predicted run and c has one: only sweep a (3 pairs, 2 in order: the
    # prediction swaps 100 and 110; it picks the 110 run: regret 10 %)
    assert t["key"].tolist() == ["a"]
    row = t.iloc[0]
    assert (row["runs"], row["pairs"], row["in_order"]) == (3, 3, 2)
    assert row["regret_pct"] == pytest.approx(10.0)
    assert (row["predicted_best"], row["measured_best"]) == (1, 0)
    s = ranking_summary(t)
    assert s["sweeps"] == 1 and s["in_order_pct"] == pytest.approx(200 / 3)
    assert s["mean_regret_pct"] == pytest.approx(10.0) and s["best_picked_pct"] == 0.0
    assert ranking_summary(t.iloc[:0])["sweeps"] == 0
    # a sweep whose runs share one layout is none
    same = df.assign(layout=["x", "x", "x", "y", "z", "w"])
    assert sweeps(same, ["key"], layout="layout").empty
