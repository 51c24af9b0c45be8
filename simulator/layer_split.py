"""Decoder layers over virtual pipeline stages, balanced by cost."""

from __future__ import annotations

import functools

from simulator.errors import SimulatorError


def split_layers(num_layers: int, num_vstages: int, explicit: tuple[int, ...] | None = None,
                 layer_cost: list[float] | None = None, pre: float = 0.0, post: float = 0.0) -> list[int]:
    """Layers per virtual stage (model order).

    ``explicit`` is used as given (validated). Otherwise the split is balanced by cost:
    contiguous groups minimising the largest stage time, the first stage also paying
    ``pre`` (embeddings) and the last ``post`` (head and loss) -- the balancing the Zero
    Bubble paper does by hand (Qi et al. 2024, Table 3: first and last stages carry fewer
    layers). Bisection on the bottleneck T; for each T a right-to-left greedy packing gives
    the fewest groups (and the lightest first group); groups are then split to exactly
    ``num_vstages`` (splitting never raises the maximum). Without costs all layers weigh 1.

    Raises ValueError when there are fewer layers than virtual stages or ``explicit``
    does not fit. Balanced splits are memoised by their arguments (a search asks the same
    ones for every candidate of a layer layout)."""
    if explicit is None:
        return list(_balanced(num_layers, num_vstages, tuple(layer_cost) if layer_cost else None,
                              float(pre), float(post)))
    return _split(num_layers, num_vstages, explicit, layer_cost, pre, post)


@functools.lru_cache(maxsize=4096)
def _balanced(num_layers: int, num_vstages: int, layer_cost: tuple[float, ...] | None,
              pre: float, post: float) -> tuple[int, ...]:
    return tuple(_split(num_layers, num_vstages, None, list(layer_cost) if layer_cost else None, pre, post))


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
    """Right-to-left greedy groups (layer counts, model order) under ``limit``, or None."""
    groups: list[int] = []
    load, count = post, 0
    for c in reversed(cost):
        if load + c > limit * (1 + 1e-12) and count:
            groups.append(count)
            load, count = 0.0, 0
        load += c
        count += 1
        if load > limit * (1 + 1e-12):
            return None
    if load + pre > limit * (1 + 1e-12):
        return None
    groups.append(count)
    return groups[::-1]
