"""Decoder layers over virtual pipeline stages, balanced by cost."""

from __future__ import annotations

import functools
import itertools

import numpy as np

#: how the decoder layers are split when no list is given: the cost model's balanced split
#: (the default) or the frameworks' even one (``--layers-per-stage``, tune's scorer config);
#: the registry is ``completion.choices.SPLITS``
from completion.choices import SPLITS  # noqa: F401
from simulator.errors import SimulatorError


def split_layers(num_layers: int, num_vstages: int, explicit: tuple[int, ...] | None = None,
                 layer_cost: list[float] | None = None, pre: float = 0.0, post: float = 0.0,
                 ranks: tuple[int, ...] | None = None) -> list[int]:
    """Layers per virtual stage (model order).

    ``explicit`` is used as given (validated). Otherwise the split is balanced by cost:
    contiguous groups minimising the largest stage time, the first stage also paying
    ``pre`` (embeddings) and the last ``post`` (head and loss) -- the balancing the Zero
    Bubble paper does by hand (Qi et al. 2024, Table 3: first and last stages carry fewer
    layers). Bisection on the bottleneck T; for each T a right-to-left greedy packing gives
    the fewest groups (:func:`_pack`); groups are then split to exactly ``num_vstages``
    (splitting never raises the maximum). Without costs all layers weigh 1.

    ``ranks``: the pipeline rank of each virtual stage (Megatron's interleaving, ZB-V's V;
    ``simulator.stage_timing.vstage_ranks``). When a rank holds several, its stages run one
    after another on its one compute stream, so the steady state is paced by the busiest
    *rank*, not the busiest stage (Narayanan et al. 2021, sec. 2.2.2: each device runs its v
    chunks for every micro-batch): the split then lowers (the largest rank load, the
    largest stage load) by a steepest-descent search over one-layer moves between stages
    (:func:`_rank_balanced`), started from the even split and from the stage-balanced one,
    whichever ends lower. It is a local search: it ends where no single move helps, which
    for identical decoder layers is the optimum (``tests/simulator/test_layer_split_balance.py``
    checks it by brute force) and for layers of different costs may not be (a few percent
    on mixed dense / MoE stacks). E.g. Qwen3-30B-A3B, 16 layers on pp 2 x vpp 4 beside a
    151k-vocabulary head: 9 layers on one rank and 7 plus the head on the other, where
    balancing stages alone put 10 on one and 6 plus the head on the other.

    Raises ValueError when there are fewer layers than virtual stages or ``explicit``
    does not fit. Balanced splits are memoised by their arguments (a search asks the same
    ones for every candidate of a layer layout)."""
    if ranks is not None and len(ranks) != num_vstages:
        raise SimulatorError(f"ranks {list(ranks)} must name the rank of each of the {num_vstages} "
                             f"virtual stages")
    if explicit is None:  # the rank search only where a rank holds several of several ranks
        multi = ranks is not None and 1 < len(set(ranks)) < len(ranks)
        return list(_balanced(num_layers, num_vstages, tuple(layer_cost) if layer_cost else None,
                              float(pre), float(post), tuple(ranks) if multi else None))
    return _split(num_layers, num_vstages, explicit, layer_cost, pre, post)


@functools.lru_cache(maxsize=4096)
def _balanced(num_layers: int, num_vstages: int, layer_cost: tuple[float, ...] | None,
              pre: float, post: float, ranks: tuple[int, ...] | None = None) -> tuple[int, ...]:
    cost = list(layer_cost) if layer_cost else None
    split = _split(num_layers, num_vstages, None, cost, pre, post)
    if ranks is None:
        return tuple(split)
    weights = cost or [1.0] * num_layers
    even = list(even_split(num_layers, num_vstages))
    found = [_rank_balanced(start, weights, pre, post, ranks) for start in (even, split)]
    return tuple(min(found, key=lambda f: f[1])[0])


