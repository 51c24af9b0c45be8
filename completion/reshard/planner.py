"""The reshard planner: a cheapest path over layouts, one mesh dim per step.

States are ``(side, placements)``: ``side`` 0 is the source mesh, 1 the destination mesh
(they coincide for an in-mesh reshard). Edges are the single-mesh-dim transitions of
:mod:`completion.reshard.steps` (legal under nested sharding) and, between meshes, a
send_recv edge. Dijkstra's algorithm (ties broken by fewer emitted steps, then by a fixed
edge order) returns the cheapest path under a per-step cost, so for any intermediate
layout ``mid`` reachable in the same graph, ``cost(src, dst) <= cost(src, mid) +
cost(mid, dst)`` holds exactly: the path through ``mid`` is a candidate. The graph holds
the partial reduce types of ``src`` and ``dst``, plus ``sum`` and ``avg`` whenever either
is present (their conversion is a local scale).

The default cost is hardware-free (``completion`` knows no hardware): ring wire bytes of
a collective (nccl-tests bus factors) plus ``STEP_OVERHEAD_BYTES`` per collective, and
``LOCAL_WEIGHT`` times the memory traffic of a local step. ``simulator.reshard_cost``
supplies a cluster-timed cost for the same search.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from functools import lru_cache

from completion.dist_attr import Partial, Placement, Replicate, Shard, TensorDistAttr
from completion.dtypes import dtype_bytes
from completion.errors import CompletionError, DistAttrError
from completion.mesh import ProcessMesh
from completion.reshard.layout import LINEAR_REDUCE, Layout, partial_types_ok
from completion.reshard.steps import (
    TRANSITIONS,
    Ctx,
    ReshardPlan,
    ReshardStep,
    cross_mesh_step,
)

STEP_OVERHEAD_BYTES = 65536.0
LOCAL_WEIGHT = 0.05

StepCost = Callable[[ReshardStep], float]


class ReshardError(CompletionError):
    """No legal reshard: bad layouts, a shape mismatch, or meshes with no path between them."""


def default_step_cost(step: ReshardStep) -> float:
    """Hardware-free cost of one step, in equivalent wire bytes per rank.

    Collectives: the nccl-tests bus factor times the buffer size (all_reduce 2(n-1)/n,
    reduce_scatter / all_gather / all_to_all (n-1)/n, send_recv 1; NCCL nccl-tests
    PERFORMANCE.md) plus STEP_OVERHEAD_BYTES for latency. Local steps: LOCAL_WEIGHT times
    their memory traffic (HBM is an order of magnitude faster than links).
    """
    if not step.is_collective:
        return LOCAL_WEIGHT * step.nbytes
    n = step.group_size
    if step.kind == "send_recv":
        factor = 1.0
    elif step.kind == "all_reduce":
        factor = 2.0 * (n - 1) / n
    else:
        factor = (n - 1) / n
    return factor * step.nbytes + STEP_OVERHEAD_BYTES


def plan_reshard(
    src: TensorDistAttr | Layout,
    dst: TensorDistAttr | Layout,
    global_shape: Sequence[int],
    dtype: str = "float32",
    *,
    cost: StepCost | None = None,
    cross_mesh: bool = True,
    value: str = "value",
) -> ReshardPlan:
    """Plan the reshard of a tensor of ``global_shape`` from layout ``src`` to ``dst``.

    Args:
        src, dst: TensorDistAttr or Layout (placements with nested sharding, mesh-dim order).
        global_shape: logical shape (elements per dim).
        dtype: element type, for byte counts.
        cost: per-step cost minimised by the search (default: :func:`default_step_cost`).
        cross_mesh: allow a send_recv path between different meshes.
        value: how error messages name the value being resharded.

    Returns:
        A ReshardPlan whose steps (no steps for identity) are the cheapest path.

    Raises:
        ReshardError: a layout that does not fit the shape (Shard of a missing dim, a
            dims_mapping of the wrong length), partial types whose order matters, or
            different meshes with ``cross_mesh=False``; the message names the value and both
            layouts.
    """
    shape = tuple(int(s) for s in global_shape)
    key = (src, dst, shape, dtype)
    try:
        hit = _CHECKED.get(key)
    except TypeError:  # an unhashable spec: the checks below name it
        key, hit = None, None
    if hit is None:
        try:
            s, d = Layout.of(src), Layout.of(dst)
            for a in (src, dst):
                if isinstance(a, TensorDistAttr):
                    a.check_shape(shape, value)
            s.check(shape)
            d.check(shape)
            itemsize = dtype_bytes(dtype)
        except (DistAttrError, ValueError) as e:
            raise ReshardError(f"cannot reshard {value} of shape {list(shape)} from {src!r} to {dst!r}: {e}") from None
        plans: dict = {}
        if key is not None:
            if len(_CHECKED) >= _CHECKED_MAX:
                _CHECKED.pop(next(iter(_CHECKED)))
            _CHECKED[key] = (s, d, itemsize, plans)
    else:
        s, d, itemsize, plans = hit
    if not cross_mesh and s.mesh != d.mesh:
        raise ReshardError(
            f"cannot reshard {value} from {src!r} to {dst!r}: the meshes {list(s.mesh.process_ids)} and "
            f"{list(d.mesh.process_ids)} differ and no cross-mesh path is allowed"
        )
    cost = cost or default_step_cost
    plan = plans.get(cost)
    if plan is None:
        plan = plans[cost] = _plan(s, d, shape, dtype, itemsize, cost)
    return plan


#: (src, dst, shape, dtype) -> (src Layout, dst Layout, itemsize, plans by step cost) of
#: specs that passed the checks of :func:`plan_reshard`: the partition and reshard passes
#: plan the same few layout pairs for every layer (both specs are frozen, so the checks'
#: answer is fixed, and so is the plan for a cost; keeping it here spares hashing the two
#: Layouts for ``_plan``'s cache on every call). Bounded, oldest dropped first;
#: :func:`clear_plan_caches` empties it with the plans.
_CHECKED: dict[tuple, tuple[Layout, Layout, int, dict]] = {}
_CHECKED_MAX = 8192


def clear_plan_caches() -> None:
    """Forget every memoised plan and check of :func:`plan_reshard` (benchmarks time cold
    planning)."""
    _CHECKED.clear()
    _plan.cache_clear()


@lru_cache(maxsize=8192)
def _plan(src: Layout, dst: Layout, shape, dtype, itemsize, cost) -> ReshardPlan:
    types = _reduce_types(src.placements + dst.placements)
    meshes = (src.mesh, dst.mesh)
    ctxs = tuple(
        Ctx(m, shape, itemsize, tuple(tuple(m.groups(k)) for k in range(m.ndim))) for m in meshes
    )
    # every placement of the search is one of these (plan_reshard checked the specs); the
    # search keys its states by their indices: int tuples hash and compare in C, where
    # tuples of placement dataclasses call a Python __hash__ / __eq__ per entry
    options = (Replicate(), *(Shard(e) for e in range(len(shape))), *(Partial(r) for r in types))
    index = {p: i for i, p in enumerate(options)}
    start = (0, tuple(index[p] for p in src.placements))
    goal = (1 if src.mesh != dst.mesh else 0, tuple(index[p] for p in dst.placements))
    tick = itertools.count()
    best: dict = {start: (0.0, 0)}
    prev: dict = {start: None}
    heap = [(0.0, 0, next(tick), start)]
    while heap:
        c, k, _, state = heapq.heappop(heap)
        if state == goal:
            break
        if (c, k) > best[state]:
            continue
        for nxt, step in _neighbors(state, ctxs, options, index, dst.mesh):
            emitted = isinstance(step, ReshardStep)
            key = (c + (cost(step) if emitted else 0.0), k + emitted)
            if key < best.get(nxt, (float("inf"), 0)):
                best[nxt], prev[nxt] = key, (state, step)
                heapq.heappush(heap, (key[0], key[1], next(tick), nxt))
    if goal not in prev:  # pragma: no cover - every layout pair is connected
        raise ReshardError(f"no reshard path from {src!r} to {dst!r}")
    steps: list[ReshardStep] = []
    node = goal
    while prev[node] is not None:
        node, step = prev[node]
        if isinstance(step, ReshardStep):
            steps.append(step)
    return ReshardPlan(src, dst, shape, dtype, tuple(reversed(steps)), best[goal][0])


def _reduce_types(placements: tuple[Placement, ...]) -> tuple[str, ...]:
    types = {p.reduce_type for p in placements if isinstance(p, Partial)}
    if types & LINEAR_REDUCE:
        types |= LINEAR_REDUCE
    return tuple(sorted(types))


def _neighbors(state, ctxs, options: tuple[Placement, ...], index: dict, dst_mesh: ProcessMesh):
    """The states one transition from ``state`` and the step (or ``"relabel"``) to each.
    A state is ``(side, codes)``: ``codes[m]`` is the index in ``options`` (the placements
    a mesh dim may take, built once per search; ``index`` inverts it) of mesh dim m's
    placement."""
    side, codes = state
    pl = tuple(options[c] for c in codes)
    ctx = ctxs[side]
    if side == 0 and ctxs[0].mesh != dst_mesh:
        if dst_mesh.shape == ctx.mesh.shape or all(isinstance(p, Replicate) for p in pl):
            step = cross_mesh_step(Layout(ctx.mesh, pl), dst_mesh, ctx.shape, ctx.itemsize)
            yield (1, tuple(index[p] for p in step.dst)), step
    sharders: dict[int, list[int]] = {}
    for m, p in enumerate(pl):
        if isinstance(p, Shard):
            sharders.setdefault(p.dim, []).append(m)
    for m, cur in enumerate(pl):
        if isinstance(cur, Shard) and sharders[cur.dim][-1] != m:
            continue  # not the innermost mesh dim on its tensor dim: cannot leave
        here = codes[m]
        for t, tgt in enumerate(options):
            if t == here:
                continue
            if isinstance(tgt, Shard) and any(x > m for x in sharders.get(tgt.dim, ()) if x != m):
                continue  # would not be innermost on its tensor dim
            new = pl[:m] + (tgt,) + pl[m + 1 :]
            if not partial_types_ok(new):
                continue
            nxt = (side, codes[:m] + (t,) + codes[m + 1 :])
            if ctx.mesh.shape[m] == 1:
                yield nxt, "relabel"
                continue
            builder = TRANSITIONS.get((type(cur), type(tgt)))
            res = builder(ctx, m, pl, new) if builder else None
            if res is not None:
                yield nxt, res
