"""The cost-balanced pipeline layer split (``simulator.layer_split``): the smallest
bottleneck stage for one chunk per rank, the least loaded busiest rank for several.

A search found the default ("balanced") split slower than the frameworks' even one on
interleaved plans: Llama 2 7B on pp 4 x vpp 4 got [3, 3, 3, 3, 3, 1, 2, ...] (1734.6 ms)
against 2 each (1506.4 ms). Two causes, each tested here: the greedy packing declared a
bottleneck infeasible when the embedding overflowed the first group while a smaller one
packed (so the bisection settled on 3 layers a stage), and with several chunks a rank
runs all of them, so balancing stages alone can leave one rank 10 layers and the other
6 plus the head."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.layer_split import _objective, split_layers
from simulator.stage_timing import vstage_ranks

# per-layer, embedding and head + loss seconds of Llama 2 7B (dp 2, pp 4, VPP, H100) and of
# Qwen3-30B-A3B (16 layers, pp 2, ep 4, s 2048): the step model's block times
LLAMA = ([10.431e-3] * 32, 0.218e-3, 5.874e-3)
QWEN = ([3.05e-3] * 16, 0.28e-3, 7.57e-3)


def _loads(split, cost, pre, post):
    out, i = [], 0
    for n in split:
        out.append(sum(cost[i:i + n]))
        i += n
    out[0] += pre
    out[-1] += post
    return out


def test_llama_pp4_vpp4_gets_two_layers_a_stage():
    cost, pre, post = LLAMA
    assert split_layers(32, 16, None, cost, pre, post) == [2] * 16
    # 2 layers + the head (26.7 ms) is the smallest bottleneck; 3 layers is 31.3 ms
    assert max(_loads([2] * 16, cost, pre, post)) == 2 * 10.431e-3 + 5.874e-3


def test_interleaved_ranks_are_balanced_not_just_stages():
    """pp 2 x vpp 4: rank 0 runs stages 0, 2, 4, 6 and rank 1 stages 1, 3, 5, 7 plus the
    head (2.5 layers' time). Stage-balancing alone gives [3, 3, 3, 1, 2, 1, 2, 1]: rank 0 10
    layers (30.5 ms), rank 1 6 + head (25.9 ms). Rank-balanced: 9 and 7 + head (27.5 and
    28.9 ms), within one layer of equal -- below even's 8 and 8 + head (32.0 ms)."""
    cost, pre, post = QWEN
    ranks = vstage_ranks("VPP", 2, 4)
    assert ranks == [0, 1, 0, 1, 0, 1, 0, 1]
    split = split_layers(16, 8, None, cost, pre, post, tuple(ranks))
    got = _objective(split, cost, pre, post, tuple(ranks))
    # the optimum over all 6,435 splits (brute force): (busiest rank, busiest stage)
    objs = [_objective([b - a for a, b in zip((0, *cuts), (*cuts, 16), strict=True)], cost, pre, post, ranks)
            for cuts in itertools.combinations(range(1, 16), 7)]
    best0 = min(o[0] for o in objs)
    best1 = min(o[1] for o in objs if o[0] <= best0 * (1 + 1e-12))
    assert got[0] == pytest.approx(best0, rel=1e-12) and got[1] == pytest.approx(best1, rel=1e-12)
    assert got[0] == pytest.approx(7 * 3.05e-3 + 7.57e-3, rel=1e-12)  # rank 1: 7 layers + head
    even0 = _objective([2] * 8, cost, pre, post, ranks)[0]
    assert got[0] < even0 == pytest.approx(8 * 3.05e-3 + 7.57e-3, rel=1e-12)
    assert sum(split) == 16 and min(split) >= 1
    # without the ranks the same costs give the stage-balanced split
    assert split_layers(16, 8, None, cost, pre, post) == [3, 3, 3, 1, 2, 1, 2, 1]


def test_vstage_ranks_of_the_v_and_of_interleaving():
    assert vstage_ranks("ZBVPP", 3, 2) == [0, 1, 2, 2, 1, 0]
    assert vstage_ranks("VPP", 3, 2) == [0, 1, 2, 0, 1, 2]
    assert vstage_ranks("1F1B", 4, 1) == [0, 1, 2, 3]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(cost=st.lists(st.floats(0.1, 10.0), min_size=2, max_size=9),
       pre=st.floats(0.0, 10.0), post=st.floats(0.0, 20.0), k=st.integers(1, 4))
def test_one_chunk_per_rank_split_has_the_smallest_bottleneck(cost, pre, post, k):
    """Against every contiguous split of the layers into k stages (brute force), the
    balanced split's largest stage load is the smallest."""
    n = len(cost)
    if k > n:
        return
    got = max(_loads(split_layers(n, k, None, cost, pre, post), cost, pre, post))
    best = min(max(_loads([b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True)], cost, pre, post))
               for cuts in itertools.combinations(range(1, n), k - 1))
    assert got <= best * (1 + 1e-9)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(n=st.integers(4, 11), c=st.floats(0.5, 3.0), pre=st.floats(0.0, 3.0),
       post=st.floats(0.0, 8.0), p=st.integers(2, 3), v_shape=st.booleans())