def even_split(num_layers: int, num_vstages: int) -> tuple[int, ...]:
    """``num_layers`` over ``num_vstages`` as evenly as possible, the earlier stages one
    more (Megatron-LM's default split where they divide: ``get_num_layers_to_build``)."""
    q, r = divmod(num_layers, num_vstages)
    return tuple(q + (1 if i < r else 0) for i in range(num_vstages))


def _stage_loads(counts: list[int], cost: list[float], pre: float, post: float,
                 prefix: list[float] | None = None) -> list[float]:
    """Load of each stage of split ``counts`` (``prefix``: the running sums of ``cost``)."""
    if prefix is None:
        prefix = list(itertools.accumulate(cost, initial=0.0))
    loads, i = [], 0
    for n in counts:
        loads.append(prefix[i + n] - prefix[i])
        i += n
    loads[0] += pre
    loads[-1] += post
    return loads


def _objective(counts: list[int], cost: list[float], pre: float, post: float,
               ranks: tuple[int, ...], prefix: list[float] | None = None) -> tuple[float, float]:
    """(largest rank load, largest stage load) of a split (loads in the units of ``cost``)."""
    loads = _stage_loads(counts, cost, pre, post, prefix)
    return max(_rank_loads(loads, ranks).values()), max(loads)


def _rank_loads(loads: list[float], ranks: tuple[int, ...]) -> dict[int, float]:
    """Rank -> the summed loads of its stages."""
    per: dict[int, float] = {}
    for r, x in zip(ranks, loads, strict=True):
        per[r] = per.get(r, 0.0) + x
    return per


def _rank_balanced(start: list[int], cost: list[float], pre: float, post: float,
                   ranks: tuple[int, ...]) -> tuple[list[int], tuple[float, float]]:
    """Steepest descent from ``start`` on :func:`_objective` (lexicographic, a relative
    1e-12 counting as no gain): each step moves one layer from a stage of a busiest rank
    (or the busiest stage) to any other stage, every stage keeping at least one layer,
    until no such move lowers it (no other move can lower the busiest rank's load).
    The moves of a step are scored together (:func:`_move_objectives`, the same floating
    point operations as :func:`_objective`, so the same split) and taken in the order
    sources ascending, then targets ascending, the first strictly lower one kept.
    Returns (split, objective)."""
    prefix = list(itertools.accumulate(cost, initial=0.0))
    counts = list(start)
    best = _objective(counts, cost, pre, post, ranks, prefix)
    n = len(counts)
    pre_arr = np.asarray(prefix)
    slot = {r: k for k, r in enumerate(dict.fromkeys(ranks))}
    rank_of = [slot[r] for r in ranks]
    while True:
        loads = _stage_loads(counts, cost, pre, post, prefix)
        per = _rank_loads(loads, ranks)
        top = max(per.values())
        busy = {r for r, x in per.items() if x >= top * (1 - 1e-12)}
        sources = {v for v in range(n) if ranks[v] in busy} | {max(range(n), key=loads.__getitem__)}
        moves = [(a, b) for a in sorted(sources) if counts[a] > 1 for b in range(n) if b != a]
        if not moves:
            return counts, best
        worst_rank, worst_stage = _move_objectives(counts, moves, pre_arr, pre, post, rank_of, len(slot))
        move = None
        for k, obj in enumerate(zip(worst_rank, worst_stage, strict=True)):
            if _lower(obj, move[1] if move else best):
                move = (moves[k], obj)
        if move is None:
            return counts, best
        (a, b), best = move
        counts[a] -= 1
        counts[b] += 1