def test_identical_layers_over_several_chunks_a_rank_get_the_least_busy_busiest_rank(n, c, pre, post, p, v_shape):
    """Identical decoder layers (every model the catalog builds), embedding and head of any
    cost: the local search reaches the optimum busiest-rank load of every split (brute
    force over all of them). For layers of different costs it may stop short (documented)."""
    nvs = 2 * p
    if n < nvs:
        return
    cost = [c] * n
    ranks = tuple(vstage_ranks("ZBVPP" if v_shape else "VPP", p, 2))
    split = split_layers(n, nvs, None, cost, pre, post, ranks)
    assert sum(split) == n and len(split) == nvs and min(split) >= 1
    best = min(_objective([b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True)],
                          cost, pre, post, ranks)[0]
               for cuts in itertools.combinations(range(1, n), nvs - 1))
    assert _objective(split, cost, pre, post, ranks)[0] <= best * (1 + 1e-9)


def test_ranks_of_the_wrong_length_are_refused():
    from simulator.errors import SimulatorError

    with pytest.raises(SimulatorError, match="must name the rank of each of the 4 virtual stages"):
        split_layers(8, 4, None, None, 0.0, 0.0, (0, 1, 0))


def _descent_one_move_at_a_time(start, cost, pre, post, ranks):
    """The steepest descent as first written (before the moves of a step were scored
    together): every move's :func:`_objective` on its own, the first strictly lower kept."""
    from simulator.layer_split import _lower

    counts, n = list(start), len(start)
    best = _objective(counts, cost, pre, post, ranks)
    while True:
        loads = _loads(counts, cost, pre, post)
        per: dict[int, float] = {}
        for r, x in zip(ranks, loads, strict=True):
            per[r] = per.get(r, 0.0) + x
        top = max(per.values())
        busy = {r for r, x in per.items() if x >= top * (1 - 1e-12)}
        sources = {v for v in range(n) if ranks[v] in busy} | {max(range(n), key=loads.__getitem__)}
        move = None
        for a in sorted(sources):
            for b in range(n):
                if counts[a] <= 1 or b == a:
                    continue
                trial = list(counts)
                trial[a] -= 1
                trial[b] += 1
                obj = _objective(trial, cost, pre, post, ranks)
                if _lower(obj, move[1] if move else best):
                    move = ((a, b), obj)
        if move is None:
            return counts, best
        (a, b), best = move
        counts[a] -= 1
        counts[b] += 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-4, 1e-1), min_size=6, max_size=40), st.floats(0, 0.2), st.floats(0, 0.2),
       st.sampled_from([(2, 2), (2, 3), (3, 2), (4, 2), (2, 4)]), st.booleans())
def test_moves_scored_together_give_the_same_split_as_one_at_a_time(cost, pre, post, pv, vee):
    """The descent scores a step's moves in one array pass; on random mixed-cost stacks it
    ends on the same split with the bit-identical objective as the move-by-move descent
    (which the cost model used before: no prediction changes)."""
    from simulator.layer_split import _rank_balanced, even_split

    p, v = pv[0], 2 if vee else pv[1]  # the V holds two chunks a rank
    if len(cost) < p * v:
        return
    ranks = tuple(vstage_ranks("ZBVPP" if vee else "VPP", p, v))
    start = list(even_split(len(cost), p * v))
    assert _rank_balanced(start, cost, pre, post, ranks) == _descent_one_move_at_a_time(start, cost, pre,
                                                                                         post, ranks)