def _move_objectives(counts: list[int], moves: list[tuple[int, int]], prefix: np.ndarray, pre: float,
                     post: float, rank_of: list[int], n_ranks: int) -> tuple[list[float], list[float]]:
    """:func:`_objective` of ``counts`` after each one-layer move ``(a, b)`` (a layer from
    stage a to stage b), as (largest rank loads, largest stage loads), one per move. Each
    value is the one :func:`_objective` computes: a stage's load is the same difference of
    running sums plus ``pre`` / ``post``, a rank's load the same sum of its stages' loads
    in stage order, from 0.0."""
    k = np.arange(len(moves))
    src, dst = np.array(moves, dtype=np.intp).T
    c = np.tile(np.asarray(counts, dtype=np.intp), (len(moves), 1))
    c[k, src] -= 1
    c[k, dst] += 1
    ends = np.cumsum(c, axis=1)
    loads = prefix[ends] - prefix[ends - c]
    loads[:, 0] += pre
    loads[:, -1] += post
    per = np.zeros((len(moves), n_ranks))
    for v, r in enumerate(rank_of):
        per[:, r] += loads[:, v]
    return per.max(axis=1).tolist(), loads.max(axis=1).tolist()


def _lower(x: tuple[float, float], y: tuple[float, float]) -> bool:
    tol = 1e-12 * max(abs(y[0]), 1e-30)
    if x[0] < y[0] - tol:
        return True
    return abs(x[0] - y[0]) <= tol and x[1] < y[1] - 1e-12 * max(abs(y[1]), 1e-30)


def _split(num_layers: int, num_vstages: int, explicit: tuple[int, ...] | None,
           layer_cost: list[float] | None, pre: float, post: float) -> list[int]:
    if explicit is not None:
        if len(explicit) != num_vstages or sum(explicit) != num_layers or min(explicit) < 0:
            raise SimulatorError(f"layers_per_stage {list(explicit)} must have {num_vstages} entries "
                             f">= 0 summing to the {num_layers} layers")
        return list(explicit)
    if num_layers == 0 and num_vstages == 1:
        return [0]  # a program without decoder layers runs as one stage
    if num_layers < num_vstages:
        raise SimulatorError(f"{num_layers} layers cannot fill {num_vstages} pipeline stages x chunks")
    cost = layer_cost or [1.0] * num_layers
    lo = max(max(cost), cost[0] + pre, cost[-1] + post)
    hi = sum(cost) + pre + post
    best = _pack(cost, hi, pre, post)
    for _ in range(60):
        mid = (lo + hi) / 2
        groups = _pack(cost, mid, pre, post)
        if groups is not None and len(groups) <= num_vstages:
            hi, best = mid, groups
        else:
            lo = mid
    if best is None:  # the loose bound hi always packs into one group
        raise SimulatorError(f"cannot split {num_layers} layers over {num_vstages} virtual stages")
    while len(best) < num_vstages:  # split the group with most layers (ties: the last)
        i = max(range(len(best)), key=lambda j: (best[j], j))
        best[i:i + 1] = [best[i] // 2, best[i] - best[i] // 2]
    return best


def _pack(cost: list[float], limit: float, pre: float, post: float) -> list[int] | None:
    """Right-to-left greedy groups (layer counts, model order, at least one layer each)
    with every group's load under ``limit``, the first also carrying ``pre`` and the last
    ``post``; None when none exist. Each group takes as many layers as fit, so the groups
    are as few as the limit allows and their number never rises with it (the bisection of
    :func:`_split` relies on that). When the leftmost group cannot take ``pre`` it is cut
    after the layers that fit beside it. (Before, that case was declared infeasible while a
    smaller limit packed: the bisection then settled above 3 layers a stage where 2 fit,
    e.g. Llama 2 7B on pp 4 x vpp 4: [3, 3, 3, 3, 3, 1, 2, ...] instead of 2 each.)"""
    lim = limit * (1 + 1e-12)
    groups: list[int] = []
    load, count = post, 0
    for c in reversed(cost):
        if load + c > lim and count:
            groups.append(count)
            load, count = 0.0, 0
        load += c
        count += 1
        if load > lim:
            return None
    if load + pre > lim:  # the embedding does not fit: a first group of what fits beside it
        first, acc = 0, pre
        for c in cost[:count]:
            if acc + c > lim:
                break
            acc += c
            first += 1
        if first == 0:
            return None
        groups.append(count - first)
        count = first
    groups.append(count)
    return groups[::-1]
